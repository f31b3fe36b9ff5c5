package e2e

import (
	"bufio"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestWaiterWithdrawnOnClose: a queued acquire whose connection closes leaves
// the queue and is never granted. Were it left queued, the release would hand
// the key to it, that grant would find its connection closed and be released
// as an orphan, and the key would end up free all the same: only the token
// tells the two apart. Nothing else is granted for this key and a key's
// tokens count up by one per grant, so the next grant must carry exactly the
// holder's token + 1.
func TestWaiterWithdrawnOnClose(t *testing.T) {
	t.Parallel()
	s := startServer(t, "--admin", "127.0.0.1:0")
	h := s.dial(t)
	tok := h.acquire("h", "wd", 60000, 0)
	w := s.dial(t)
	w.send(acq("w", "wd", 60000, 30000))
	w.sync("wd")
	if v, err := s.metric("ticketd_waiters"); err != nil || v != 1 {
		t.Fatalf("ticketd_waiters = %v (error %v) with one acquire queued, want 1", v, err)
	}
	w.close()
	// The server learns of the close asynchronously; the waiter count says
	// when it has withdrawn the acquire. (Not fatal: the token check below
	// must see what a waiter left queued does.)
	if v, ok := s.awaitMetric("ticketd_waiters", 0, readTimeout); !ok {
		t.Errorf("ticketd_waiters = %v %v after the waiter's connection closed, want 0: not withdrawn", v, readTimeout)
	}
	h.release(tok, "wd")
	// Handed to nobody: the key is free, and no token went to the withdrawn
	// waiter. x may wait, so that a grant to the waiter that is released as
	// an orphan only later shows as the token gap, not as a T.
	x := s.dial(t)
	x.send(acq("x", "wd", 60000, 3000))
	if got := x.expectAcquired("x", "wd"); got != tok+1 {
		t.Fatalf("the grant after the holder's token %d has token %d, want %d: token(s) in between went to the closed waiter",
			tok, got, tok+1)
	}
}

// TestHolderCloseKeepsKey: a held key outlives its holder's connection; the token releases it.
func TestHolderCloseKeepsKey(t *testing.T) {
	t.Parallel()
	s := startServer(t, "--admin", "127.0.0.1:0")
	h := s.dial(t)
	tok := h.acquire("h", "keep", 60000, 0)
	h.close()
	// Not a guess at how long the server takes to see the close: the
	// connection count drops when it handles the close, right before it
	// tells the lock table.
	if v, ok := s.awaitMetric("ticketd_connections", 0, readTimeout); !ok {
		t.Fatalf("ticketd_connections = %v %v after the only connection closed, want 0", v, readTimeout)
	}
	x := s.dial(t)
	x.send(acq("x", "keep", 60000, 0))
	x.expect(timedOut("x", "keep"))
	// A waiter on another connection, granted by the release from a third one.
	w := s.dial(t)
	w.send(acq("w", "keep", 60000, 10000))
	w.sync("keep")
	x.release(tok, "keep")
	tok2 := w.expectAcquired("w", "keep")
	if tok2 <= tok {
		t.Fatalf("token %d not above %d", tok2, tok)
	}
}

// TestManyConnections: 2,000 connections open at once, each acquiring (with
// contention: 20 per key, queued) and releasing; every request is answered.
func TestManyConnections(t *testing.T) {
	s := startServer(t) // the default --max-conns fits 2,000
	const n, perKey = 2000, 20
	conns := make([]net.Conn, n)
	var dialErr atomic.Value
	var wg sync.WaitGroup
	sem := make(chan struct{}, 100)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c, err := net.DialTimeout("tcp", s.addr, 10*time.Second)
			if err != nil {
				dialErr.Store(err)
				return
			}
			conns[i] = c
		}()
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	})
	if err := dialErr.Load(); err != nil {
		t.Fatalf("dial: %v", err)
	}
	start := time.Now()
	deadline := start.Add(60 * time.Second)
	errs := make(chan error, n)
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- oneClient(c, deadline, fmt.Sprintf("c.%d", i), fmt.Sprintf("k.%d", i%(n/perKey)))
		}()
	}
	wg.Wait()
	close(errs)
	failed := 0
	for err := range errs {
		if err != nil {
			if failed < 10 {
				t.Error(err)
			}
			failed++
		}
	}
	if failed > 0 {
		t.Fatalf("%d of %d connections failed", failed, n)
	}
	t.Logf("%d connections served in %v", n, time.Since(start))
}

// oneClient acquires key (queueing behind the others) and releases it.
func oneClient(c net.Conn, deadline time.Time, owner, key string) error {
	_ = c.SetDeadline(deadline)
	r := bufio.NewReader(c)
	if _, err := fmt.Fprintf(c, "A %s %s 60000 50000\n", owner, key); err != nil {
		return fmt.Errorf("%s: write: %w", owner, err)
	}
	line, err := r.ReadString('\n')
	if err != nil {
		return fmt.Errorf("%s: read acquire answer: %w", owner, err)
	}
	tok, ok := parseAcquired(strings.TrimSuffix(line, "\n"), owner, key)
	if !ok {
		return fmt.Errorf("%s: want A <token> %s %s, got %q", owner, owner, key, line)
	}
	if _, err := fmt.Fprintf(c, "R %d %s\n", tok, key); err != nil {
		return fmt.Errorf("%s: write: %w", owner, err)
	}
	line, err = r.ReadString('\n')
	if err != nil {
		return fmt.Errorf("%s: read release answer: %w", owner, err)
	}
	if want := released(tok, key) + "\n"; line != want {
		return fmt.Errorf("%s: want %q, got %q", owner, want, line)
	}
	return nil
}

// TestFloodWithoutReading: a client that writes without reading is slowed by
// backpressure; the server's memory stays bounded and others are served.
func TestFloodWithoutReading(t *testing.T) {
	s := startServer(t)
	h := s.dial(t)
	tok := h.acquire("h", "flood", 60000, 0)
	probe := s.dial(t)
	probe.acquire("p", "warm", 1000, 0)
	time.Sleep(100 * time.Millisecond)
	base, err := s.rssKiB()
	if err != nil {
		t.Fatalf("read RSS: %v", err)
	}

	// Neither frame changes state: the key is held (T) and the token is wrong (N).
	unit := fmt.Sprintf("A f flood 60000 0\nR %d flood\n", tok+1000)
	block := []byte(strings.Repeat(unit, 64<<10/len(unit)))
	fc, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer fc.Close()
	var written atomic.Int64
	blocked := make(chan struct{})
	stop := make(chan struct{})
	writerDone := make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				writerDone <- nil
				return
			default:
			}
			_ = fc.SetWriteDeadline(time.Now().Add(time.Second))
			n, err := fc.Write(block)
			written.Add(int64(n))
			if err != nil {
				if isTimeout(err) {
					close(blocked) // a whole second without room: the server stopped reading
					writerDone <- nil
				} else {
					writerDone <- err
				}
				return
			}
		}
	}()

	var maxRSS int64
	var maxRTT time.Duration
	sample := func() {
		if rss, err := s.rssKiB(); err == nil && rss > maxRSS {
			maxRSS = rss
		}
		start := time.Now()
		probe.send(rel(maxToken, "warm"))
		probe.expect(notRel(maxToken, "warm"))
		if d := time.Since(start); d > maxRTT {
			maxRTT = d
		}
	}
	timeout := time.After(10 * time.Second)
	isBlocked := false
loop:
	for {
		select {
		case <-blocked:
			isBlocked = true
			break loop
		case <-timeout:
			break loop
		case <-time.After(50 * time.Millisecond):
			sample()
		}
	}
	close(stop)
	if isBlocked {
		// Stay blocked a little longer: memory must not creep up meanwhile.
		for range 10 {
			time.Sleep(50 * time.Millisecond)
			sample()
		}
	}
	if err := <-writerDone; err != nil {
		t.Errorf("flood writer: %v", err)
	}
	t.Logf("flooded %d MiB; RSS %d MiB at start, %d MiB at most; probe round trip at most %v",
		written.Load()>>20, base>>10, maxRSS>>10, maxRTT)
	if !isBlocked {
		t.Errorf("writer never blocked after %d MiB in 10s: no backpressure", written.Load()>>20)
	}
	if grew := maxRSS - base; grew > 64<<10 {
		t.Errorf("RSS grew by %d MiB during the flood, want under 64 MiB", grew>>10)
	}
	if maxRTT > time.Second {
		t.Errorf("another connection waited %v for an answer during the flood", maxRTT)
	}
	fc.Close()
	time.Sleep(100 * time.Millisecond)
	if s.exited() {
		t.Fatalf("server exited")
	}
	h.release(tok, "flood")
}

// TestMaxConns: past --max-conns a connection is refused or closed; the
// others keep working, and room comes back when some close.
func TestMaxConns(t *testing.T) {
	s := startServer(t, "--max-conns", "50")
	var first []*conn
	for i := range 50 {
		c := s.dial(t)
		c.acquire(fmt.Sprintf("o%d", i), fmt.Sprintf("k%d", i), 60000, 0)
		first = append(first, c)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 50)
	for i := 50; i < 100; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- overLimit(s.addr, i)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if s.exited() {
		t.Fatal("server exited")
	}
	for i, c := range first {
		key := fmt.Sprintf("k%d", i)
		c.sync(key)
	}
	// Closing ten makes room for ten again.
	for _, c := range first[:10] {
		c.close()
	}
	deadline := time.Now().Add(3 * time.Second)
	for i := range 10 {
		for {
			c, err := net.DialTimeout("tcp", s.addr, time.Second)
			if err == nil {
				r := bufio.NewReader(c)
				_ = c.SetDeadline(time.Now().Add(time.Second))
				fmt.Fprintf(c, "A n%d new%d 1000 0\n", i, i)
				line, err := r.ReadString('\n')
				if err == nil {
					if _, ok := parseAcquired(strings.TrimSuffix(line, "\n"), fmt.Sprintf("n%d", i), fmt.Sprintf("new%d", i)); !ok {
						t.Fatalf("new connection %d: got %q", i, line)
					}
					t.Cleanup(func() { c.Close() })
					break
				}
				c.Close()
			}
			if time.Now().After(deadline) {
				t.Fatalf("no room for connection %d within 3s after 10 closed", i)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// overLimit requires connection i to be refused, or closed without being served.
func overLimit(addr string, i int) error {
	c, err := net.DialTimeout("tcp", addr, 3*time.Second)
	if err != nil {
		return nil // refused
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	_, _ = fmt.Fprintf(c, "A x%d over%d 1000 0\n", i, i)
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			if isTimeout(err) {
				return fmt.Errorf("connection %d over --max-conns 50 was neither refused nor closed within 3s", i+1)
			}
			return nil // closed
		}
		if !strings.HasPrefix(line, "E ") {
			return fmt.Errorf("connection %d over --max-conns 50 was served: %q", i+1, line)
		}
	}
}

// A flood of connections past the process's descriptor limit must not stop
// the server (gnet's own acceptor would stop the whole engine on EMFILE):
// the excess is refused and the connections it has keep being served.
func TestConnectionFloodPastDescriptorLimit(t *testing.T) {
	if _, err := exec.LookPath("prlimit"); err != nil {
		t.Skip("prlimit (util-linux) not installed")
	}
	const limit = 400 // --max-conns defaults to limit - 288 = 112
	s, err := launchWrapped(t, []string{"prlimit", fmt.Sprintf("--nofile=%d:%d", limit, limit)}, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	keeper := s.dial(t)
	tok := keeper.acquire("keeper", "kept", 60000, 0)

	var mu sync.Mutex
	var flood []net.Conn
	defer func() {
		for _, c := range flood {
			c.Close()
		}
	}()
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 100; i++ {
				c, err := net.DialTimeout("tcp", s.addr, 2*time.Second)
				if err != nil {
					continue
				}
				mu.Lock()
				flood = append(flood, c)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if s.exited() {
		t.Fatalf("server exited under a connection flood of %d", len(flood))
	}
	// The connection it had is still served, and a new one gets in once the
	// flood is gone.
	keeper.release(tok, "kept")
	mu.Lock()
	for _, c := range flood {
		c.Close()
	}
	flood = nil
	mu.Unlock()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", s.addr, time.Second)
		if err == nil {
			_ = c.SetDeadline(time.Now().Add(time.Second))
			fmt.Fprintf(c, "A after flood 1000 0\n")
			line, err := bufio.NewReader(c).ReadString('\n')
			c.Close()
			if err == nil && strings.HasPrefix(line, "A ") {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no new connection served within 5s after the flood")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
