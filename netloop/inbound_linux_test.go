//go:build linux && !poll_opt

package netloop

import (
	"bufio"
	"bytes"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/panjf2000/gnet/v2"

	"github.com/ticketd/ticketd/codec"
)

// lateBackend answers nothing at once: every request waits in
// pending for the test to answer it through Post, as cluster mode answers
// once a request commits.
type lateBackend struct {
	handled atomic.Int64
	mu      sync.Mutex
	pending []*Conn
}

func (b *lateBackend) Handle(c *Conn, reqs []codec.Request, out []byte) ([]byte, int, bool) {
	b.handled.Add(int64(len(reqs)))
	b.mu.Lock()
	for range reqs {
		b.pending = append(b.pending, c)
	}
	b.mu.Unlock()
	return out, 0, false
}

func (*lateBackend) Closed(*Conn)            {}
func (*lateBackend) Orphaned(uint64, []byte) {}
func (*lateBackend) Queued(*Conn) int        { return 0 }

// A connection paused at MaxInflight (cluster mode: requests waiting for
// their commits) is not read, but gnet turns reading back on (its write's
// ModRead) every time the connection's unsent output drains, reads up to a
// buffer, and the parse, still at MaxInflight, takes none of it. A client
// that sends without end and reads its answers in bursts (so that the
// output backs up, then drains) grew that input by a buffer per burst for
// ever; it is closed once it holds hardInbound. Here the answers come in
// rounds of MaxInflight, as slow commits would bring them.
func TestInputOfAConnectionPausedAtMaxInflightIsBounded(t *testing.T) {
	b := &lateBackend{}
	const maxInflight = 64
	s, addr := startServer(t, Config{Backend: b, MaxInflight: maxInflight, SendBuffer: 4 << 10, Loops: 1})
	c := dialSmallReceive(t, addr)
	var sc *Conn
	waitFor(t, func() bool { s.reg.each(func(x *Conn) { sc = x }); return sc != nil })

	owner, key := strings.Repeat("o", codec.MaxOwner), strings.Repeat("k", codec.MaxKey)
	frame := []byte("A " + owner + " " + key + " 1000 0\n")
	answer := []byte("A 1 " + owner + " " + key + "\n")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer func() { close(stop); _ = c.Close(); wg.Wait() }()
	batch := bytes.Repeat(frame, 200)
	wg.Go(func() { // sends without end
		rest := batch
		for {
			select {
			case <-stop:
				return
			default:
			}
			// A write cut short by its deadline goes on where it stopped:
			// a frame cut in two would be a bad frame.
			_ = c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
			n, err := c.Write(rest)
			if rest = rest[n:]; len(rest) == 0 {
				rest = batch
			}
			if err != nil {
				if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
					return
				}
			}
		}
	})

	inbound := func() int {
		ch := make(chan int, 1)
		if err := sc.gc.Wake(func(gc gnet.Conn, _ error) error { ch <- gc.InboundBuffered(); return nil }); err != nil {
			return -1
		}
		select {
		case n := <-ch:
			return n
		case <-time.After(5 * time.Second):
			return -1
		}
	}
	bound := s.hardInbound() + 64<<10 // and one read of gnet's
	heap0 := memStatsNow()
	r := bufio.NewReader(c)
	deadline := time.Now().Add(30 * time.Second)
	for round := 1; ; round++ {
		if time.Now().After(deadline) {
			t.Fatalf("still open after %d rounds: the client was not stopped", round)
		}
		// The round's requests are handed over and wait for their commits.
		var ps []*Conn
		for len(ps) < maxInflight && time.Now().Before(deadline) {
			b.mu.Lock()
			ps, b.pending = append(ps, b.pending...), nil
			b.mu.Unlock()
			time.Sleep(time.Millisecond)
		}
		for _, pc := range ps { // they commit
			pc.Post(answer, 1)
		}
		// The client reads the round's answers: the output drains.
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		closed := false
		for range len(ps) {
			if _, err := r.ReadSlice('\n'); err != nil {
				closed = true
				break
			}
		}
		if closed {
			if n := s.Stats().FloodClosed; n != 1 {
				t.Fatalf("the connection ended after %d rounds, and %d were closed for flooding, want 1", round, n)
			}
			t.Logf("closed after %d rounds; heap in use from %d to %d bytes", round, heap0, memStatsNow())
			return
		}
		if n := inbound(); n > bound {
			t.Fatalf("a connection paused at MaxInflight=%d holds %d bytes of unparsed input after %d rounds of answers (bound %d); heap in use from %d to %d bytes",
				maxInflight, n, round, bound, heap0, memStatsNow())
		}
	}
}

func memStatsNow() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}
