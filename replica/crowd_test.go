package replica

import (
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// A client that pipelines without end is not read past the node's
// MaxQueued, another with little outstanding is read and answered
// meanwhile, and every request read is answered in the end.
func TestClusterCrowdedConnectionWaitsAndOthersDoNot(t *testing.T) {
	const maxQueued = 300
	c := newTestClusterWith(t, 2, func(o *Options) { o.MaxQueued = maxQueued })
	n := c.nodes[0]
	most := watchMost(n)

	flood := c.dial(0)
	const frames = 6000
	var b strings.Builder
	for i := range frames {
		fmt.Fprintf(&b, "A o%d f%d 60000 0\n", i, i)
	}
	wrote := make(chan error, 1)
	go func() { _, err := flood.c.Write([]byte(b.String())); wrote <- err }()
	waitUntil(t, func() bool { return n.queued.Load() >= maxQueued })

	light := c.dial(0)
	light.send("A l light 60000 0")
	_ = light.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if got, err := light.r.ReadString('\n'); err != nil || !strings.HasPrefix(got, "A ") || !strings.HasSuffix(got, " l light\n") {
		t.Fatalf("light connection beside the flood: %q, %v", got, err)
	}

	_ = flood.c.SetReadDeadline(time.Now().Add(60 * time.Second))
	for i := range frames {
		got, err := flood.r.ReadString('\n')
		if err != nil || !strings.HasPrefix(got, "A ") {
			t.Fatalf("answer %d to the flood: %q, %v", i, got, err)
		}
	}
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	held := most()
	// At most twice the bound, and a frame more per parse running.
	if bound := int64(2*maxQueued + 2); held > bound {
		t.Fatalf("the node held %d commands on their way through the log, bound %d", held, bound)
	}
	t.Logf("most held: %d", held)
	waitUntil(t, func() bool { return n.queued.Load() == 0 })
}

// watchMost samples how many commands n holds on their way through the
// log until the returned func is called, which says the most seen.
func watchMost(n *Node) func() int64 {
	var most atomic.Int64
	stop, sampled := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if q := n.queued.Load(); q > most.Load() {
				most.Store(q)
			}
			time.Sleep(20 * time.Microsecond)
		}
	}()
	return func() int64 { close(stop); <-sampled; return most.Load() }
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 30s")
		}
		time.Sleep(time.Millisecond)
	}
}

// However many connections flood a node at once, it holds at most twice
// MaxQueued and a frame more per parse running: their shares of it shrink
// as they come, and frames are counted as they are read, also those of
// connections whose clients closed their side, which are parsed off the
// event loops, many at once.
func TestClusterManyFloodingConnectionsShareTheBound(t *testing.T) {
	for _, halfClose := range []bool{false, true} {
		t.Run(fmt.Sprintf("half-close=%v", halfClose), func(t *testing.T) { floodShares(t, halfClose) })
	}
}

func floodShares(t *testing.T, halfClose bool) {
	const maxQueued, conns, frames = 200, 40, 1500
	c := newTestClusterWith(t, 2, func(o *Options) { o.MaxQueued = maxQueued })
	n := c.nodes[0]
	lines := make([]*line, conns)
	for i := range lines {
		lines[i] = c.dial(0)
	}
	most := watchMost(n)
	errs := make(chan error, conns)
	for i, l := range lines {
		var b strings.Builder
		for j := range frames {
			fmt.Fprintf(&b, "A o%d f%d-%d 60000 0\n", j, i, j)
		}
		go func() {
			_, err := l.c.Write([]byte(b.String()))
			if err == nil && halfClose {
				err = l.c.(*net.TCPConn).CloseWrite()
			}
			errs <- err
		}()
	}
	for i, l := range lines {
		_ = l.c.SetReadDeadline(time.Now().Add(60 * time.Second))
		for j := range frames {
			if got, err := l.r.ReadString('\n'); err != nil || !strings.HasPrefix(got, "A ") {
				t.Fatalf("connection %d, answer %d: %q, %v", i, j, got, err)
			}
		}
	}
	for range conns {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	held := most()
	if bound := int64(2*maxQueued + conns); held > bound {
		t.Fatalf("%d connections flooding: the node held %d commands on their way through the log, bound %d", conns, held, bound)
	}
	t.Logf("most held: %d", held)
	waitUntil(t, func() bool { return n.queued.Load() == 0 })
}
