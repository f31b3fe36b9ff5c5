package replica

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lni/dragonboat/v4/raftio"
	"go.uber.org/zap"
)

// A transfer the target cannot take (here it is down: raft gives the
// transfer up an election timeout later, and transfer asks again) drops
// every proposal meanwhile. The leader's own wait for the transfer to end
// and are tried once more then, instead of every tick, where they would
// reach the log just before the next request and make the target skip its
// campaign again; and their requests are answered.
func TestTransferHoldsOwnDroppedProposals(t *testing.T) {
	c := newTestCluster(t, 3)
	c.waitLeads([]int{0, 1, 2}, 15*time.Second) // shard i on node i+1
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

// Under load from the other nodes, the target of a transfer nearly always
// has committed entries left to apply when told to campaign, and skips the
// campaign; the transfer is then given up an election timeout later. A
// stopping node first makes its shards' logs go quiet (quiesce), so that
// every transfer goes through at once: here the election timeout is 2s,
// and the node hands over its shards well within it.
func TestClusterHandOverUnderLoadWithinElectionTimeout(t *testing.T) {
	const shards = 9
	c := newTestClusterWith(t, shards, func(o *Options) {
		o.ElectionRTT = 200
		// Room for quiesce on a machine busy with the rest of the suite
		// under the race detector (eight ticks and one by default).
		o.quiesceMax, o.quietFor = time.Second, 50*time.Millisecond
	})
	c.waitLeads([]int{0, 1, 2, 0, 1, 2, 0, 1, 2}, 30*time.Second)
	// Pairs on nodes 2 and 3, on every shard: node 1's shards take
	// proposals forwarded from both all the time.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var pairs atomic.Int64
	for w := range 16 {
		l := c.dial(1 + w%2)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k := fmt.Sprintf("w%d-%d", w, i)
				if _, err := l.c.Write([]byte("A o " + k + " 60000 0\n")); err != nil {
					t.Error(err)
					return
				}
				_ = l.c.SetReadDeadline(time.Now().Add(10 * time.Second))
				got, err := l.r.ReadString('\n')
				f := strings.Fields(got)
				if err != nil || len(f) != 4 || f[0] != "A" {
					t.Errorf("acquire %s: got %q (%v)", k, got, err)
					return
				}
				if _, err := l.c.Write([]byte("R " + f[1] + " " + k + "\n")); err != nil {
					t.Error(err)
					return
				}
				if got, err := l.r.ReadString('\n'); err != nil || got != "R "+f[1]+" "+k+"\n" {
					t.Errorf("release %s: got %q (%v)", k, got, err)
					return
				}
				pairs.Add(1)
			}
		}()
	}
	defer func() { close(stop); wg.Wait() }()
	for pairs.Load() < 200 {
		time.Sleep(10 * time.Millisecond)
	}

	start := time.Now()
	c.stop(0)
	took := time.Since(start)
	at := c.leads()
	for _, sh := range []int{0, 3, 6} {
		if at[sh] == 0 {
			t.Errorf("shard %d still led by the stopped node", sh)
		}
	}
	if election := c.opt.RTT * time.Duration(c.opt.ElectionRTT); took >= election {
		t.Errorf("the stop took %v with shards to hand over: a transfer was given up after the election timeout (%v)", took, election)
	}
	t.Logf("stopped in %v, %d pairs so far", took, pairs.Load())
	// The load goes on on the shards handed over.
	before := pairs.Load()
	for wait := time.Now().Add(10 * time.Second); pairs.Load() < before+100; {
		if time.Now().After(wait) {
			t.Fatalf("the load stalled after the stop: %d pairs", pairs.Load()-before)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A hand-over notice holds the node's proposals to the shard until another
// leader is known, or holdTime at most; a notice from long ago (a log
// replayed at start) holds nothing.
func TestHandOverNoticeHoldsProposals(t *testing.T) {
	clock := time.Now().UnixNano()
	n := &Node{opt: Options{NodeID: 1, RTT: 10 * time.Millisecond, ElectionRTT: 20, MaxClockSkew: time.Second,
		Clock: func() int64 { return clock }}, log: zap.NewNop(), stop: make(chan struct{})}
	n.members.Store(newMemberSet(map[uint32]string{1: "a", 2: "b", 3: "c"}))
	g := &group{n: n}
	n.grps = []*group{g}
	g.leader.Store(1)

	n.notice(0, 1, noticeHandOver, clock-int64(5*time.Second))
	if g.hold.Load() != nil {
		t.Fatal("a notice from 5s ago holds proposals")
	}

	took := make(chan bool)
	takeOff := func() { go func() { took <- g.takeOff(n.stop) }() }
	n.notice(0, 1, noticeHandOver, clock)
	takeOff()
	select {
	case <-took:
		t.Fatal("a proposal went out during the hold")
	case <-time.After(50 * time.Millisecond):
	}
	n.LeaderUpdated(raftio.LeaderInfo{ShardID: 1, ReplicaID: 1, LeaderID: 2, Term: 2})
	if !<-took || g.flying.Load() != 1 {
		t.Fatalf("after the new leader: in flight %d, want 1", g.flying.Load())
	}
	g.flying.Store(0)

	// No new leader: the hold ends after holdTime (100ms).
	g.leader.Store(1)
	start := time.Now()
	n.notice(0, 1, noticeHandOver, clock)
	takeOff()
	<-took
	if d := time.Since(start); d < n.holdTime() {
		t.Errorf("the hold ended after %v, before holdTime (%v)", d, n.holdTime())
	}
}

// A node still applying what it missed (here its apply of the shard
// stalls) is not handed the shard's leadership: its raft would skip the
// campaign, and the transfer drop the shard's proposals for an election
// timeout, twice. The shard stays with its leader, whose requests go on
// without a retry, and goes to the node once it has caught up.
func TestHandBackWaitsForTheTargetToCatchUp(t *testing.T) {
	c := newTestCluster(t, 3)
	c.waitLeads([]int{0, 1, 2}, 15*time.Second) // shard i on node i+1
	n1, n3 := c.nodes[0], c.nodes[2]
	if moved, _ := n3.transfer(n3.stop, []*group{n3.grps[2]}, func(*group) uint32 { return 1 }, time.Now().Add(n3.transferTime())); moved != 1 {
		t.Fatal("shard 2 not moved to node 1")
	}
	g := n1.grps[2]
	for g.leader.Load() != 1 {
		time.Sleep(time.Millisecond)
	}
	var keys []string
	for i := 0; len(keys) < 6; i++ {
		if k := fmt.Sprintf("k%d", i); n1.shardOf([]byte(k)) == 2 {
			keys = append(keys, k)
		}
	}
	a := c.dial(0)
	grant := func() {
		t.Helper()
		_ = a.c.SetReadDeadline(time.Now().Add(10 * time.Second))
		got, err := a.r.ReadString('\n')
		if f := strings.Fields(got); err != nil || len(f) != 4 || f[0] != "A" {
			t.Fatalf("got %q (%v), want a grant", got, err)
		}
	}
	a.send("A w " + keys[0] + " 60000 0")
	grant()

	f := n3.grps[2].fsm.Load()
	f.mu.Lock() // node 3 falls behind on shard 2 from here
	stalled := true
	defer func() {
		if stalled {
			f.mu.Unlock()
		}
	}()
	a.send("A w " + keys[1] + " 60000 0") // committed, and not applied on node 3
	grant()
	before := n1.Counters()
	type result struct{ moved, left, behind int }
	done := make(chan result, 1)
	go func() {
		m, l, b := n1.handBack([]*group{g})
		done <- result{m, l, b}
	}()
	for _, k := range keys[2:4] {
		a.send("A w " + k + " 60000 0")
		time.Sleep(n1.opt.RTT)
	}
	if r := <-done; r != (result{0, 0, 1}) {
		t.Errorf("hand-back to a node behind: %+v, want 0 moved, 0 left, 1 behind", r)
	}
	for range keys[2:4] {
		grant()
	}
	if r := n1.Counters().Retries - before.Retries; r != 0 {
		t.Errorf("%d proposals retried: a transfer was asked of a node behind and dropped them", r)
	}
	if l := g.leader.Load(); l != 1 {
		t.Fatalf("shard 2 led by %d, want 1", l)
	}
	// Left a bounded number of times in a row; then asked for as before
	// (a target of an older ticketd never drains): here it fails.
	for range maxHandBackSkips - 1 {
		if m, l, b := n1.handBack([]*group{g}); b != 1 {
			t.Fatalf("hand-back to a node behind: %d moved, %d left, %d behind; want it left again", m, l, b)
		}
	}
	if m, l, b := n1.handBack([]*group{g}); b != 0 || m+l != 1 {
		t.Fatalf("hand-back after %d left in a row: %d moved, %d left, %d behind; want it asked for", maxHandBackSkips, m, l, b)
	}
	for deadline := time.Now().Add(10 * time.Second); g.leader.Load() != 1; { // back after the failed transfer
		if time.Now().After(deadline) {
			t.Fatalf("shard 2 led by %d after a transfer to a node behind, want 1", g.leader.Load())
		}
		time.Sleep(time.Millisecond)
	}

	f.mu.Unlock()
	stalled = false
	for try := 0; ; try++ {
		r := result{}
		r.moved, r.left, r.behind = n1.handBack([]*group{g})
		if r.moved == 1 {
			break
		}
		if try == 20 {
			t.Fatalf("not handed back once caught up: %+v", r)
		}
		time.Sleep(50 * time.Millisecond)
	}
	a.send("A w " + keys[4] + " 60000 0")
	grant()
}

// Quiesce's timeouts of the node's queued acquires are proposed again when
// a proposal is dropped (here by a transfer to a node that is down): the
// acquires are answered T, not left queued without an answer.
func TestQuiesceRetriesDroppedTimeouts(t *testing.T) {
	c := newTestCluster(t, 1)
	deadline := time.Now().Add(15 * time.Second)
	for c.leads()[0] != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("shard 0 not led by node 1: %v", c.leads())
		}
		if n := c.nodes[c.leads()[0]]; n != c.nodes[0] {
			n.transfer(n.stop, []*group{n.grps[0]}, func(*group) uint32 { return 1 }, time.Now().Add(n.transferTime()))
		}
		time.Sleep(50 * time.Millisecond)
	}
	n, g := c.nodes[0], c.nodes[0].grps[0]
	h, w := c.dial(1), c.dial(0)
	h.send("A h k 60000 0")
	h.expect("A 1 h k")
	w.send("A w k 60000 60000")
	queued := func() int { return waitingOf(g, 1) }
	for deadline := time.Now().Add(10 * time.Second); queued() == 0; {
		if time.Now().After(deadline) {
			t.Fatal("w's acquire not queued")
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.stop(2)
	go n.transfer(n.stop, []*group{g}, func(*group) uint32 { return 3 }, time.Now().Add(n.transferTime()))
	for g.handing.Load() == nil {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(2 * n.opt.RTT) // the transfer has reached raft: proposals are dropped
	n.Quiesce()
	w.expect("T w k")
}
