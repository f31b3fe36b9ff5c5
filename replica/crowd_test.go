package replica

import (
	"fmt"
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
	close(stop)
	<-sampled
	// Past the bound by at most one batch of frames read before the
	// check (netloop's maxBatch) and the light connection's share.
	if bound := int64(maxQueued + 256 + crowdShare); most.Load() > bound {
		t.Fatalf("the node held %d commands on their way through the log, bound %d", most.Load(), bound)
	}
	t.Logf("most held: %d", most.Load())
	waitUntil(t, func() bool { return n.queued.Load() == 0 })
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
