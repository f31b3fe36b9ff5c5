package e2e

import (
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ticketd/ticketd/internal/serverproc"
)

// TestCleanRestart: after SIGTERM and a restart on the same data dir every
// held key is still held by its token; queued acquires got T before the close.
func TestCleanRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s1 := startServerDir(t, dir)
	c := s1.dial(t)
	keys := []string{"r0", "r1", "r2", "r3", "r4"}
	old := map[string]uint64{}
	for _, k := range keys {
		old[k] = c.acquire("o", k, 60000, 0)
	}
	// Keys whose leases end soon after the restart: a lease keeps running
	// across it. Their ends are staggered so that one of them still runs
	// after the restart, however long the restart takes (a start is bounded
	// by startTimeout).
	shortStart := time.Now()
	shorts := []time.Duration{6 * time.Second, 12 * time.Second, 24 * time.Second, 48 * time.Second}
	shortToks := make([]uint64, len(shorts))
	for i, d := range shorts {
		shortToks[i] = c.acquire("o", fmt.Sprintf("short%d", i), int(d/time.Millisecond), 0)
	}
	w := s1.dial(t)
	w.send(acq("w", "r0", 60000, 30000))
	w.sync("r0")

	if !s1.stop() {
		t.Fatal("no clean exit on SIGTERM")
	}
	if code := s1.exitCode(); code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0", code)
	}
	w.expect(timedOut("w", "r0"))
	w.expectClosed()
	c.expectClosed()

	s2 := startServerDir(t, dir)
	c2 := s2.dial(t)
	for _, k := range keys {
		c2.send(acq("x", k, 60000, 0), rel(old[k], k))
		c2.expect(timedOut("x", k), released(old[k], k))
		if tok := c2.acquire("x", k, 60000, 0); tok <= old[k] {
			t.Errorf("%s: token %d after the restart, not above %d from before", k, tok, old[k])
		}
	}
	// The first lease with at least a second left: still held, then free
	// once it ends, to a new token.
	i := 0
	for i < len(shorts) && time.Until(shortStart.Add(shorts[i])) < time.Second {
		i++
	}
	if i == len(shorts) {
		t.Fatalf("the restart took %v, longer than every short lease", time.Since(shortStart))
	}
	key := fmt.Sprintf("short%d", i)
	c2.send(acq("x", key, 60000, 0))
	c2.expect(timedOut("x", key))
	time.Sleep(time.Until(shortStart.Add(shorts[i] + 300*time.Millisecond)))
	if tok := c2.acquire("x", key, 60000, 0); tok <= shortToks[i] {
		t.Errorf("%s: token %d after the restart, not above %d", key, tok, shortToks[i])
	}
}

// TestCrashRestart: after SIGKILL no key is granted while a lease from
// before the crash could be live, and tokens keep growing.
func TestCrashRestart(t *testing.T) {
	t.Parallel()
	const lease = 2000 * time.Millisecond
	dir := t.TempDir()
	s1 := startServerDir(t, dir)
	c := s1.dial(t)
	// Push the token counters of many keys (so of every shard) up first.
	last := map[string]uint64{}
	var maxTok uint64
	for round := range 5 {
		for i := range 32 {
			k := fmt.Sprintf("churn.%d", i)
			tok := c.acquire(fmt.Sprintf("o.%d", round), k, 2000, 0)
			c.release(tok, k)
			last[k] = tok
			maxTok = max(maxTok, tok)
		}
	}
	leaseStart := time.Now()
	for _, k := range []string{"crash", "crash2"} {
		last[k] = c.acquire("o", k, int(lease/time.Millisecond), 0)
		maxTok = max(maxTok, last[k])
	}
	leaseEnd := leaseStart.Add(lease) // no lease granted before the crash ends later than this

	s1.kill()
	s2 := startServerDir(t, dir)
	restarted := time.Since(leaseStart)
	if restarted > lease-200*time.Millisecond {
		t.Logf("restart took %v; little of the grace period is left to observe", restarted)
	}

	// A queued acquire in the grace period waits as for a held key and is granted after it.
	q := s2.dial(t)
	q.send(acq("q", "crash2", 60000, 30000))

	p := s2.dial(t)
	// The lower bound is the protocol's. The upper one leaves room for a
	// durable lease ceiling kept in steps of up to 10s past the latest deadline.
	const extraGrace = 12 * time.Second
	limit := leaseEnd.Add(extraGrace)
	var grantedAt time.Time
	sawT := 0
	for grantedAt.IsZero() {
		if time.Now().After(limit) {
			t.Fatalf("no grant within %v after the pre-crash lease ended", extraGrace)
		}
		asked := time.Now()
		p.send(acq("p", "crash", 60000, 0), acq("p", "never", 60000, 0))
		a1, a2 := p.next(), p.next()
		t1, ok1 := parseAcquired(a1, "p", "crash")
		_, ok2 := parseAcquired(a2, "p", "never")
		if !ok1 && a1 != timedOut("p", "crash") {
			t.Fatalf("want A or T for crash, got %q", a1)
		}
		if !ok2 && a2 != timedOut("p", "never") {
			t.Fatalf("want A or T for never, got %q", a2)
		}
		if !ok1 && !ok2 {
			sawT++
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if asked.Before(leaseEnd) {
			t.Fatalf("granted in the grace period (%v before the pre-crash lease ended): %q, %q",
				leaseEnd.Sub(asked), a1, a2)
		}
		// The grace may have ended between the two requests.
		if !ok1 {
			t1 = p.acquire("p", "crash", 60000, 0)
		}
		if !ok2 {
			p.acquire("p", "never", 60000, 0)
		}
		if t1 <= last["crash"] {
			t.Errorf("crash: token %d after the crash, not above %d from before", t1, last["crash"])
		}
		if t1 <= maxTok {
			t.Logf("crash: token %d after the crash is not above the largest token before it (%d, another key)", t1, maxTok)
		}
		grantedAt = time.Now()
	}
	t.Logf("crash restart: first grant %v after the pre-crash lease ended (%d T answers before)",
		grantedAt.Sub(leaseEnd), sawT)
	if sawT == 0 && restarted < lease-200*time.Millisecond {
		t.Errorf("no T answer in the grace period")
	}

	line, err := q.readLine(5 * time.Second)
	if err != nil {
		t.Fatalf("queued acquire in the grace period: %v", err)
	}
	if time.Now().Before(leaseEnd) {
		t.Fatalf("queued acquire answered %q before the pre-crash lease ended", line)
	}
	tok, ok := parseAcquired(line, "q", "crash2")
	if !ok {
		t.Fatalf("queued acquire in the grace period: want A <token> q crash2, got %q", line)
	}
	if tok <= last["crash2"] {
		t.Errorf("crash2: token %d after the crash, not above %d", tok, last["crash2"])
	}
	for k, before := range last {
		if !strings.HasPrefix(k, "churn.") {
			continue
		}
		if tok := p.acquire("p", k, 60000, 0); tok <= before {
			t.Errorf("%s: token %d after the crash, not above %d from before", k, tok, before)
		}
	}
}

// TestSecondInstanceSameDataDir: a second ticketd on a data dir in use exits
// non-zero and says why; the first keeps serving.
func TestSecondInstanceSameDataDir(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	c := s.dial(t)
	tok := c.acquire("o", "k", 60000, 0)
	code, out, listening := runOnce(t, 15*time.Second, serverproc.TicketdArgs("", s.dataDir)...)
	if listening {
		t.Fatalf("second ticketd started on a data dir in use; output:\n%s", out)
	}
	if code == 0 {
		t.Errorf("second ticketd exited 0, want non-zero; output:\n%s", out)
	}
	lower := strings.ToLower(out)
	if !strings.Contains(out, s.dataDir) && !strings.Contains(lower, "data dir") &&
		!strings.Contains(lower, "data-dir") && !strings.Contains(lower, "data_dir") {
		t.Errorf("second ticketd's message does not mention the data dir:\n%s", out)
	}
	t.Logf("second instance: exit %d: %s", code, strings.TrimSpace(out))
	c.send(acq("x", "k", 60000, 0), rel(tok, "k"))
	c.expect(timedOut("x", "k"), released(tok, "k"))
}

// TestInvalidFlags: impossible flag values stop the start with a message naming the flag.
func TestInvalidFlags(t *testing.T) {
	t.Parallel()
	cases := []struct{ flag, value string }{
		{"shards", "0"},
		{"shards", "-1"},
		{"shards", "many"},
		{"max-lease", "-1s"},
		{"max-lease", "0s"},
		{"max-lease", "forever"},
		{"max-wait", "-1s"},
		{"max-wait", "0"},
		{"max-wait", "500us"},
		{"max-lease", "1500us"},
		{"max-lease", "2562047h"},
		{"shutdown-timeout", "0s"},
		{"sweep-interval", "bogus"},
		{"sweep-interval", "-1s"},
		{"max-conns", "-1"},
		{"max-keys", "-1"},
		{"max-waiters", "-1"},
		{"max-waiters-per-key", "-1"},
		{"log-format", "xml"},
		{"log-level", "loud"},
	}
	for _, tc := range cases {
		t.Run(tc.flag+"="+tc.value, func(t *testing.T) {
			t.Parallel()
			code, out, listening := runOnce(t, 15*time.Second,
				"--listen", "127.0.0.1:0", "--data-dir", t.TempDir(), "--"+tc.flag, tc.value)
			if listening {
				t.Fatalf("started with --%s %s; output:\n%s", tc.flag, tc.value, out)
			}
			if code == 0 {
				t.Errorf("exit code 0, want non-zero; output:\n%s", out)
			}
			if !strings.Contains(out, tc.flag) {
				t.Errorf("message does not name the flag %q:\n%s", tc.flag, out)
			}
		})
	}
	t.Run("unknown flag", func(t *testing.T) {
		t.Parallel()
		code, out, listening := runOnce(t, 15*time.Second,
			"--listen", "127.0.0.1:0", "--data-dir", t.TempDir(), "--no-such-flag", "1")
		if listening || code == 0 {
			t.Errorf("unknown flag accepted (exit %d); output:\n%s", code, out)
		}
	})
}

// TestVersion: --version prints something and exits 0 without serving.
func TestVersion(t *testing.T) {
	t.Parallel()
	code, out, listening := runOnce(t, 15*time.Second, "--version")
	if listening || code != 0 || strings.TrimSpace(out) == "" {
		t.Errorf("--version: exit %d, listening %v, output %q", code, listening, out)
	}
}

// TestSIGINT: SIGINT is a clean shutdown too.
func TestSIGINT(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	c := s.dial(t)
	c.acquire("o", "k", 60000, 0)
	if err := s.p.Cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatalf("SIGINT: %v", err)
	}
	select {
	case <-s.p.Done():
	case <-time.After(stopTimeout):
		t.Fatalf("no exit within %v of SIGINT", stopTimeout)
	}
	if code := s.exitCode(); code != 0 {
		t.Errorf("exit code %d after SIGINT, want 0", code)
	}
	c.expectClosed()
}

// A clean shutdown reaches a client that reads slowly: every answer the
// server owed it, the T of its queued acquire last, then the end of the
// stream. Closed at once, gnet dropped what it had not written yet, and
// the input the server had not read (the connection paused for its unsent
// output) made the kernel reset the connection: the client lost all but
// its first few hundred answers, grants among them, and the T that the
// protocol promises at shutdown.
func TestShutdownReachesASlowReader(t *testing.T) {
	t.Parallel()
	s := startServer(t, "--send-buffer", "65536") // the kernel holds little of its output
	h := s.dial(t)
	h.acquire("h", "sdq", 600000, 0)
	// A small receive buffer, set before the handshake (set after it, the
	// window it advertised shrinks, and the rest crawls in probes).
	dialer := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) {
			_ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		})
	}}
	d, err := dialer.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	const n = 60000 // over 1 MiB of answers: the server stops reading it
	var b strings.Builder
	b.WriteString("A w sdq 600000 600000\n") // queued behind h
	for i := range n {
		fmt.Fprintf(&b, "A slow sd%d 600000 0\n", i)
	}
	go func() { _, _ = d.Write([]byte(b.String())) }()
	time.Sleep(1500 * time.Millisecond) // not reading meanwhile
	stopped := make(chan bool, 1)
	go func() { stopped <- s.stop() }()
	time.Sleep(500 * time.Millisecond)
	_ = d.SetReadDeadline(time.Now().Add(20 * time.Second))
	all, err := io.ReadAll(d)
	d.Close()
	lines := strings.Split(strings.TrimSuffix(string(all), "\n"), "\n")
	if err != nil || len(lines) == 0 || lines[len(lines)-1] != "T w sdq" {
		last := ""
		if len(lines) > 0 {
			last = lines[len(lines)-1]
		}
		t.Fatalf("after %d lines (the last %q): %v; want the answers owed, T w sdq and the end of the stream", len(lines), last, err)
	}
	for i, l := range lines[:len(lines)-1] {
		if f := strings.Fields(l); len(f) != 4 || f[0] != "A" || f[3] != fmt.Sprintf("sd%d", i) {
			t.Fatalf("line %d: %q, want the grant of sd%d", i, l, i)
		}
	}
	if !<-stopped {
		t.Error("the server did not stop cleanly")
	}
}
