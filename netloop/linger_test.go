package netloop

import (
	"bufio"
	"context"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketd/ticketd/codec"
)

// byeBackend answers acquires at once, but a frame for key "bye" makes
// Handle return close (as single.Runner does once closing or failed);
// "later" acquires are queued (Queued counts them).
type byeBackend struct {
	mu     sync.Mutex
	conn   *Conn
	queued atomic.Int64
	closed atomic.Int64
}

func (b *byeBackend) Handle(c *Conn, reqs []codec.Request, out []byte) ([]byte, int, bool) {
	n := 0
	for i := range reqs {
		q := &reqs[i]
		switch string(q.Key) {
		case "bye":
			b.mu.Lock()
			b.conn = c
			b.mu.Unlock()
			return out, n, true
		case "later":
			b.mu.Lock()
			b.conn = c
			b.mu.Unlock()
			b.queued.Add(1)
		default:
			out = codec.AppendAcquired(out, 1, q.Owner, q.Key)
			n++
		}
	}
	return out, n, false
}
func (b *byeBackend) Closed(*Conn)          { b.closed.Add(1) }
func (*byeBackend) Orphaned(uint64, []byte) {}
func (b *byeBackend) Queued(*Conn) int      { return int(b.queued.Load()) }

// A connection the Backend closes lingers: its mailbox is sealed when the
// linger starts (what it held goes out first), so a post after that is
// refused, and Stop's drain of the mailboxes does not wait on it for the
// whole of its deadline (Stop itself then waits for the client to close,
// as it lets every connection linger).
func TestLingeringConnectionTakesNothingAfterItsEnd(t *testing.T) {
	b := &byeBackend{}
	s, addr := startServer(t, Config{Backend: b})
	c, r := dial(t, addr)
	if _, err := c.Write([]byte("A o k 1000 0\nA o bye 1000 0\n")); err != nil {
		t.Fatal(err)
	}
	if got := readLine(t, r); got != "A 1 o k" {
		t.Fatalf("got %q", got)
	}
	if _, err := r.ReadByte(); err != io.EOF { // the write side is shut: lingering
		t.Fatalf("want EOF from the lingering connection, got %v", err)
	}
	b.mu.Lock()
	lc := b.conn
	b.mu.Unlock()
	if lc.Post([]byte("T w later\n"), 1) { // as a Quiesce's T would be
		t.Error("a post after the end of the stream was taken")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	s.drainMailboxes(ctx)
	if took := time.Since(start); took > time.Second {
		t.Fatalf("the drain took %v: it waited on the lingering connection's mailbox", took)
	}
}

// After an E line the connection's queued acquires are withdrawn at once
// (Closed), not when its client closes or the linger ends.
func TestBadFrameWithdrawsAtOnce(t *testing.T) {
	b := &byeBackend{}
	_, addr := startServer(t, Config{Backend: b})
	c, r := dial(t, addr)
	if _, err := c.Write([]byte("A o later 1000 60000\nA o k 1000 0\nX\n")); err != nil {
		t.Fatal(err)
	}
	if got := readLine(t, r); got != "A 1 o k" {
		t.Fatalf("got %q", got)
	}
	if got := readLine(t, r); len(got) == 0 || got[0] != 'E' {
		t.Fatalf("got %q, want E", got)
	}
	if _, err := r.ReadByte(); err != io.EOF {
		t.Fatalf("want EOF, got %v", err)
	}
	// The client keeps its side open: the linger lasts lingerFor.
	for deadline := time.Now().Add(time.Second); b.closed.Load() == 0; {
		if time.Now().After(deadline) {
			t.Fatal("1 s after its E line, the connection's queued acquire is not withdrawn (Closed not called)")
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.Close()
	time.Sleep(100 * time.Millisecond)
	if n := b.closed.Load(); n != 1 {
		t.Errorf("Closed called %d times, want once", n)
	}
}

// Connections that sent a bad frame, read their E line and then neither
// read nor close linger up to lingerFor with nothing left to write: the
// parked loop leaves them alone until then (a close is seen without it).
// Woken every parkedEvery for the whole linger, 3,000 of them took most of
// a loop's time (a review measured 0.2-0.8 s of CPU a second).
func TestLingeringConnectionsWithNothingToWriteAreNotWoken(t *testing.T) {
	const n = 2000
	s, addr := startServer(t, Config{Backend: &fakeBackend{}, Loops: 1, MaxConns: 2 * n})
	conns := make([]net.Conn, n)
	for i := range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		conns[i] = c
	}
	for i, c := range conns {
		if _, err := c.Write([]byte("x\n")); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if l, err := bufio.NewReader(c).ReadString('\n'); err != nil || !strings.HasPrefix(l, "E command") {
			t.Fatalf("conn %d: %q, %v", i, l, err)
		}
	}
	time.Sleep(200 * time.Millisecond) // the last E lines are written and the write sides shut
	w0 := s.parkedWakes.Load()
	time.Sleep(time.Second)
	if w := s.parkedWakes.Load() - w0; w > n/10 {
		t.Errorf("the parked loop woke %d lingering connections with nothing to write in a second (%d of them)", w, n)
	}
}
