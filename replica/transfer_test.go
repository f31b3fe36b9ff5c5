package replica

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// A transfer the target cannot take (here it is down: raft gives the
// transfer up an election timeout later, and transfer asks again) drops
// every proposal meanwhile. The leader's own wait for the transfer to end
// and are tried once more then, instead of every tick, where they would
// reach the log just before the next request and make the target skip its
// campaign again; and their requests are answered.
func TestTransferHoldsOwnDroppedProposals(t *testing.T) {
	c := newTestCluster(t, 3)
	deadline := time.Now().Add(15 * time.Second)
	for !slices.Equal(c.leads(), []int{0, 1, 2}) { // shard i on node i+1
		if time.Now().After(deadline) {
			t.Fatalf("leadership not spread: %v", c.leads())
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.stop(2)
	n, g := c.nodes[0], c.nodes[0].grps[0]
	var keys []string
	for i := 0; len(keys) < 4; i++ {
		if k := fmt.Sprintf("k%d", i); n.shardOf([]byte(k)) == 0 {
			keys = append(keys, k)
		}
	}
	a := c.dial(0)
	a.send("A w " + keys[0] + " 60000 0")
	a.expect("A 1 w " + keys[0])

	before := n.Counters()
	type result struct{ moved, left int }
	done := make(chan result, 1)
	go func() {
		m, l := n.transfer(n.stop, []*group{g}, func(*group) uint32 { return 3 }, time.Now().Add(n.transferTime()))
		done <- result{m, l}
	}()
	for g.handing.Load() == nil {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(2 * n.opt.RTT) // the request has reached raft
	for _, k := range keys[1:] {
		a.send("A h " + k + " 60000 0") // apart, so that each is a batch of its own
		time.Sleep(n.opt.RTT)
	}
	if r := <-done; r != (result{0, 1}) {
		t.Errorf("transfer to a node that is down: %d moved, %d left; want 0, 1", r.moved, r.left)
	}
	// Granted, in the order their batches committed (tokens grow per shard).
	var granted []string
	for range keys[1:] {
		_ = a.c.SetReadDeadline(time.Now().Add(10 * time.Second))
		got, err := a.r.ReadString('\n')
		f := strings.Fields(got)
		if err != nil || len(f) != 4 || f[0] != "A" || f[2] != "h" {
			t.Fatalf("got %q (%v), want a grant", got, err)
		}
		granted = append(granted, f[3])
	}
	slices.Sort(granted)
	if !slices.Equal(granted, slices.Sorted(slices.Values(keys[1:]))) {
		t.Errorf("granted %v, want %v", granted, keys[1:])
	}
	after := n.Counters()
	proposals, retries := after.Proposals-before.Proposals, after.Retries-before.Retries
	if retries == 0 {
		t.Fatalf("%d proposals, none retried: the transfer dropped nothing", proposals)
	}
	// Once each when the transfer ends; a few more only if raft's ticks
	// ran so late that its last try was still dropping then. Every tick
	// is 20 or more each.
	t.Logf("%d proposals during the transfer, %d retries", proposals, retries)
	if retries > 4*proposals {
		t.Errorf("%d proposals retried %d times during the transfer: they retried every tick instead of waiting for its end", proposals, retries)
	}
	if g.handing.Load() != nil {
		t.Error("the shard is still marked as being handed over")
	}
}
