package replica

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lni/dragonboat/v4"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ticketd/ticketd/internal/fscktest"
	"github.com/ticketd/ticketd/internal/serverproc"
	"github.com/ticketd/ticketd/netloop"
)

// testCluster is three nodes in this process, each with its own network side
// on loopback: the same code paths as three ticketd processes.
type testCluster struct {
	t     *testing.T
	dirs  []string
	peers map[uint32]string
	nodes []*Node
	srvs  []*netloop.Server
	addrs []string
	opt   Options
	// maxInflight is netloop's MaxInflight for nodes started from now on;
	// 0: its default.
	maxInflight int
}

func freePort(t *testing.T) string {
	t.Helper()
	addr, err := serverproc.FreeAddr() // below the ephemeral ports: nodes restart on theirs
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

func newTestCluster(t *testing.T, shards int) *testCluster {
	t.Helper()
	return newTestClusterWith(t, shards, nil)
}

func newTestClusterWith(t *testing.T, shards int, tune func(*Options)) *testCluster {
	t.Helper()
	c := newStoppedCluster(t, shards, tune)
	for i := range 3 {
		c.start(i)
	}
	c.waitReady()
	return c
}

// newStoppedCluster is a cluster of three nodes none of which has started.
func newStoppedCluster(t *testing.T, shards int, tune func(*Options)) *testCluster {
	t.Helper()
	c := &testCluster{t: t, peers: map[uint32]string{}, opt: Options{Shards: shards, RTT: 10 * time.Millisecond, ElectionRTT: 20, Bootstrap: true}}
	if tune != nil {
		tune(&c.opt)
	}
	for i := 1; i <= 3; i++ {
		c.peers[uint32(i)] = freePort(t)
		c.dirs = append(c.dirs, t.TempDir())
	}
	c.nodes = make([]*Node, 3)
	c.srvs = make([]*netloop.Server, 3)
	c.addrs = make([]string, 3)
	t.Cleanup(c.stopAll)
	return c
}

func (c *testCluster) start(i int) { c.startAs(i, uint32(i+1), false) }

// options are the cluster's Options for node id on data dir dir.
func (c *testCluster) options(id uint32, dir string) Options {
	opt := c.opt
	opt.NodeID, opt.Peers, opt.DataDir = id, c.peers, dir
	opt.Logger = zaptest.NewLogger(c.t).Named(fmt.Sprintf("n%d", id))
	return opt
}

// startAs starts node id in slot i (its data dir and listener address).
func (c *testCluster) startAs(i int, id uint32, join bool) {
	opt := c.options(id, c.dirs[i])
	opt.Join = join
	c.startWith(i, opt)
}

// startWith starts a node with opt in slot i, on the slot's listener
// address, attached to a network side of its own as ticketd does.
func (c *testCluster) startWith(i int, opt Options) {
	t := c.t
	n, err := Start(opt)
	if err != nil {
		t.Fatal(err)
	}
	addr := c.addrs[i]
	if addr == "" {
		addr = freePort(t)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := netloop.New(netloop.Config{Backend: n, MaxConns: 200, Loops: 1, MaxInflight: c.maxInflight})
	if err != nil {
		t.Fatal(err)
	}
	n.Attach(srv)
	if err := srv.Serve(ln); err != nil {
		t.Fatal(err)
	}
	c.nodes[i], c.srvs[i], c.addrs[i] = n, srv, ln.Addr().String()
}

func (c *testCluster) stop(i int) {
	if c.nodes[i] == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c.srvs[i].StopAccepting()
	_ = c.nodes[i].Shutdown(ctx)
	_ = c.srvs[i].Stop(ctx)
	c.nodes[i], c.srvs[i] = nil, nil
}

func (c *testCluster) stopAll() {
	for i := range c.nodes {
		c.stop(i)
	}
}

func (c *testCluster) waitReady() { c.t.Helper(); c.waitReadyExcept(-1) }

// waitReadyExcept waits for every running node but the one in slot skip.
func (c *testCluster) waitReadyExcept(skip int) {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		ok := true
		for i, n := range c.nodes {
			if n != nil && i != skip && !n.Ready() {
				ok = false
			}
		}
		if ok {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.t.Fatal("cluster not ready within 30s")
}

type line struct {
	t *testing.T
	c net.Conn
	r *bufio.Reader
}

func (c *testCluster) dial(i int) *line {
	c.t.Helper()
	conn, err := net.Dial("tcp", c.addrs[i])
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { conn.Close() })
	return &line{t: c.t, c: conn, r: bufio.NewReader(conn)}
}

func (l *line) send(s string) {
	l.t.Helper()
	if _, err := l.c.Write([]byte(s + "\n")); err != nil {
		l.t.Fatal(err)
	}
}

func (l *line) expect(want string) {
	l.t.Helper()
	_ = l.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := l.r.ReadString('\n')
	if err != nil {
		l.t.Fatalf("waiting for %q: %v", want, err)
	}
	if got = strings.TrimRight(got, "\n"); got != want {
		l.t.Fatalf("got %q, want %q", got, want)
	}
}

func TestClusterHandOverAcrossNodes(t *testing.T) {
	c := newTestCluster(t, 4)
	a, b, r := c.dial(0), c.dial(1), c.dial(2)
	a.send("A holder k 30000 0")
	a.expect("A 1 holder k")
	b.send("A other k 30000 0")
	b.expect("T other k")
	b.send("A waiter k 30000 10000")
	r.send("R 1 k")
	r.expect("R 1 k")
	b.expect("A 2 waiter k")
	r.send("R 1 k")
	r.expect("N 1 k")

	// A wait that passes is ended by a committed WaitTimeout.
	a.send("A late k 30000 200")
	start := time.Now()
	a.expect("T late k")
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Fatalf("T after %v, before the wait passed", d)
	}
	c.checkReplicasAgree()
}

// Committed acquires queued for their key do not count against
// MaxInflight, as in single mode: the release pipelined behind more of them
// than that is read and hands the key on.
func TestClusterQueuedAcquiresDoNotStopReading(t *testing.T) {
	c := newTestCluster(t, 2)
	c.maxInflight = 8
	c.stop(0)
	c.start(0)
	c.waitReady()
	a := c.dial(0)
	a.send("A h K 60000 0")
	a.expect("A 1 h K")
	var b strings.Builder
	for i := range 20 {
		fmt.Fprintf(&b, "A w%d K 60000 30000\n", i)
	}
	b.WriteString("R 1 K")
	a.send(b.String())
	a.expect("R 1 K")
	a.expect("A 2 w0 K")
}

func TestClusterLeaseEndsByCommittedExpire(t *testing.T) {
	c := newTestCluster(t, 2)
	a, b := c.dial(0), c.dial(1)
	a.send("A h k 100 0")
	a.expect("A 1 h k")
	start := time.Now()
	b.send("A w k 30000 10000")
	b.expect("A 2 w k")
	// The lease ends MaxClockSkew (500ms) after its deadline on the leader's clock.
	if d := time.Since(start); d < 100*time.Millisecond+c.nodes[0].opt.MaxClockSkew-50*time.Millisecond {
		t.Fatalf("hand-over after %v, before lease + skew", d)
	}
	// Until the Expire commits the holder can release with its token: here
	// it already has, so its token no longer matches.
	a.send("R 1 k")
	a.expect("N 1 k")
	c.checkReplicasAgree()
}

// With the timer loop's idle sleep at an hour, waits and leases still end
// on time: the loop is woken by the Update that sets a timer, and, on a
// node that becomes a shard's leader, by the leader change.
func TestClusterTimersRunOnKicks(t *testing.T) {
	c := newTestClusterWith(t, 1, func(o *Options) { o.timerIdle = time.Hour; o.MaxClockSkew = 50 * time.Millisecond })
	leader := c.leaderOf("k")
	other := (leader + 1) % 3
	a, b := c.dial(other), c.dial(other)
	a.send("A h k 60000 0")
	a.expect("A 1 h k")
	b.send("A w k 60000 300") // its wait ends before the lease
	b.expect("T w k")
	a.send("A x e 200 0")
	a.expect("A 2 x e")
	b.send("A y e 60000 10000")
	b.expect("A 3 y e") // after the lease and the skew
	// A wait queued while another node leads, which then stops: the node
	// that takes the shard over ends it.
	b.send("A z k 60000 1500")
	time.Sleep(200 * time.Millisecond)
	c.stop(leader)
	b.expect("T z k")
}

// checkReplicasAgree waits until every node has applied the same index of
// each shard and compares the replicas' state digests.
func (c *testCluster) checkReplicasAgree() {
	c.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var sts [][]ShardStatus
		for _, n := range c.nodes {
			if n != nil {
				sts = append(sts, n.Status(true))
			}
		}
		same := true
		for s := range sts[0] {
			for _, o := range sts[1:] {
				if o[s].Applied != sts[0][s].Applied {
					same = false
				} else if o[s].Digest != sts[0][s].Digest {
					c.t.Fatalf("shard %d: replicas at index %d differ: %s vs %s", s, o[s].Applied, sts[0][s].Digest, o[s].Digest)
				}
			}
		}
		if same {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("replicas did not reach the same index: %+v", sts)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// leaderOf returns the index of the node that leads the shard of key.
func (c *testCluster) leaderOf(key string) int {
	c.t.Helper()
	for _, n := range c.nodes {
		if n == nil {
			continue
		}
		g := n.grps[n.shardOf([]byte(key))]
		if id := g.leader.Load(); id != 0 {
			return int(id) - 1
		}
	}
	c.t.Fatal("no leader known")
	return -1
}

func TestClusterLeaderStopKeepsLocksAndTokens(t *testing.T) {
	c := newTestCluster(t, 2)
	lead := c.leaderOf("k")
	other := (lead + 1) % 3
	a := c.dial(other)
	a.send("A h k 60000 0")
	a.expect("A 1 h k")
	c.stop(lead)
	// A new leader takes over with the lock still held under the same token.
	b := c.dial((lead + 2) % 3)
	b.send("A x k 60000 0")
	b.expect("T x k")
	b.send("R 1 k")
	b.expect("R 1 k")
	b.send("A x k 60000 0")
	b.expect("A 2 x k")
	// The node comes back (its log catches up) and agrees with the others.
	c.start(lead)
	c.waitReady()
	c.checkReplicasAgree()
}

// A node restarted after missing entries is not ready until it has applied
// what its shards had committed: a rolling restart that waits for /readyz
// takes the next node down only then.
func TestClusterRestartedNodeIsReadyOnlyOnceCaughtUp(t *testing.T) {
	c := newTestCluster(t, 2)
	c.stop(2)
	a := c.dial(0)
	for round := range 40 {
		for i := range 50 {
			a.send(fmt.Sprintf("A h k%d-%d 600000 0", round, i))
		}
		for range 50 {
			_ = a.c.SetReadDeadline(time.Now().Add(10 * time.Second))
			if l, err := a.r.ReadString('\n'); err != nil || l[0] != 'A' {
				t.Fatalf("got %q (%v)", l, err)
			}
		}
	}
	committed := c.nodes[0].Status(false)
	c.start(2)
	deadline := time.Now().Add(30 * time.Second)
	for !c.nodes[2].Ready() {
		if time.Now().After(deadline) {
			t.Fatal("the restarted node is not ready within 30s")
		}
		time.Sleep(time.Millisecond)
	}
	for s, st := range c.nodes[2].Status(false) {
		if st.Applied < committed[s].Applied {
			t.Fatalf("shard %d: ready at index %d, before the %d committed while it was down", s, st.Applied, committed[s].Applied)
		}
	}
}

func TestClusterWholeRestartKeepsHolders(t *testing.T) {
	c := newTestCluster(t, 2)
	a := c.dial(0)
	for i := range 20 {
		a.send(fmt.Sprintf("A h k%d 600000 0", i))
	}
	got := map[string]bool{}
	for range 20 {
		_ = a.c.SetReadDeadline(time.Now().Add(10 * time.Second))
		l, err := a.r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		got[strings.TrimSpace(l)] = true
	}
	c.stopAll()
	for i := range 3 {
		c.start(i)
	}
	c.waitReady()
	b := c.dial(1)
	for l := range got {
		f := strings.Fields(l) // A token owner key
		b.send("A y " + f[3] + " 600000 0")
		b.expect("T y " + f[3])
		b.send("R " + f[1] + " " + f[3])
		b.expect("R " + f[1] + " " + f[3])
	}
	c.checkReplicasAgree()
}

func TestClusterWithoutQuorumAnswersUnavailable(t *testing.T) {
	c := newTestClusterWith(t, 1, func(o *Options) { o.UnavailableTimeout = time.Second })
	h, w := c.dial(0), c.dial(0)
	h.send("A h k 60000 0")
	h.expect("A 1 h k")
	w.send("A w k 60000 60000") // queued; its wait can be neither granted nor ended without quorum
	time.Sleep(300 * time.Millisecond)
	c.stop(1)
	c.stop(2)
	start := time.Now()
	h.send("A o j 1000 0")
	for _, l := range []*line{h, w} {
		l.expect("E unavailable a shard of this request has no quorum; outcome unknown, try another node")
		_ = l.c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if extra, err := l.r.ReadString('\n'); err == nil {
			t.Fatalf("connection still open after E: %q", extra)
		}
	}
	if d := time.Since(start); d > 6*time.Second {
		t.Fatalf("E after %v", d)
	}
}

// A node that knows no leader for a shard (here its peers are down; a cut
// from the leader alone does the same) answers E unavailable once the
// leaderless timeout has passed, not after the unavailable timeout, so
// that its clients move to a node that can serve them.
func TestClusterLeaderlessAnswersUnavailableEarly(t *testing.T) {
	c := newTestClusterWith(t, 1, func(o *Options) { o.UnavailableTimeout = time.Minute })
	h := c.dial(0)
	h.send("A h k 60000 0")
	h.expect("A 1 h k")
	c.stop(1)
	c.stop(2)
	start := time.Now()
	h.send("A o j 1000 0")
	h.expect("E unavailable a shard of this request has no quorum; outcome unknown, try another node")
	// The expect above waits 10s at most, a sixth of the unavailable
	// timeout: against the leaderless timeout (four election timeouts,
	// 0.8s here) plus an election timeout to lose the leader, a wide margin.
	t.Logf("E unavailable after %v", time.Since(start))
}

func TestClusterLaggingNodeCatchesUpFromSnapshot(t *testing.T) {
	cl := newTestClusterWith(t, 2, func(o *Options) { o.SnapshotEntries = 50 })
	cl.stop(2)
	a := cl.dial(0)
	for i := range 400 {
		a.send(fmt.Sprintf("A o%d key%d 600000 0", i, i%37))
		if _, err := a.r.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	cl.start(2)
	cl.waitReady()
	cl.checkReplicasAgree()
	if cl.nodes[2].stats.snapshotsReceived.Load() == 0 {
		t.Fatal("the lagging node caught up without a snapshot: the test did not test that")
	}
	// Every restore's index is reported to its replica (SnapshotRecovered,
	// delivered apart from the entries that may come first).
	for s, g := range cl.nodes[2].grps {
		f := g.fsm.Load()
		r := 0
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			f.mu.Lock()
			r = f.recovering
			f.mu.Unlock()
			if r == 0 || time.Now().After(deadline) {
				break
			}
		}
		if r != 0 {
			t.Fatalf("shard %d: %d restores without their index", s, r)
		}
	}
}

// replaceThird replaces node 3, which is down, by node 4 at a new address,
// through node 1; node 4 gets node 3's slot with an empty data dir, not
// started yet.
func (c *testCluster) replaceThird(ctx context.Context) {
	c.t.Helper()
	addr4 := freePort(c.t)
	if err := c.nodes[0].Replace(ctx, 3, 4, addr4); err != nil {
		c.t.Fatal(err)
	}
	delete(c.peers, 3)
	c.peers[4] = addr4
	c.dirs[2] = c.t.TempDir()
}

// loseThird stops the third node, as if its disk were lost, replaces it
// by node 4 (within d), and starts node 4 in its slot, joining.
func (c *testCluster) loseThird(d time.Duration) {
	c.t.Helper()
	c.stop(2)
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	c.replaceThird(ctx)
	c.startAs(2, 4, true)
	c.waitReady()
}

func TestClusterReplacesALostNode(t *testing.T) {
	c := newTestCluster(t, 3) // shard 2 prefers the third node: 3, then 4
	a := c.dial(0)
	a.send("A h k 600000 0")
	a.expect("A 1 h k")
	c.loseThird(20 * time.Second)
	// The nodes that kept running spread leadership over the new members
	// without a restart: shard 2 goes to node 4.
	deadline := time.Now().Add(15 * time.Second)
	for i := range c.nodes {
		for !slices.Equal(c.nodes[i].members.Load().ids, []uint32{1, 2, 4}) {
			if time.Now().After(deadline) {
				t.Fatalf("node %d spreads leadership over %v", c.nodes[i].opt.NodeID, c.nodes[i].members.Load().ids)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	for c.leads()[2] != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("shard 2 is led from slot %d, not by node 4", c.leads()[2])
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Node 4 serves the lock held before, and the cluster survives losing
	// node 1 now: 2 and 4 are a majority of the new membership.
	x := c.dial(2)
	x.send("A x k 1000 0")
	x.expect("T x k")
	c.checkReplicasAgree()
	// Node 3's id cannot come back: raft does not take a removed id.
	if err := c.nodes[1].Replace(t.Context(), 4, 3, freePort(t)); err == nil || !strings.Contains(err.Error(), "removed") {
		t.Fatalf("a replace by the removed id 3: %v", err)
	}
	c.stop(0)
	y := c.dial(1)
	y.send("R 1 k")
	y.expect("R 1 k")
}

// A new node whose first start (with --join) stopped before it had started
// every shard joins the rest at its next start without the flag: --join is
// for the first start only, and bootstrapping them would make it a founder
// of shards that exist without it.
func TestClusterJoinOutlivesAStartThatStopped(t *testing.T) {
	c := newTestCluster(t, 3)
	c.stop(2)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c.replaceThird(ctx)
	opt := c.options(4, c.dirs[2])
	opt.Join = true
	startFault = func(i int) error {
		if i == 0 {
			return errors.New("stopped after the first shard")
		}
		return nil
	}
	_, err := Start(opt)
	startFault = nil
	if err == nil {
		t.Fatal("the start did not stop")
	}
	var id identity
	if b, err := os.ReadFile(filepath.Join(c.dirs[2], identityFile)); err != nil || json.Unmarshal(b, &id) != nil || !id.Join {
		t.Fatalf("%s does not record the join: %s %v", identityFile, b, err)
	}
	c.startAs(2, 4, false)
	c.waitReady()
	for s, st := range c.nodes[2].Status(false) {
		if st.Leader == 0 || st.Applied == 0 {
			t.Fatalf("shard %d on the new node: %+v", s, st)
		}
	}
	c.checkReplicasAgree()
	x := c.dial(2)
	for i := range 6 { // keys on every shard
		x.send(fmt.Sprintf("A x k%d 1000 0", i))
		_ = x.c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if l, err := x.r.ReadString('\n'); err != nil || !strings.HasPrefix(l, "A ") || !strings.HasSuffix(l, fmt.Sprintf(" x k%d\n", i)) {
			t.Fatalf("got %q (%v), want a grant of k%d", l, err, i)
		}
	}
}

// The acquires queued through a node that went down (or was replaced) are
// withdrawn by the leader once it has been out of reach for a while: left
// queued, each would be granted in turn to nobody, and hold the key for its
// lease before the clients waiting elsewhere got it.
func TestClusterLostNodesAcquiresAreWithdrawn(t *testing.T) {
	c := newTestClusterWith(t, 1, func(o *Options) { o.UnavailableTimeout = time.Second })
	h, waiters, _ := c.crashWithAWaiter(60000)
	for deadline := time.Now().Add(15 * time.Second); waiters() != 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the acquire queued through the lost node is still queued")
		}
	}
	c.nextWaiterGetsK(h)
	var reaped int64
	for _, n := range c.nodes[:2] {
		reaped += n.Counters().LostNodeWithdrawals
	}
	if reaped == 0 {
		t.Error("no withdraw counted")
	}
}

// The acquires queued through a node that a replace took out are withdrawn
// at the leader's next pass, not once it has led for two unavailable
// timeouts: every leadership change (a replace hands the new node its
// shards) put that off again, and meanwhile the key went to nobody and
// stayed held for the lost waiter's lease (a review: 14 s and more).
func TestClusterReplacedNodesAcquiresAreWithdrawnAtOnce(t *testing.T) {
	const unavailable = 10 * time.Second // a pass every 5 s; led for 20 s before the rule for nodes out of reach
	// Its address does not refuse either, as when its host is gone: the
	// rule for a process gone does not take the acquires out first.
	neverRefused(t)
	c := newTestClusterWith(t, 1, func(o *Options) { o.UnavailableTimeout = unavailable })
	// Node 3 goes down as in a crash, and is replaced by node 4 (not
	// started: nobody needs it to take the lost node's acquires out).
	h, waiters, _ := c.crashWithAWaiter(600000)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c.replaceThird(ctx)
	replaced := time.Now()
	// Within a pass and its commit, well before the leader (elected as the
	// cluster started, seconds ago) has led for 20 s.
	for waiters() != 0 {
		if time.Since(replaced) > unavailable {
			t.Fatalf("the acquire queued through the replaced node is still queued %v after the replace", time.Since(replaced))
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.nextWaiterGetsK(h)
}

// The acquires queued through a node whose process is gone (its raft
// address refuses connections, as after a kill -9) are withdrawn as soon as
// the leader sees the refusal, not after two unavailable timeouts: its
// connections closed with it, and a release meanwhile handed the key to the
// dead waiter, held for its lease (a review: 15 s and more).
func TestClusterCrashedNodesAcquiresAreWithdrawnAtOnce(t *testing.T) {
	const unavailable = 10 * time.Second // a pass every 5 s; out of reach for 20 s before the rule for nodes cut off
	c := newTestClusterWith(t, 1, func(o *Options) { o.UnavailableTimeout = unavailable })
	h, waiters, crashed := c.crashWithAWaiter(600000)
	// Within a commit of the failed connection's pass, well before the
	// ticker's next pass.
	for waiters() != 0 {
		if time.Since(crashed) > unavailable/4 {
			t.Fatalf("the acquire queued through the crashed node is still queued %v after the crash", time.Since(crashed))
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.nextWaiterGetsK(h)
}

// A node out of reach whose address does not refuse (cut off, not gone)
// keeps its acquires until the rule for nodes cut off: its own clients are
// told first.
func TestClusterCutOffNodesAcquiresWaitTheirTurn(t *testing.T) {
	const unavailable = 2 * time.Second
	neverRefused(t) // a cut that drops, as a partition does
	c := newTestClusterWith(t, 1, func(o *Options) { o.UnavailableTimeout = unavailable })
	_, waiters, cut := c.crashWithAWaiter(600000)
	for waiters() != 0 {
		time.Sleep(20 * time.Millisecond)
	}
	if d := time.Since(cut); d < lostAfter*unavailable-unavailable/2 {
		t.Fatalf("withdrawn %v after the cut, before %v out of reach", d, lostAfter*unavailable)
	}
}

// neverRefused has no address refuse for the rest of t, the cluster's
// goroutines included (they stop in a cleanup registered later, which runs
// first).
func neverRefused(t *testing.T) {
	old := refused
	t.Cleanup(func() { refused = old })
	refused = func(context.Context, string) bool { return false }
}

// crashWithAWaiter has node 1's client h hold k (token 1) and w queue an
// acquire of k through node 3 (lease and wait leaseMs), then takes node 3
// down as in a crash: nothing withdraws its acquires on its way out.
// waiters counts the acquires queued, as node 1 applied them; down is when
// node 3 began to go.
func (c *testCluster) crashWithAWaiter(leaseMs int) (h *line, waiters func() int, down time.Time) {
	c.t.Helper()
	h = c.dial(0)
	h.send("A h k 60000 0")
	h.expect("A 1 h k")
	w := c.dial(2)
	w.send(fmt.Sprintf("A w k %d %d", leaseMs, leaseMs))
	waiters = func() int { return c.nodes[0].Stats().Waiters }
	for deadline := time.Now().Add(10 * time.Second); waiters() != 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			c.t.Fatal("w's acquire was not queued")
		}
	}
	down = time.Now()
	_ = c.nodes[2].Close()
	// Its connections close at once, as in a crash, without lingering
	// until their clients read.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_ = c.srvs[2].Stop(ctx)
	c.nodes[2], c.srvs[2] = nil, nil
	return h, waiters, down
}

// nextWaiterGetsK has x queue for k through node 2 and h release it: x
// gets it next (token 2), the lost node's waiter being gone.
func (c *testCluster) nextWaiterGetsK(h *line) {
	c.t.Helper()
	x := c.dial(1)
	x.send("A x k 60000 30000")
	h.send("R 1 k")
	h.expect("R 1 k")
	x.expect("A 2 x k")
}

// A replace with a wrong id or address is refused before any shard
// changes: taking out a live node (with the lost one still counted) would
// leave its shards without a quorum for good, and adding a member that is
// one already, or at another's address, would leave shards with members
// nobody starts.
func TestReplaceRefusesWrongIDs(t *testing.T) {
	defer func(d time.Duration) { replaceSeenDown = d }(replaceSeenDown)
	replaceSeenDown = 500 * time.Millisecond
	c := newTestCluster(t, 2)
	c.stop(2) // node 3 is lost
	n := c.nodes[0]
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, r := range []struct {
		old, new uint32
		addr     string
		want     string
	}{
		{2, 4, freePort(t), "node 2 is up"},
		{1, 4, freePort(t), "node 1 is this node"},
		{3, 2, c.peers[2], "node 2 is already a member"},
		{7, 4, freePort(t), "node 7 is not a member"},
		{3, 4, c.peers[2], "is the raft address of node 2"},
		{3, 4, "garbage", "not a raft address"},
		{3, 4, "", "not a raft address"},
		{3, 3, freePort(t), "two different positive node ids"},
	} {
		// Refused as asked (the admin answers 409, which a script does
		// not retry), not for want of a quorum (503).
		err := n.Replace(ctx, r.old, r.new, r.addr)
		if err == nil || !strings.Contains(err.Error(), r.want) || !errors.Is(err, ErrRefused) {
			t.Fatalf("Replace(%d, %d, %s) = %v, want %q, a refusal", r.old, r.new, r.addr, err, r.want)
		}
	}
	// The replacement, given node 3's own address, was started before the
	// replace: refused all the same, and told so, where it said node 3 was
	// up.
	ln, err := net.Listen("tcp", c.peers[3])
	if err != nil {
		t.Fatal(err)
	}
	err = n.Replace(ctx, 3, 4, c.peers[3])
	ln.Close()
	if err == nil || !strings.Contains(err.Error(), "was started before the replace") || !errors.Is(err, ErrRefused) {
		t.Fatalf("Replace(3, 4) at node 3's address, taken by the replacement: %v", err)
	}
	info := n.nh.GetNodeHostInfo(dragonboat.NodeHostInfoOption{SkipLogInfo: true})
	for _, si := range info.ShardInfoList {
		if len(si.Replicas) != 3 {
			t.Fatalf("shard %d has members %v after refused replaces", si.ShardID-1, si.Replicas)
		}
	}
}

// A node taken out of its shards while it runs (here node 1 cannot tell it
// is up, as when only its link to node 1 is cut) applies its own removal:
// it stops, saying why, rather than answer ready and serve nothing.
func TestNodeRemovedWhileRunningStops(t *testing.T) {
	c := newTestCluster(t, 2)
	n, victim := c.nodes[0], c.nodes[2]
	defer func(f func(context.Context, string) bool) { listening = f }(listening)
	listening = func(context.Context, string) bool { return false } // node 1's link to it is cut
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := n.Replace(ctx, 3, 4, freePort(t)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-victim.Failed():
		if err := victim.Err(); err == nil || !strings.Contains(err.Error(), "was removed from shard") {
			t.Fatalf("the removed node stopped with %v", err)
		}
		if victim.Ready() {
			t.Fatal("the removed node answers ready")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the removed node runs on")
	}
}

// A replace asked of a node that has stopped is refused, not a panic.
func TestReplaceOnAStoppedNodeFails(t *testing.T) {
	c := newTestCluster(t, 1)
	n := c.nodes[0]
	c.stop(0)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := n.Replace(ctx, 3, 4, freePort(t)); err == nil {
		t.Fatal("a stopped node replaced a member")
	}
}

// A Replace still running when its node stops ends with it, and the node's
// Close waits for a NodeHost call the Replace is making rather than closing
// the NodeHost under it (the two raced inside Dragonboat).
func TestReplaceEndsWhenItsNodeStops(t *testing.T) {
	var closed atomic.Bool // node 1's Close returned
	var closedInAttempt atomic.Bool
	held := make(chan struct{})
	c := newTestClusterWith(t, 2, nil)
	n := c.nodes[0]
	c.stop(1)
	c.stop(2) // no quorum: the replace keeps trying
	n.opt.memberAttempt = func() {
		select {
		case <-n.stop:
		default:
			return
		}
		// The node is closing and this attempt is about to use the
		// NodeHost: Close must not get past it.
		defer close(held)
		for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
			if closed.Load() {
				closedInAttempt.Store(true)
				return
			}
		}
	}
	addr := freePort(t)
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		done <- n.Replace(ctx, 3, 4, addr)
	}()
	time.Sleep(1500 * time.Millisecond) // past its reads of the members (1 s each without quorum), into its attempts
	c.stop(0)
	closed.Store(true)
	select {
	case err := <-done:
		if !errors.Is(err, errStopping) {
			t.Fatalf("replace ended with %v, want %v", err, errStopping)
		}
	case <-time.After(time.Minute):
		t.Fatal("the replace outlived its node by a minute")
	}
	select {
	case <-held:
	case <-time.After(time.Minute):
		t.Fatal("no attempt of the replace ran while the node closed")
	}
	if closedInAttempt.Load() {
		t.Fatal("Close returned while a replace was using the NodeHost")
	}
	if err := n.Replace(context.Background(), 3, 4, addr); !errors.Is(err, errStopping) {
		t.Fatalf("a replace on the closed node: %v, want %v", err, errStopping)
	}
}

// leads waits until every shard has a leader that knows it leads, and
// returns, per shard, the slot of that node.
// waitLeads waits until shard i is led by node slot want[i], for within at
// most (balanceLoop spreads leadership).
func (c *testCluster) waitLeads(want []int, within time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(within)
	for !slices.Equal(c.leads(), want) {
		if time.Now().After(deadline) {
			c.t.Fatalf("leadership not spread: %v", c.leads())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (c *testCluster) leads() []int {
	c.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var at []int
		for sh := range c.opt.Shards {
			at = append(at, -1)
			for i, n := range c.nodes {
				if n != nil && n.grps[sh].leader.Load() == uint64(n.opt.NodeID) {
					at[sh] = i
				}
			}
		}
		if !slices.Contains(at, -1) {
			return at
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("shards without a leader that knows it: %v", at)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A node that stops cleanly hands its shards' leadership over first: when
// its shutdown returns, each of them already has a leader among the others,
// with no election timeout to sit out. It gets them back once it returns.
func TestClusterCleanStopHandsLeadershipOver(t *testing.T) {
	const shards = 6
	c := newTestCluster(t, shards)
	// Wait for balanceLoop to spread leadership: shard i prefers node i mod 3.
	c.waitLeads([]int{0, 1, 2, 0, 1, 2}, 15*time.Second)
	keys := make([]string, shards) // a key on each shard
	for i := 0; slices.Contains(keys, ""); i++ {
		k := fmt.Sprintf("k%d", i)
		if sh := c.nodes[0].shardOf([]byte(k)); keys[sh] == "" {
			keys[sh] = k
		}
	}
	a := c.dial(1)
	for _, k := range keys {
		a.send("A h " + k + " 60000 0")
		a.expect("A 1 h " + k)
	}

	c.stop(0)
	// The stopped node waited until it knew the new leaders; they may take
	// a moment longer to report it themselves, far less than the election
	// timeout (200ms) that the others would otherwise sit out.
	to := make([]int, shards)
	for sh := range shards {
		to[sh] = -1
		for wait := time.Now().Add(100 * time.Millisecond); to[sh] < 0 && time.Now().Before(wait); {
			for i, n := range c.nodes {
				if n != nil && n.grps[sh].leader.Load() == uint64(n.opt.NodeID) {
					to[sh] = i
				}
			}
			time.Sleep(time.Millisecond)
		}
		if to[sh] < 0 {
			t.Errorf("shard %d: no leader among the nodes left within 100ms of the stopped node's shutdown", sh)
		}
	}
	// Its shards (0 and 3) were spread over the other two, which know they
	// were handed over (so they do not hand them back to a node on its way
	// out).
	if to[0] == to[3] {
		t.Errorf("the stopped node's shards went to nodes %d and %d, want one each", to[0], to[3])
	}
	for _, sh := range []int{0, 3} {
		if i := to[sh]; i > 0 && c.nodes[i].grps[sh].handedAt.Load() == nil {
			t.Errorf("shard %d: node %d does not know it was handed the shard", sh, i+1)
		}
	}
	// The locks are where they were, and the shards answer.
	b := c.dial(2)
	for _, k := range keys {
		b.send("A x " + k + " 60000 0")
		b.expect("T x " + k)
		b.send("R 1 " + k)
		b.expect("R 1 " + k)
	}

	// Back, it leads its shards again.
	c.start(0)
	deadline := time.Now().Add(15 * time.Second)
	for !slices.Equal(c.leads(), []int{0, 1, 2, 0, 1, 2}) {
		if time.Now().After(deadline) {
			t.Fatalf("leadership not given back: %v", c.leads())
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.checkReplicasAgree()
}

// A node that stops carries out and answers every request it has read, even
// those still committing, before it closes the connection; a request it
// reads after that is neither carried out nor answered.
func TestClusterStopAnswersWhatItTook(t *testing.T) {
	c := newTestCluster(t, 4)
	n0 := c.nodes[0]
	const count = 64
	var keys []string // on shards another node leads: each commit takes a round trip
	for i := 0; len(keys) < count; i++ {
		k := fmt.Sprintf("s%d", i)
		if n0.grps[n0.shardOf([]byte(k))].leader.Load() != uint64(n0.opt.NodeID) {
			keys = append(keys, k)
		}
	}
	a := c.dial(0)
	var req []byte
	for _, k := range keys {
		req = fmt.Appendf(req, "A o %s 60000 0\n", k)
	}
	if _, err := a.c.Write(req); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for c.srvs[0].Stats().Acquires < count {
		if time.Now().After(deadline) {
			t.Fatalf("the node read %d of %d acquires", c.srvs[0].Stats().Acquires, count)
		}
		time.Sleep(time.Millisecond)
	}
	n0.Quiesce()
	if n0.Ready() {
		t.Fatal("a stopping node answers ready")
	}
	a.send("A o late 60000 0")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = c.srvs[0].Stop(ctx)
	_ = n0.Shutdown(ctx)
	c.nodes[0], c.srvs[0] = nil, nil

	_ = a.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	seen := map[string]bool{}
	for {
		line, err := a.r.ReadString('\n')
		if err != nil {
			break
		}
		f := strings.Fields(line)
		if len(f) != 4 || f[0] != "A" || f[2] != "o" {
			t.Fatalf("answer %q, want a grant to o", line)
		}
		seen[f[3]] = true
	}
	for _, k := range keys {
		if !seen[k] {
			t.Errorf("no answer to the acquire of %s before the connection closed", k)
		}
	}
	if seen["late"] {
		t.Error("the acquire sent after the node began to stop was answered")
	}
	b := c.dial(1)
	b.send("A x late 60000 0")
	line, err := b.r.ReadString('\n')
	if f := strings.Fields(line); err != nil || len(f) != 4 || f[0] != "A" || f[2] != "x" {
		t.Fatalf("late was taken by the request read after the stop began: %q %v", line, err)
	}
}

// A node whose raft state is gone but whose data dir says it had one is
// refused: started, it would bootstrap again with its votes and the
// entries it acknowledged forgotten, and with another node down a
// committed grant could be lost and its token given out again. So is one
// whose raft/ is there but empty (a separate mount that failed and left
// its mountpoint, files deleted): none of its shards is in it.
func TestClusterRefusesADataDirThatLostItsRaftState(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		empty      bool
	}{
		{"raft/ gone", "raft state", false},
		{"raft/ empty", "holds none of its shards", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newTestCluster(t, 2)
			c.stop(2)
			raft := filepath.Join(c.dirs[2], "raft")
			if err := os.RemoveAll(raft); err != nil {
				t.Fatal(err)
			}
			if tc.empty {
				if err := os.Mkdir(raft, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			n, err := Start(c.options(3, c.dirs[2]))
			if err == nil {
				n.Close()
				t.Fatalf("a node with %s started", tc.name)
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), c.dirs[2]) {
				t.Errorf("refusal %q does not say what is wrong and where", err)
			}
		})
	}
}

// A node whose data dir looks new while its lost+found holds entries (a
// file system check moved its files there) is refused: bootstrapped again
// under its id, it would have forgotten its votes and what it acknowledged.
func TestClusterRefusesANewLookingDataDirWithFilesInLostFound(t *testing.T) {
	c := newTestCluster(t, 2)
	c.stop(2)
	dir := c.dirs[2]
	if err := fscktest.IntoLostFound(dir); err != nil {
		t.Fatal(err)
	}
	n, err := Start(c.options(3, dir))
	if err == nil {
		n.Close()
		t.Fatal("a node whose files were in lost+found started as new")
	}
	if !strings.Contains(err.Error(), "lost+found") || !strings.Contains(err.Error(), dir) {
		t.Errorf("refusal %q does not say what is wrong and where", err)
	}
}

// A data dir restored from a copy has forgotten what it acknowledged: the
// node stops, saying so, rather than answer E unavailable for ever (every
// batch it proposes is refused as an earlier run's).
func TestClusterNodeOnARestoredDataDirStops(t *testing.T) {
	c := newTestCluster(t, 2)
	c.stop(2)
	backup := filepath.Join(t.TempDir(), "copy")
	if out, err := exec.Command("cp", "-a", c.dirs[2], backup).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
	for range 2 { // the node runs on: its incarnation moves past the copy's
		c.start(2)
		c.waitReady()
		c.stop(2)
	}
	// A leader that knows how far node 3's log went would see it shorter
	// and Dragonboat would panic (log.go says why): here every node starts
	// again, and nothing tells the node's log is behind but the log's
	// entries of its later runs.
	c.stopAll()
	if err := os.RemoveAll(c.dirs[2]); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(backup, c.dirs[2]); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		c.start(i)
	}
	select {
	case <-c.nodes[2].Failed():
	case <-time.After(20 * time.Second):
		t.Fatal("the node on a restored data dir did not stop")
	}
	if err := c.nodes[2].Err(); !strings.Contains(err.Error(), "restored from a copy") {
		t.Fatalf("stopped with %v", err)
	}
}

// The limits decide answers in the state machine, so a node restarted with
// others must not replay the log to other outcomes than its peers (and its
// own clients saw): it replays it under the limits the log holds, and stops
// before it takes a request.
func TestClusterNodeRestartedWithOtherLimitsStops(t *testing.T) {
	c := newTestCluster(t, 1)
	a := c.dial(0)
	for _, k := range []string{"k1", "k2", "k3"} {
		a.send("A o " + k + " 60000 0")
		a.expectGrant("o", k)
	}
	c.stop(2)
	c.opt.MaxKeys = 1
	c.start(2)
	select {
	case <-c.nodes[2].Failed():
	case <-time.After(20 * time.Second):
		t.Fatal("a node restarted with other limits did not stop")
	}
	if err := c.nodes[2].Err(); !strings.Contains(err.Error(), "--max-keys") {
		t.Errorf("Err() = %q does not name the limits", err)
	}
	c.checkReplicasAgree() // its replica too: the log replayed alike
	c.stop(2)
	c.opt.MaxKeys = 0
	c.start(2) // with the limits the cluster has
	c.waitReady()
}

// A node started with another raft address than its data dir's is refused
// with a message that says so: Dragonboat's own reads like a file
// permission problem.
func TestNodeWithAnotherRaftAddressIsRefusedSayingWhy(t *testing.T) {
	c := newStoppedCluster(t, 1, nil)
	c.start(0)
	c.stop(0)
	opt := c.options(1, c.dirs[0])
	peers := maps.Clone(c.peers)
	peers[1] = freePort(t)
	opt.Peers = peers
	n, err := Start(opt)
	if err == nil {
		n.Close()
		t.Fatal("started with another raft address")
	}
	if !strings.Contains(err.Error(), "another raft address than this node's in --peers") {
		t.Fatalf("the error does not say why: %v", err)
	}
}

// --join on a data dir that has the node's raft state is ignored, and said
// so, as --bootstrap is.
func TestJoinOnADataDirWithStateIsIgnoredSayingSo(t *testing.T) {
	c := newStoppedCluster(t, 1, nil)
	c.start(0)
	c.stop(0)
	opt := c.options(1, c.dirs[0])
	core, logs := observer.New(zap.WarnLevel)
	opt.Logger, opt.Join, opt.Bootstrap = zap.New(core), true, false
	n, err := Start(opt)
	if err != nil {
		t.Fatalf("--join on a data dir with state: %v", err)
	}
	defer n.Close()
	if logs.FilterMessageSnippet("--join ignored").Len() == 0 {
		t.Fatalf("--join on a data dir with state said nothing: %v", logs.All())
	}
}

// A node whose raft flag file was emptied (a crash while it was written, a
// file system check) is refused with an error: Dragonboat's node host
// gives back neither itself nor an error, and the start went on to use it.
func TestClusterRefusesAnEmptiedRaftFlagFile(t *testing.T) {
	c := newTestCluster(t, 1)
	c.stop(2)
	if err := os.Truncate(filepath.Join(c.dirs[2], "raft", "NODEHOST.ID"), 0); err != nil {
		t.Fatal(err)
	}
	n, err := Start(c.options(3, c.dirs[2]))
	if err == nil {
		n.Close()
		t.Fatal("a node with an empty NODEHOST.ID started")
	}
	if !strings.Contains(err.Error(), "damaged") || !strings.Contains(err.Error(), "replacement") {
		t.Errorf("refusal %q does not say that the raft state is damaged and what to do", err)
	}
}

// When Dragonboat finds that the log lost entries the node acknowledged
// (the leader's commit index is past its log's end), the data dir records
// it before the panic ends the process, and every later start is refused:
// each would vote and answer with them forgotten until a heartbeat came.
func TestLostEntriesAreRecordedAndRefused(t *testing.T) {
	dir := t.TempDir()
	peers := map[uint32]string{1: "127.0.0.1:1", 2: "127.0.0.1:2", 3: "127.0.0.1:3"}
	d, err := openDataDir(dir, 1, peers, 1, false, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.raftMade(); err != nil {
		t.Fatal(err)
	}
	lost := d.lostEntries
	prev := lostTo.Swap(&lost)
	defer lostTo.Store(prev)
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("no panic")
			}
		}()
		(&dbLogger{pkg: "raft"}).Panicf("invalid commitTo index %d, lastIndex() %d", 4063, 4037)
	}()
	d.close()
	_, err = openDataDir(dir, 1, peers, 1, false, false)
	if err == nil || !strings.Contains(err.Error(), "lost entries it acknowledged") || !strings.Contains(err.Error(), "4063") {
		t.Fatalf("start after the loss was found: %v; want a refusal that says why", err)
	}
}

// The hook that records lost entries in a data dir ends with its node's
// run: a node closed, or one whose start failed, must not leave it behind
// for a later panic to rewrite its cluster.json from an old copy.
func TestLostEntriesHookEndsWithItsRun(t *testing.T) {
	c := newTestCluster(t, 1)
	c.stopAll()
	if lostTo.Load() != nil {
		t.Fatal("the lost-entries hook outlived the nodes")
	}
	// A start refused after its node host started (raft/ emptied).
	raft := filepath.Join(c.dirs[0], "raft")
	if err := os.RemoveAll(raft); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(raft, 0o755); err != nil {
		t.Fatal(err)
	}
	if n, err := Start(c.options(1, c.dirs[0])); err == nil {
		n.Close()
		t.Fatal("started on an emptied raft/")
	}
	if lostTo.Load() != nil {
		t.Fatal("the lost-entries hook outlived a start that failed")
	}
}

// Only damaged raft state gets the advice to replace the node: a node host
// that fails for another reason (its raft address taken) must not send an
// operator to replace a healthy node.
func TestNodeHostErrorAdvisesAReplaceOnlyForDamage(t *testing.T) {
	c := newStoppedCluster(t, 1, nil)
	ln, err := net.Listen("tcp", c.peers[1])
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	n, err := Start(c.options(1, c.dirs[0]))
	if err == nil {
		n.Close()
		t.Fatal("started with its raft address taken")
	}
	if !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("with its raft address taken: %v", err)
	}
	if strings.Contains(err.Error(), "replacement") {
		t.Errorf("a taken raft address: %q advises a replace", err)
	}
}
