package replica

import (
	"testing"
	"time"
)

// A shard goes back to its preferred node only while that node is
// reachable: at once on a first connection (a cluster starting has no
// backlog), handBackSettle after a reconnection (a restarted node is still
// catching up), and not to a node that handed it over on its way out until
// that node has reconnected or handBackAfter has passed.
func TestMayHandBack(t *testing.T) {
	const addr = "127.0.0.1:7002"
	n := &Node{reach: map[string]bool{}, reachSince: map[string]time.Time{}, reconnected: map[string]bool{}}
	n.members.Store(newMemberSet(map[uint32]string{1: "127.0.0.1:7001", 2: addr}))
	g := &group{}
	t0 := time.Unix(1_000_000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }

	if n.mayHandBack(g, 2, t0) {
		t.Fatal("handed back to a node never reached")
	}
	n.reach[addr], n.reachSince[addr] = true, t0 // first connection
	if !n.mayHandBack(g, 2, at(time.Millisecond)) {
		t.Fatal("first connection: not handed back at once")
	}

	// Node 2 hands g over on its way out; its connection fails.
	handed := at(time.Second)
	g.handedAt.Store(&handed)
	n.reach[addr] = false
	if n.mayHandBack(g, 2, at(2*time.Second)) {
		t.Fatal("handed back to a node that is down")
	}
	// It comes back: the connection is up again.
	n.reach[addr], n.reachSince[addr], n.reconnected[addr] = true, at(5*time.Second), true
	if n.mayHandBack(g, 2, at(5*time.Second+handBackSettle/2+time.Millisecond)) {
		t.Fatal("handed back before the restarted node settled")
	}
	if !n.mayHandBack(g, 2, at(5*time.Second+handBackSettle+time.Millisecond)) {
		t.Fatal("not handed back once the restarted node settled")
	}

	// Handed over with the connection up all along (the node is stopping):
	// not before it reconnects, or handBackAfter.
	handed = at(time.Minute)
	g.handedAt.Store(&handed)
	if n.mayHandBack(g, 2, at(time.Minute+time.Second)) {
		t.Fatal("handed back to a node on its way out")
	}
	if !n.mayHandBack(g, 2, at(time.Minute+handBackAfter+time.Millisecond)) {
		t.Fatal("not handed back after handBackAfter")
	}
}

// A snapshot stream that fails while messages flow does not make a peer
// unreachable (transfers and the reap go by it); one that connects makes
// it reachable, as Dragonboat then does not report the message stream's
// own reconnection (the two share a circuit breaker, which it resets).
func TestReachFollowsTheMessageStream(t *testing.T) {
	const addr = "127.0.0.1:7002"
	n := &Node{reach: map[string]bool{}, reachSince: map[string]time.Time{}, reconnected: map[string]bool{}, downSince: map[string]time.Time{}}
	n.setReach(addr, true, false)
	n.setReach(addr, false, true) // a snapshot stream fails
	if !n.reach[addr] || n.downFor(addr, 0) {
		t.Fatal("a failed snapshot stream made the peer unreachable")
	}
	n.setReach(addr, false, false) // the message stream fails
	n.downSince[addr] = time.Now().Add(-time.Minute)
	if n.reach[addr] || !n.downFor(addr, time.Second) {
		t.Fatal("the message stream failed: the peer is still in reach")
	}
	n.setReach(addr, true, true) // a snapshot stream connects
	if !n.reach[addr] || n.downFor(addr, 0) {
		t.Fatal("a snapshot stream that connected left the peer out of reach")
	}
}

// A replace part-way through: shard g has node 4 in node 3's place, the
// others not yet, so the set all shards agree on is still 1, 2, 3. Node 4,
// in reach, is no lost node on g (its clients' waiters stay), node 3 is.
func TestLostByTheShardsOwnMembers(t *testing.T) {
	n := &Node{reach: map[string]bool{}, downSince: map[string]time.Time{}}
	m := newMemberSet(map[uint32]string{1: "a:1", 2: "a:2", 3: "a:3"})
	g := &group{}
	rs := map[uint32]string{1: "a:1", 2: "a:2", 4: "a:4"}
	g.replicas.Store(&rs)
	n.reach["a:4"] = true
	if n.lostNode(g, m, 4) {
		t.Error("the new node, a member of the shard and in reach, counts as lost")
	}
	if !n.lostNode(g, m, 3) {
		t.Error("the node the shard replaced does not count as lost")
	}
}
