package replica

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sm "github.com/lni/dragonboat/v4/statemachine"

	"github.com/ticketd/ticketd/netloop"
	"github.com/ticketd/ticketd/shard"
)

// A node started with other settings than the cluster's stops, whether they
// are limits (its replicas would answer B where the others grant) or the
// shard count (it would send a key to another shard than the others do,
// where a second holder could be granted). Its data dir takes the
// cluster's shard count, and started again with the cluster's settings it
// joins as any node.
func TestClusterNodeWithOtherSettingsStops(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(*Options)
		flag string
	}{
		{"limits", func(o *Options) { o.MaxKeys = 1 }, "--max-keys 1"},
		{"shards", func(o *Options) { o.Shards = 1 }, "--shards 1"},
		{"clock skew", func(o *Options) { o.MaxClockSkew = 50 * time.Millisecond }, "--max-clock-skew 50ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newStoppedCluster(t, 2, func(o *Options) { o.MaxKeys = 100 })
			c.start(0)
			c.start(1)
			c.waitReady()
			a := c.dial(0)
			a.send("A h k 60000 0")
			a.expect("A 1 h k")

			cluster := c.opt
			tc.set(&c.opt)
			c.start(2)
			n := c.nodes[2]
			select {
			case <-n.Failed():
			case <-time.After(20 * time.Second):
				t.Fatal("a node with other settings than the cluster's did not stop")
			}
			err := n.Err()
			if err == nil || !strings.Contains(err.Error(), tc.flag) || !strings.Contains(err.Error(), "--shards 2 --max-keys 100") {
				t.Fatalf("Err() = %v: does not name both settings", err)
			}
			// A node stopping for its settings changes no one's limits.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if err := n.SetLimits(ctx, 7, 0, 0); err == nil {
				t.Error("a change of limits from a node stopping for its settings reported success")
			}
			cancel()
			if set, _, _ := c.nodes[0].grps[0].fsm.Load().settings(); set.MaxKeys != 100 {
				t.Errorf("a node stopping for its settings changed the cluster's to %s", set)
			}
			// Until the process exits, what it is sent is not carried out.
			x := c.dial(2)
			x.send("A y j 60000 0")
			x.expect("E unavailable a shard of this request has no quorum; outcome unknown, try another node")
			a.send("A z j 60000 0")
			a.expect("A 1 z j")
			c.stop(2)
			b, rerr := os.ReadFile(filepath.Join(c.dirs[2], identityFile))
			var id identity
			if rerr != nil || json.Unmarshal(b, &id) != nil {
				t.Fatalf("reading %s: %v", identityFile, rerr)
			}
			if id.Shards != 2 {
				t.Fatalf("the data dir did not take the cluster's shard count: %s", b)
			}

			c.opt = cluster
			c.start(2)
			c.waitReady()
			r := c.dial(2)
			r.send("A x k 60000 0")
			r.expect("T x k")
			a.send("R 1 k")
			a.expect("R 1 k")
			r.send("A x k 60000 0")
			r.expect("A 2 x k")
			if err := c.nodes[2].Err(); err != nil {
				t.Fatalf("restarted with the cluster's settings, it failed: %v", err)
			}
			c.checkReplicasAgree()
		})
	}
}

// The limits change while the cluster runs, on every replica at the same
// place in each shard's log; a node restarted with the old ones then stops,
// and one with the new works.
func TestClusterLimitsChangeWhileItRuns(t *testing.T) {
	c := newTestClusterWith(t, 2, func(o *Options) { o.MaxKeys = 2 })
	a := c.dial(0)
	for _, k := range []string{"k1", "k2"} {
		a.send("A o " + k + " 60000 0")
		a.expectGrant("o", k)
	}
	a.send("A o k3 60000 0")
	a.expect("B o k3")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.nodes[1].SetLimits(ctx, 4, 0, 0); err != nil {
		t.Fatal(err)
	}
	a.send("A o k3 60000 0")
	a.expectGrant("o", "k3")
	a.send("A o k4 60000 0")
	a.expectGrant("o", "k4")
	a.send("A o k5 60000 0")
	a.expect("B o k5")
	c.checkReplicasAgree()
	// Every node shows the limits in force (/debug/cluster), as applied.
	for i, n := range c.nodes {
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			done := true
			for _, st := range n.Status(false) {
				done = done && st.Limits != nil && st.Limits.MaxKeys == 4
			}
			if done {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node %d shows the limits %+v, want --max-keys 4 on every shard", i+1, n.Status(false))
			}
		}
	}

	c.stop(2)
	c.start(2) // with --max-keys 2
	select {
	case <-c.nodes[2].Failed():
	case <-time.After(20 * time.Second):
		t.Fatal("a node restarted with the limits from before the change did not stop")
	}
	if err := c.nodes[2].Err(); err == nil || !strings.Contains(err.Error(), "--max-keys 4") {
		t.Fatalf("Err() = %v: does not name the cluster's limits", err)
	} else if !strings.Contains(err.Error(), "a change of limits (POST /cluster/limits) through node 2 at ") {
		t.Fatalf("Err() = %v: does not say the limits came from the change made through node 2", err)
	}
	c.stop(2)
	c.opt.MaxKeys = 4
	c.start(2)
	c.waitReady()
	r := c.dial(2)
	r.send("A x k6 60000 0")
	r.expect("B x k6")
	r.send("A x k1 60000 0")
	r.expect("T x k1")
	if err := c.nodes[2].Err(); err != nil {
		t.Fatal(err)
	}
	c.checkReplicasAgree()
}

// expectGrant reads a grant of key to owner, whatever its token (tokens
// count per shard).
func (l *line) expectGrant(owner, key string) {
	l.t.Helper()
	_ = l.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := l.r.ReadString('\n')
	if f := strings.Fields(got); err != nil || len(f) != 4 || f[0] != "A" || f[2] != owner || f[3] != key {
		l.t.Fatalf("got %q (%v), want a grant of %s to %s", got, err, key, owner)
	}
}

// A new cluster whose nodes start at once, one with other limits, takes one
// node's settings on every shard, whichever reached it first: decided shard
// by shard, some shards took the odd node's and the others the rest's,
// every node then stopped on a shard whose settings were not its own, and
// no flags could start one again. The nodes that stop name settings every
// shard has, and started again with them, they serve.
func TestNewClusterTakesOneSettingsOnEveryShard(t *testing.T) {
	c := newStoppedCluster(t, 8, func(o *Options) { o.MaxKeys = 800 })
	c.start(0)
	c.start(1)
	cluster := c.opt
	c.opt.MaxKeys = 8
	c.start(2)
	c.opt = cluster

	// Every live replica knows its shard's settings, and at least one node
	// has stopped.
	var seen map[settings][]string
	deadline := time.Now().Add(20 * time.Second)
	for {
		seen = map[settings][]string{}
		known, failed := true, 0
		for i, n := range c.nodes {
			if n.Err() != nil {
				failed++
			}
			for _, g := range n.grps {
				f := g.fsm.Load()
				if f == nil {
					known = false
					continue
				}
				set, _, ok := f.settings()
				if !ok {
					known = false
					continue
				}
				seen[set] = append(seen[set], fmt.Sprintf("n%d/s%d", i+1, g.idx))
			}
		}
		if known && failed > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("within 20s: settings known on every replica %v, nodes stopped %d", known, failed)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(seen) != 1 {
		t.Fatalf("the shards took different settings: %v", seen)
	}
	var won settings
	for s := range seen {
		won = s
	}
	for i, n := range c.nodes {
		if err := n.Err(); err != nil && !strings.Contains(err.Error(), "the cluster runs with "+won.String()) {
			t.Fatalf("node %d: %v: does not name %s", i+1, err, won)
		}
	}
	c.opt.MaxKeys = won.MaxKeys
	for i, n := range c.nodes {
		if n.Err() != nil {
			c.stop(i)
			c.start(i)
		}
	}
	c.waitReady()
	for i := range c.nodes {
		x := c.dial(i)
		key := fmt.Sprintf("k%d", i)
		x.send("A o " + key + " 60000 0")
		x.expectGrant("o", key)
		if err := c.nodes[i].Err(); err != nil {
			t.Fatalf("node %d, started with the cluster's settings: %v", i+1, err)
		}
	}
	c.checkReplicasAgree()
}

// A data dir of an earlier ticketd pinned the limits in cluster.json, and
// its logs hold entries applied under them before any settings notice: the
// node replays those under them, whatever its flags (restarted with new
// limits after a change, it replayed them otherwise than its peers had and
// granted a held key), and keeps them in cluster.json for later starts.
func TestEarlierDataDirReplaysUnderItsPinnedLimits(t *testing.T) {
	c := newStoppedCluster(t, 2, func(o *Options) { o.MaxKeys = 100 })
	for i, dir := range c.dirs {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		id := identity{Node: uint32(i + 1), Peers: c.peers, Shards: 2, Incarnation: 1, Limits: &limits{MaxKeys: 6, MaxWaiters: 8, MaxWaitersPerKey: 3}}
		if err := writeLegacyIdentity(filepath.Join(dir, identityFile), &id); err != nil {
			t.Fatal(err)
		}
	}
	for i := range c.nodes {
		c.start(i)
	}
	c.waitReady()
	for i, n := range c.nodes {
		for _, g := range n.grps {
			if cfg := g.fsm.Load().cfg; cfg.MaxKeys != 3 || cfg.MaxWaiters != 4 || cfg.MaxWaitersPerKey != 3 {
				t.Fatalf("node %d shard %d replays under %+v, not the pinned limits", i+1, g.idx, cfg)
			}
		}
	}
	c.stopAll()
	for _, dir := range c.dirs {
		b, err := os.ReadFile(filepath.Join(dir, identityFile))
		var id identity
		if err != nil || json.Unmarshal(b, &id) != nil || id.Limits == nil || id.Limits.MaxKeys != 6 {
			t.Fatalf("%s lost the pinned limits: %s %v", identityFile, b, err)
		}
	}
}

// A node whose settings notice had not committed when the limits changed
// (started before a quorum was up, and asked nothing since) takes the new
// limits: it was started with the cluster's of its time, and stopping it
// for a change made while it ran would leave the cluster without it.
func TestNodeThatHadNotAnnouncedTakesALimitsChange(t *testing.T) {
	c := clusterWithNodeZeroUnannounced(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.nodes[1].SetLimits(ctx, 50, 0, 0); err != nil {
		t.Fatal(err)
	}
	// Its first notice to shard 0 can meet the hand-back of shard 0's
	// leadership to it, which drops proposals for a while (E unavailable,
	// the connection closed): ask again on a new connection.
	for attempt := 1; ; attempt++ {
		a := c.dial(0)
		a.send("A o k 60000 0")
		_ = a.c.SetReadDeadline(time.Now().Add(10 * time.Second))
		got, err := a.r.ReadString('\n')
		if err := c.nodes[0].Err(); err != nil {
			t.Fatalf("a node running during a change of limits stopped: %v", err)
		}
		if f := strings.Fields(got); err == nil && len(f) == 4 && f[0] == "A" && f[2] == "o" && f[3] == "k" {
			break
		}
		if !strings.HasPrefix(got, "E unavailable") || attempt == 5 {
			t.Fatalf("attempt %d: got %q (%v), want a grant of k to o", attempt, got, err)
		}
	}
	if got := c.nodes[0].settings().MaxKeys; got != 50 {
		t.Fatalf("the node runs with --max-keys %d, not the cluster's 50", got)
	}
	c.checkReplicasAgree()
}

// A node that stops for its settings hands over the shards it leads, as a
// clean stop does, instead of leaving them an election timeout (2s here)
// without a leader.
func TestNodeStoppingForItsSettingsHandsLeadershipOver(t *testing.T) {
	const shards = 6
	c := newTestClusterWith(t, shards, func(o *Options) { o.ElectionRTT = 200 })
	c.waitLeads([]int{0, 1, 2, 0, 1, 2}, 20*time.Second)
	n := c.nodes[0]
	n.mismatch(n.grps[0], settings{shards: shards, limits: limits{MaxKeys: 1}}, 2, 0)
	// As ticketd's abort does: no more requests, then close.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c.srvs[0].StopAccepting()
	n.Quiesce()
	_ = c.srvs[0].Stop(ctx)
	_ = n.Close()
	c.nodes[0], c.srvs[0] = nil, nil
	for _, sh := range []int{0, 3} {
		led := false
		for wait := time.Now().Add(500 * time.Millisecond); !led && time.Now().Before(wait); time.Sleep(time.Millisecond) {
			for _, m := range c.nodes {
				led = led || m != nil && m.grps[sh].leader.Load() == uint64(m.opt.NodeID)
			}
		}
		if !led {
			t.Errorf("shard %d: no leader among the nodes left within 500ms of the stopping node's close", sh)
		}
	}
}

// A node started before its peers: its notice to shard 0 gives up (no
// leader), and a request on another shard waits for shard 0's agreement.
// Once the peers are up, shard 0 is asked again and the request is carried
// out, instead of waiting out the unavailable timeout (30s here) for an
// E unavailable.
func TestRequestOnAnotherShardWaitsForShardZerosSecondNotice(t *testing.T) {
	c := newStoppedCluster(t, 2, func(o *Options) {
		o.UnavailableTimeout = 30 * time.Second
		o.LeaderlessTimeout = 300 * time.Millisecond
	})
	c.start(0)
	key := "k"
	for i := 0; c.nodes[0].shardOf([]byte(key)) == 0; i++ {
		key = fmt.Sprintf("k%d", i)
	}
	a := c.dial(0)
	a.send("A o " + key + " 60000 0")
	time.Sleep(1500 * time.Millisecond) // shard 0's notice gives up: no quorum
	if hasSettings(c.nodes[0].grps[0]) {
		t.Fatal("shard 0 agreed without a quorum")
	}
	c.start(1)
	c.start(2)
	// The shard's own leader may come after shard 0's: its proposal can
	// then give up too (E unavailable, connection closed). Ask again once
	// the node knows every shard's leader.
	for attempt := 1; ; attempt++ {
		_ = a.c.SetReadDeadline(time.Now().Add(10 * time.Second))
		got, err := a.r.ReadString('\n')
		if f := strings.Fields(got); err == nil && len(f) == 4 && f[0] == "A" && f[2] == "o" && f[3] == key {
			break
		}
		if !strings.HasPrefix(got, "E unavailable") || attempt == 5 {
			t.Fatalf("attempt %d: got %q (%v), want a grant of %s to o", attempt, got, err, key)
		}
		c.waitReady()
		a = c.dial(0)
		a.send("A o " + key + " 60000 0")
	}
	c.checkReplicasAgree()
}

// clusterWithNodeZeroUnannounced starts node 0 alone, waits until its
// settings notices have given up (no quorum; with retryNotice false for the
// test, they are not tried again by themselves), then starts the others
// and waits until they are ready. The shards' limits are --max-keys 100.
func clusterWithNodeZeroUnannounced(t *testing.T) *testCluster {
	t.Helper()
	retryNotice.Store(false)
	t.Cleanup(func() { retryNotice.Store(true) })
	c := newStoppedCluster(t, 2, func(o *Options) { o.MaxKeys = 100; o.UnavailableTimeout = time.Second })
	c.start(0)
	time.Sleep(2500 * time.Millisecond) // its notices give up: no quorum
	for _, g := range c.nodes[0].grps {
		if hasSettings(g) {
			t.Fatalf("shard %d agreed without a quorum", g.idx)
		}
	}
	c.start(1)
	c.start(2)
	// Nodes 1 and 2 too announce once at their start, and again only at a
	// request (an attempt gives up if it meets an election or a hand-back):
	// each is asked for a key on every shard. Node 0 is asked nothing.
	for i := 1; i <= 2; i++ {
		for sh := range 2 {
			key := ""
			for n := 0; key == ""; n++ {
				if k := fmt.Sprintf("ready%d-%d", i, n); c.nodes[i].shardOf([]byte(k)) == sh {
					key = k
				}
			}
			grantVia(c, i, "ready", key)
		}
	}
	c.waitReadyExcept(0) // node 0 asks again only at its next request
	return c
}

// hasSettings tells whether a settings notice has committed on g's shard,
// which its proposer's agreed needs.
func hasSettings(g *group) bool {
	f := g.fsm.Load()
	if f == nil {
		return false
	}
	_, _, ok := f.settings()
	return ok
}

// A node whose settings notice gave up while the shard's leader stayed the
// same (its apply stalled past the unavailable timeout, as in a long
// catch-up or a disk stall; here the replica's lock is held) tries it again
// by itself: readiness checks send it nothing until it is ready.
func TestClusterNoticeGivenUpWithAStableLeaderIsTriedAgain(t *testing.T) {
	c := newTestClusterWith(t, 1, func(o *Options) { o.UnavailableTimeout = time.Second })
	c.stop(2)
	n, err := Start(c.options(3, c.dirs[2]))
	if err != nil {
		t.Fatal(err)
	}
	f := n.grps[0].fsm.Load()
	if f == nil {
		t.Fatal("no fsm yet")
	}
	f.mu.Lock() // the replica's apply stalls
	ln, err := net.Listen("tcp", freePort(t))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := netloop.New(netloop.Config{Backend: n, MaxConns: 200, Loops: 1})
	if err != nil {
		t.Fatal(err)
	}
	n.Attach(srv)
	if err := srv.Serve(ln); err != nil {
		t.Fatal(err)
	}
	c.nodes[2], c.srvs[2], c.addrs[2] = n, srv, ln.Addr().String()
	time.Sleep(2500 * time.Millisecond) // the notice gives up after 1 s, the leader known throughout
	f.mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for !n.Ready() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if !n.Ready() {
		t.Fatalf("not ready 10 s after its apply resumed, with the leader known throughout: %+v", n.Status(false))
	}
}

// A leader ends leases by the shard's skew, not by its own flag, and only
// once the shard has agreed with its settings: a node restarted with a
// smaller --max-clock-skew may win a shard's leadership before its notice
// is compared, and a lease it ended by its own skew, before the end the
// other nodes answered their holders by, would be held twice.
func TestLeaderEndsLeasesByTheShardsSkewOnceAgreed(t *testing.T) {
	var local int64
	n := &Node{
		opt:       Options{NodeID: 1, MaxClockSkew: 50 * time.Millisecond, Clock: func() int64 { return local }},
		stop:      make(chan struct{}),
		timerKick: make(chan struct{}, 1),
		failed:    make(chan struct{}),
	}
	g := &group{n: n, idx: 0, id: 1, kick: make(chan struct{}, 1), slots: make(chan struct{}, maxInflight), next: 1,
		open: make(map[uint64]struct{})}
	n.grps = []*group{g}
	f := newFSM(0, 1, shard.Config{}, nil)
	f.skew, f.timersMoved, f.inc, f.clock = int64(n.opt.MaxClockSkew), n.kickTimers, 2, n.now
	g.fsm.Store(f)
	// The timer proposals wait on a hold (there is no NodeHost) until the
	// node stops; the count of expiries proposed is what is looked at.
	g.hold.Store(&holdOn{from: 9, done: make(chan struct{})})
	defer close(n.stop)

	// The shard's log: node 2's settings, skew 500 ms, and a grant stamped
	// 1 s with a lease of 1 s: no leader may end it before 2.5 s.
	notice := appendSettings(appendHeader(nil, header{node: 2, inc: 1, floor: noticeSettings, stamp: 1e9}), settings{shards: 1, skew: 500e6})
	grant := batch{h: header{node: 2, inc: 1, batch: 1, stamp: 1e9}, cmds: []shard.Command{acquire(requesterConn(1, 1), 1, "o", "k", 1000, 0)}}
	local = 1e9
	if _, err := f.Update([]sm.Entry{{Index: 1, Cmd: notice}, {Index: 2, Cmd: grant.bytes()}}); err != nil {
		t.Fatal(err)
	}
	if f.skew != 500e6 {
		t.Errorf("the replica allows for a skew of %v, want the shard's 500ms", time.Duration(f.skew))
	}
	run := func(at int64) int64 {
		local = at
		before := n.stats.expiries.Load()
		n.runTimers(new([]shard.Command), new([]shard.Command))
		g.timerRun.Store(false)
		return n.stats.expiries.Load() - before
	}
	g.leader.Store(1)
	if e := run(2.6e9); e != 0 {
		t.Errorf("before the shard agreed with this node's settings, %d expiries proposed", e)
	}
	g.agreed.Store(true)
	if e := run(2.1e9); e != 0 {
		t.Errorf("at 2.1 s (deadline 2 s, shard skew 500 ms), %d expiries proposed", e)
	}
	if e := run(2.6e9); e != 1 {
		t.Errorf("at 2.6 s, %d expiries proposed, want 1", e)
	}
	f.mu.Lock()
	f.due = 0 // the lease is still held: its Expire never committed
	f.mu.Unlock()
	n.failErr = errStopping
	close(n.failed)
	if e := run(3e9); e != 0 {
		t.Errorf("once the node found it must stop, %d expiries proposed", e)
	}
}

// A change of limits sent through a node whose clock is behind the last
// change's sender comes after that change: stamped by its own clock alone,
// it looked older and was not applied.
func TestLimitsChangeThroughANodeWhoseClockIsBehind(t *testing.T) {
	c := newStoppedCluster(t, 2, func(o *Options) { o.MaxKeys = 100; o.MaxClockSkew = 5 * time.Second })
	cluster := c.opt
	c.opt.Clock = func() int64 { return time.Now().Add(2 * time.Second).UnixNano() }
	c.start(0) // 2s ahead of the others
	c.opt = cluster
	c.start(1)
	c.start(2)
	c.waitReady()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := c.nodes[0].SetLimits(ctx, 200, 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.nodes[1].SetLimits(ctx, 300, 0, 0); err != nil {
		t.Fatalf("a change through a node whose clock is behind the last change's sender: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for i, n := range c.nodes {
		for _, g := range n.grps {
			for {
				set, _, _ := g.fsm.Load().settings()
				if set.MaxKeys == 300 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("node %d, shard %d: %s, want --max-keys 300", i+1, g.idx, set)
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
	}
	c.checkReplicasAgree()
}

// A change of limits waits until every shard has agreed with its node's
// settings, asking them to announce them if they have not (here they gave
// up without a quorum, and are not tried again by themselves). Applied
// where no settings were yet, a change became that shard's first, skipping
// shard 0's rule: sent in a new cluster's first moment through a node
// started with another skew than the cluster's, it fixed that skew on the
// shard, and every other node stopped there. A node whose every shard has
// agreed sends no change to a shard without settings.
func TestLimitsChangeWaitsForItsNodesSettingsToAgree(t *testing.T) {
	c := clusterWithNodeZeroUnannounced(t)
	for _, g := range c.nodes[0].grps {
		if g.agreed.Load() {
			t.Fatalf("shard %d agreed on node 1 without a quorum", g.idx)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// Node 0's first notices can meet the hand-back of a shard's leadership
	// to it, which drops proposals for a while: past the unavailable
	// timeout (1 s here) the change is refused, to be run again.
	for attempt := 1; ; attempt++ {
		err := c.nodes[0].SetLimits(ctx, 50, 0, 0)
		if err == nil {
			break
		}
		if !strings.Contains(err.Error(), "have not agreed") || attempt == 5 {
			t.Fatalf("attempt %d: %v", attempt, err)
		}
	}
	for _, g := range c.nodes[0].grps {
		if !g.agreed.Load() {
			t.Errorf("shard %d: the change was sent before the shard agreed with the node's settings", g.idx)
		}
		if set, _, _ := g.fsm.Load().settings(); set.MaxKeys != 50 {
			t.Errorf("shard %d runs with %s, want --max-keys 50", g.idx, set)
		}
	}
	grantVia(c, 0, "o", "k")
	c.checkReplicasAgree()
}

// grantVia asks node i for key until it is granted, on a new connection
// after an E unavailable (no leader yet, or a hand-back): 5 attempts.
func grantVia(c *testCluster, i int, owner, key string) {
	c.t.Helper()
	for attempt := 1; ; attempt++ {
		a := c.dial(i)
		a.send("A " + owner + " " + key + " 60000 0")
		_ = a.c.SetReadDeadline(time.Now().Add(15 * time.Second))
		got, err := a.r.ReadString('\n')
		if f := strings.Fields(got); err == nil && len(f) == 4 && f[0] == "A" && f[2] == owner && f[3] == key {
			return
		}
		if !strings.HasPrefix(got, "E unavailable") || attempt == 5 {
			c.t.Fatalf("node %d, attempt %d: got %q (%v), want a grant of %s to %s", i+1, attempt, got, err, key, owner)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Changes of limits from different nodes never share a stamp, and none is
// earlier than asked for.
func TestNodeStampIsUniquePerNode(t *testing.T) {
	seen := map[int64]uint32{}
	for _, at := range []int64{0, 1, 65535, 65536, 1<<40 + 12345} {
		for id := uint32(1); id <= 5; id++ {
			s := nodeStamp(at, id)
			if s < at || s-at >= 1<<16 || uint32(s%(1<<16)) != id {
				t.Errorf("nodeStamp(%d, %d) = %d", at, id, s)
			}
			if other, ok := seen[s]; ok && other != id {
				t.Errorf("nodes %d and %d share stamp %d", other, id, s)
			}
			seen[s] = id
		}
	}
}

// writeLegacyIdentity writes id as a ticketd before the checksum did,
// which had no such field.
func writeLegacyIdentity(file string, id *identity) error {
	b, err := json.MarshalIndent(id, "", "  ")
	if err != nil {
		return err
	}
	b = bytes.Replace(b, []byte(",\n  \"checksum\": \"\""), nil, 1)
	return os.WriteFile(file, append(b, '\n'), 0o644)
}

// A change of limits with a majority of the nodes down fails saying so,
// not only "run it again", which does not help until they are back.
func TestClusterLimitsChangeWithoutQuorumSaysSo(t *testing.T) {
	c := newTestCluster(t, 1)
	c.waitReady()
	c.stop(1)
	c.stop(2)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := c.nodes[0].SetLimits(ctx, 7, 0, 0)
	if why := c.nodes[0].NotReady(); !strings.Contains(why, "knows no leader") {
		t.Errorf("not ready without a quorum says %q", why)
	}
	if err == nil || !strings.Contains(err.Error(), "no quorum") {
		t.Fatalf("SetLimits with 2 of 3 nodes down: %v, want an error that says no quorum", err)
	}
	t.Log(err)
}
