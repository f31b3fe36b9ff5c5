//go:build linux && !poll_opt

package netloop

import (
	"bytes"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketd/ticketd/codec"
)

// hookBackend parks acquires of "later", runs hook (on the loop) before it
// grants one of "hook", and grants the others at once; Queued reports
// queued while the connection is open.
type hookBackend struct {
	fakeBackend
	hook   atomic.Pointer[func()]
	queued atomic.Int64
	gone   atomic.Bool
}

func (b *hookBackend) Handle(c *Conn, reqs []codec.Request, out []byte) ([]byte, int, bool) {
	n := 0
	for i := range reqs {
		q := &reqs[i]
		b.handled.Add(1)
		switch string(q.Key) {
		case "later":
			b.mu.Lock()
			b.parked = append(b.parked, c)
			b.mu.Unlock()
			continue
		case "hook":
			if h := b.hook.Load(); h != nil {
				(*h)()
			}
		}
		out = codec.AppendAcquired(out, 1, q.Owner, q.Key)
		n++
	}
	return out, n, false
}

func (b *hookBackend) Closed(*Conn)          { b.gone.Store(true); b.closed.Add(1) }
func (*hookBackend) Orphaned(uint64, []byte) {}
func (b *hookBackend) Queued(*Conn) int {
	if b.gone.Load() {
		return 0
	}
	return int(b.queued.Load())
}

// A write that fails inside OnTraffic closes the connection under it
// (gnet runs OnClose within the write); OnTraffic must not go on to park
// the closed connection, which would stay in the parked set, woken every
// 10 ms, for ever.
func TestConnClosedByAFailedWriteIsNotParked(t *testing.T) {
	b := &hookBackend{}
	b.queued.Store(100)
	s, addr := startServer(t, Config{Backend: b, MaxInflight: 1, Loops: 1})
	c, _ := dial(t, addr)
	hook := func() {
		_ = c.(*net.TCPConn).SetLinger(0)
		_ = c.Close() // a reset, while the loop carries out the request
		time.Sleep(100 * time.Millisecond)
	}
	b.hook.Store(&hook)
	_, _ = c.Write([]byte("A w later 1000 5000\nA w2 later 1000 5000\nA o hook 1000 0\n"))
	waitFor(t, func() bool { return b.closed.Load() == 1 })
	time.Sleep(100 * time.Millisecond)
	s.parked.mu.Lock()
	n := len(s.parked.m)
	s.parked.mu.Unlock()
	if n != 0 || s.conns.Load() != 0 {
		t.Fatalf("%d connections parked, %d open after the only one closed", n, s.conns.Load())
	}
}

// Fail's E line is the last thing written: what the client sent after it
// is neither carried out nor answered, even when the loop was busy as Fail
// was called.
func TestNothingCarriedOutAfterFailLine(t *testing.T) {
	b := &hookBackend{}
	_, addr := startServer(t, Config{Backend: b, Loops: 1})
	a, ra := dial(t, addr)
	other, _ := dial(t, addr)
	_, _ = a.Write([]byte("A w later 1000 5000\n"))
	waitFor(t, func() bool { b.mu.Lock(); defer b.mu.Unlock(); return len(b.parked) == 1 })
	parked := b.parked[0]
	release := make(chan struct{})
	var once sync.Once
	hook := func() { once.Do(func() { <-release }) } // holds the one loop
	b.hook.Store(&hook)
	_, _ = other.Write([]byte("A o hook 1000 0\n"))
	time.Sleep(50 * time.Millisecond)
	parked.Fail([]byte("E unavailable gone\n"))
	_, _ = a.Write([]byte("A o k 1000 0\n"))
	time.Sleep(50 * time.Millisecond)
	handled := b.handled.Load()
	close(release)
	var got []string
	for {
		l, err := ra.ReadString('\n')
		if err != nil {
			break
		}
		got = append(got, strings.TrimSpace(l))
	}
	if len(got) != 1 || got[0] != "E unavailable gone" {
		t.Fatalf("the client read %q, want the E line alone", got)
	}
	time.Sleep(50 * time.Millisecond)
	if n := b.handled.Load(); n != handled {
		t.Fatalf("%d requests carried out after the E line", n-handled)
	}
}

// Late answers (to acquires queued for their key, which MaxInflight does
// not count) are written past MaxOutbound; a client that does not read them
// is closed once hardOutbound times that is unsent.
func TestUnreadLateAnswersCloseTheConnection(t *testing.T) {
	b := &hookBackend{}
	const n = 20000
	b.queued.Store(1 << 30)
	s, addr := startServer(t, Config{Backend: b, MaxInflight: 16, MaxOutbound: 16 << 10, SendBuffer: 4 << 10, Loops: 1})
	c := dialSmallReceive(t, addr)
	var req bytes.Buffer
	for i := range n {
		fmt.Fprintf(&req, "A owner-%06d later 1000 5000\n", i)
	}
	go func() { _, _ = c.Write(req.Bytes()) }()
	waitFor(t, func() bool { return b.handled.Load() == n })
	b.mu.Lock()
	ps := append([]*Conn(nil), b.parked...)
	b.mu.Unlock()
	for i, pc := range ps { // their waits end, a round at a time
		pc.Post(fmt.Appendf(nil, "T owner-%06d later\n", i), 1)
		if i%1000 == 999 {
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFor(t, func() bool { return s.Stats().UnreadClosed == 1 && s.conns.Load() == 0 })
}
