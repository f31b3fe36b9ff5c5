package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ticketd/ticketd/pprof"
)

func TestAdminWarnsWhenReachableFromOtherHosts(t *testing.T) {
	for _, tc := range []struct {
		ip   string
		warn bool
	}{
		{"0.0.0.0", true}, // "0.0.0.0:x"
		{"::", true},      // ":0" and "[::]:x"
		{"10.1.2.3", true},
		{"192.168.0.7", true},
		{"2001:db8::1", true},
		{"127.0.0.1", false},
		{"127.3.2.1", false},
		{"::1", false},
		{"::ffff:127.0.0.1", false},
	} {
		core, logs := observer.New(zap.InfoLevel)
		warnIfExposed(zap.New(core), &net.TCPAddr{IP: net.ParseIP(tc.ip), Port: 9090})
		warned := logs.FilterLevelExact(zap.WarnLevel).Len() == 1
		if warned != tc.warn {
			t.Errorf("admin on %s: warned %v, want %v", tc.ip, warned, tc.warn)
		}
	}

	// The check is on the address bound, which startAdmin passes it.
	core, logs := observer.New(zap.InfoLevel)
	adm, err := startAdmin(&config{admin: "127.0.0.1:0"}, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	adm.stop(context.Background())
	if n := logs.FilterLevelExact(zap.WarnLevel).Len(); n != 0 {
		t.Errorf("admin on 127.0.0.1: %d warnings, want none: %v", n, logs.All())
	}
	if logs.FilterMessage("admin listening").Len() != 1 {
		t.Errorf("no \"admin listening\" line: %v", logs.All())
	}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// net/http's own lines (here a handler's panic) go through the logger, so a
// JSON logger writes them as JSON.
func TestAdminHTTPErrorsThroughLogger(t *testing.T) {
	var buf lockedBuffer
	log := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(&buf), zap.InfoLevel))
	adm, err := startAdmin(&config{admin: "127.0.0.1:0"}, log)
	if err != nil {
		t.Fatal(err)
	}
	defer adm.stop(context.Background())
	adm.a.Handle("/boom", http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("boom") }))

	client := &http.Client{Timeout: 10 * time.Second}
	if resp, err := client.Get("http://" + adm.ln.Addr().String() + "/boom"); err == nil {
		resp.Body.Close() // the server drops the connection instead
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(buf.String(), "panic serving") {
		if time.Now().After(deadline) {
			t.Fatalf("the handler's panic did not reach the logger; it logged %q", buf.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	var found bool
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var e struct{ Level, Logger, Msg string }
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Errorf("not a JSON line: %q", line)
			continue
		}
		if strings.Contains(e.Msg, "panic serving") {
			found = true
			if e.Level != "warn" || e.Logger != "admin" {
				t.Errorf("panic line at level %q from %q, want warn from admin", e.Level, e.Logger)
			}
		}
	}
	if !found {
		t.Error("no JSON line holds the panic")
	}
}

// TestHelperTicketd is not a test: the tests below run it as a ticketd
// process of their own, with a descriptor limit of its own.
func TestHelperTicketd(t *testing.T) {
	if os.Getenv("TICKETD_TEST_PROCESS") != "1" {
		return
	}
	if n, err := strconv.ParseUint(os.Getenv("TICKETD_TEST_NOFILE"), 10, 64); err == nil {
		// Hard limit too: the server raises its soft limit to the hard one.
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: n, Max: n}); err != nil {
			fmt.Fprintln(os.Stderr, "setrlimit:", err)
			os.Exit(3)
		}
	}
	var args []string
	_ = json.Unmarshal([]byte(os.Getenv("TICKETD_TEST_ARGS")), &args)
	os.Exit(run(args, os.Stderr))
}

// helperCommand is a command that runs ticketd with args in this test
// binary (TestHelperTicketd), under a descriptor limit of nofile.
func helperCommand(nofile int, args ...string) *exec.Cmd {
	a, _ := json.Marshal(args)
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperTicketd$")
	cmd.Env = append(os.Environ(), "TICKETD_TEST_PROCESS=1",
		"TICKETD_TEST_NOFILE="+strconv.Itoa(nofile), "TICKETD_TEST_ARGS="+string(a))
	return cmd
}

// server is a ticketd process started by a test.
type server struct {
	cmd         *exec.Cmd
	lock, admin string
	log         *lockedBuffer
	exited      chan struct{}
	err         error // Wait's, once exited is closed
}

func startServer(t *testing.T, nofile int, extra ...string) *server {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("counts descriptors in /proc")
	}
	args := append([]string{"--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0",
		"--data-dir", t.TempDir(), "--log-format", "json"}, extra...)
	cmd := helperCommand(nofile, args...)
	s := &server{cmd: cmd, log: &lockedBuffer{}, exited: make(chan struct{})}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addrs := make(chan [2]string, 1)
	go func() {
		var lock, admin string
		sc := bufio.NewScanner(stderr)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			_, _ = s.log.Write(append(sc.Bytes(), '\n'))
			var e struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &e) == nil {
				switch e.Msg {
				case "admin listening":
					admin = e.Addr
				case "listening":
					lock = e.Addr
					addrs <- [2]string{lock, admin}
				}
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		s.err = cmd.Wait()
		close(s.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-s.exited:
		default:
			_ = cmd.Process.Kill()
			<-s.exited
		}
		if t.Failed() {
			t.Logf("server log:\n%s", s.log.String())
		}
	})
	select {
	case a := <-addrs:
		s.lock, s.admin = a[0], a[1]
	case <-s.exited:
		t.Fatalf("server exited before listening: %v", s.err)
	case <-time.After(30 * time.Second):
		t.Fatal("server not listening after 30s")
	}
	return s
}

func (s *server) fds(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", s.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// stop sends SIGTERM and returns how long the process took to exit.
func (s *server) stop(t *testing.T, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.exited:
	case <-time.After(within):
		t.Fatalf("still running %v after SIGTERM", within)
	}
	if s.err != nil {
		t.Errorf("exit after SIGTERM: %v", s.err)
	}
	return time.Since(start)
}

// span is the time between the first log lines with messages from and to.
func (s *server) span(t *testing.T, from, to string) time.Duration {
	t.Helper()
	var at [2]time.Time
	for _, line := range strings.Split(s.log.String(), "\n") {
		var e struct {
			Msg string
			TS  json.RawMessage
		}
		if json.Unmarshal([]byte(line), &e) != nil {
			continue
		}
		for i, m := range []string{from, to} {
			if e.Msg == m && at[i].IsZero() {
				at[i] = logTime(t, e.TS)
			}
		}
	}
	if at[0].IsZero() || at[1].IsZero() {
		t.Fatalf("no %q or no %q line in the log", from, to)
	}
	return at[1].Sub(at[0])
}

// logTime reads zap's "ts": ISO 8601 text, or seconds as a number.
func logTime(t *testing.T, ts json.RawMessage) time.Time {
	var text string
	if json.Unmarshal(ts, &text) == nil {
		at, err := time.Parse("2006-01-02T15:04:05.999999999Z0700", text)
		if err != nil {
			t.Fatalf("log time %s: %v", ts, err)
		}
		return at
	}
	var sec float64
	if err := json.Unmarshal(ts, &sec); err != nil {
		t.Fatalf("log time %s: %v", ts, err)
	}
	return time.Unix(0, int64(sec*1e9))
}

// jsonOnly fails on any line of the server's log that is not JSON.
func (s *server) jsonOnly(t *testing.T) {
	t.Helper()
	for _, line := range strings.Split(strings.TrimSpace(s.log.String()), "\n") {
		if !json.Valid([]byte(line)) {
			t.Errorf("a log line under --log-format json is not JSON: %q", line)
		}
	}
}

// acquire sends one acquire on a new lock-port connection and returns the
// answer line.
func acquire(addr, key string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(c, "A probe %s 10000 0\n", key); err != nil {
		return "", err
	}
	return bufio.NewReader(c).ReadString('\n')
}

// Many more keep-alive admin connections than the process has descriptors
// for: the admin listener holds its limit, the rest wait in the backlog,
// and a lock client is still served.
func TestAdminFloodDoesNotStarveTheLockPort(t *testing.T) {
	const nofile, flood = 512, 800
	s := startServer(t, nofile)
	before := s.fds(t)

	var answered atomic.Int64
	conns := make([]net.Conn, 0, flood)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	var wg sync.WaitGroup
	for range flood {
		c, err := net.DialTimeout("tcp", s.admin, 10*time.Second)
		if err != nil {
			t.Fatalf("after %d admin connections: %v", len(conns), err)
		}
		conns = append(conns, c)
		if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: admin\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
			if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
				resp.Body.Close()
				answered.Add(1)
			}
		})
	}
	// The first connections up to the limit are served and then sit idle.
	deadline := time.Now().Add(20 * time.Second)
	for answered.Load() < pprof.DefaultMaxConns {
		if time.Now().After(deadline) {
			t.Fatalf("%d admin requests answered after 20s, want at least %d", answered.Load(), pprof.DefaultMaxConns)
		}
		time.Sleep(10 * time.Millisecond)
	}

	line, err := acquire(s.lock, "k")
	if err != nil || !strings.HasPrefix(line, "A ") {
		t.Errorf("lock client during the admin flood: %q, %v; want A", line, err)
	}
	// Each admin connection the server accepted is one descriptor; the
	// lock connection above is closed, a few spare for the runtime.
	if n := s.fds(t) - before; n > pprof.DefaultMaxConns+8 {
		t.Errorf("server holds %d more descriptors under the flood, want at most its admin limit %d and a few", n, pprof.DefaultMaxConns)
	}
	t.Logf("%d of %d flood connections answered; server descriptors %d before, %d during", answered.Load(), flood, before, s.fds(t))

	for _, c := range conns {
		c.Close()
	}
	wg.Wait()
	s.stop(t, 15*time.Second)
	s.jsonOnly(t)
}

// A profile longer than the limit is refused, and SIGTERM during a running
// profile does not wait for its seconds.
func TestSIGTERMDuringAProfile(t *testing.T) {
	s := startServer(t, 4096, "--shutdown-timeout", "30s")
	base := "http://" + s.admin
	client := &http.Client{Timeout: 60 * time.Second}

	short := &http.Client{Timeout: 10 * time.Second}
	resp, err := short.Get(base + "/debug/pprof/profile?seconds=100000")
	if err != nil {
		t.Fatalf("profile?seconds=100000: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("profile?seconds=100000 = %d %q, want 400", resp.StatusCode, body)
	}

	type result struct {
		code int
		err  error
	}
	got := make(chan result, 1)
	go func() {
		resp, err := client.Get(base + "/debug/pprof/profile?seconds=50")
		if err != nil {
			got <- result{err: err}
			return
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		got <- result{resp.StatusCode, err}
	}()
	// Wait until the server's goroutines show the profile running.
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := short.Get(base + "/debug/pprof/goroutine?debug=2")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if bytes.Contains(b, []byte("net/http/pprof.Profile(")) {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the profile is not running after 20s")
		}
		time.Sleep(20 * time.Millisecond)
	}

	took := s.stop(t, 45*time.Second)
	// The server's own span from the signal to its last line; the exit
	// after it is bounded loosely, as it is not the admin listener's.
	span := s.span(t, "shutting down", "stopped cleanly")
	if span > 3*time.Second || took > 10*time.Second {
		t.Errorf("SIGTERM with a 50s profile running: shutdown logged over %v, exit after %v; want about a second", span, took)
	}
	if r := <-got; r.err != nil || r.code != http.StatusOK {
		t.Errorf("the profile cut by SIGTERM: %d, %v; want 200 with what was sampled", r.code, r.err)
	}
	if !strings.Contains(s.log.String(), `"stopped cleanly"`) {
		t.Error("no clean stop logged")
	}
	t.Logf("SIGTERM with a profile running: shutdown logged over %v, exited after %v", span, took)
	s.jsonOnly(t)
}
