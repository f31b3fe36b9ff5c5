//go:build linux

package netloop

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"sync"
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
	c := dialSmall(t, addr)
	if _, err := c.Write(acquires(n)); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // the server reads the end while its answers wait
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(c)
	for i := range n {
		line, err := r.ReadString('\n')
		if want := fmt.Sprintf("A %d o h%d\n", i+1, i); line != want {
			t.Fatalf("answer %d of %d: %q (%v), want %q", i+1, n, line, err, want)
		}
	}
	if _, err := r.ReadByte(); err != io.EOF {
		t.Fatalf("after the answers: %v, want the end of the stream", err)
	}
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
// gets, once it reads, every answer the server decided, in order, then the
// end of the server's stream: the end is read after the output drains.
// (gnet, woken by the end alone, threw the output away, and the grants in
// it stayed held.) Requests that the server had read but not yet parsed
// when it met the end (parsing stops at the connection's limits) are not
// carried out.
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
	if h := b.handled.Load(); int64(got) != h {
		t.Errorf("%d answers read, %d requests carried out", got, h)
	}
	if got < n/2 {
		t.Errorf("%d answers of %d: the answers decided before the end were lost", got, n)
	}
	if o := b.orphans(); len(o) != 0 {
		t.Errorf("%d grants given back, all of which were delivered", len(o))
	}
}

// releaseUnsent gives back the grants of whole lines not begun: never the
// buffer's first line (gnet may have written its start), nor one written in
// part, nor an answer other than a grant.
func TestReleaseUnsentKeepsLinesBegun(t *testing.T) {
	buf := []byte("A 1 o h0\nA 2 o h1\nR 9 h9\nA 3 o h2\nA 4 o h3\n")
	second := bytes.Index(buf, []byte("A 2"))
	for _, c := range []struct {
		sent int
		want []uint64
	}{
		{0, []uint64{2, 3, 4}},
		{second, []uint64{2, 3, 4}},
		{second + 1, []uint64{3, 4}},
		{len(buf) - 1, nil},
		{len(buf), nil},
	} {
		b := &tokenBackend{}
		s := &Server{cfg: Config{Backend: b}}
		s.releaseUnsent(buf, c.sent)
		if got := b.orphans(); !slices.Equal(got, c.want) {
			t.Errorf("sent %d: released %v, want %v", c.sent, got, c.want)
		}
	}
}
