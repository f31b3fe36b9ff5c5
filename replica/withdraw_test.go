package replica

import (
	"strings"
	"testing"
	"time"

	"github.com/ticketd/ticketd/shard"
)

// A connection's withdraw waits for the batches sent before it, the one
// still queued included: a retry of one of them that committed after the
// withdraw would queue an acquire of a connection that is gone.
func TestWithdrawWaitsForTheBatchesBeforeIt(t *testing.T) {
	g := &group{kick: make(chan struct{}, 1), next: 6, open: map[uint64]struct{}{4: {}, 5: {}}}
	acq := acquire(requesterConn(1, 9), 1, "o", "k", 1000, 1000)
	g.add(&acq, 9) // queued: goes out as batch 6
	wd := shard.Command{Op: shard.OpWithdraw, From: shard.Requester{Conn: requesterConn(1, 9)}}
	g.withdraw(&wd)
	if g.pendN != 1 {
		t.Fatalf("the withdraw joined the batch queued while batches were in flight (%d queued)", g.pendN)
	}
	take := func() { // the proposer sends what is queued
		g.open[g.next] = struct{}{}
		g.next++
		g.pend, g.pendN = g.pend[:0], 0
	}
	take()
	g.settle(5)
	g.settle(4)
	if g.pendN != 0 {
		t.Fatal("the withdraw went out with batch 6, holding its connection's acquire, in flight")
	}
	g.settle(6)
	if g.pendN != 1 || len(g.later) != 0 {
		t.Fatalf("the withdraw was not queued once the batches before it settled (%d queued, %d waiting)", g.pendN, len(g.later))
	}
	r := reader{b: g.pend}
	var c shard.Command
	if r.command(1, &c); r.err != nil || c.Op != shard.OpWithdraw {
		t.Fatalf("queued %v (%v), want the withdraw", c.Op, r.err)
	}

	// With nothing in flight it joins the queued batch, after what is there.
	g.add(&acq, 9)
	g.withdraw(&wd)
	if g.pendN != 3 || len(g.later) != 0 {
		t.Fatalf("%d queued, %d waiting; want the withdraw queued at once", g.pendN, len(g.later))
	}
}

// A connection's withdraw that is given up (no quorum while it closed) is
// queued again, and commits once the shard has a quorum back: its acquire
// does not stay queued, to be granted to nobody in turn.
func TestGivenUpWithdrawIsProposedAgain(t *testing.T) {
	c := newTestClusterWith(t, 1, func(o *Options) { o.UnavailableTimeout = time.Second })
	h, w := c.dial(0), c.dial(2)
	h.send("A h k 60000 0")
	h.expect("A 1 h k")
	w.send("A w k 60000 60000")
	n3 := c.nodes[2]
	queued := func() int { return waitingOf(n3.grps[0], 3) }
	for deadline := time.Now().Add(10 * time.Second); queued() == 0; {
		if time.Now().After(deadline) {
			t.Fatal("w's acquire not queued")
		}
		time.Sleep(10 * time.Millisecond)
	}
	before := n3.Counters()
	c.stop(0)
	c.stop(1)
	_ = w.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if line, err := w.r.ReadString('\n'); err != nil || !strings.HasPrefix(line, "E unavailable ") {
		t.Fatalf("got %q (%v), want E unavailable", line, err)
	}
	w.c.Close()
	// Its withdraw is proposed and given up while the others are down.
	for deadline := time.Now().Add(20 * time.Second); n3.Counters().GivenUp == before.GivenUp; {
		if time.Now().After(deadline) {
			t.Fatalf("no batch given up: %+v", n3.Counters())
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.start(0)
	c.start(1)
	c.waitReady()
	for deadline := time.Now().Add(20 * time.Second); queued() != 0; {
		if time.Now().After(deadline) {
			t.Fatal("w's acquire still queued after the shard had a quorum again: its withdraw was lost")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitingOf is how many acquires of node wait in g's queues, as g's replica
// on this node has applied them.
func waitingOf(g *group, node uint32) int {
	f := g.fsm.Load()
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.t.Waiting(node, nil))
}
