package netloop

import (
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"github.com/ticketd/ticketd/codec"
)

// stallBackend is fakeBackend, except that an acquire of key "stall" holds
// the event loop inside Handle until release is closed.
type stallBackend struct {
	fakeBackend
	entered chan struct{}
	release chan struct{}
}

func (b *stallBackend) Handle(c *Conn, reqs []codec.Request, out []byte) ([]byte, int, bool) {
	if len(reqs) > 0 && string(reqs[0].Key) == "stall" {
		close(b.entered)
		<-b.release
	}
	return b.fakeBackend.Handle(c, reqs, out)
}

// A connection is taken from the listen backlog while others wait for their
// loop: with one enroll at a time, a loop that was busy (or slow to get a
// core) held every later connection in the backlog, and a burst of them
// overflowed it.
func TestAcceptGoesOnWhileTheLoopIsBusy(t *testing.T) {
	b := &stallBackend{entered: make(chan struct{}), release: make(chan struct{})}
	s, addr := startServer(t, Config{Backend: b, Loops: 1})
	c0, r0 := dial(t, addr)
	if _, err := c0.Write([]byte("A o stall 1000 0\n")); err != nil {
		t.Fatal(err)
	}
	<-b.entered

	const more = 10
	for i := range more {
		c, _ := dial(t, addr)
		if _, err := fmt.Fprintf(c, "A o%d k%d 1000 0\n", i, i); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.Stats().Conns < 1+more {
		if time.Now().After(deadline) {
			close(b.release)
			t.Fatalf("with the loop busy, %d of %d connections accepted", s.Stats().Conns, 1+more)
		}
		time.Sleep(5 * time.Millisecond)
	}
	close(b.release)
	if got := readLine(t, r0); got != "A 1 o stall" {
		t.Fatalf("the stalled acquire was answered %q", got)
	}
	deadline = time.Now().Add(10 * time.Second)
	for s.Stats().Accepted < 1+more {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d connections enrolled once the loop was free", s.Stats().Accepted, 1+more)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// The spare descriptor kept for running out of them (/dev/null) is closed
// with the server, not left to a finalizer.
func TestStopClosesTheSpareDescriptor(t *testing.T) {
	devNull := func() int {
		es, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Skip("no /proc/self/fd")
		}
		n := 0
		for _, e := range es {
			if l, _ := os.Readlink("/proc/self/fd/" + e.Name()); l == os.DevNull {
				n++
			}
		}
		return n
	}
	before := devNull()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Backend: &fakeBackend{}, MaxConns: 10, Loops: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Serve(ln); err != nil {
		t.Fatal(err)
	}
	if err := s.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
	if after := devNull(); after != before {
		t.Fatalf("%d descriptors of %s open before Serve, %d after Stop", before, os.DevNull, after)
	}
}
