// Package e2e runs the ticketd binary as a separate process and speaks the
// wire protocol to it over loopback, as a client would.
package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ticketd/ticketd/internal/serverproc"
)

const (
	readTimeout  = 5 * time.Second  // default bound on any single answer
	startTimeout = 15 * time.Second // build is done before; this covers opening the store
	stopTimeout  = 10 * time.Second // SIGTERM to exit, before SIGKILL
)

// binPath is the server binary, built once by TestMain.
var binPath string

func TestMain(m *testing.M) {
	os.Exit(serverproc.Main(func() int {
		var err error
		if binPath, err = serverproc.Ticketd(); err != nil {
			fmt.Fprintln(os.Stderr, "e2e:", err)
			return 1
		}
		return m.Run()
	}))
}

// ---- server process ----

// server is one running ticketd process.
type server struct {
	t       testing.TB
	p       *serverproc.Proc
	addr    string // p.Addr
	dataDir string

	// ring, for a cluster seen as one server: dial goes to its nodes in turn.
	ring []string
	next atomic.Int64
}

// startServer starts ticketd on a fresh data dir with the given extra flags.
func startServer(t testing.TB, flags ...string) *server {
	t.Helper()
	return startServerDir(t, t.TempDir(), flags...)
}

// startServerDir starts ticketd on dataDir; the caller may reuse the dir for a restart.
func startServerDir(t testing.TB, dataDir string, flags ...string) *server {
	t.Helper()
	s, err := launch(t, dataDir, flags...)
	if err != nil {
		t.Fatalf("start ticketd: %v", err)
	}
	return s
}

func launch(t testing.TB, dataDir string, flags ...string) (*server, error) {
	return launchWrapped(t, nil, dataDir, flags...)
}

// launchWrapped starts ticketd through a wrapper that execs it (so the pid
// is ticketd's), such as prlimit.
func launchWrapped(t testing.TB, wrapper []string, dataDir string, flags ...string) (*server, error) {
	argv := append(append(wrapper[:len(wrapper):len(wrapper)], binPath), serverproc.TicketdArgs("", dataDir, flags...)...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout = io.Discard
	p, err := serverproc.StartListening(cmd, startTimeout)
	if err != nil {
		return nil, err
	}
	s := &server{t: t, p: p, addr: p.Addr, dataDir: dataDir}
	t.Cleanup(func() {
		s.stop()
		if t.Failed() {
			t.Logf("ticketd (pid %d, data dir %s) stderr:\n%s", s.pid(), dataDir, p.Log().Tail(80))
		}
	})
	return s, nil
}

func (s *server) pid() int     { return s.p.Pid() }
func (s *server) exited() bool { return s.p.Exited() }

// stop sends SIGTERM and waits for the exit, with SIGKILL after stopTimeout.
// It reports whether the process exited by itself in time.
func (s *server) stop() bool {
	if err := s.p.Stop(stopTimeout); err != nil {
		s.t.Errorf("ticketd: %v", err)
		return false
	}
	return true
}

// kill sends SIGKILL (a crash) and waits for the exit.
func (s *server) kill() { s.p.Kill() }

// exitCode is valid after the process exited; -1 for a signal death.
func (s *server) exitCode() int { return s.p.ExitCode() }

// adminAddr is the address of the admin listener of a server started with
// "--admin", "127.0.0.1:0", read from its log ("admin listening" comes
// before "listening").
func (s *server) adminAddr() string {
	s.t.Helper()
	for _, line := range strings.Split(s.p.Log().String(), "\n") {
		var rec struct {
			Msg  string `json:"msg"`
			Addr string `json:"addr"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "admin listening" && rec.Addr != "" {
			return rec.Addr
		}
	}
	s.t.Fatalf("no \"admin listening\" line in the log (started without --admin?)")
	return ""
}

// metric reads one unlabelled sample (a line "name value") from /metrics.
func (s *server) metric(name string) (float64, error) {
	cl := &http.Client{Timeout: readTimeout, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := cl.Get("http://" + s.adminAddr() + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return strconv.ParseFloat(v, 64)
		}
	}
	return 0, fmt.Errorf("no sample %q in /metrics", name)
}

// awaitMetric polls metric name until it equals want, for at most timeout.
// It returns the last value read and whether it reached want.
func (s *server) awaitMetric(name string, want float64, timeout time.Duration) (float64, bool) {
	s.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		v, err := s.metric(name)
		if err != nil {
			s.t.Fatalf("reading %s: %v", name, err)
		}
		if v == want {
			return v, true
		}
		if time.Now().After(deadline) {
			return v, false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// rssKiB reads VmRSS of the server process.
func (s *server) rssKiB() (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.pid()))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) >= 1 {
				return strconv.ParseInt(f[0], 10, 64)
			}
		}
	}
	return 0, errors.New("no VmRSS line")
}

// runOnce runs ticketd to completion (for start-up failures) and returns its
// exit code and combined output. A server that starts listening instead is
// stopped and reported through listening=true.
func runOnce(t testing.TB, timeout time.Duration, args ...string) (code int, out string, listening bool) {
	t.Helper()
	p, err := serverproc.Start(exec.Command(binPath, args...), listeningLine)
	if err != nil {
		t.Fatalf("start ticketd: %v", err)
	}
	select {
	case <-p.Done():
		return p.ExitCode(), p.Log().String(), false
	case <-p.Ready():
		_ = p.Stop(stopTimeout)
		return p.ExitCode(), p.Log().String(), true
	case <-time.After(timeout):
		p.Kill()
		t.Fatalf("ticketd %q neither exited nor listened within %v; output:\n%s", args, timeout, p.Log())
		return
	}
}

// listeningLine finds the "listening" log message in JSON or console format.
func listeningLine(line []byte) (string, bool) {
	if bytes.Contains(line, []byte(`"msg":"listening"`)) {
		return "", true
	}
	for _, f := range bytes.Split(line, []byte("\t")) {
		if string(f) == "listening" {
			return "", true
		}
	}
	return "", false
}

// ---- client connection ----

// conn is one client connection; all reads are bounded by a deadline.
type conn struct {
	t testing.TB
	c net.Conn
	r *bufio.Reader
}

func (s *server) dial(t testing.TB) *conn {
	t.Helper()
	addr := s.addr
	if len(s.ring) > 0 {
		addr = s.ring[int(s.next.Add(1)-1)%len(s.ring)]
	}
	c, err := net.DialTimeout("tcp", addr, readTimeout)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return &conn{t: t, c: c, r: bufio.NewReaderSize(c, 64<<10)}
}

func (c *conn) close() { c.c.Close() }

// on returns the same connection reporting failures to t (for use in subtests).
func (c *conn) on(t testing.TB) *conn {
	c2 := *c
	c2.t = t
	return &c2
}

// send writes the lines, each with "\n", in one write.
func (c *conn) send(lines ...string) {
	c.t.Helper()
	var b strings.Builder
	for _, l := range lines {
		b.WriteString(l)
		b.WriteByte('\n')
	}
	c.sendRaw([]byte(b.String()))
}

func (c *conn) sendRaw(p []byte) {
	c.t.Helper()
	_ = c.c.SetWriteDeadline(time.Now().Add(readTimeout))
	if _, err := c.c.Write(p); err != nil {
		c.t.Fatalf("write %q: %v", clip(p), err)
	}
}

// readLine reads one answer line (without "\n") within d.
func (c *conn) readLine(d time.Duration) (string, error) {
	_ = c.c.SetReadDeadline(time.Now().Add(d))
	line, err := c.r.ReadString('\n')
	if err != nil {
		if line != "" {
			return "", fmt.Errorf("%w (after partial line %q)", err, line)
		}
		return "", err
	}
	return strings.TrimSuffix(line, "\n"), nil
}

// next reads one answer within readTimeout.
func (c *conn) next() string {
	c.t.Helper()
	line, err := c.readLine(readTimeout)
	if err != nil {
		c.t.Fatalf("reading an answer: %v", err)
	}
	return line
}

// expect reads len(want) answers and requires them in that order.
func (c *conn) expect(want ...string) {
	c.t.Helper()
	for i, w := range want {
		got, err := c.readLine(readTimeout)
		if err != nil {
			c.t.Fatalf("answer %d: want %q, got error %v", i+1, w, err)
		}
		if got != w {
			c.t.Fatalf("answer %d: want %q, got %q", i+1, w, got)
		}
	}
}

// expectSet reads len(want) answers and requires them in any order.
func (c *conn) expectSet(want ...string) {
	c.t.Helper()
	got := make([]string, 0, len(want))
	for range want {
		line, err := c.readLine(readTimeout)
		if err != nil {
			c.t.Fatalf("want answers %q (any order), got %q then error %v", want, got, err)
		}
		got = append(got, line)
	}
	if !sameSet(got, want) {
		c.t.Fatalf("want answers %q (any order), got %q", want, got)
	}
}

// expectNothing requires that no answer arrives within d.
func (c *conn) expectNothing(d time.Duration) {
	c.t.Helper()
	line, err := c.readLine(d)
	if err == nil {
		c.t.Fatalf("want no answer within %v, got %q", d, line)
	}
	if !isTimeout(err) {
		c.t.Fatalf("want no answer within %v, got error %v", d, err)
	}
}

// expectClosed requires that the server closes the connection without
// sending anything more.
func (c *conn) expectClosed() {
	c.t.Helper()
	line, err := c.readLine(readTimeout)
	switch {
	case err == nil:
		c.t.Fatalf("want the connection closed, got another line %q", line)
	case isTimeout(err):
		c.t.Fatalf("want the connection closed within %v, it stayed open", readTimeout)
	case !isClosed(err):
		c.t.Fatalf("want the connection closed, got error %v", err)
	}
}

// expectError requires one "E <code> <text>" line, then the close.
func (c *conn) expectError(code string) {
	c.t.Helper()
	line, err := c.readLine(readTimeout)
	if err != nil {
		c.t.Fatalf("want \"E %s ...\", got error %v", code, err)
	}
	if !strings.HasPrefix(line, "E "+code+" ") || len(line) <= len("E "+code+" ") {
		c.t.Fatalf("want \"E %s <text>\", got %q", code, line)
	}
	c.expectClosed()
}

// sync is a barrier on key: a release with a token nobody holds changes
// nothing and is answered after every earlier request of this connection on
// the same key (same shard) has been carried out.
func (c *conn) sync(key string) {
	c.t.Helper()
	c.send(rel(maxToken, key))
	c.expect(notRel(maxToken, key))
}

// acquire sends one acquire and requires an immediate A; it returns the token.
func (c *conn) acquire(owner, key string, leaseMs, waitMs int) uint64 {
	c.t.Helper()
	c.send(acq(owner, key, leaseMs, waitMs))
	return c.expectAcquired(owner, key)
}

// release sends one release and requires R.
func (c *conn) release(tok uint64, key string) {
	c.t.Helper()
	c.send(rel(tok, key))
	c.expect(released(tok, key))
}

// expectAcquired reads one answer that must be "A <token> owner key".
func (c *conn) expectAcquired(owner, key string) uint64 {
	c.t.Helper()
	line := c.next()
	tok, ok := parseAcquired(line, owner, key)
	if !ok {
		c.t.Fatalf("want \"A <token> %s %s\", got %q", owner, key, line)
	}
	return tok
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func isClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, net.ErrClosed)
}

// ---- frames ----

const maxToken uint64 = 1<<64 - 1

func acq(owner, key string, leaseMs, waitMs int) string {
	return fmt.Sprintf("A %s %s %d %d", owner, key, leaseMs, waitMs)
}
func rel(tok uint64, key string) string { return fmt.Sprintf("R %d %s", tok, key) }
func acquired(tok uint64, owner, key string) string {
	return fmt.Sprintf("A %d %s %s", tok, owner, key)
}
func timedOut(owner, key string) string      { return "T " + owner + " " + key }
func busy(owner, key string) string          { return "B " + owner + " " + key }
func released(tok uint64, key string) string { return fmt.Sprintf("R %d %s", tok, key) }
func notRel(tok uint64, key string) string   { return fmt.Sprintf("N %d %s", tok, key) }

// parseAcquired checks "A <token> owner key" and returns the token.
func parseAcquired(line, owner, key string) (uint64, bool) {
	f := strings.Split(line, " ")
	if len(f) != 4 || f[0] != "A" || f[2] != owner || f[3] != key {
		return 0, false
	}
	tok, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil || tok == 0 || f[1] != strconv.FormatUint(tok, 10) {
		return 0, false
	}
	return tok, true
}

func sameSet(a, b []string) bool {
	return slices.Equal(slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b)))
}

func clip(p []byte) string {
	if len(p) > 80 {
		return string(p[:80]) + fmt.Sprintf("...(%d bytes)", len(p))
	}
	return string(p)
}
