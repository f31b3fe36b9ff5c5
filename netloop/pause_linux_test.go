//go:build linux && !poll_opt

package netloop

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/panjf2000/gnet/v2"
	"golang.org/x/sys/unix"
)

// A paused connection's socket is no longer read: a client that floods
// without reading finds its writes blocked, what it sent waits in the
// kernel's receive queue on the server side, and gnet's inbound buffer stays
// small. Parsing alone stopping (TestFloodWithoutReadingIsBounded) would not
// show this: gnet would go on reading into memory without end.
func TestPauseStopsReadingTheSocket(t *testing.T) {
	s, addr := startServer(t, Config{Backend: &fakeBackend{}, MaxOutbound: 64 << 10})
	c, _ := dial(t, addr)
	var sc *Conn
	waitFor(t, func() bool { s.reg.each(func(x *Conn) { sc = x }); return sc != nil })
	// OnOpen stores epfd before it registers the connection.
	if sc.epfd < 0 {
		t.Fatalf("could not find gnet's epoll descriptor (got %d): pausing reads is a no-op with this gnet version", sc.epfd)
	}

	batch := bytes.Repeat([]byte("A flooding-owner flooding-key 1000 0\n"), 1000)
	var wrote, lastWrite atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		rest := batch
		for {
			_ = c.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
			n, err := c.Write(rest)
			if n > 0 {
				wrote.Add(int64(n))
				lastWrite.Store(time.Now().UnixNano())
			}
			if rest = rest[n:]; len(rest) == 0 {
				rest = batch
			}
			if err != nil {
				if ne, ok := err.(net.Error); ok && ne.Timeout() {
					continue
				}
				return
			}
		}
	}()
	defer func() { _ = c.Close(); <-done }()

	// The writes must stop moving for a whole second. Without the pause
	// they never do: the server reads as fast as the client writes.
	const quiet = time.Second
	deadline := time.Now().Add(30 * time.Second)
	for {
		lw := lastWrite.Load()
		if lw != 0 && time.Since(time.Unix(0, lw)) > quiet {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("client's writes never blocked: %d bytes written, the server keeps reading", wrote.Load())
		}
		time.Sleep(50 * time.Millisecond)
	}

	inq, err := unix.IoctlGetInt(sc.gc.Fd(), unix.SIOCINQ)
	if err != nil {
		t.Fatal(err)
	}
	if inq == 0 {
		t.Fatal("server's receive queue is empty although the client cannot write: the socket is still read")
	}
	buffered := make(chan int, 1)
	if err := sc.gc.Wake(func(gc gnet.Conn, _ error) error { buffered <- gc.InboundBuffered(); return nil }); err != nil {
		t.Fatal(err)
	}
	in := <-buffered
	t.Logf("client wrote %d bytes; server: %d in the kernel's receive queue, %d in gnet's inbound buffer", wrote.Load(), inq, in)
	if in > 4<<20 {
		t.Fatalf("gnet buffered %d bytes of a paused connection", in)
	}
}

// A client that writes without reading must meet backpressure: the server
// stops reading it once its unsent answers pass MaxOutbound, so the number of
// handled requests stops growing, and it goes on once the client reads. It
// lives here because where the socket is not paused (pause_other.go) gnet
// reads what the client writes without bound, and the drain at the end would
// have no bound either.
func TestFloodWithoutReadingIsBounded(t *testing.T) {
	b := &fakeBackend{}
	s, addr := startServer(t, Config{Backend: b, MaxOutbound: 64 << 10})
	c, r := dial(t, addr)
	frame := []byte("A flooding-owner flooding-key 1000 0\n")
	batch := bytes.Repeat(frame, 1000)
	var wrote atomic.Int64
	stop := make(chan struct{})
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		rest := batch
		for {
			select {
			case <-stop:
				if len(rest) == len(batch) {
					return
				}
			default:
			}
			_ = c.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
			n, err := c.Write(rest)
			wrote.Add(int64(n))
			if rest = rest[n:]; len(rest) == 0 {
				rest = batch
			}
			if err != nil {
				if ne, ok := err.(net.Error); ok && ne.Timeout() {
					continue
				}
				return
			}
		}
	}()
	// Let the flood hit the limits, then check that handling has stalled.
	deadline := time.Now().Add(5 * time.Second)
	var last int64 = -1
	stalled := false
	for time.Now().Before(deadline) {
		time.Sleep(300 * time.Millisecond)
		h := b.handled.Load()
		if h == last && h > 0 {
			stalled = true
			break
		}
		last = h
	}
	if !stalled {
		t.Fatalf("server kept handling requests (%d) from a client that reads nothing", b.handled.Load())
	}
	if s.Stats().Paused == 0 {
		t.Fatal("connection was never paused")
	}
	// Handled requests are bounded by the output limit plus socket buffers,
	// far below what the client tried to send.
	answerBytes := int64(len("A 1 flooding-owner flooding-key\n"))
	if h := b.handled.Load(); h*answerBytes > 64<<20 {
		t.Fatalf("handled %d requests (%d answer bytes) while paused", h, h*answerBytes)
	}
	// Reading drains everything the server accepted, and it resumes: the
	// writer can finish its last batch only while answers are read.
	var read atomic.Int64
	go func() {
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		for {
			if _, err := r.ReadSlice('\n'); err != nil {
				return
			}
			read.Add(1)
		}
	}()
	close(stop)
	<-writerDone
	want := wrote.Load() / int64(len(frame))
	waitFor(t, func() bool { return read.Load() == want })
}

// A connection paused on its unsent output, with all its input already
// read into gnet's buffer, has nothing left to wake it once the client
// drains the output: no byte arrives, and gnet calls no handler when its
// write finishes. Only the parked loop looks at it again. Small socket
// buffers on both ends make the answers back up on loopback before the
// client reads.
func TestPausedOnOutputGoesOnWhenDrained(t *testing.T) {
	const n = 2500 // 52 KB of frames: one read of gnet's 64 KB buffer
	b := &fakeBackend{}
	s, addr := startServer(t, Config{Backend: b, MaxOutbound: 2 << 10, SendBuffer: 4 << 10})
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<10)
		}); err != nil {
			return err
		}
		return serr
	}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	var req bytes.Buffer
	for i := range n {
		fmt.Fprintf(&req, "A o%04d k%04d 1000 0\n", i, i)
	}
	if _, err := c.Write(req.Bytes()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return s.Stats().Paused > 0 })
	time.Sleep(50 * time.Millisecond) // let it settle with output pending
	// The state under test: parsing stopped short of the input, and none
	// of the input waits in the kernel any more, so no read event can come.
	fd := -1
	s.reg.each(func(c *Conn) { fd = c.gc.Fd() })
	if q, err := unix.IoctlGetInt(fd, unix.SIOCINQ); err != nil || q != 0 {
		t.Fatalf("server socket holds %d unread bytes (error %v): the input was not all read into gnet", q, err)
	}
	if h := b.handled.Load(); h >= n {
		t.Fatalf("handled all %d requests before the client read: never paused with input left", h)
	}

	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(c)
	for i := range n {
		if got, want := readLine(t, r), fmt.Sprintf("A 1 o%04d k%04d", i, i); got != want {
			t.Fatalf("answer %d: %q, want %q", i, got, want)
		}
	}
}

// A connection paused on its in-flight limit, with nothing to write, is
// not read; the client's close must still be seen, so that the backend
// withdraws its queued acquires and releases what is granted to it, as
// for any connection that goes away. A close reads as a half-close, whose
// client may still read: the answers still to come for it are awaited up
// to lingerFor (unsent.go), and here they never come.
func TestPausedConnectionThatClosesIsClosed(t *testing.T) {
	b := &fakeBackend{}
	s, addr := startServer(t, Config{Backend: b, MaxInflight: 4})
	c, _ := dial(t, addr)
	if _, err := c.Write(bytes.Repeat([]byte("A w later 1000 0\n"), 8)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return s.paused.Load() == 1 })
	if got := b.handled.Load(); got != 4 {
		t.Fatalf("the backend got %d requests, want the limit of 4", got)
	}
	_ = c.Close()
	deadline := time.Now().Add(lingerFor + 5*time.Second)
	for b.closed.Load() != 1 || s.Stats().Conns != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the connection was not closed within %v of its client's close", lingerFor+5*time.Second)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
