package replica

import (
	"context"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lni/dragonboat/v4"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// appliedMembers is every shard's members as n has applied them.
func appliedMembers(n *Node) map[uint64][]uint64 {
	out := map[uint64][]uint64{}
	info := n.nh.GetNodeHostInfo(dragonboat.NodeHostInfoOption{SkipLogInfo: true})
	if info == nil {
		return out
	}
	for _, si := range info.ShardInfoList {
		ids := slices.Sorted(maps.Keys(si.Replicas))
		out[si.ShardID-1] = ids
	}
	return out
}

// A replace run on a node that has just started, its shards still loading
// (Dragonboat lists a loading shard with no members), takes old out before
// it adds new: a shard that got new beside old would count a dead member,
// two live of four, no quorum until new starts.
func TestReplaceRightAfterARestartRemovesFirst(t *testing.T) {
	c := newTestCluster(t, 4)
	c.stop(2) // node 3 is lost
	c.stop(0) // node 1 restarts; the operator runs the replace on it at once
	n, err := Start(c.options(1, c.dirs[0]))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	var pending []uint64
	if info := n.nh.GetNodeHostInfo(dragonboat.NodeHostInfoOption{SkipLogInfo: true}); info != nil {
		for _, si := range info.ShardInfoList {
			if si.Pending || len(si.Replicas) == 0 {
				pending = append(pending, si.ShardID-1)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	addr4 := freePort(t)
	if err := n.Replace(ctx, 3, 4, addr4); err != nil {
		t.Fatalf("replace: %v (shards pending at the call: %v)", err, pending)
	}
	time.Sleep(500 * time.Millisecond)
	for sh, ids := range appliedMembers(n) {
		if slices.Contains(ids, 3) || len(ids) != 3 {
			t.Errorf("shard %d has members %v after Replace(3 -> 4) returned nil (shards pending when it was called: %v): "+
				"node 3 (down) is still counted and node 4 is not started, so the shard has 2 live members of 4, no quorum", sh, ids, pending)
		}
	}
	t.Logf("shards loading at the call: %v", pending)
}

// A node that never opened a raft connection to a live peer (a follower
// sends to leaders alone) must not take its silence for "down": a replace
// of that peer is refused.
func TestReplaceRefusesALiveNodeItNeverReached(t *testing.T) {
	c := newTestCluster(t, 1) // one shard, led by node 1 (its preferred node)
	// Node 3 was lost and replaced by node 4, which joined: a joining
	// follower sends only to the leader, so it never connects to node 2.
	c.loseThird(30 * time.Second)
	c.waitLeads([]int{0}, 15*time.Second)
	time.Sleep(time.Second)
	from, old := 2, 1 // slot 2 is node 4; slot 1 is node 2, up and serving
	n := c.nodes[from]
	n.mu.Lock()
	r, seen := n.reach[c.peers[2]]
	n.mu.Unlock()
	t.Logf("node 4's view of node 2 (live): reach=%v, known=%v", r, seen)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := c.nodes[from].Replace(ctx, uint32(old+1), 5, freePort(t))
	if err == nil {
		time.Sleep(300 * time.Millisecond)
		t.Errorf("Replace on node %d took out node %d, which is up and serving (members now %v): "+
			"node %d never opened a raft connection to it", n.opt.NodeID, old+1, appliedMembers(c.nodes[0]), n.opt.NodeID)
		select {
		case <-c.nodes[old].Failed():
			t.Logf("the live node stopped: %v", c.nodes[old].Err())
		case <-time.After(5 * time.Second):
		}
	}
}

// Two replaces of one lost node at once (two operators, two nodes) both
// pass their checks; their adds are ordered by the members' config change
// id, so only one goes through and the other says so.
func TestConcurrentReplacesAddOneNode(t *testing.T) {
	c := newTestCluster(t, 1)
	c.stop(2) // node 3 is lost
	// Each read of the members waits for the other replace's next read
	// (up to 5 s), so that both read the same members before each change:
	// both remove node 3, then both add on the members [1 2].
	var mu sync.Mutex
	arrived := 0
	gen := make(chan struct{})
	barrier := func() {
		mu.Lock()
		arrived++
		wait := gen
		if arrived%2 == 0 {
			close(gen)
			gen = make(chan struct{})
		}
		mu.Unlock()
		select {
		case <-wait:
		case <-time.After(5 * time.Second):
		}
	}
	c.nodes[0].opt.memberAttempt = barrier
	c.nodes[1].opt.memberAttempt = barrier
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := make(chan error, 2)
	go func() { errs <- c.nodes[0].Replace(ctx, 3, 4, freePort(t)) }()
	go func() { errs <- c.nodes[1].Replace(ctx, 3, 5, freePort(t)) }()
	e1, e2 := <-errs, <-errs
	time.Sleep(300 * time.Millisecond)
	ids := appliedMembers(c.nodes[0])[0]
	t.Logf("errors %v / %v, members %v, barrier arrivals %d", e1, e2, ids, arrived)
	lost := e1
	if lost == nil {
		lost = e2
	}
	if (e1 == nil) == (e2 == nil) || len(ids) != 3 || !strings.Contains(lost.Error(), "another replace ran") {
		t.Errorf("two replaces of node 3 (by 4 and by 5) at once: errors %v / %v, shard 0 members %v: "+
			"an even membership with a member nobody starts", e1, e2, ids)
	}
}

// A node that ran before and finds its data dir empty (a typo in the path,
// a data disk that did not mount) is refused, not started afresh under its
// old id: it would have forgotten its votes and the entries it
// acknowledged. Only a new cluster's first start (Bootstrap) or a
// replacement (Join) begins on an empty data dir.
func TestNodeOnAnEmptyDataDirIsRefusedWithoutBootstrap(t *testing.T) {
	c := newTestCluster(t, 1)
	c.stop(2)
	for _, dir := range []string{t.TempDir(), filepath.Join(t.TempDir(), "typo")} {
		opt := c.options(3, dir)
		opt.Bootstrap = false
		n, err := Start(opt)
		if err == nil {
			n.Close()
			t.Fatalf("node 3 started afresh on the empty data dir %s", dir)
		}
		if !strings.Contains(err.Error(), "holds no cluster state") || !strings.Contains(err.Error(), dir) {
			t.Fatalf("refused with %v", err)
		}
		if _, err := os.Stat(dir); filepath.Base(dir) == "typo" && !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("the refused start left %s behind (stat: %v)", dir, err)
		}
	}
	// Its own data dir, without Bootstrap, is fine.
	c.opt.Bootstrap = false
	c.start(2)
	c.waitReady()
}

// A node started to join that no replace added (a wrong --node-id, a
// replace not run) hears from no shard: it says so, and why that may be,
// rather than wait unready without a word.
func TestJoiningNodeNobodyAddedSaysSo(t *testing.T) {
	defer func(d time.Duration) { joinWarnEvery = d }(joinWarnEvery)
	joinWarnEvery = 200 * time.Millisecond
	c := newTestCluster(t, 1)
	core, logs := observer.New(zap.WarnLevel)
	opt := c.opt
	opt.NodeID, opt.Peers, opt.DataDir, opt.Join, opt.Bootstrap = 9, maps.Clone(c.peers), t.TempDir(), true, false
	delete(opt.Peers, 3) // as after a replace of node 3 by node 9: one that was never run
	opt.Peers[9] = freePort(t)
	opt.Logger = zap.New(core)
	n, err := Start(opt)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	n.wg.Add(1)
	go n.every(joinWarnEvery, n.joinWatch())
	deadline := time.Now().Add(10 * time.Second)
	for logs.FilterMessageSnippet("no shard has heard from its members").Len() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no warning in 10 s from a joining node no replace added")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Members gives each shard's members as the node applied them: what an
// operator checks after a replace (the admin's /debug/cluster).
func TestMembersAfterAReplace(t *testing.T) {
	c := newTestCluster(t, 2)
	c.waitReady()
	// Read again after each change applied, and each second: soon, if not
	// at once.
	waitMembers := func(what string, want []uint32) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			st := c.nodes[0].Status(false)
			c.nodes[0].Members(st)
			done := true
			for _, s := range st {
				done = done && slices.Equal(s.Members, want) && len(s.Addrs) == len(want)
				for _, id := range want {
					done = done && s.Addrs[id] == c.peers[id]
				}
			}
			if done {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %+v, want members %v in every shard", what, st, want)
			}
		}
	}
	waitMembers("started", []uint32{1, 2, 3})
	c.stop(2)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c.replaceThird(ctx)
	waitMembers("after replacing 3 by 4", []uint32{1, 2, 4})
}

// A node started with a --peers that is not the members the shards agree
// on (here, after a replace, with its flags unchanged) follows the members
// and says once what to correct.
func TestPeersThatAreNotTheMembersAreSaid(t *testing.T) {
	c := newTestCluster(t, 2)
	c.waitReady()
	old := maps.Clone(c.peers)
	c.loseThird(30 * time.Second)
	c.stop(0)
	opt := c.options(1, c.dirs[0])
	core, logs := observer.New(zap.WarnLevel)
	opt.Peers, opt.Logger, opt.Bootstrap = old, zap.New(core), false
	c.startWith(0, opt)
	for deadline := time.Now().Add(20 * time.Second); logs.FilterMessageSnippet("--peers is not the cluster's members").Len() == 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("a node started with the peers before a replace said nothing: %v", logs.All())
		}
	}
	if got := logs.FilterMessageSnippet("--peers is not the cluster's members").Len(); got != 1 {
		t.Fatalf("said %d times, want once", got)
	}
}

// A node whose shards have all gone without a leader for unledFor while a
// peer's raft port answered all along (a replace took it out while it was
// down) says what may be the cause; not while a shard has a leader, nor
// while no peer is in reach (a partition, a cluster still starting), nor
// when the peer has just come up (a cluster started one node at a time).
func TestUnledWithPeersInReach(t *testing.T) {
	n := &Node{opt: Options{NodeID: 1}, reach: map[string]bool{}, reachSince: map[string]time.Time{}}
	n.members.Store(newMemberSet(map[uint32]string{1: "a:1", 2: "b:1", 3: "c:1"}))
	g0, g1 := &group{n: n}, &group{n: n}
	n.grps = []*group{g0, g1}
	long := monoNow() - int64(unledFor) - int64(time.Second)
	g0.leaderless.Store(long)
	g1.leaderless.Store(long)
	if n.unledWithPeers() {
		t.Fatal("said with no peer in reach")
	}
	n.reach["b:1"], n.reachSince["b:1"] = true, time.Now()
	if n.unledWithPeers() {
		t.Fatal("said with a peer just come up (its elections still to come)")
	}
	n.reachSince["b:1"] = time.Now().Add(-unledFor - time.Second)
	if !n.unledWithPeers() {
		t.Fatal("not said with every shard leaderless and a peer in reach all along")
	}
	g1.leaderless.Store(0)
	if n.unledWithPeers() {
		t.Fatal("said while a shard has a leader")
	}
	g1.leaderless.Store(monoNow())
	if n.unledWithPeers() {
		t.Fatal("said of a shard leaderless for a moment")
	}
}
