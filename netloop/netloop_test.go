package netloop

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/panjf2000/gnet/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ticketd/ticketd/codec"
)

// fakeBackend grants every acquire at once, except for key "later", whose
// acquires it parks for the test to answer through Post.
type fakeBackend struct {
	handled atomic.Int64
	mu      sync.Mutex
	parked  []*Conn
	closed  atomic.Int64
}

func (b *fakeBackend) Handle(c *Conn, reqs []codec.Request, out []byte) ([]byte, int, bool) {
	n := 0
	for i := range reqs {
		q := &reqs[i]
		b.handled.Add(1)
		switch {
		case q.Kind == codec.Acquire && string(q.Key) == "later":
			b.mu.Lock()
			b.parked = append(b.parked, c)
			b.mu.Unlock()
		case q.Kind == codec.Acquire:
			out = codec.AppendAcquired(out, 1, q.Owner, q.Key)
			n++
		default:
			out = codec.AppendReleased(out, q.Token, q.Key)
			n++
		}
	}
	return out, n, false
}

func (b *fakeBackend) Closed(*Conn)          { b.closed.Add(1) }
func (*fakeBackend) Orphaned(uint64, []byte) {}
func (*fakeBackend) Queued(*Conn) int        { return 0 } // parked acquires are undecided

func startServer(t *testing.T, cfg Config) (*Server, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MaxConns == 0 {
		cfg.MaxConns = 1000
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Serve(ln); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Stop(t.Context()) })
	return s, ln.Addr().String()
}

func dial(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	return c, bufio.NewReader(c)
}

func readLine(t *testing.T, r *bufio.Reader) string {
	t.Helper()
	l, err := r.ReadString('\n')
	if err != nil {
		t.Fatalf("read: %v (got %q)", err, l)
	}
	return strings.TrimSuffix(l, "\n")
}

func TestPipelineAndLateAnswer(t *testing.T) {
	b := &fakeBackend{}
	s, addr := startServer(t, Config{Backend: b})
	c, r := dial(t, addr)
	var req bytes.Buffer
	req.WriteString("A w later 1000 5000\nA w2 later 1000 5000\n")
	for i := 0; i < 1000; i++ {
		fmt.Fprintf(&req, "A o%d k%d 1000 0\r\nR 7 k%d\n", i, i, i)
	}
	if _, err := c.Write(req.Bytes()); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 1000; i++ {
		if got, want := readLine(t, r), fmt.Sprintf("A 1 o%d k%d", i, i); got != want {
			t.Fatalf("answer %d: %q, want %q", i, got, want)
		}
		if got, want := readLine(t, r), fmt.Sprintf("R 7 k%d", i); got != want {
			t.Fatalf("answer %d: %q, want %q", i, got, want)
		}
	}
	b.mu.Lock()
	parked := b.parked[0]
	b.mu.Unlock()
	if s.Conn(parked.ID()) != parked {
		t.Fatal("registry does not find the connection")
	}
	go parked.Post([]byte("T w later\n"), 1)
	if got := readLine(t, r); got != "T w later" {
		t.Fatalf("late answer: %q", got)
	}
	go parked.PostGrant([]byte("A 10 w2 later\n"), 10, []byte("later"))
	if got := readLine(t, r); got != "A 10 w2 later" {
		t.Fatalf("late grant: %q", got)
	}
}

func TestBadFrameAnswersEarlierThenCloses(t *testing.T) {
	b := &fakeBackend{}
	_, addr := startServer(t, Config{Backend: b})
	c, r := dial(t, addr)
	_, _ = c.Write([]byte("A o k 1000 0\nA o k 1000 0 extra\nA o k2 1000 0\n"))
	if got := readLine(t, r); got != "A 1 o k" {
		t.Fatalf("first answer: %q", got)
	}
	if got := readLine(t, r); !strings.HasPrefix(got, "E syntax ") {
		t.Fatalf("want E syntax, got %q", got)
	}
	if rest, err := io.ReadAll(r); err != nil || len(rest) != 0 {
		t.Fatalf("after E: %q, %v; want EOF", rest, err)
	}
	if got := b.handled.Load(); got != 1 {
		t.Fatalf("backend saw %d requests, want 1: nothing after a bad line runs", got)
	}
}

func TestOneByteAtATime(t *testing.T) {
	_, addr := startServer(t, Config{Backend: &fakeBackend{}})
	c, r := dial(t, addr)
	for _, ch := range []byte("A slow key 10 0\r\n") {
		if _, err := c.Write([]byte{ch}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond)
	}
	if got := readLine(t, r); got != "A 1 slow key" {
		t.Fatalf("got %q", got)
	}
}

func TestMaxConnsRefusesAndKeepsServing(t *testing.T) {
	b := &fakeBackend{}
	core, logs := observer.New(zap.WarnLevel)
	s, addr := startServer(t, Config{Backend: b, MaxConns: 3, Logger: zap.New(core)})
	var kept []*bufio.Reader
	var conns []net.Conn
	for i := 0; i < 3; i++ {
		c, r := dial(t, addr)
		_, _ = c.Write([]byte("A o k 1 0\n"))
		if got := readLine(t, r); got != "A 1 o k" {
			t.Fatalf("conn %d: %q", i, got)
		}
		kept, conns = append(kept, r), append(conns, c)
	}
	for i := 0; i < 5; i++ {
		c, r := dial(t, addr)
		_, _ = c.Write([]byte("A o k 1 0\n"))
		if l, err := r.ReadString('\n'); err == nil {
			t.Fatalf("connection beyond MaxConns was served: %q", l)
		}
	}
	for i, c := range conns {
		_, _ = c.Write([]byte("R 1 k\n"))
		if got := readLine(t, kept[i]); got != "R 1 k" {
			t.Fatalf("conn %d after refusals: %q", i, got)
		}
	}
	if st := s.Stats(); st.Refused < 5 {
		t.Fatalf("refused %d, want 5", st.Refused)
	}
	// Said, once for the burst: a refusal is otherwise only a counter.
	if got := logs.FilterMessageSnippet("connections refused").Len(); got != 1 {
		t.Fatalf("the refusals were said %d times, want once: %v", got, logs.All())
	}
}

func TestCloseTellsBackendAndUnregisters(t *testing.T) {
	b := &fakeBackend{}
	s, addr := startServer(t, Config{Backend: b})
	c, r := dial(t, addr)
	_, _ = c.Write([]byte("A o k 1 0\n"))
	readLine(t, r)
	id := uint64(0)
	s.reg.each(func(cc *Conn) { id = cc.ID() })
	_ = c.Close()
	waitFor(t, func() bool { return b.closed.Load() == 1 })
	if s.Conn(id) != nil {
		t.Fatal("closed connection still registered")
	}
}

type orphanRecorder struct {
	fakeBackend
	got []string
}

func (o *orphanRecorder) Orphaned(tok uint64, key []byte) {
	o.got = append(o.got, fmt.Sprintf("%d %s", tok, key))
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 5s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Parsing that stops at MaxOutbound within one read must go on by itself
// once the answers are written, even if the client sends nothing more.
func TestOutputLimitWithinOneReadDoesNotStall(t *testing.T) {
	_, addr := startServer(t, Config{Backend: &fakeBackend{}, MaxOutbound: 1 << 10})
	c, r := dial(t, addr)
	var req bytes.Buffer
	const n = 1000 // more than one batch (maxBatch) in one read
	for i := 0; i < n; i++ {
		fmt.Fprintf(&req, "A o%d k%d 1000 0\n", i, i)
	}
	if _, err := c.Write(req.Bytes()); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		if got, want := readLine(t, r), fmt.Sprintf("A 1 o%d k%d", i, i); got != want {
			t.Fatalf("answer %d: %q, want %q", i, got, want)
		}
	}
}

// stubConn stands in for gnet's connection in tests of the mailbox and
// the parked loop alone; it counts the wake-ups asked of it.
type stubConn struct {
	gnet.Conn
	ctx    any
	out    int // OutboundBuffered
	wakes  atomic.Int32
	closes atomic.Int32
}

func (s *stubConn) Context() any                  { return s.ctx }
func (s *stubConn) Wake(gnet.AsyncCallback) error { s.wakes.Add(1); return nil }
func (s *stubConn) Close() error                  { s.closes.Add(1); return nil }
func (s *stubConn) OutboundBuffered() int         { return s.out }
func (s *stubConn) Fd() int                       { return -1 }

func newStubConn(t *testing.T, b Backend) (*handler, *Conn, *stubConn) {
	t.Helper()
	s, err := New(Config{Backend: b, MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	c := &Conn{id: 1, s: s, epfd: -1}
	gc := &stubConn{ctx: c}
	c.gc = gc
	s.conns.Add(1)
	return &handler{s: s}, c, gc
}

// Grants posted and never written are released once each when the
// connection closes; other answers are dropped. Nothing is parsed back.
func TestUndeliveredGrantsReleasedOnClose(t *testing.T) {
	b := &orphanRecorder{}
	h, c, gc := newStubConn(t, b)
	c.Post([]byte("T w later\n"), 1)
	c.PostGrant([]byte("A 7 w k1\n"), 7, []byte("k1"))
	c.PostGrants([]byte("A 9 v k3\nR 3 k2\n"), 2, []Grant{{Token: 9, Key: []byte("k3")}})
	c.PostGrant([]byte("A 11 x k4\n"), 11, []byte("k4"))
	c.PostGrants([]byte("A 13 y k5\n"), 1, []Grant{{Token: 13, Key: []byte("k5")}})
	h.OnClose(gc, nil)
	if want := []string{"7 k1", "9 k3", "11 k4", "13 k5"}; fmt.Sprint(b.got) != fmt.Sprint(want) {
		t.Fatalf("released %v, want %v", b.got, want)
	}
	if got := h.s.Stats().Orphans; got != 4 {
		t.Fatalf("Orphans = %d, want 4", got)
	}
	if c.PostGrant([]byte("A 15 z k6\n"), 15, []byte("k6")) || c.Post([]byte("T z k6\n"), 1) {
		t.Fatal("a closed connection took mail")
	}
}

// After Fail's E line nothing more is posted: the client reads no further,
// so a grant decided later must be refused (its poster releases it), not
// written after the E and counted as delivered.
func TestNothingPostedAfterFail(t *testing.T) {
	b := &orphanRecorder{}
	h, c, gc := newStubConn(t, b)
	c.inflight = 2
	c.PostGrant([]byte("A 7 w k1\n"), 7, []byte("k1"))
	c.Fail([]byte("E unavailable gone\n"))
	if c.PostGrant([]byte("A 9 v k3\n"), 9, []byte("k3")) || c.Post([]byte("T x k4\n"), 1) {
		t.Fatal("a failed connection took mail after its E line")
	}
	c.Fail([]byte("E unavailable again\n"))
	if n := gc.closes.Load(); n != 0 {
		t.Fatalf("closed %d times, want the loop to close it once it wrote the line", n)
	}
	if out, last := c.takeMail(nil); string(out) != "A 7 w k1\nE unavailable gone\n" || !last {
		t.Fatalf("took %q (last %v), want the grant posted before the failure, then one E line, last", out, last)
	}
	h.OnClose(gc, nil)
	if len(b.got) != 0 {
		t.Fatalf("released %v, want nothing (the grant before the E was written)", b.got)
	}
}

// Mail that was written releases nothing when the connection closes later.
func TestDeliveredGrantsNotReleased(t *testing.T) {
	b := &orphanRecorder{}
	h, c, gc := newStubConn(t, b)
	key := []byte("k1")
	c.inflight = 2
	c.PostGrant([]byte("A 7 w k1\n"), 7, key)
	c.Post([]byte("T v k3\n"), 1)
	key[0] = 'X' // the caller may reuse its buffers at once
	if out, _ := c.takeMail(nil); string(out) != "A 7 w k1\nT v k3\n" || c.inflight != 0 {
		t.Fatalf("took %q, inflight %d", out, c.inflight)
	}
	c.PostGrant([]byte("A 11 x k4\n"), 11, []byte("k4"))
	h.OnClose(gc, nil)
	if want := []string{"11 k4"}; fmt.Sprint(b.got) != fmt.Sprint(want) {
		t.Fatalf("released %v, want %v", b.got, want)
	}
}

// Fail called twice at once (two batches of one connection given up
// together) writes one E line, then the connection closes.
func TestFailWritesOneLine(t *testing.T) {
	b := &fakeBackend{}
	_, addr := startServer(t, Config{Backend: b})
	c, r := dial(t, addr)
	if _, err := c.Write([]byte("A w later 1000 5000\n")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { b.mu.Lock(); defer b.mu.Unlock(); return len(b.parked) == 1 })
	parked := b.parked[0]
	line := []byte("E unavailable gone\n")
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { parked.Fail(line) })
	}
	wg.Wait()
	if got := readLine(t, r); got != "E unavailable gone" {
		t.Fatalf("got %q, want the E line", got)
	}
	if extra, err := r.ReadString('\n'); err == nil {
		t.Fatalf("got %q after the E line, want the connection closed", extra)
	}
}

// Idle connections are budgeted at 1 KiB of server memory each (the
// bench's target), and a Conn is a good part of it: past 256 bytes it
// moves to the next allocation class, 32 bytes more per connection.
func TestConnFitsItsAllocationClass(t *testing.T) {
	if n := unsafe.Sizeof(Conn{}); n > 256 {
		t.Errorf("Conn is %d bytes, over 256: each connection allocates 288", n)
	}
}

// addrBackend records, on the loop, what gnet holds of a connection's
// addresses when its first request is handled.
type addrBackend struct {
	fakeBackend
	held atomic.Pointer[string] // "" once dropped
}

func (b *addrBackend) Handle(c *Conn, reqs []codec.Request, out []byte) ([]byte, int, bool) {
	held := ""
	if a := c.gc.LocalAddr(); a != nil {
		held += " local " + a.String()
	}
	if a := c.gc.RemoteAddr(); a != nil {
		held += " remote " + a.String()
	}
	if v := reflect.ValueOf(c.gc).Elem().FieldByName("remote"); !v.IsValid() || !v.IsNil() {
		held += " socket address"
	}
	b.held.CompareAndSwap(nil, &held)
	return b.fakeBackend.Handle(c, reqs, out)
}

// What gnet keeps of a connection's addresses is dropped at its open
// (forgetAddrs): this fails, rather than the memory budget quietly, if
// gnet's layout changes.
func TestGnetsCopiesOfTheAddressesAreDropped(t *testing.T) {
	b := &addrBackend{}
	_, addr := startServer(t, Config{Backend: b})
	c, r := dial(t, addr)
	if _, err := c.Write([]byte("A o k 1000 0\n")); err != nil {
		t.Fatal(err)
	}
	readLine(t, r)
	if held := b.held.Load(); held == nil || *held != "" {
		t.Errorf("gnet still holds:%v", *held)
	}
}
