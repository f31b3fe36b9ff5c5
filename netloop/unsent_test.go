//go:build linux

package netloop

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ticketd/ticketd/codec"
)

// tokenBackend grants every acquire of key h<i> with token i+1 and records
// the grants given back as orphaned.
type tokenBackend struct {
	fakeBackend
	mu       sync.Mutex
	orphaned []uint64
}

func (b *tokenBackend) Handle(c *Conn, reqs []codec.Request, out []byte) ([]byte, int, bool) {
	for i := range reqs {
		q := &reqs[i]
		b.handled.Add(1)
		n, _ := strconv.ParseUint(string(q.Key[1:]), 10, 64)
		out = codec.AppendAcquired(out, n+1, q.Owner, q.Key)
	}
	return out, len(reqs), false
}

func (b *tokenBackend) Orphaned(token uint64, _ []byte) {
	b.mu.Lock()
	b.orphaned = append(b.orphaned, token)
	b.mu.Unlock()
}

func (b *tokenBackend) orphans() []uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]uint64(nil), b.orphaned...)
}

// dialSmall dials addr with a small receive buffer, so that the server's
// answers back up in its own output while the test does not read.
func dialSmall(t *testing.T, addr string) *net.TCPConn {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var err error
		_ = rc.Control(func(fd uintptr) { err = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
		return err
	}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c.(*net.TCPConn)
}

// endStream dials addr as dialSmall does, sends req and ends the client's
// stream (shutdown(SHUT_WR), `nc -N`).
func endStream(t *testing.T, addr string, req []byte) *net.TCPConn {
	t.Helper()
	c := dialSmall(t, addr)
	if _, err := c.Write(req); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	return c
}

// expectGrantsThenEnd reads from c the grants of acquires(n), in order,
// then the end of the server's stream; handled counts the requests the
// backend carried out, for the failure message.
func expectGrantsThenEnd(t *testing.T, c net.Conn, n int, handled *atomic.Int64) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(c)
	for i := range n {
		line, err := r.ReadString('\n')
		if want := fmt.Sprintf("A %d o h%d\n", i+1, i); line != want {
			t.Fatalf("answer %d of %d: %q (%v), want %q; %d carried out", i+1, n, line, err, want, handled.Load())
		}
	}
	if _, err := r.ReadByte(); err != io.EOF {
		t.Fatalf("after the answers: %v, want the end of the stream", err)
	}
}

func acquires(n int) []byte {
	var b bytes.Buffer
	for i := range n {
		fmt.Fprintf(&b, "A o h%d 30000 0\n", i)
	}
	return b.Bytes()
}

// A client that ends its stream (shutdown(SHUT_WR), `nc -N`) before it
// reads its answers still gets every one, then the end of the server's:
// gnet, closing at the client's end, would write what the socket takes at
// once and drop the rest, grants among it.
func TestAnswersAfterTheClientsEndOfStream(t *testing.T) {
	const n = 5000
	b := &tokenBackend{}
	_, addr := startServer(t, Config{Backend: b, SendBuffer: 8192})
	c := endStream(t, addr, acquires(n))
	time.Sleep(500 * time.Millisecond) // the server reads the end while its answers wait
	expectGrantsThenEnd(t, c, n, &b.handled)
	if o := b.orphans(); len(o) != 0 {
		t.Errorf("%d grants given back, all of which were delivered", len(o))
	}
}

// A client that closes (resets) its connection with answers unread loses
// them, and the grants among what gnet had not written are given back, not
// left held to the end of their leases. None its client may have read is:
// the first line of gnet's output may have been begun.
func TestGrantsUnsentAtAResetAreGivenBack(t *testing.T) {
	const n = 5000
	b := &tokenBackend{}
	s, addr := startServer(t, Config{Backend: b, SendBuffer: 8192})
	c := dialSmall(t, addr)
	if _, err := c.Write(acquires(n)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for b.handled.Load() < n { // wait for the answers to back up
		if time.Now().After(deadline) {
			t.Fatal("the server did not answer within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	_ = c.SetLinger(0)
	_ = c.Close()
	for s.Stats().Conns > 0 || s.unsentBusy.Load() > 0 {
		if time.Now().After(deadline) {
			t.Fatal("the connection is still open, or its output not seen to, 10s on")
		}
		time.Sleep(10 * time.Millisecond)
	}
	o := b.orphans()
	if len(o) == 0 {
		t.Fatal("no grant given back: those gnet had not written stay held")
	}
	// What was given back is the tail of the answers, in order.
	for i := 1; i < len(o); i++ {
		if o[i] != o[i-1]+1 {
			t.Fatalf("given back %v...: not the unsent tail in order", o[:min(len(o), 10)])
		}
	}
	if o[len(o)-1] != n {
		t.Errorf("the last grant given back is %d, want %d", o[len(o)-1], n)
	}
}

// A client paused for not reading its answers that then ends its stream
// gets, once it reads, the answer to every request it sent, in order, then
// the end of the server's stream: the end is read after the output drains
// (gnet, woken by the end alone, threw the output away, and the grants in
// it stayed held), and the requests the server had read but not yet parsed
// when it met the end (parsing stops at the connection's limits) are
// carried out after it (they were dropped unanswered).
func TestAnswersAfterTheEndOfStreamOfAPausedClient(t *testing.T) {
	const n = 20000
	b := &tokenBackend{}
	s, addr := startServer(t, Config{Backend: b, SendBuffer: 8192, MaxOutbound: 64 << 10})
	c := dialSmall(t, addr)
	_ = c.SetWriteBuffer(1 << 20)
	if _, err := c.Write(acquires(n)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.Stats().Paused == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the connection was not paused within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // the end arrives while paused
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	r := bufio.NewReader(c)
	got := 0
	for ; ; got++ {
		line, err := r.ReadString('\n')
		if err == io.EOF && line == "" {
			break
		}
		if want := fmt.Sprintf("A %d o h%d\n", got+1, got); line != want {
			t.Fatalf("answer %d of %d: %q (%v), want %q", got+1, n, line, err, want)
		}
	}
	if h := b.handled.Load(); int64(got) != h || got != n {
		t.Errorf("%d answers read, %d requests carried out, of %d sent", got, h, n)
	}
	if o := b.orphans(); len(o) != 0 {
		t.Errorf("%d grants given back, all of which were delivered", len(o))
	}
}

// releaseUnsent gives back the grants of whole lines not begun: never one
// written in part, nor an answer other than a grant, nor, of gnet's output,
// the first line (gnet may have written its start).
func TestReleaseUnsentKeepsLinesBegun(t *testing.T) {
	buf := []byte("A 1 o h0\nA 2 o h1\nR 9 h9\nA 3 o h2\nA 4 o h3\n")
	second := bytes.Index(buf, []byte("A 2"))
	for _, c := range []struct {
		sent  int
		begun bool
		want  []uint64
	}{
		{0, true, []uint64{2, 3, 4}},
		{0, false, []uint64{1, 2, 3, 4}},
		{1, false, []uint64{2, 3, 4}},
		{second, true, []uint64{2, 3, 4}},
		{second, false, []uint64{2, 3, 4}},
		{second + 1, true, []uint64{3, 4}},
		{len(buf) - 1, true, nil},
		{len(buf), false, nil},
	} {
		b := &tokenBackend{}
		s := &Server{cfg: Config{Backend: b}}
		s.releaseUnsent(buf, c.sent, c.begun)
		if got := b.orphans(); !slices.Equal(got, c.want) {
			t.Errorf("sent %d, begun %v: released %v, want %v", c.sent, c.begun, got, c.want)
		}
	}
}

// commitBackend answers acquires later, in order, from a goroutine of its
// own, as cluster mode answers once a request commits: lag after Handle,
// it finds the connection by id, as the Outbox does, and posts the grants
// there.
type commitBackend struct {
	tokenBackend
	srv     atomic.Pointer[Server] // set once started; read on other goroutines
	lag     time.Duration
	batches chan commitBatch
}

type commitBatch struct {
	at     time.Time
	id     uint64
	lines  []byte
	grants []Grant
}

func newCommitBackend(lag time.Duration) *commitBackend {
	b := &commitBackend{lag: lag, batches: make(chan commitBatch, 1024)}
	go func() {
		for x := range b.batches {
			time.Sleep(time.Until(x.at))
			if c := b.srv.Load().Conn(x.id); c == nil || !c.PostGrants(x.lines, len(x.grants), x.grants) {
				for _, g := range x.grants {
					b.Orphaned(g.Token, g.Key)
				}
			}
		}
	}()
	return b
}

func (b *commitBackend) Handle(c *Conn, reqs []codec.Request, out []byte) ([]byte, int, bool) {
	x := commitBatch{at: time.Now().Add(b.lag), id: c.ID()}
	for i := range reqs {
		q := &reqs[i]
		b.handled.Add(1)
		n, _ := strconv.ParseUint(string(q.Key[1:]), 10, 64)
		x.lines = codec.AppendAcquired(x.lines, n+1, q.Owner, q.Key)
		x.grants = append(x.grants, Grant{Token: n + 1, Key: bytes.Clone(q.Key)})
	}
	b.batches <- x
	return out, 0, false
}

// startCommitServer starts a server on a commitBackend.
func startCommitServer(t *testing.T, lag time.Duration) (*Server, *commitBackend, string) {
	return startCommitServerConfig(t, lag, Config{})
}

// startCommitServerConfig is startCommitServer with cfg (its Backend set).
func startCommitServerConfig(t *testing.T, lag time.Duration, cfg Config) (*Server, *commitBackend, string) {
	b := newCommitBackend(lag)
	cfg.Backend = b
	s, addr := startServer(t, cfg)
	b.srv.Store(s)
	t.Cleanup(func() { close(b.batches) })
	return s, b, addr
}

// A client that ends its stream right after its requests gets the answers
// decided after its end too (cluster mode: they commit later), then the
// end of the server's stream; before, the connection was gone when they
// came, and the client read nothing.
func TestAnswersDecidedAfterTheClientsEndOfStream(t *testing.T) {
	const n = 2000
	s, b, addr := startCommitServer(t, 300*time.Millisecond)
	c := endStream(t, addr, acquires(n))
	expectGrantsThenEnd(t, c, n, &b.handled)
	if o := b.orphans(); len(o) != 0 {
		t.Errorf("%d grants given back, all of which were delivered", len(o))
	}
	waitFor(t, func() bool { return s.Stats().Conns == 0 && s.unsentBusy.Load() == 0 })
}

// A bad frame after requests still being decided, then the client's end:
// the answers, then the frame's E line, then the end of the stream.
func TestErrorLineAfterAnswersDecidedAfterTheEndOfStream(t *testing.T) {
	const n = 50
	_, b, addr := startCommitServer(t, 300*time.Millisecond)
	c := endStream(t, addr, append(acquires(n), "X what\nA o h99 30000 0\n"...))
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	all, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("reading to the end: %v", err)
	}
	lines := strings.Split(strings.TrimSuffix(string(all), "\n"), "\n")
	if len(lines) != n+1 {
		t.Fatalf("%d lines, want %d answers and the E line: %q", len(lines), n, all)
	}
	for i := range n {
		if want := fmt.Sprintf("A %d o h%d", i+1, i); lines[i] != want {
			t.Fatalf("line %d: %q, want %q", i+1, lines[i], want)
		}
	}
	if !strings.HasPrefix(lines[n], "E ") {
		t.Fatalf("last line %q, want the bad frame's E line", lines[n])
	}
	if h := b.handled.Load(); h != n {
		t.Errorf("%d requests carried out, want the %d before the bad frame", h, n)
	}
}

// A client that ends its stream and then resets before its answers are
// decided gets none; each grant decided for it is given back once, not
// left held to the end of its lease.
func TestGrantsDecidedAfterTheEndOfStreamOfAResetClientAreGivenBack(t *testing.T) {
	const n = 500
	s, b, addr := startCommitServer(t, 300*time.Millisecond)
	c := endStream(t, addr, acquires(n))
	waitFor(t, func() bool { return b.handled.Load() == n })
	_ = c.SetLinger(0)
	_ = c.Close()
	waitFor(t, func() bool { return len(b.orphans()) >= n && s.Stats().Conns == 0 && s.unsentBusy.Load() == 0 })
	time.Sleep(50 * time.Millisecond) // none given back twice
	o := b.orphans()
	slices.Sort(o)
	if len(o) != n || o[0] != 1 || len(slices.Compact(o)) != n {
		t.Fatalf("%d grants given back (%v...), want each of the %d once", len(o), o[:min(len(o), 5)], n)
	}
}

// A client that sends its requests and ends its stream at once, then reads
// late, gets an answer to every request: the server meets the end while
// parsing is stopped at the connection's output limit, with requests read
// and not parsed, which it carries out after the end (they were dropped).
func TestRequestsReadButNotParsedAtTheEndOfStreamAreCarriedOut(t *testing.T) {
	const n = 5000
	b := &tokenBackend{}
	_, addr := startServer(t, Config{Backend: b, SendBuffer: 8192, MaxOutbound: 4 << 10})
	c := endStream(t, addr, acquires(n))
	time.Sleep(500 * time.Millisecond) // the server meets the end while paused on its output
	expectGrantsThenEnd(t, c, n, &b.handled)
}

// queueBackend grants an acquire without a wait at once; one with a wait
// is left queued, which it becomes some time after Handle, posting
// nothing, as a cluster acquire that commits behind a holder.
type queueBackend struct {
	tokenBackend
	queued atomic.Int64
}

func (b *queueBackend) Handle(c *Conn, reqs []codec.Request, out []byte) ([]byte, int, bool) {
	n := 0
	for i := range reqs {
		q := &reqs[i]
		b.handled.Add(1)
		if q.WaitMs > 0 {
			time.AfterFunc(50*time.Millisecond, func() { b.queued.Add(1) })
			continue
		}
		out = codec.AppendAcquired(out, 1, q.Owner, q.Key)
		n++
	}
	return out, n, false
}

func (b *queueBackend) Queued(*Conn) int { return int(b.queued.Load()) }

// halfClose writes req, ends the client's stream and reads to the
// server's end; it returns what was read and how long that took.
func halfClose(t *testing.T, addr, req string) (string, time.Duration) {
	t.Helper()
	start := time.Now()
	c := endStream(t, addr, []byte(req))
	_ = c.SetReadDeadline(time.Now().Add(2 * lingerFor))
	all, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("reading to the end: %v after %q", err, all)
	}
	return string(all), time.Since(start)
}

// After the client's end, a request that commits into its key's queue
// posts nothing: the writer still sees it (as the parked loop does on the
// event loop), so the bad frame after it gets its E line and the stream
// ends, rather than the writer sleeping to its bound and missing both.
func TestErrorLineAfterAQueuedAcquireAndTheEndOfStream(t *testing.T) {
	b := &queueBackend{}
	_, addr := startServer(t, Config{Backend: b})
	got, took := halfClose(t, addr, "A o q 30000 20000\nX what\n")
	if !strings.HasPrefix(got, "E ") || strings.Count(got, "\n") != 1 {
		t.Fatalf("read %q, want the bad frame's E line alone", got)
	}
	if took >= lingerFor {
		t.Errorf("the stream ended after %v, the writer's bound: the queued acquire went unseen", took)
	}
}

// Requests held back by the connection's in-flight limit when the client
// ends its stream are carried out, and answered, once queued acquires
// make room.
func TestRequestsBehindQueuedAcquiresAfterTheEndOfStream(t *testing.T) {
	b := &queueBackend{}
	_, addr := startServer(t, Config{Backend: b, MaxInflight: 2})
	got, _ := halfClose(t, addr, "A o q1 30000 20000\nA o q2 30000 20000\nA o h3 30000 0\n")
	if got != "A 1 o h3\n" {
		t.Fatalf("read %q, want the grant of h3", got)
	}
	if o := b.orphans(); len(o) != 0 {
		t.Errorf("grants given back: %v", o)
	}
}

// A connection paused at its in-flight limit is not read: the requests
// its client sent before its end wait in the socket, and are carried out
// and answered after it.
func TestRequestsInTheSocketOfAPausedClientAfterTheEndOfStream(t *testing.T) {
	const n = 5000
	s, b, addr := startCommitServerConfig(t, time.Millisecond, Config{MaxInflight: 100})
	got, _ := halfClose(t, addr, string(acquires(n)))
	lines := strings.Split(strings.TrimSuffix(got, "\n"), "\n")
	if len(lines) != n {
		t.Fatalf("%d answers of %d (%d carried out)", len(lines), n, b.handled.Load())
	}
	for i, l := range lines {
		if want := fmt.Sprintf("A %d o h%d", i+1, i); l != want {
			t.Fatalf("answer %d: %q, want %q", i+1, l, want)
		}
	}
	waitFor(t, func() bool { return s.Stats().Conns == 0 })
	if o := b.orphans(); len(o) != 0 {
		t.Errorf("%d grants given back, all delivered", len(o))
	}
}

// Stop that runs out of time while a writer after EOF waits for a client
// that does not read returns only once that writer has given back the
// grants it did not write: single mode writes its snapshot after Stop,
// and one released after it would stay held across the restart.
func TestStopCutsTheWritersAfterEOFShort(t *testing.T) {
	const n = 20000
	b := &tokenBackend{}
	s, addr := startServer(t, Config{Backend: b, SendBuffer: 8192})
	endStream(t, addr, acquires(n))
	waitFor(t, func() bool { return b.handled.Load() == n && s.unsentBusy.Load() == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_ = s.Stop(ctx)
	if busy := s.unsentBusy.Load(); busy != 0 {
		t.Fatalf("Stop returned with %d writers after EOF still running", busy)
	}
	if o := b.orphans(); len(o) == 0 || o[len(o)-1] != n {
		t.Fatalf("given back by Stop's return: %d grants, the last %v; want the unwritten tail up to %d", len(o), o[max(0, len(o)-1):], n)
	}
}

// countingCommits is a commitBackend that counts the looks at its queues.
type countingCommits struct {
	*commitBackend
	looks atomic.Int64
}

func (b *countingCommits) Queued(c *Conn) int { b.looks.Add(1); return b.commitBackend.Queued(c) }

// A writer after EOF waiting for answers that are slow to come looks
// again less and less often, as a paused connection is woken: looking
// every 10 ms, thousands of them took more than a core.
func TestAWriterAfterEOFLooksLessOftenWhileNothingComes(t *testing.T) {
	cb := newCommitBackend(2 * time.Second)
	b := &countingCommits{commitBackend: cb}
	s, addr := startServer(t, Config{Backend: b})
	cb.srv.Store(s)
	t.Cleanup(func() { close(cb.batches) })
	got, _ := halfClose(t, addr, "A o h7 30000 0\n")
	if got != "A 8 o h7\n" {
		t.Fatalf("read %q, want the grant of h7", got)
	}
	// Every 10 ms would be about 200 looks in the 2 s.
	if n := b.looks.Load(); n > 40 {
		t.Errorf("%d looks at the queues while waiting 2s for one answer", n)
	}
}

// silentBackend carries out nothing and answers nothing, as cluster mode
// once it has quiesced for a shutdown.
type silentBackend struct{ fakeBackend }

func (*silentBackend) Handle(_ *Conn, _ []codec.Request, out []byte) ([]byte, int, bool) {
	return out, 0, false
}

// At Stop a writer after EOF does as a lingering connection does: it
// waits no more for answers to requests that will not be carried out.
func TestStopDoesNotWaitForAWriterAfterEOFsUnansweredRequests(t *testing.T) {
	s, addr := startServer(t, Config{Backend: &silentBackend{}})
	endStream(t, addr, []byte("A o k 30000 0\n"))
	waitFor(t, func() bool { return s.unsentBusy.Load() == 1 })
	start := time.Now()
	_ = s.Stop(context.Background())
	if took := time.Since(start); took >= lingerFor/2 {
		t.Errorf("Stop took %v, waiting for answers that will not come", took)
	}
}

// A client that ends its stream after a pipeline whose answers come slowly
// but steadily (cluster mode: one commit after another) gets all of them,
// however long they take in all: the writer after EOF waits lingerFor
// without an answer, not in all (that cut off 1436 answers of 1500 on a
// busy machine, and released their grants).
func TestAnswersThatKeepComingAfterTheEndOfStreamAreAllWritten(t *testing.T) {
	const n = 8 // one a second, with one request in flight at a time: past lingerFor in all
	_, b, addr := startCommitServerConfig(t, time.Second, Config{MaxInflight: 1})
	start := time.Now()
	c := endStream(t, addr, acquires(n))
	_ = c.SetReadDeadline(time.Now().Add(n*time.Second + lingerFor))
	all, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("reading to the end: %v after %q", err, all)
	}
	if got := strings.Count(string(all), "\n"); got != n {
		t.Fatalf("%d answers of %d in %v, then the end", got, n, time.Since(start))
	}
	if o := b.orphans(); len(o) != 0 {
		t.Errorf("%d grants given back, all delivered", len(o))
	}
}
