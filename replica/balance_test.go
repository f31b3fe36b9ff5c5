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
