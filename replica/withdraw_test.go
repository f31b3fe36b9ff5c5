package replica

import (
	"testing"

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
