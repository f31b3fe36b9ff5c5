package netloop

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// expectClosed reads from r until the server closes the connection and
// returns when that was seen. Anything but EOF (or a reset) within 10s fails.
func expectClosed(t *testing.T, c net.Conn, r *bufio.Reader) time.Time {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	rest, err := io.ReadAll(r)
	at := time.Now()
	if err != nil && !errors.Is(err, net.ErrClosed) && !isReset(err) {
		t.Fatalf("waiting for the server to close: %v (read %q)", err, rest)
	}
	if len(rest) != 0 {
		t.Fatalf("unexpected bytes before close: %q", rest)
	}
	return at
}

func isReset(err error) bool {
	var ne *net.OpError
	return errors.As(err, &ne) && !ne.Timeout()
}

// expectOpen checks that nothing, not even a close, arrives for d.
func expectOpen(t *testing.T, c net.Conn, r *bufio.Reader, d time.Duration) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(d))
	b, err := r.ReadByte()
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("connection should be open and quiet: read %q, %v", b, err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
}

func TestIdleConnectionClosed(t *testing.T) {
	const idle = 200 * time.Millisecond
	b := &fakeBackend{}
	s, addr := startServer(t, Config{Backend: b, IdleTimeout: idle})

	silent, silentR := dial(t, addr) // never sends anything
	silentFrom := time.Now()

	c, r := dial(t, addr)
	from := time.Now() // before the request: no later than the server's last activity
	_, _ = c.Write([]byte("A o k 1000 0\n"))
	if got := readLine(t, r); got != "A 1 o k" {
		t.Fatalf("answer: %q", got)
	}
	if d := expectClosed(t, c, r).Sub(from); d < idle {
		t.Fatalf("closed after %v, before the idle timeout %v", d, idle)
	}
	if d := expectClosed(t, silent, silentR).Sub(silentFrom); d < idle {
		t.Fatalf("silent connection closed after %v, before the idle timeout %v", d, idle)
	}
	waitFor(t, func() bool { return b.closed.Load() == 2 && s.Stats().Conns == 0 })
	if st := s.Stats(); st.IdleClosed != 2 || st.FrameClosed != 0 {
		t.Fatalf("stats: %+v", st)
	}
}

// A queued acquire keeps its connection open however long it waits; once it
// is answered the connection can become idle.
func TestQueuedAcquireIsNotIdle(t *testing.T) {
	const idle = 100 * time.Millisecond
	b := &fakeBackend{}
	s, addr := startServer(t, Config{Backend: b, IdleTimeout: idle})
	c, r := dial(t, addr)
	_, _ = c.Write([]byte("A w later 1000 60000\n"))
	waitFor(t, func() bool { b.mu.Lock(); defer b.mu.Unlock(); return len(b.parked) == 1 })
	expectOpen(t, c, r, 10*idle)
	b.mu.Lock()
	parked := b.parked[0]
	b.mu.Unlock()
	from := time.Now()
	if !parked.PostGrant([]byte("A 9 w later\n"), 9, []byte("later")) {
		t.Fatal("connection closed while its acquire was queued")
	}
	if got := readLine(t, r); got != "A 9 w later" {
		t.Fatalf("late answer: %q", got)
	}
	if d := expectClosed(t, c, r).Sub(from); d < idle {
		t.Fatalf("closed %v after the answer, before the idle timeout %v", d, idle)
	}
	if st := s.Stats(); st.IdleClosed != 1 {
		t.Fatalf("stats: %+v", st)
	}
}

// A frame that never ends is closed after FrameTimeout even though bytes of
// it keep arriving; answers to earlier requests are written first.
func TestTricklingFrameClosed(t *testing.T) {
	const frame = 300 * time.Millisecond
	b := &fakeBackend{}
	s, addr := startServer(t, Config{Backend: b, FrameTimeout: frame})
	c, r := dial(t, addr)
	from := time.Now()
	_, _ = c.Write([]byte("A o k 1000 0\nA trickling-owner-"))
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			if _, err := c.Write([]byte("x")); err != nil {
				return
			}
		}
	}()
	defer func() { close(stop); <-done }()
	if got := readLine(t, r); got != "A 1 o k" {
		t.Fatalf("answer: %q", got)
	}
	if d := expectClosed(t, c, r).Sub(from); d < frame {
		t.Fatalf("closed after %v, before the frame timeout %v", d, frame)
	}
	if st := s.Stats(); st.FrameClosed != 1 || st.IdleClosed != 0 {
		t.Fatalf("stats: %+v", st)
	}
}

// A connection that keeps sending complete frames stays open with both
// timeouts set, also when each frame arrives in two parts.
func TestActiveConnectionStaysOpen(t *testing.T) {
	// Gaps far below the timeouts, for a span of three of them.
	const timeout, gap = time.Second, 10 * time.Millisecond
	b := &fakeBackend{}
	s, addr := startServer(t, Config{Backend: b, IdleTimeout: timeout, FrameTimeout: timeout})
	c, r := dial(t, addr)
	end := time.Now().Add(3 * timeout)
	for time.Now().Before(end) {
		if _, err := c.Write([]byte("A o k 1000")); err != nil {
			t.Fatal(err)
		}
		time.Sleep(gap)
		if _, err := c.Write([]byte(" 0\n")); err != nil {
			t.Fatal(err)
		}
		if got := readLine(t, r); got != "A 1 o k" {
			t.Fatalf("answer: %q", got)
		}
		time.Sleep(gap)
	}
	if st := s.Stats(); st.IdleClosed != 0 || st.FrameClosed != 0 || st.Conns != 1 {
		t.Fatalf("stats: %+v", st)
	}
}

func TestNegativeTimeoutRefused(t *testing.T) {
	for _, cfg := range []Config{
		{Backend: &fakeBackend{}, MaxConns: 1, IdleTimeout: -1},
		{Backend: &fakeBackend{}, MaxConns: 1, FrameTimeout: -time.Second},
	} {
		if _, err := New(cfg); err == nil {
			t.Fatalf("New(%+v) accepted a negative timeout", cfg)
		}
	}
}

// Keeping the timeout stamps costs no allocation per request, also when
// frames arrive split across reads.
func TestTimeoutsDoNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	_, addr := startServer(t, Config{Backend: &fakeBackend{}, IdleTimeout: time.Minute, FrameTimeout: time.Minute, Loops: 1})
	c, r := dial(t, addr)
	_ = c.SetDeadline(time.Time{})
	const perRound = 64
	var batch []byte
	for i := 0; i < perRound; i++ {
		batch = append(batch, "A o k 1000 0\n"...)
	}
	half := len(batch) - 5 // the last frame arrives in two parts
	round := func() {
		_, _ = c.Write(batch[:half])
		time.Sleep(50 * time.Microsecond)
		_, _ = c.Write(batch[half:])
		for i := 0; i < perRound; i++ {
			if _, err := r.ReadSlice('\n'); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := 0; i < 100; i++ {
		round()
	}
	const rounds = 1000
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := 0; i < rounds; i++ {
		round()
	}
	runtime.ReadMemStats(&after)
	perReq := float64(after.Mallocs-before.Mallocs) / (rounds * perRound)
	t.Logf("%.4f allocations per request", perReq)
	if perReq > 0.01 {
		t.Fatalf("%.4f allocations per request, want 0", perReq)
	}
}

// The timeout sweep walks every connection from its own goroutine; with one
// P it must let the event loop run while it walks a large registry, not
// hold the P for the whole walk (milliseconds at tens of thousands of
// connections), and must not yield while it walks a small one: with the
// loop locked to its thread, each yield costs the loop two hand-offs of the
// P between threads.
func TestRegistryWalkYieldsToOtherGoroutines(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	for _, tc := range []struct {
		conns  int
		yields bool
	}{{50, false}, {3 * eachYield, true}} {
		var r registry
		r.init()
		for id := range uint64(tc.conns) {
			r.put(&Conn{id: id})
		}
		var ran atomic.Bool
		ready, done := make(chan struct{}), make(chan struct{})
		go func() {
			<-ready
			ran.Store(true)
			close(done)
		}()
		close(ready) // runnable, but the P is ours until we yield
		walked, sawRun := 0, false
		r.each(func(*Conn) {
			walked++
			if walked == tc.conns {
				sawRun = ran.Load()
			}
		})
		<-done
		if walked != tc.conns {
			t.Fatalf("walked %d connections, want %d", walked, tc.conns)
		}
		if sawRun != tc.yields {
			t.Errorf("%d connections: a runnable goroutine ran during the walk: %v, want %v", tc.conns, sawRun, tc.yields)
		}
	}
}

// A frame-timeout close writes the answers already decided before it (the
// Config's promise), as a bad frame's close does: a client that pipelined
// acquires, left its last frame unfinished and read nothing meanwhile gets
// every grant, instead of as many as gnet writes at once before its close.
func TestFrameTimeoutWritesTheAnswersDecided(t *testing.T) {
	_, addr := startServer(t, Config{Backend: &fakeBackend{}, FrameTimeout: 300 * time.Millisecond, SendBuffer: 4 << 10, Loops: 1})
	c := dialSmallReceive(t, addr)
	const n = 3000
	var req bytes.Buffer
	for i := range n {
		fmt.Fprintf(&req, "A owner-%05d key-%05d 1000 0\n", i, i)
	}
	req.WriteString("A partial") // a frame left unfinished
	if _, err := c.Write(req.Bytes()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // the frame timeout passes while the client reads nothing
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(c)
	got := 0
	for {
		if _, err := r.ReadString('\n'); err != nil {
			break
		}
		got++
	}
	if got != n {
		t.Fatalf("the client read %d of the %d answers decided before the frame timeout closed it", got, n)
	}
}

// dialSmallReceive dials addr with a 4 KiB receive buffer, so that a client
// that does not read backs the server up within a few answers.
func dialSmallReceive(t *testing.T, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { _ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<10) })
	}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}
