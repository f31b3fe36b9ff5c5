package replica

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/lni/dragonboat/v4"
	"github.com/lni/dragonboat/v4/client"
	"github.com/lni/dragonboat/v4/config"
	"github.com/lni/dragonboat/v4/raftio"
	sm "github.com/lni/dragonboat/v4/statemachine"
	"go.uber.org/zap"

	"github.com/ticketd/ticketd/codec"
	"github.com/ticketd/ticketd/netloop"
	"github.com/ticketd/ticketd/shard"
)

// Options configure a Node. Every node of a cluster must be given the same
// Peers, Shards and limits: they decide what the replicated tables do. The
// first Shards and limits each shard's log records are the shard's, and a
// node started with others stops (see Node.Failed).
type Options struct {
	NodeID uint32
	Peers  map[uint32]string // raft address of every node, this one's included
	// Join: this node replaces a lost one and joins shards that already
	// exist (after Node.Replace on a live node); used on its first start.
	Join bool
	// Bootstrap: the first start of a new cluster, whose nodes found the
	// shards with Peers. Without it or Join, a data dir with no raft
	// state is refused: a node that ran before and finds its data dir
	// empty (a typo in the path, a disk that did not mount) would start
	// afresh, having forgotten its votes and what it acknowledged.
	// Ignored, with a warning, where the data dir has raft state.
	Bootstrap bool
	DataDir   string
	Shards    int

	MaxKeys          int // cluster-wide, split evenly over the shards; 0: unlimited
	MaxWaitersPerKey int
	MaxWaiters       int // cluster-wide, split likewise; 0: unlimited

	RTT                time.Duration // raft tick; default 10ms
	ElectionRTT        uint64        // ticks; default 30
	MaxClockSkew       time.Duration // default 500ms
	UnavailableTimeout time.Duration // default 5s
	LeaderlessTimeout  time.Duration // the same where this node knows no leader; default 4 election timeouts
	ProposeTimeout     time.Duration // one attempt; default two election timeouts
	SnapshotEntries    uint64        // log entries between snapshots; default 20000
	// MaxQueued bounds the clients' commands this node holds on their way
	// through the log (queued for a proposal, or proposed and not yet
	// applied); default DefaultMaxQueued. Past it, connections with more
	// than their share of it stop being read (Crowded), and at twice it
	// every connection does.
	MaxQueued int

	// Optional observers: seconds from proposing a batch to its commit
	// here, and commands per batch.
	ProposeSeconds Observer
	BatchCommands  Observer

	// Clock returns wall time in unix nanoseconds; nil: time.Now. Tests
	// offset it to play a node whose clock is wrong.
	Clock  func() int64
	Logger *zap.Logger

	// timerIdle is the longest the timer loop sleeps (default 100ms); a
	// test sets it long to see the loop driven by its kicks alone.
	timerIdle time.Duration
	// quiesceMax and quietFor stretch quiesce's bound and its quiet tick
	// (see quiesceTime): a test on a machine loaded by the whole suite gives
	// it room without lengthening the ticks, which would take away the
	// load under which transfers fail.
	quiesceMax, quietFor time.Duration
	// memberAttempt, when set, runs before each read of a shard's members
	// for a membership change, with the NodeHost in use: a test holds an
	// attempt there while the node closes.
	memberAttempt func()
	// fs, when set, holds the raft log and snapshots in place of the
	// operating system's (a test's disk that stalls).
	fs config.IFS
}

// election is the election timeout.
func (o *Options) election() time.Duration { return o.RTT * time.Duration(o.ElectionRTT) }

func (o *Options) validate() error {
	if o.NodeID == 0 {
		return errors.New("replica: node id must be positive")
	}
	if _, ok := o.Peers[o.NodeID]; !ok {
		return fmt.Errorf("replica: node %d is not among the peers", o.NodeID)
	}
	if len(o.Peers) < 3 || len(o.Peers)%2 == 0 {
		return fmt.Errorf("replica: %d peers; a cluster has an odd number of nodes, at least 3", len(o.Peers))
	}
	if o.Shards < 1 {
		return errors.New("replica: Shards must be positive")
	}
	if o.RTT <= 0 {
		o.RTT = 10 * time.Millisecond
	}
	if o.ElectionRTT == 0 {
		o.ElectionRTT = 30
	}
	if o.MaxClockSkew < 0 {
		return errors.New("replica: MaxClockSkew must not be negative")
	}
	if o.MaxClockSkew == 0 {
		o.MaxClockSkew = 500 * time.Millisecond
	}
	if o.UnavailableTimeout <= 0 {
		o.UnavailableTimeout = 5 * time.Second
	}
	if o.timerIdle <= 0 {
		o.timerIdle = 100 * time.Millisecond
	}
	if o.LeaderlessTimeout <= 0 {
		o.LeaderlessTimeout = 4 * o.election()
	}
	o.LeaderlessTimeout = min(o.LeaderlessTimeout, o.UnavailableTimeout)
	if o.ProposeTimeout <= 0 {
		// A leader that starts a transfer drops proposals until the new
		// leader is elected or an election timeout has passed (a target
		// still applying entries does not campaign). Those forwarded to it
		// from other nodes are lost without a word and wait out their
		// attempt: two election timeouts retry them soon after the drop
		// ends, yet far above a commit under load (a retry of a batch that
		// did commit is refused by its id).
		o.ProposeTimeout = 2 * o.election()
	}
	if o.SnapshotEntries == 0 {
		o.SnapshotEntries = 20000
	}
	if o.MaxQueued <= 0 {
		o.MaxQueued = DefaultMaxQueued
	}
	if o.Clock == nil {
		o.Clock = func() int64 { return time.Now().UnixNano() }
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	return nil
}

// Observer takes one observation; prometheus.Histogram is one.
type Observer interface{ Observe(float64) }

// DefaultMaxQueued is Options.MaxQueued's default. Five hundred clients that
// pipelined thousands of acquires each without reading put millions of
// commands in flight at once: proposals of tens of megabytes, a node of
// 1.8 GB, replication that kept heartbeats waiting (about 200 leader
// changes in 25 s) and E unavailable for well-behaved clients. A pipelined
// bench of 50 connections at depth 64 holds under 7,000.
const DefaultMaxQueued = 32768

func perShard(total, shards int) int {
	if total <= 0 {
		return 0
	}
	return max(1, total/shards)
}

// Node is cluster mode's netloop.Backend: one Dragonboat NodeHost with a
// replica of every shard.
type Node struct {
	opt Options
	log *zap.Logger
	nh  *dragonboat.NodeHost
	dir *dataDir
	inc uint64
	// members: the cluster's nodes, for spreading leadership. From --peers
	// at start; then from the shards' membership whenever every shard
	// here agrees on it, so that a node replaced (Replace) leaves and its
	// replacement joins the preferences of nodes that keep running.
	members        atomic.Pointer[memberSet]
	membersChanged chan struct{}
	// noticeGaveUpLog: monoNow of the last line about a notice that could
	// not commit (logGiveUp).
	noticeGaveUpLog atomic.Int64
	// peersSaid: the log has said once that --peers is not the members the
	// shards agree on.
	peersSaid atomic.Bool
	lostHook  *func(why string) error // this run's lostTo
	grps      []*group
	srv       atomic.Pointer[netloop.Server]

	mu         sync.Mutex
	reach      map[string]bool      // raft address -> last connection attempt worked
	reachSince map[string]time.Time // raft address -> when its connection last came up
	downSince  map[string]time.Time // raft address -> when it went out of reach (absent: in reach)
	// reconnected: its connection came up again after failing (the node
	// restarted, or was cut off), not for the first time.
	reconnected map[string]bool
	closing     atomic.Bool
	closeOnce   sync.Once
	// probeLoop's: when its write in flight began (monoNow; 0: none), and
	// whether the last one failed or took an unavailable timeout or more;
	// probeSaid under probeMu: the node was logged as not ready for it, and
	// not yet as ready again.
	probing   atomic.Int64
	probeBad  atomic.Bool
	probeMu   sync.Mutex
	probeSaid bool
	stop      chan struct{}
	wg        sync.WaitGroup
	timerKick chan struct{} // capacity 1: see timerLoop
	reapKick  chan struct{} // capacity 1: a peer's connection failed (see reapLoop)
	// An operator's Replace or SetLimits uses the NodeHost from outside the
	// node's goroutines: see enter.
	useMu    sync.RWMutex
	useEnded bool

	setMu sync.Mutex
	set   settings // this node's, announced to every shard (under setMu)
	// limitsMu orders this node's changes of limits; lastLimits is the
	// stamp of its last (see SetLimits).
	limitsMu   sync.Mutex
	lastLimits int64
	started    int64         // n.now() at Start: see announce
	settled    chan struct{} // closed once shard 0 has agreed: see announce
	failed     chan struct{} // closed when the node must stop: see mismatch
	failOnce   sync.Once
	failErr    error // set before failed closes

	stats nodeStats
	// queued counts the clients' commands in the groups' pend and in
	// their batches in flight until they apply here (Options.MaxQueued).
	queued atomic.Int64
}

type nodeStats struct {
	proposals, retries, failed, expiries atomic.Int64
	leaderChanges, orphans, renewals     atomic.Int64
	snapshotsReceived, reaped, givenUp   atomic.Int64
}

// group is one shard on this node: its replica and its proposer.
type group struct {
	n    *Node
	idx  int
	id   uint64 // raft shard id: idx + 1
	sess *client.Session

	fsm atomic.Pointer[fsm]

	mu    sync.Mutex
	pend  []byte // encoded commands waiting for the next proposal
	pendN uint64 // how many
	mine  int64  // how many of them came from this node's clients (Node.queued)
	// minesOut: of the batches in flight, those with clients' commands,
	// and how many (Node.queued), until they apply here or settle.
	minesOut map[uint64]int64
	conns    []uint64            // local connections with a request in pend
	next     uint64              // batch id of the next proposal
	open     map[uint64]struct{} // batch ids in flight: the floor is the least
	force    bool                // propose even an empty batch (see quorumLoop)
	// redo: the commands in pend that no client waits for, withdraws and
	// orphans' releases; a batch given up queues them again, as nobody
	// else would retry them (a withdraw lost left the connection's acquires
	// queued, granted to nobody in turn).
	redo  []byte
	redoN uint64
	// agreed: this node's settings matched the shard's, its notice
	// committed and applied here, so this node has caught up with what the
	// shard had committed when it started (set by the proposer).
	agreed atomic.Bool
	// later holds withdraws until the batches sent before them settle:
	// a retry of one of those committing after the withdraw would queue an
	// acquire of a connection that is gone (see withdraw).
	later []laterCmd
	kick  chan struct{}
	slots chan struct{} // proposals in flight

	out netloop.Outbox // deliver's; the shard's apply goroutine only

	leader     atomic.Uint64 // leader's node id; 0: none known
	leaderless atomic.Int64  // since when no leader is known (monoNow; 0: one is)
	gaveUpLog  atomic.Int64  // monoNow of the last logGiveUp line
	changeMu   sync.Mutex
	changeCh   chan struct{} // closed and replaced at each leader change
	term       atomic.Uint64
	timerRun   atomic.Bool  // a timer proposal is in flight
	reapRun    atomic.Bool  // a withdraw of lost nodes' acquires is in flight (reapLoop)
	ledSince   atomic.Int64 // monoNow of when this node last became the leader (reapLoop)
	lastOK     atomic.Int64 // monoNow of the last proposal of ours that committed
	// stalled counts our proposals given up on the clock (result) whose
	// result has not come yet.
	stalled    atomic.Int64
	transferAt time.Time // the last leader transfer asked for (balanceLoop only)
	// handing is closed when the transfer of this shard's leadership that
	// this node is asking for ends; nil while none is (see transfer).
	handing atomic.Pointer[chan struct{}]
	// hold is set while the shard's leader hands its leadership over (a
	// notice of it was applied): this node's proposals to the shard wait
	// until it ends, so that the log goes quiet (see Node.quiesce).
	hold atomic.Pointer[holdOn]
	// flying counts this node's proposals to the shard sent and not yet
	// settled; drained, while this node quiesces the shard, receives the
	// nodes whose drained notice was applied.
	flying  atomic.Int32
	drained atomic.Pointer[chan uint32]
	// handedAt is when the shard's preferred node handed its leadership to
	// this one (nil: never). A node does that when it stops, so the shard
	// goes back only once it has reconnected since, or after handBackAfter
	// (leadership lost some other way, with the node up). A time.Now, like
	// the reconnection it is compared with: both on the monotonic clock.
	handedAt atomic.Pointer[time.Time]
	// handBackSkips: hand-backs in a row left for a target that had not
	// shown it caught up (handBack); each doubles the wait to the next.
	handBackSkips atomic.Int32
	// replicas: the shard's own voting members (raft address by node id),
	// as last read by refreshMembers; nil until then.
	replicas   atomic.Pointer[map[uint32]string]
	lastLeader atomic.Uint64 // the last leader known, never 0 once set (LeaderUpdated only)
}

const handBackAfter = 10 * time.Second

// handBackEvery is the least time between two hand-backs of a shard.
const handBackEvery = 5 * time.Second

// maxHandBackSkips bounds the hand-backs in a row that handBack leaves
// for a target that has not shown it caught up.
const maxHandBackSkips = 3

// handBackSettle is how long a node's raft connection must have been up
// again before shards go back to it: a node that has just restarted (or
// come back from a cut) is still applying what it missed, with its raft
// steps behind (Dragonboat warns of queued ticks), and a transfer to it
// fails or leaves the shards with a leader that cannot keep up. A first
// connection (the cluster starting) has no backlog and does not wait.
const handBackSettle = 3 * time.Second

const maxInflight = 4 // proposals in flight per shard: fewer, fuller batches under load

// release ends what Start took, once the node host is made: the lost
// entries hook, the node host and the data dir's lock. Close, or a start
// that fails.
func (n *Node) release() {
	lostTo.CompareAndSwap(n.lostHook, nil)
	n.nh.Close()
	n.dir.close()
}

// Start opens the data dir and starts the NodeHost and every shard's replica
// (which replay their logs); Attach then starts proposing and taking requests.
func Start(opt Options) (*Node, error) {
	if err := opt.validate(); err != nil {
		return nil, err
	}
	opt.Peers = maps.Clone(opt.Peers) // read for the node's life: the caller may reuse its map
	setupLogging(opt.Logger)
	set := settings{shards: opt.Shards, limits: limits{MaxKeys: opt.MaxKeys, MaxWaiters: opt.MaxWaiters, MaxWaitersPerKey: opt.MaxWaitersPerKey},
		skew: int64(opt.MaxClockSkew)}
	dir, err := openDataDir(opt.DataDir, opt.NodeID, opt.Peers, opt.Shards, opt.Join, opt.Bootstrap)
	if err != nil {
		return nil, err
	}
	// Left in a unit file, either flag is harmless until the day the disk
	// is lost: then it brings the node back under its old id, its votes
	// and the entries it acknowledged forgotten, and with one more node
	// down a committed grant can be lost and the key granted again (a
	// review did so). The words say that, not only that it is ignored.
	const oldID = "; given to a start on an empty data dir (a disk lost), it would bring this node back under its id with the votes and entries it acknowledged forgotten, " +
		"and the cluster could lose a committed grant and grant its key again: remove the flag from this node's command line now, and bring a node whose disk is lost back as a replacement under a new id (README: replacing a node)"
	if opt.Bootstrap && !dir.fresh {
		opt.Logger.Warn("--bootstrap ignored: the data dir has this node's raft state"+oldID, zap.String("data_dir", opt.DataDir))
	}
	if opt.Join && !dir.fresh {
		opt.Logger.Warn("--join ignored: the data dir has this node's raft state, and the node goes on as the member it is"+oldID, zap.String("data_dir", opt.DataDir))
	}
	n := &Node{
		opt: opt, log: opt.Logger, dir: dir, inc: dir.incarnation,
		reach: make(map[string]bool), reachSince: make(map[string]time.Time), reconnected: make(map[string]bool),
		downSince: make(map[string]time.Time),
		stop:      make(chan struct{}), timerKick: make(chan struct{}, 1), reapKick: make(chan struct{}, 1),
		set: set, settled: make(chan struct{}), failed: make(chan struct{}),
	}
	n.started = n.now()
	n.members.Store(newMemberSet(opt.Peers))
	n.membersChanged = make(chan struct{}, 1)

	tuneDragonboat()
	eng := config.GetDefaultEngineConfig()
	eng.ExecShards = 1 // one fsync per step for all shards: fixed for the life of a deployment
	ldb := config.GetTinyMemLogDBConfig()
	ldb.Shards = 1 // likewise; also keeps preallocated WAL space small
	nhc := config.NodeHostConfig{
		NodeHostDir:         filepath.Join(opt.DataDir, "raft"),
		RTTMillisecond:      uint64(opt.RTT / time.Millisecond),
		RaftAddress:         opt.Peers[opt.NodeID],
		RaftEventListener:   n,
		SystemEventListener: n,
		Expert:              config.ExpertConfig{Engine: eng, LogDB: ldb, FS: opt.fs},
	}
	if err := checkSnapshots(nhc.NodeHostDir, uint64(opt.NodeID), opt.Shards); err != nil {
		dir.close()
		return nil, fmt.Errorf("%w: its replica cannot be rebuilt from this node's files, as the log before it is compacted away; "+
			"bring the node back as a replacement under a new id, on an empty data dir (README: replacing a node)", err)
	}
	nh, err := newNodeHost(nhc)
	if err != nil {
		dir.close()
		if strings.Contains(err.Error(), "not the owner of the data directory") {
			// Dragonboat's words read like a file permission problem.
			return nil, fmt.Errorf("cannot start the raft node host in %q: its raft state belongs to another raft address than this node's in --peers (%s): "+
				"start it with the address it had, or bring the node back at the new one as a replacement with an empty data dir (README: replacing a node): %w",
				nhc.NodeHostDir, nhc.RaftAddress, err)
		}
		if errors.Is(err, errRaftDamaged) {
			return nil, fmt.Errorf("cannot start the raft node host in %q: %w: bring the node back as a replacement under a new id, on an empty data dir (README: replacing a node)", nhc.NodeHostDir, err)
		}
		return nil, fmt.Errorf("cannot start the raft node host in %q: %w", nhc.NodeHostDir, err)
	}
	// Dragonboat's panic on lost entries records them in this data dir
	// (one node per process; the hook ends with this node's run).
	lost := dir.lostEntries
	n.lostHook = &lost
	lostTo.Store(n.lostHook)
	n.nh = nh
	if dir.id.ShardsMade && !anyShard(nh, opt.NodeID, opt.Shards) {
		n.release()
		return nil, fmt.Errorf("data dir %q belongs to node %d, whose raft state under raft/ holds none of its shards: "+
			"starting would forget what it acknowledged; bring the node back as a replacement with an empty data dir (README: replacing a node)",
			dir.path, opt.NodeID)
	}
	if err := dir.raftMade(); err != nil {
		n.release()
		return nil, err
	}
	// Dragonboat records the members at bootstrap; a restart passes none
	// (the log knows them, and they may have changed since), but for a
	// shard this node never started: its first run had another --shards,
	// stopped by mismatch.
	initial := make(map[uint64]dragonboat.Target, len(opt.Peers))
	for id, addr := range opt.Peers {
		initial[uint64(id)] = addr
	}
	bootstrap := func(shardID uint64) (map[uint64]dragonboat.Target, bool) {
		if !dir.fresh && nh.HasNodeInfo(shardID, uint64(opt.NodeID)) {
			return nil, false
		}
		if opt.Join || dir.id.Join {
			return nil, true
		}
		return initial, false
	}
	// The table's limits until the log's first settings notice: only an
	// earlier ticketd's log has entries that depend on them before one, and
	// it ran under the limits it pinned in the data dir, not this run's
	// flags (a node restarted with new ones after a change of limits would
	// replay those entries otherwise than its peers did).
	base := set.limits
	if l := dir.id.Limits; l != nil {
		base = *l
	}
	tcfg := shard.Config{
		MaxKeys:          perShard(base.MaxKeys, opt.Shards),
		MaxWaitersPerKey: base.MaxWaitersPerKey,
		MaxWaiters:       perShard(base.MaxWaiters, opt.Shards),
	}
	n.grps = make([]*group, opt.Shards)
	for i := range n.grps {
		g := &group{n: n, idx: i, id: uint64(i + 1), kick: make(chan struct{}, 1), slots: make(chan struct{}, maxInflight), next: 1,
			open: make(map[uint64]struct{}), minesOut: make(map[uint64]int64)}
		n.grps[i] = g
		create := func(shardID, replicaID uint64) sm.IConcurrentStateMachine {
			f := newFSM(int(shardID-1), opt.NodeID, tcfg, n)
			f.skew, f.timersMoved, f.inc, f.clock = int64(opt.MaxClockSkew), n.kickTimers, n.inc, n.now
			f.maxLate = int64(opt.UnavailableTimeout + opt.ProposeTimeout + opt.MaxClockSkew)
			g.fsm.Store(f)
			return f
		}
		rc := config.Config{
			ReplicaID:    uint64(opt.NodeID),
			ShardID:      g.id,
			ElectionRTT:  opt.ElectionRTT,
			HeartbeatRTT: max(1, opt.ElectionRTT/10),
			CheckQuorum:  true,
			PreVote:      true,
			// A membership change carries the config change id of the
			// members it was checked against, and is refused if they
			// changed since (Replace relies on it: of two at once, only
			// one adds). Without this Dragonboat ignores the id.
			OrderedConfigChange: true,
			SnapshotEntries:     opt.SnapshotEntries,
			CompactionOverhead:  opt.SnapshotEntries / 4,
		}
		members, join := bootstrap(g.id)
		err := nh.StartConcurrentReplica(members, join, create, rc)
		if err == nil && startFault != nil {
			err = startFault(i)
		}
		if err != nil {
			n.release()
			return nil, fmt.Errorf("cannot start shard %d: %w", i, err)
		}
		g.sess = nh.GetNoOPSession(g.id)
	}
	if err := dir.shardsMade(); err != nil {
		n.release()
		return nil, err
	}
	n.log.Info("cluster node started",
		zap.Uint32("node", opt.NodeID), zap.Uint64("incarnation", n.inc),
		zap.Int("shards", opt.Shards), zap.Int("nodes", len(opt.Peers)))
	return n, nil
}

// Attach connects the node to the network side it answers through and starts
// proposing; its first proposal to each shard withdraws the queued acquires
// of this node's earlier run.
func (n *Node) Attach(srv *netloop.Server) {
	n.srv.Store(srv)
	for _, g := range n.grps {
		n.wg.Add(1)
		go g.proposer()
		g.kickNow()
	}
	n.wg.Add(6)
	go n.timerLoop()
	go n.balanceLoop()
	go n.membersLoop()
	go n.quorumLoop()
	go n.reapLoop()
	go n.probeLoop()
	if n.opt.Join || n.dir.id.Join {
		n.wg.Add(1)
		go n.every(joinWarnEvery, n.joinWatch())
	}
}

// joinWarnEvery is how often a joining node that no shard has reached says
// so. A variable for tests.
var joinWarnEvery = 15 * time.Second

// joinWatch is run every joinWarnEvery: until some shard knows a leader,
// it warns that a joining node has heard from none. It joins only once a
// replace on a live node added it, and a wrong --node-id, or a replace not
// run, would leave it unready without a word.
func (n *Node) joinWatch() func() {
	heard := false
	return func() {
		for _, g := range n.grps {
			heard = heard || g.leader.Load() != 0
		}
		if heard {
			return
		}
		n.log.Warn("joining: no shard has heard from its members yet; a node joins once a replace on a live node added it "+
			"(POST /cluster/replace?old=LOST&new=THIS_ID&addr=THIS_RAFT_ADDRESS): check that it ran, and this node's --node-id and raft address; "+
			"at the lost node's raft address, stop this node while the replace runs (it refuses while that address takes connections), then start it again",
			zap.Uint32("node", n.opt.NodeID), zap.String("raft_address", n.opt.Peers[n.opt.NodeID]))
	}
}

// Handle implements netloop.Backend: every request becomes a command in its
// shard's next proposal, each shard's queue locked once per batch; the
// answers come from the replicated log.
func (n *Node) Handle(c *netloop.Conn, reqs []codec.Request, out []byte) ([]byte, int, bool) {
	if n.closing.Load() {
		// Stopping: not carried out, not answered. The connection stays
		// open for the answers to what it sent before, and closes with
		// the network side.
		n.queued.Add(-int64(len(reqs))) // counted by Admit
		return out, 0, false
	}
	local := c.ID()
	from := shard.Requester{Node: n.opt.NodeID, Conn: requesterConn(n.inc, local)}
	seq := c.NextSeq()
	for range len(reqs) - 1 {
		c.NextSeq() // sequences follow the frames' order, whatever the shard
	}
	var grp netloop.ShardGroups
	grp.Group(reqs, len(n.grps))
	var cmd shard.Command
	for i := 0; i < grp.Len(); {
		sh, run := grp.Run(i)
		g := n.grps[sh]
		g.mu.Lock()
		if n.closing.Load() {
			// Quiesce began after the check above: it waits for what the
			// shards hold (idle, under g.mu) and then times out the queued
			// acquires, so what is not in g.pend by now must stay out.
			g.mu.Unlock()
			n.queued.Add(-int64(len(reqs) - i)) // counted by Admit
			break
		}
		i += len(run)
		first := g.pendN == 0
		for _, j := range run {
			q := &reqs[j]
			from.Seq = seq + uint64(j)
			cmd = shard.Command{From: from, Key: q.Key}
			if q.Kind == codec.Acquire {
				cmd.Op, cmd.Owner, cmd.LeaseMs, cmd.WaitMs = shard.OpAcquire, q.Owner, q.LeaseMs, q.WaitMs
				if q.WaitMs > 0 {
					*c.Marks() |= 1 << (sh % 64) // may queue here: Closed withdraws here
				}
			} else {
				cmd.Op, cmd.Token = shard.OpRelease, q.Token
			}
			g.pend = appendCommand(g.pend, &cmd)
			g.pendN++
		}
		g.mine += int64(len(run)) // in Node.queued since Admit
		if len(g.conns) == 0 || g.conns[len(g.conns)-1] != local {
			g.conns = append(g.conns, local)
		}
		g.mu.Unlock()
		if first {
			g.kickNow()
		}
	}
	return out, 0, false
}

func (n *Node) shardOf(key []byte) int {
	if len(n.grps) == 1 {
		return 0
	}
	return shard.Index(key, len(n.grps))
}

// Closed implements netloop.Backend: the connection's queued acquires are
// withdrawn through the log, on the shards where it sent an acquire that
// could queue (by shard index mod 64).
func (n *Node) Closed(c *netloop.Conn) {
	marks := *c.Marks()
	if c.Pending() == 0 || marks == 0 || n.closing.Load() {
		return
	}
	cmd := shard.Command{Op: shard.OpWithdraw, From: shard.Requester{Node: n.opt.NodeID, Conn: requesterConn(n.inc, c.ID())}}
	for i, g := range n.grps {
		if marks&(1<<(i%64)) != 0 {
			g.withdraw(&cmd)
		}
	}
}

// laterCmd is an encoded command that waits until every batch with an id
// below until has settled.
type laterCmd struct {
	until uint64
	cmd   []byte
}

// withdraw queues a connection's withdraw behind everything the connection
// sent: in the batch queued now if none is in flight, else once those in
// flight and the one queued have settled. Batches in flight go out in any
// order when they are retried (a leader change, the end of a hold).
func (g *group) withdraw(cmd *shard.Command) {
	g.mu.Lock()
	if len(g.open) > 0 {
		until := g.next
		if g.pendN > 0 {
			until++ // what is queued goes out as batch next
		}
		g.later = append(g.later, laterCmd{until: until, cmd: appendCommand(nil, cmd)})
		g.mu.Unlock()
		return
	}
	first := g.pendN == 0
	g.pend = appendCommand(g.pend, cmd)
	g.pendN++
	g.redo = appendCommand(g.redo, cmd)
	g.redoN++
	g.mu.Unlock()
	if first {
		g.kickNow()
	}
}

// settle ends a batch in flight and queues the withdraws that waited for it.
func (g *group) settle(id uint64) {
	g.mu.Lock()
	delete(g.open, id)
	low := g.next
	for id := range g.open {
		low = min(low, id)
	}
	first := g.pendN == 0
	moved := false
	keep := g.later[:0]
	for _, l := range g.later {
		if l.until <= low {
			g.pend = append(g.pend, l.cmd...)
			g.pendN++
			g.redo = append(g.redo, l.cmd...)
			g.redoN++
			moved = true
		} else {
			keep = append(keep, l)
		}
	}
	clear(g.later[len(keep):])
	g.later = keep
	g.mu.Unlock()
	if moved && first {
		g.kickNow()
	}
}

// Crowded implements netloop.Crowder: while the node holds MaxQueued of
// its clients' commands on their way through the log, a connection with
// its share of MaxQueued (MaxQueued over the open connections) or more
// requests unanswered, not counting acquires queued for their key (which
// only a release or a timeout ends), is not read. It is read again as its
// answers come or the node drains. Those under their share, depth-1
// clients among them, are read on, so that a few connections that send
// without end keep nobody else waiting behind them, until the node holds
// twice MaxQueued: then none is (the shares of connections that came and
// went as the backlog stood need not add up to MaxQueued).
func (n *Node) Crowded(c *netloop.Conn) bool {
	most := int64(n.opt.MaxQueued)
	q := n.queued.Load()
	if q < most {
		return false
	}
	if q >= 2*most {
		return true
	}
	share := most
	if srv := n.srv.Load(); srv != nil {
		share = max(1, most/max(1, srv.Open()))
	}
	p := int64(c.Pending())
	return p >= share && p-int64(n.Queued(c)) >= share
}

// Admit implements netloop.Crowder: a frame read while c is not Crowded
// is counted at once, before the batch it is in reaches Handle, so that
// frames read at the same time (every event loop's, and those of
// connections whose clients closed their side, parsed off the loops) cannot
// all pass the check together: the node holds at most twice MaxQueued, and
// one frame more per parse running.
func (n *Node) Admit(c *netloop.Conn) bool {
	if n.Crowded(c) {
		return false
	}
	n.queued.Add(1)
	return true
}

// Queued implements netloop.Backend: the connection's acquires that
// committed and wait in their key's queue, on the shards it queued on.
func (n *Node) Queued(c *netloop.Conn) int {
	marks, conn, q := *c.Marks(), requesterConn(n.inc, c.ID()), 0
	for i, g := range n.grps {
		if marks&(1<<(i%64)) == 0 {
			continue
		}
		if f := g.fsm.Load(); f != nil {
			f.mu.Lock()
			q += f.t.QueuedOf(n.opt.NodeID, conn)
			f.mu.Unlock()
		}
	}
	return q
}

// Orphaned implements netloop.Backend: a grant that never reached its client
// is released through the log.
func (n *Node) Orphaned(token uint64, key []byte) {
	n.stats.orphans.Add(1)
	cmd := shard.Command{Op: shard.OpRelease, From: shard.Requester{Node: n.opt.NodeID}, Key: key, Token: token}
	n.grps[n.shardOf(key)].add(&cmd, 0)
}

// deliver implements sink: it writes this node's answers to their
// connections, one post per connection per Update. Answers for an earlier run
// of this node are dropped: whether they reached their client before the
// restart is unknown, so a grant among them stays until its lease ends rather
// than be released under a holder. Runs on the shard's apply goroutine.
func (n *Node) deliver(idx int, ans []shard.Answer) {
	g := n.grps[idx]
	for i := range ans {
		if a := &ans[i]; a.To.Conn>>connBits == n.inc {
			g.out.Add(a.To.Conn&connMask, a)
		}
	}
	var mb netloop.Mailboxes
	if srv := n.srv.Load(); srv != nil {
		mb = srv
	}
	g.out.Flush(mb, n.orphaned)
}

func (n *Node) orphaned(gr netloop.Grant) { n.Orphaned(gr.Token, gr.Key) }

// renew implements sink: it proposes the renewals of grants this replica
// applied too late to answer (fsm.judge). Each is answered when it applies;
// if it is given up, its connection hears E unavailable as for any request.
func (n *Node) renew(idx int, cmds []shard.Command) {
	g := n.grps[idx]
	n.stats.renewals.Add(int64(len(cmds)))
	for i := range cmds {
		g.add(&cmds[i], cmds[i].From.Conn&connMask)
	}
}

// applied implements sink: this run's batches applied here are no longer
// on their way through the log.
func (n *Node) applied(idx int, batches []uint64) {
	g := n.grps[idx]
	for _, id := range batches {
		g.appliedMine(id)
	}
}

// appliedMine takes batch id's clients' commands off Node.queued, once.
func (g *group) appliedMine(id uint64) {
	g.mu.Lock()
	m, ok := g.minesOut[id]
	delete(g.minesOut, id)
	g.mu.Unlock()
	if ok {
		g.n.queued.Add(-m)
	}
}

// lost closes with E unavailable this run's connections whose queued
// acquires a snapshot decided (fsm.lost): granted or timed out, which this
// node cannot tell. A grant among them stays until its lease ends.
func (n *Node) lost(idx int, conns []uint64) {
	var mine []uint64
	for _, c := range conns {
		if c>>connBits == n.inc {
			mine = append(mine, c&connMask)
		}
	}
	if len(mine) > 0 {
		n.log.Warn("answering E unavailable: queued acquires of this node's connections were decided without it (in a snapshot it received, or withdrawn by a leader that could not reach it)",
			zap.Int("shard", idx), zap.Int("connections", len(mine)))
		n.fail(mine, codec.ErrBehind)
	}
}

// behind stops the node: the log holds a later incarnation of it than
// this run's, so its data dir went back (restored from a copy), and every
// batch it proposes is refused as an earlier run's. Its raft state went
// back with it: it must not run again.
func (n *Node) behind(idx int, logInc uint64) {
	n.failOnce.Do(func() {
		n.failErr = fmt.Errorf("this node's data dir is behind the cluster's log (its incarnation %d, shard %d's log has %d): it was restored from a copy (or another process runs as this node), and has forgotten entries it acknowledged; it must not run again: replace it with an empty data dir (README: replacing a node)",
			n.inc, idx, logInc)
		n.log.Error("stopping: data dir restored from a copy", zap.Error(n.failErr))
		close(n.failed)
	})
}

// lapsed closes with E unavailable this run's connections whose grant came
// too late even to renew, or ended before its renewal applied (fsm.judge):
// neither A nor T would be true. A grant still held is released: nobody
// heard of it.
func (n *Node) lapsed(idx int, grants []shard.Answer) {
	var mine []uint64
	for i := range grants {
		if a := &grants[i]; a.To.Conn>>connBits == n.inc {
			mine = append(mine, a.To.Conn&connMask)
		}
	}
	if len(mine) == 0 {
		return
	}
	n.log.Warn("answering E unavailable: this node applied grants too late to answer them",
		zap.Int("shard", idx), zap.Int("connections", len(mine)))
	n.fail(mine, codec.ErrBehind)
	for i := range grants {
		if a := &grants[i]; a.Result == shard.Acquired && a.To.Conn>>connBits == n.inc {
			n.Orphaned(a.Token, a.Key)
		}
	}
}

// add queues cmd for the shard's next proposal; local names the connection
// that waits for its answer (0: none).
func (g *group) add(cmd *shard.Command, local uint64) {
	g.mu.Lock()
	first := g.pendN == 0
	g.pend = appendCommand(g.pend, cmd)
	g.pendN++
	if local == 0 {
		g.redo = appendCommand(g.redo, cmd)
		g.redoN++
	}
	if local != 0 && (len(g.conns) == 0 || g.conns[len(g.conns)-1] != local) {
		g.conns = append(g.conns, local)
	}
	g.mu.Unlock()
	if first {
		g.kickNow()
	}
}

func (g *group) kickNow() {
	select {
	case g.kick <- struct{}{}:
	default:
	}
}

// floor is the lowest batch id of this incarnation still in flight on the
// shard (the next one if none).
func (g *group) floor() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	f := g.next
	for id := range g.open {
		f = min(f, id)
	}
	return f
}

// leaderlessFor is how long this node has known no leader for the shard. A
// node cut off from the leader (a partition, or a bridge: the leader and a
// third node still see each other, so no election ends it) stays so, and
// its requests can go to another node instead of waiting out the
// unavailable timeout. An election passes through it briefly: a few
// ticks, an election timeout more when a vote fails.
func (g *group) leaderlessFor() time.Duration {
	if since := g.leaderless.Load(); since != 0 {
		return sinceMono(since)
	}
	return 0
}

// monoStart anchors monoNow: stamps taken from it measure elapsed time on
// the monotonic clock, which a step of the wall clock does not move.
var monoStart = time.Now()

// monoNow is the time since monoStart in ns, never 0 (0 marks "never").
func monoNow() int64 { return int64(time.Since(monoStart)) + 1 }

// sinceMono is the time elapsed since the monoNow stamp t; forever for 0.
func sinceMono(t int64) time.Duration {
	if t == 0 {
		return math.MaxInt64
	}
	return time.Duration(monoNow() - t)
}

// logGiveUp says why a batch's connections get E unavailable, once a
// second per shard at most: a partition fails every batch. A notice (of
// settings, of a hand-over) answers nobody, and says so once every
// giveUpNoticeEvery for the whole node: retried every second on each
// shard, a node without quorum logged 16 lines a second of them.
func (g *group) logGiveUp(waited, leaderless time.Duration, requests bool) {
	now := monoNow()
	at, every := &g.gaveUpLog, int64(time.Second)
	if !requests {
		at, every = &g.n.noticeGaveUpLog, int64(giveUpNoticeEvery)
	}
	last := at.Load()
	if last != 0 && now-last < every || !at.CompareAndSwap(last, now) {
		return
	}
	msg := "answering E unavailable: a proposal could not commit"
	if !requests {
		msg = "a notice (of settings or a hand-over) could not commit; no connection is answered for it"
	}
	g.n.log.Warn(msg,
		zap.Int("shard", g.idx), zap.Duration("waited", waited),
		zap.Duration("no_leader_for", leaderless), zap.Uint64("leader", g.leader.Load()))
}

// giveUpNoticeEvery spaces a node's lines about notices that could not
// commit.
const giveUpNoticeEvery = 10 * time.Second

// unledFor is how long every shard must have been without a leader, with
// peers in reach, before the node says what may be the cause: a node that
// a replace took out while it was down is never told so.
const unledFor = 30 * time.Second

// unledWithPeers tells whether no shard has known a leader for unledFor
// while some peer's raft connection has worked all that time.
func (n *Node) unledWithPeers() bool {
	for _, g := range n.grps {
		if since := g.leaderless.Load(); since == 0 || sinceMono(since) < unledFor {
			return false
		}
	}
	m := n.members.Load()
	n.mu.Lock()
	defer n.mu.Unlock()
	for id, addr := range m.addrs {
		// In reach all along: a peer that has just come up (a cluster
		// started one node at a time) is in reach before its elections end.
		if id != n.opt.NodeID && n.reach[addr] && time.Since(n.reachSince[addr]) >= unledFor {
			return true
		}
	}
	return false
}

// leaderChanged returns a channel closed at the shard's next leader change.
func (g *group) leaderChanged() <-chan struct{} {
	g.changeMu.Lock()
	defer g.changeMu.Unlock()
	if g.changeCh == nil {
		g.changeCh = make(chan struct{})
	}
	return g.changeCh
}

// startFault, in tests, stops a start after it started shard i, as a crash
// there would.
var startFault func(i int) error

// retryNotice: the proposer tries a notice that gave up again by itself
// (false only in a test of a node whose notice has not committed yet).
var retryNotice = func() *atomic.Bool { var b atomic.Bool; b.Store(true); return &b }()

// proposer turns what add queued into proposals, up to maxInflight at once;
// everything queued while they are in flight goes into the next one.
func (g *group) proposer() {
	defer g.n.wg.Done()
	var changed <-chan struct{}
	retry := time.NewTimer(time.Hour)
	defer retry.Stop()
	for {
		// Until the notice commits, a leader change tries it again, and
		// so does every leaderless timeout (an attempt can give up with
		// the leader unchanged, as behind a slow apply): a node started
		// before its peers, or one that readiness checks keep unused,
		// would otherwise stay unready until its first request.
		var again <-chan time.Time
		if !g.agreed.Load() && g.n.Err() == nil && retryNotice.Load() {
			if changed == nil {
				changed = g.leaderChanged()
			}
			retry.Reset(g.n.opt.LeaderlessTimeout)
			again = retry.C
		}
		select {
		case <-g.n.stop:
			return
		case <-g.kick:
		case <-changed:
			changed = nil
		case <-again:
		}
		if !g.agreed.Load() && retryNotice.Load() {
			// Taken before the attempt: a change while it runs wakes the
			// next wait at once.
			changed = g.leaderChanged()
		}
		if !g.agreed.Load() && !g.announce() {
			continue
		}
		for {
			select {
			case g.slots <- struct{}{}:
			case <-g.n.stop:
				return
			}
			g.mu.Lock()
			if g.pendN == 0 && !g.force {
				g.mu.Unlock()
				<-g.slots
				break
			}
			id := g.next
			g.next++
			g.open[id] = struct{}{}
			h := header{node: g.n.opt.NodeID, inc: g.n.inc, batch: id, count: g.pendN}
			body := append([]byte(nil), g.pend...)
			conns, count := g.conns, g.pendN
			if g.mine > 0 {
				g.minesOut[id] = g.mine
			}
			redo, redoN := append([]byte(nil), g.redo...), g.redoN
			g.pend, g.pendN, g.mine, g.conns, g.force = emptied(g.pend), 0, 0, nil, false
			g.redo, g.redoN = emptied(g.redo), 0
			g.mu.Unlock()
			if o := g.n.opt.BatchCommands; o != nil {
				o.Observe(float64(count))
			}
			g.n.wg.Add(1) // Close waits: Dragonboat's Propose is not safe against its Close
			go func() {
				defer g.n.wg.Done()
				defer func() { <-g.slots }()
				ok, gaveUp := g.proposeOrGiveUp(h, body)
				// Settled either way: committed, or given up (its
				// connections are told E unavailable next, and a copy
				// that commits later is refused below the floor).
				g.settle(h.batch)
				g.appliedMine(h.batch) // if it did not apply here: given up, or stopping
				if !ok {
					g.n.fail(conns, codec.ErrUnavailable)
				}
				if gaveUp {
					// Not when stopping or refused: that would come
					// round again at once.
					g.n.stats.givenUp.Add(1)
					g.requeue(redo, redoN)
				}
			}()
		}
	}
}

// announce commits this node's settings to the shard before anything else
// it proposes there, and checks them against the shard's (see fsm.adopt): a
// node that routes keys or decides B otherwise than the shard's replicas
// must not take requests. If the notice cannot commit, or the settings
// differ, what is queued is answered E unavailable; the next request tries
// again, unless the node is stopping for a mismatch.
//
// Shard 0 is asked first, and decides for the cluster: the other shards
// get this node's notice only once shard 0 has agreed, so every shard's
// first settings are shard 0's. Were each shard to take whichever notice
// reached it first, a new cluster with one node started otherwise would
// be split between the two settings, and no node could start again.
//
// Limits changed while this node runs (POST /cluster/limits) are this
// node's from then on, whether or not its notice had committed yet: it was
// started with the cluster's limits of its time. A change stamped by a
// clock behind this node's can look older than its start; the node then
// stops as one started with old limits, which costs it, never safety.
func (g *group) announce() bool {
	n := g.n
	h := header{node: n.opt.NodeID, inc: n.inc, floor: noticeSettings}
	if n.Err() == nil && g.afterShardZero() && g.propose(h, appendSettings(nil, n.settings())) {
		set, by, at, ok := g.fsm.Load().settingsAt()
		if ok && set.shards == n.opt.Shards && at > n.started {
			n.takeLimits(set.limits, g.idx, by)
		}
		if mine := n.settings(); !ok || set.same(mine) {
			g.agreed.Store(true)
			if g.idx == 0 {
				close(n.settled)
			}
			return true
		}
		n.mismatch(g, set, by, at)
	}
	g.mu.Lock()
	conns := g.conns
	g.n.queued.Add(-g.mine)
	g.pend, g.pendN, g.mine, g.conns = append(g.pend[:0], g.redo...), g.redoN, 0, nil
	g.mu.Unlock()
	n.fail(conns, codec.ErrUnavailable)
	return false
}

// requeue queues again the commands of a batch given up that no client
// waits for (redo); harmless to apply twice, should a copy still commit.
func (g *group) requeue(b []byte, count uint64) {
	if count == 0 {
		return
	}
	g.mu.Lock()
	first := g.pendN == 0
	g.pend = append(g.pend, b...)
	g.pendN += count
	g.redo = append(g.redo, b...)
	g.redoN += count
	g.mu.Unlock()
	if first {
		g.kickNow()
	}
}

// afterShardZero waits until shard 0 has agreed with this node's settings
// (at once for shard 0 itself, and for a shard that has settings already:
// this node's notice cannot decide them, and a restart need not wait for
// shard 0), asking it to announce them if it has not; false if it has not
// within the unavailable timeout, or the node stops.
func (g *group) afterShardZero() bool {
	n := g.n
	if g.idx == 0 {
		return true
	}
	if _, _, ok := g.fsm.Load().settings(); ok {
		return true
	}
	// Shard 0's announce may have given up (no leader known yet, as on a
	// node started before its peers) with nothing queued there since: ask
	// again at once, at each of its leader changes, and every leaderless
	// timeout, or this shard's requests wait out the unavailable timeout.
	z := n.grps[0]
	t := time.NewTimer(n.opt.UnavailableTimeout)
	defer t.Stop()
	again := time.NewTicker(n.opt.LeaderlessTimeout)
	defer again.Stop()
	for {
		changed := z.leaderChanged()
		z.kickNow()
		select {
		case <-n.settled:
			return true
		case <-changed:
		case <-again.C:
		case <-t.C:
			return false
		case <-n.failed:
			return false
		case <-n.stop:
			return false
		}
	}
}

// settings returns this node's settings.
func (n *Node) settings() settings {
	n.setMu.Lock()
	defer n.setMu.Unlock()
	return n.set
}

// takeLimits makes l this node's limits: a change made while it runs.
func (n *Node) takeLimits(l limits, shard int, by uint32) {
	n.setMu.Lock()
	old := n.set.limits
	n.set.limits = l
	n.setMu.Unlock()
	if old != l {
		n.log.Info("running with the limits changed since this node started (give it them as flags at its next start)",
			zap.Int("shard", shard), zap.Uint32("changed_by", by), zap.Stringer("settings", settings{shards: n.opt.Shards, limits: l}))
	}
}

// mismatch stops the node: its settings are not the cluster's. Its data dir
// takes the cluster's shard count, which a start checks, so that it starts
// again with the cluster's flags.
func (n *Node) mismatch(g *group, set settings, by uint32, at int64) {
	n.failOnce.Do(func() {
		// A change of limits by a version that did not stamp them has at 0.
		from := fmt.Sprintf("node %d's start, or a change of limits by an earlier version", by)
		if at != 0 {
			from = fmt.Sprintf("a change of limits (POST /cluster/limits) through node %d at %s", by, time.Unix(0, at).UTC().Format(time.RFC3339))
		}
		err := fmt.Errorf("this node was started with %s, but the cluster runs with %s (shard %d's log has them from %s): every node must run with the same, or replicas would answer differently; start this node again with the cluster's",
			n.settings(), set, g.idx, from)
		if werr := n.dir.adopt(set.shards); werr != nil {
			err = fmt.Errorf("%w (and its data dir could not take the shard count: %v)", err, werr)
		}
		n.log.Error("stopping: settings differ from the cluster's", zap.Error(err))
		n.failErr = err
		close(n.failed)
	})
}

// SetLimits changes the limits of every shard, which every replica applies
// from the change's place in the shard's log on (keys and waiters above a
// lowered limit stay). A node started later with the old limits stops (see
// Node.Failed). An error names the shards not changed (no quorum within the
// unavailable timeout): run it again, as until it succeeds a node started
// with either limits stops on the shards that have the others.
func (n *Node) SetLimits(ctx context.Context, maxKeys, maxWaiters, maxWaitersPerKey int) error {
	if maxKeys < 0 || maxWaiters < 0 || maxWaitersPerKey < 0 {
		return errors.New("replica: limits cannot be negative")
	}
	if err := n.Err(); err != nil {
		return fmt.Errorf("this node is stopping: %w", err)
	}
	leave, err := n.enter()
	if err != nil {
		return err
	}
	defer leave()
	// Applied to a shard without settings, a change would become its
	// first, skipping shard 0's rule (see announce) and carrying this
	// node's skew: only once every shard has agreed with this node.
	if waiting := n.awaitAgreed(ctx); len(waiting) > 0 {
		if err := n.Err(); err != nil {
			return fmt.Errorf("this node is stopping: %w", err)
		}
		select {
		case <-n.stop:
			return errStopping
		default:
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		return fmt.Errorf("shards %v have not agreed with this node's settings yet (no quorum, or no leader): run it again", waiting)
	}
	n.limitsMu.Lock() // one change at a time from this node: each its own stamp
	defer n.limitsMu.Unlock()
	set := settings{shards: n.opt.Shards, limits: limits{MaxKeys: maxKeys, MaxWaiters: maxWaiters, MaxWaitersPerKey: maxWaitersPerKey},
		skew: int64(n.opt.MaxClockSkew)}
	body := appendSettings(nil, set)
	// Later than every change committed before this one, whatever the
	// clocks that stamped them: sent through a node whose clock is behind
	// the last change's sender, a change stamped by its clock alone looked
	// older than that one and was not applied. Concurrent changes are
	// still ordered alike on every shard by their stamps, which no two
	// changes share: each is past this node's last, and its low bits are
	// this node's id (two equal stamps would let each shard keep whichever
	// came first there).
	stamp := max(n.now(), n.lastLimits+1)
	for _, g := range n.grps {
		at, err := g.limitsStamp(ctx)
		if err != nil && (ctx.Err() != nil || errors.Is(err, errStopping)) {
			return fmt.Errorf("shard %d: cannot read its last change of limits (%v): run it again", g.idx, err)
		}
		if err != nil {
			return fmt.Errorf("shard %d: cannot read its last change of limits (%v): no quorum (a majority of its nodes down or out of reach?); run it again once they are back", g.idx, err)
		}
		stamp = max(stamp, at+1)
	}
	stamp = nodeStamp(stamp, n.opt.NodeID)
	n.lastLimits = stamp
	ok := make([]bool, len(n.grps))
	var wg sync.WaitGroup
	for i, g := range n.grps {
		wg.Go(func() {
			// Stamped: a copy retried after a later change must not undo it.
			if ctx.Err() != nil || !g.propose(header{node: n.opt.NodeID, inc: n.inc, floor: noticeLimits, stamp: stamp}, body) {
				return
			}
			// Applied here by now; a shard of another shard count keeps its
			// own (this node is stopping), and a change after this one wins.
			got, _, _ := g.fsm.Load().settings()
			ok[i] = got.same(set)
		})
	}
	wg.Wait()
	var failed []int
	for i := range ok {
		if !ok[i] {
			failed = append(failed, i)
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("the limits of shards %v did not change (no quorum, or changed again meanwhile): run it again", failed)
	}
	return nil
}

// awaitAgreed asks every shard that has not agreed with this node's
// settings to announce them, and waits until all have, the unavailable
// timeout has passed, ctx is done or the node stops. It returns the shards
// that have not.
func (n *Node) awaitAgreed(ctx context.Context) []int {
	t := time.NewTimer(n.opt.UnavailableTimeout)
	defer t.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		var waiting []int
		for _, g := range n.grps {
			if !g.agreed.Load() {
				waiting = append(waiting, g.idx)
				g.kickNow()
			}
		}
		if len(waiting) == 0 {
			return nil
		}
		select {
		case <-tick.C:
		case <-t.C:
			return waiting
		case <-ctx.Done():
			return waiting
		case <-n.failed:
			return waiting
		case <-n.stop:
			return waiting
		}
	}
}

// nodeStamp is the first stamp no earlier than t whose low 16 bits are
// id's: changes of limits from different nodes never share a stamp (65 us
// of precision is plenty for them).
func nodeStamp(t int64, id uint32) int64 {
	const bits = 1 << 16
	s := t&^(bits-1) | int64(id%bits)
	if s < t {
		s += bits
	}
	return s
}

// limitsStamp reads the stamp of the last change of limits committed on
// g's shard, through a read index (its leader's commit index, applied
// here first), retrying until the unavailable timeout.
func (g *group) limitsStamp(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, g.n.opt.UnavailableTimeout)
	defer cancel()
	for {
		try, done := context.WithTimeout(ctx, g.n.opt.LeaderlessTimeout)
		v, err := g.n.nh.SyncRead(try, g.id, limitsQuery{})
		done()
		if err == nil {
			return v.(int64), nil
		}
		select {
		case <-ctx.Done():
			return 0, err
		case <-g.n.stop:
			return 0, errStopping
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// restamp stamps h for an attempt to propose it with now, but for a change
// of limits, which keeps the stamp it was made with: a copy retried after
// a later change must look older than it (see fsm.setAt).
func (h *header) restamp(now int64) {
	if !h.notice() || h.floor != noticeLimits || h.stamp == 0 {
		h.stamp = now
	}
}

// propose gets a batch committed, retrying a proposal that timed out or was
// dropped (a retry of a batch already applied is recognised by its id) until
// the unavailable timeout, or until this node has known no leader for the
// shard for the leaderless timeout. A proposal in flight when the shard's
// leader changes was likely lost with the old leader: it is retried at once
// rather than at its timeout. Every attempt is a new buffer (Dragonboat may
// still hold the last one).
func (g *group) propose(h header, body []byte) bool {
	ok, _ := g.proposeOrGiveUp(h, body)
	return ok
}

// proposeOrGiveUp is propose that also tells whether it gave up for want
// of a commit within the unavailable timeout (or of a leader), rather than
// because the node or the shard is stopping or refused the batch.
func (g *group) proposeOrGiveUp(h header, body []byte) (ok, gaveUp bool) {
	n := g.n
	start := time.Now()
	n.stats.proposals.Add(1)
	for attempt := 0; ; attempt++ {
		select {
		case <-n.stop:
			return false, false
		default:
		}
		if attempt > 0 {
			n.stats.retries.Add(1)
			waited, leaderless := time.Since(start), g.leaderlessFor()
			if waited > n.opt.UnavailableTimeout || leaderless > n.opt.LeaderlessTimeout {
				g.logGiveUp(waited, leaderless, !h.notice())
				return false, true
			}
		}
		if !g.takeOff(n.stop) {
			return false, false
		}
		h.restamp(n.now())
		if !h.notice() { // a notice's floor is its kind
			h.floor = g.floor()
		}
		b := append(appendHeader(make([]byte, 0, 40+len(body)), h), body...)
		changed := g.leaderChanged()
		rs, err := n.nh.Propose(g.sess, b, n.opt.ProposeTimeout)
		if err != nil {
			g.flying.Add(-1)
			if errors.Is(err, dragonboat.ErrClosed) || n.closing.Load() && errors.Is(err, dragonboat.ErrShardClosed) {
				return false, false
			}
			// Busy or not ready yet: back off a little.
			select {
			case <-n.stop:
				return false, false
			case <-time.After(n.opt.RTT):
			}
			continue
		}
		r, ok := g.result(rs, changed, maxTime(start.Add(n.opt.UnavailableTimeout), time.Now().Add(2*n.opt.ProposeTimeout)))
		g.flying.Add(-1)
		if !ok {
			continue
		}
		rs.Release()
		switch {
		case r.Completed() && r.GetResult().Value == resultUnanswered:
			n.log.Warn("a batch of this node was applied without its answers coming out here; its connections are told the outcome is unknown",
				zap.Int("shard", g.idx), zap.Uint64("batch", h.batch))
			return false, false
		case r.Completed():
			g.lastOK.Store(monoNow())
			if o := n.opt.ProposeSeconds; o != nil {
				o.Observe(time.Since(start).Seconds())
			}
			return true, false
		case r.Terminated():
			return false, false
		case r.Rejected():
			n.log.Error("proposal rejected", zap.Int("shard", g.idx))
			return false, false
		}
		// Timed out (lost at a leader that stepped down) or dropped (no
		// leader, or this one transferring): the batch may or may not be in
		// the log; retry. Dropped by a transfer this node asked for, it
		// waits for the transfer to end rather than reach the log at the
		// moment that decides whether the next attempt succeeds.
		var wait <-chan time.Time
		var ended <-chan struct{}
		if h := g.handing.Load(); h != nil && r.Dropped() {
			ended = *h
		} else {
			wait = time.After(n.opt.RTT)
		}
		select {
		case <-n.stop:
			return false, false
		case <-wait:
		case <-ended:
		}
	}
}

// result waits for a proposal's result; false if the shard's leader
// changed first, or giveUp came (the proposal is abandoned, not released:
// its result may still come). Dragonboat's own timeout counts raft ticks,
// which stop while this node's raft step waits on its disk: a disk that
// stalls would hold the proposal's connections for as long as it stalls
// (a review: 30 s for a 30 s stall, with /readyz 200 throughout). giveUp
// is an unavailable timeout after the request's first attempt, and no
// sooner than twice Dragonboat's timeout after this one's proposal, which
// a raft step that moves keeps: a request waits at most the two, and a
// proposal is counted stalled only once it has gone that long without.
func (g *group) result(rs *dragonboat.RequestState, changed <-chan struct{}, giveUp time.Time) (dragonboat.RequestResult, bool) {
	t := time.NewTimer(time.Until(giveUp))
	defer t.Stop()
	select {
	case r := <-rs.ResultC():
		return r, true
	case <-g.n.stop: // Close waits for this proposal; the next attempt sees the stop
	case <-t.C:
		g.stall(rs)
	case <-changed:
		if g.leader.Load() == 0 {
			select { // no leader yet: the next change, or the timeout
			case r := <-rs.ResultC():
				return r, true
			case <-g.leaderChanged():
			case <-g.n.stop:
			case <-t.C:
				g.stall(rs)
			}
		}
	}
	return dragonboat.RequestResult{}, false
}

// stall counts rs, abandoned, as stalled until its result comes, which
// makes the node not ready (Ready): until then this node's raft step has
// not been seen to move past it. Dragonboat gives every proposal a result
// (at the latest its timeout, once ticks run again).
func (g *group) stall(rs *dragonboat.RequestState) {
	n := g.n
	if g.stalled.Add(1) == 1 {
		n.log.Warn("a proposal has had no result for an unavailable timeout: this node is not ready until it has one (its disk or its raft step stalls, or the shard has no quorum)",
			zap.Int("shard", g.idx), zap.Duration("unavailable_timeout", n.opt.UnavailableTimeout))
	}
	// Not in n.wg: SetLimits proposes from goroutines of its own, which
	// may get here while Close waits; this one ends at the stop anyway.
	go func() {
		select {
		case <-rs.ResultC():
			g.stalled.Add(-1)
		case <-n.stop:
		}
	}()
}

// fail answers why (an E unavailable) to the connections whose requests
// could not be settled, and closes them.
func (n *Node) fail(conns []uint64, why *codec.Error) {
	srv := n.srv.Load()
	if srv == nil {
		return
	}
	line := codec.AppendError(nil, why)
	seen := make(map[uint64]bool, len(conns))
	for _, id := range conns {
		if id == 0 || seen[id] {
			continue
		}
		seen[id] = true
		if c := srv.Conn(id); c != nil {
			n.stats.failed.Add(1)
			c.Fail(line)
		}
	}
}

func (n *Node) now() int64 { return n.opt.Clock() }

// every runs fn every d until the node stops.
func (n *Node) every(d time.Duration, fn func()) {
	defer n.wg.Done()
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-n.stop:
			return
		case <-t.C:
			fn()
		}
	}
}

// newNodeHost is dragonboat.NewNodeHost with its failures on damaged raft
// state as errors: it panics on some (a table whose checksum fails, as
// pebble opens the log), and on an unreadable flag file (NODEHOST.ID,
// dragonboat.ds: a crash while it was written, a file system check that
// emptied it) its own recover returns neither a node host nor an error.
func newNodeHost(nhc config.NodeHostConfig) (nh *dragonboat.NodeHost, err error) {
	defer func() {
		if r := recover(); r != nil {
			nh, err = nil, fmt.Errorf("%w (%v)", errRaftDamaged, r)
		}
	}()
	nh, err = dragonboat.NewNodeHost(nhc)
	if err == nil && nh == nil {
		err = fmt.Errorf("%w (a flag file, NODEHOST.ID or dragonboat.ds, cannot be read)", errRaftDamaged)
	}
	return nh, err
}

// errRaftDamaged: the raft state under the data dir cannot be read.
var errRaftDamaged = errors.New("its raft state is damaged")

// timerLoop is the leader's clock: for each shard this node leads, it
// proposes the Expire and WaitTimeout commands that have come due. A lease
// ends only once this node's clock is MaxClockSkew past its deadline, so no
// lease ends before its lease_ms have passed on any node whose clock is
// within MaxClockSkew of the others.
//
// It sleeps until the earliest command of the shards it leads comes due,
// woken sooner by kickTimers: when an Update moves a shard's earliest one
// earlier, when leadership changes, and when a timer proposal ends. It
// runs at most once per timerMin (under load most Updates kick it), and
// at least once per Options.timerIdle (100 ms), which also bounds how late
// a jump of the clock can make it. Polling every 2 ms instead cost an idle cluster a
// steady 500 wakeups a second per node.
func (n *Node) timerLoop() {
	defer n.wg.Done()
	var expires, waits []shard.Command
	t := time.NewTimer(0)
	defer t.Stop()
	var ranAt time.Time
	for {
		select {
		case <-n.stop:
			return
		case <-t.C:
		case <-n.timerKick:
			if wait := timerMin - time.Since(ranAt); wait > 0 {
				t.Reset(wait)
				continue
			}
		}
		ranAt = time.Now()
		next := n.runTimers(&expires, &waits)
		d := n.opt.timerIdle
		if next < math.MaxInt64 {
			d = min(n.opt.timerIdle, max(timerMin, time.Duration(next-n.now())))
		}
		t.Reset(d)
	}
}

// timerMin is the shortest time between two runs of the timer loop.
const timerMin = 2 * time.Millisecond

// coverPoll is how often the timer loop looks at a shard while a lease due
// by its deadline waits for its cover (fsm.covers) to pass.
const coverPoll = int64(10 * time.Millisecond)

// kickTimers wakes timerLoop to look at the shards again.
func (n *Node) kickTimers() {
	select {
	case n.timerKick <- struct{}{}:
	default:
	}
}

// runTimers proposes the commands due on the shards this node leads (but
// for those with a timer proposal in flight, whose end kicks the loop) and
// returns the time the next one comes due, math.MaxInt64 if none. Leases
// end by the shard's skew (fsm.followSkew), and only on a node whose
// settings the shard has agreed with: one that may have been started with
// another skew, or has found it was, proposes no timer (the shard's timers
// wait for a leader that has agreed; ending a lease late is safe).
func (n *Node) runTimers(expires, waits *[]shard.Command) int64 {
	next := int64(math.MaxInt64)
	for _, g := range n.grps {
		f := g.fsm.Load()
		if f == nil || g.leader.Load() != uint64(n.opt.NodeID) || g.timerRun.Load() || !g.agreed.Load() || n.Err() != nil {
			continue
		}
		now := n.now()
		var b []byte
		count := uint64(0)
		f.mu.Lock()
		skew := f.skew
		held := int64(math.MaxInt64) // the first cover to pass, of leases held back by theirs
		if first, ok := f.t.NextDeadline(); ok && first <= now {
			// waits is scratch here: the timers due by the skew, of which
			// dueExpires keeps the lease ends whose covers have passed too.
			*waits = f.t.Due(now-skew, (*waits)[:0])
			*expires, held = f.dueExpires(now, *waits, (*expires)[:0])
			for i := range *expires {
				b = appendCommand(b, &(*expires)[i])
				count++
			}
			*waits = f.t.Due(now, (*waits)[:0])
			for i := range *waits {
				if (*waits)[i].Op == shard.OpWaitTimeout {
					b = appendCommand(b, &(*waits)[i])
					count++
				}
			}
		}
		due, ok := f.t.NextDue(skew)
		if !ok {
			due = math.MaxInt64
		}
		if held < math.MaxInt64 && due <= now {
			// The earliest timer is a lease held back by its cover, and the
			// heap cannot say what comes after it: look again when the first
			// cover passes, and meanwhile often enough for a timer that
			// comes due in between.
			due = min(held, now+coverPoll)
		}
		f.due = due // Updates that set a timer before it kick the loop
		if count == 0 {
			next = min(next, due)
		}
		f.mu.Unlock()
		if count == 0 {
			continue
		}
		n.stats.expiries.Add(int64(count))
		g.timerRun.Store(true)
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			defer n.kickTimers()
			defer g.timerRun.Store(false)
			g.propose(header{node: n.opt.NodeID, inc: n.inc, count: count}, b)
		}()
	}
	return next
}

// balanceLoop spreads leadership: shard i prefers node ids[i mod nodes]. A
// leader that is not the preferred one hands over when the preferred node is
// reachable, so that a node that comes back takes its share again.
func (n *Node) balanceLoop() {
	// Often enough that leadership is spread within a second of start (a
	// load that begins at once meets few transfers); a transfer is asked
	// for only while leadership is misplaced, so the check costs nothing
	// once it is spread.
	var due []*group
	n.every(500*time.Millisecond, func() {
		if n.closing.Load() {
			return // handOver gives every shard away
		}
		due = due[:0]
		for _, g := range n.grps {
			want := n.preferred(g)
			if g.leader.Load() != uint64(n.opt.NodeID) || want == n.opt.NodeID || !n.reachable(want) {
				// A new episode (the target back in reach, or this
				// node leading again) starts with its own tries; a
				// settle or hand-over pause is none.
				g.handBackSkips.Store(0)
				continue
			}
			if !n.mayHandBack(g, want, time.Now()) {
				continue
			}
			// A transfer drops proposals until it completes or an election
			// timeout passes, twice at most (see transfer): one hand-back
			// per shard per 5s at most, 5, 10 and 20 s after the tries
			// handBack left.
			wait := handBackEvery
			if k := g.handBackSkips.Load(); k > 1 {
				wait <<= k - 1
			}
			if time.Since(g.transferAt) > wait {
				g.transferAt = time.Now()
				due = append(due, g)
			}
		}
		if len(due) == 0 {
			return
		}
		start := time.Now()
		moved, left, behind := n.handBack(due)
		n.log.Info("handed shard leadership to the preferred nodes",
			zap.Int("shards", moved), zap.Int("left", left), zap.Int("target_catching_up", behind),
			zap.Duration("took", time.Since(start)))
	})
}

// handBack hands each of gs to its preferred node, but only where that node
// has shown it applied the shard's log up to the hand-over notice (its
// drained notice): a node that has just joined or come back may still be
// applying what it missed, Dragonboat's target then skips its campaign,
// and a transfer asked of it drops the shard's proposals for an election
// timeout, twice (see transfer). Those shards stay here, at the price of
// the quiesce's short hold, and are tried again later (behind), 5, 10 and
// 20 s on; after maxHandBackSkips in a row (a target of an older ticketd,
// which sends no drained notice, or one too slow to within the quiesce) the
// transfer is asked for as before.
func (n *Node) handBack(gs []*group) (moved, left, behind int) {
	to := func(g *group) uint32 {
		if want := n.preferred(g); n.reachable(want) {
			return want
		}
		return 0
	}
	until := time.Now().Add(n.transferTime())
	drained := n.quiesce(n.stop, gs, until)
	ready := make([]*group, 0, len(gs))
	for i, g := range gs {
		if t := to(g); t != 0 && !slices.Contains(drained[i], t) && g.handBackSkips.Load() < maxHandBackSkips {
			g.handBackSkips.Add(1)
			behind++
			continue
		}
		g.handBackSkips.Store(0)
		ready = append(ready, g)
	}
	moved, left = n.transfer(n.stop, ready, to, until)
	return moved, left, behind
}

// memberSet is the cluster's nodes: ids ascending, and their raft addresses.
type memberSet struct {
	ids   []uint32
	addrs map[uint32]string
}

// preferred is the node that shard idx's leadership belongs on: shard i on
// the i-th node mod their count, so that it is spread.
func (m *memberSet) preferred(idx int) uint32 { return m.ids[idx%len(m.ids)] }

func newMemberSet(addrs map[uint32]string) *memberSet {
	m := &memberSet{addrs: addrs}
	for id := range addrs {
		m.ids = append(m.ids, id)
	}
	slices.Sort(m.ids)
	return m
}

// membersLoop takes the shards' membership as the cluster's after each
// change applied here (MembershipChanged runs on Dragonboat's event
// goroutine, which must not wait on the NodeHost). Checked once a second
// too: a change can be applied while an event is queued, and a node that
// restarts replays its changes before the loop runs.
func (n *Node) membersLoop() {
	defer n.wg.Done() // Close waits: it must not read the NodeHost while it closes
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		n.refreshMembers()
		select {
		case <-n.stop:
			return
		case <-n.membersChanged:
		case <-tick.C:
		}
	}
}

// refreshMembers sets members to the voting members of the shards if every
// shard here has the same ones. While a Replace is part-way through, the
// shards differ and the last agreed set stays: every node then keeps the
// same preferences until all shards have the change.
func (n *Node) refreshMembers() {
	info := n.nh.GetNodeHostInfo(dragonboat.NodeHostInfoOption{SkipLogInfo: true})
	if info == nil || len(info.ShardInfoList) != len(n.grps) {
		return // closed, or a shard not started yet
	}
	for _, si := range info.ShardInfoList {
		if !si.Pending && len(si.Replicas) > 0 && si.ShardID >= 1 && si.ShardID <= uint64(len(n.grps)) {
			rs := make(map[uint32]string, len(si.Replicas))
			for id, addr := range si.Replicas {
				rs[uint32(id)] = addr
			}
			n.grps[si.ShardID-1].replicas.Store(&rs)
		}
	}
	if !n.Ready() {
		// Still replaying its logs, the node can find every shard at the
		// members of a moment ago (before a replace that added it): said
		// as --peers gone wrong, that would send its operator to name the
		// removed node again. Its own notice applied, its shards are past
		// whatever changed before it started.
		return
	}
	var agreed map[uint64]string
	for _, si := range info.ShardInfoList {
		if si.Pending || len(si.Replicas) == 0 {
			return
		}
		if agreed == nil {
			agreed = si.Replicas
		} else if !maps.Equal(agreed, si.Replicas) {
			return
		}
	}
	addrs := make(map[uint32]string, len(agreed))
	for id, addr := range agreed {
		addrs[uint32(id)] = addr
	}
	if !maps.Equal(addrs, n.opt.Peers) && n.peersSaid.CompareAndSwap(false, true) {
		// The node follows the members; but Replace counts a shard's
		// members against --peers, and the next operator reads it.
		n.log.Warn("--peers is not the cluster's members (a replace since this node's start, or a wrong flag): the node follows the members; give it their list the next time it starts",
			zap.Any("peers", n.opt.Peers), zap.Any("members", addrs))
	}
	if maps.Equal(addrs, n.members.Load().addrs) {
		return
	}
	m := newMemberSet(addrs)
	n.members.Store(m)
	n.log.Info("cluster members changed: leadership is spread over them now", zap.Any("nodes", m.ids))
}

// reachable tells whether id's raft connection is up.
func (n *Node) reachable(id uint32) bool {
	addr := n.members.Load().addrs[id]
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.reach[addr]
}

// mayHandBack tells whether this node, leading g, may hand it to its
// preferred node want at now: want's raft connection is up, for
// handBackSettle if it came up again after failing, and want did not hand
// g over on its way out since (unless handBackAfter has passed).
func (n *Node) mayHandBack(g *group, want uint32, now time.Time) bool {
	addr := n.members.Load().addrs[want]
	handed := g.handedAt.Load()
	n.mu.Lock()
	defer n.mu.Unlock()
	since := n.reachSince[addr]
	return n.reach[addr] && (!n.reconnected[addr] || now.Sub(since) > handBackSettle) &&
		(handed == nil || since.After(*handed) || now.Sub(*handed) > handBackAfter)
}

// quorumLoop finds the local connections with queued acquires on a shard
// that has committed nothing of ours for a while and sends an empty proposal
// on their behalf: if it cannot commit within the unavailable timeout, those
// connections get E unavailable like any whose request could not commit
// (their waits could be neither granted nor ended).
func (n *Node) quorumLoop() {
	quiet := n.opt.UnavailableTimeout / 2
	var ids []uint64
	var crowdSaid, removedSaid time.Time
	n.every(quiet, func() {
		n.sayProbeStall()
		if time.Since(removedSaid) >= 5*time.Minute && n.unledWithPeers() {
			removedSaid = time.Now()
			n.log.Warn("no shard of this node has had a leader for "+unledFor.String()+" although its peers' raft ports answer: "+
				"if a replace (POST /cluster/replace) took this node out while it was down, the others drop its messages, and it must not run again (README: replacing a node); "+
				"otherwise fewer than a majority of the members are up or reach each other, or their --peers do not name this node at this raft address",
				zap.Uint32("node", n.opt.NodeID), zap.String("raft_address", n.opt.Peers[n.opt.NodeID]))
		}
		if q := n.queued.Load(); q >= int64(n.opt.MaxQueued) && time.Since(crowdSaid) >= time.Minute {
			crowdSaid = time.Now()
			n.log.Warn("this node holds --max-queued requests on their way through the raft log: connections with more than their share of it unanswered are not read until it drains (clients pipelining more than the cluster commits)",
				zap.Int64("queued", q), zap.Int("max_queued", n.opt.MaxQueued))
		}
		for _, g := range n.grps {
			f := g.fsm.Load()
			if f == nil || sinceMono(g.lastOK.Load()) < quiet {
				continue
			}
			var conns []uint64
			f.mu.Lock()
			// One entry per connection, not per waiter: a quiet shard may
			// hold many queued acquires, and Update waits on this lock.
			ids = f.t.WaitingConns(n.opt.NodeID, ids[:0])
			f.mu.Unlock()
			for _, c := range ids {
				if c>>connBits == n.inc {
					conns = append(conns, c&connMask)
				}
			}
			if len(conns) == 0 {
				continue
			}
			g.mu.Lock()
			g.conns = append(g.conns, conns...)
			g.force = true // propose even if nothing else is queued
			g.mu.Unlock()
			g.kickNow()
		}
	})
}

// lostAfter is how long a leader waits, with a node out of its reach,
// before it withdraws the acquires that node's connections have queued,
// in unavailable timeouts: the node's own quorumLoop has told those
// connections E unavailable by then (half a timeout quiet, then a
// proposal that cannot commit within one), and its clients went
// elsewhere. Were they left, each would be granted in turn to nobody and
// hold its key for its lease.
const lostAfter = 2

// reapLoop is the leader's side of a lost node: on each shard it leads, it
// withdraws the queued acquires of nodes that are members no longer (a
// replace took them out), whose process is gone (crashed), or that it has
// not reached for lostAfter unavailable timeouts. It looks every half
// timeout, and as soon as a connection to a peer fails. A node that was
// only cut off and applies the withdraw later tells the connections it
// took from E unavailable (lost); acquires it queues after the withdraw
// are not touched.
func (n *Node) reapLoop() {
	defer n.wg.Done()
	t := time.NewTicker(n.opt.UnavailableTimeout / 2)
	defer t.Stop()
	most := make(map[uint32]uint64)
	up := make(map[uint32]bool)
	var last time.Time
	var again <-chan time.Time // a kick put off (reapSpacing)
	for {
		select {
		case <-n.stop:
			return
		case <-t.C:
		case <-again:
			again = nil
		case <-n.reapKick:
			// A failed connection is retried often: one pass in
			// reapSpacing is enough, and a kick within it comes at its end.
			if d := reapSpacing - time.Since(last); d > 0 {
				if again == nil {
					again = time.After(d)
				}
				continue
			}
		}
		last = time.Now()
		n.reap(most, up)
	}
}

// reapSpacing is the least time between two passes of reapLoop woken by
// failed connections.
const reapSpacing = 100 * time.Millisecond

// reap is one pass of reapLoop over the shards this node leads.
func (n *Node) reap(most map[uint32]uint64, up map[uint32]bool) {
	m := n.members.Load()
	self := n.opt.NodeID
	clear(up)
	for _, g := range n.grps {
		f := g.fsm.Load()
		if f == nil || g.leader.Load() != uint64(self) || g.reapRun.Load() {
			continue
		}
		// A follower sends to no other follower: its view of a node's
		// reach can be old until it has led for a while. A node taken
		// out of the shard (a replace) is gone whatever its reach:
		// its acquires go at once, as read through the log, or each
		// leadership change (a replace hands the new node its shards)
		// put their withdrawal off again while keys went to nobody.
		settled := sinceMono(g.ledSince.Load()) >= lostAfter*n.opt.UnavailableTimeout
		clear(most)
		f.mu.Lock()
		f.t.WaitingAbove(self, most)
		f.mu.Unlock()
		var b []byte
		count := uint64(0)
		var members map[uint64]string // read through the log, once a pass
		for node, conn := range most {
			crashed := n.crashed(g, m, node, up)
			if settled && !crashed && !n.lostNode(g, m, node) {
				continue
			}
			if !settled && !crashed {
				if _, member := g.members(m)[node]; member {
					continue
				}
				if members == nil {
					if members = n.readMembers(g); members == nil {
						break // no read: the next pass tries again
					}
				}
				if _, member := members[uint64(node)]; member {
					continue
				}
			}
			// The connections seen, of every incarnation up to theirs:
			// one the node opens later, as after the link heals before
			// this commits, keeps its acquires.
			below := conn + 1
			b = appendCommand(b, &shard.Command{Op: shard.OpWithdrawBelow, From: shard.Requester{Node: node, Conn: below}})
			count++
			n.log.Warn("withdrawing the queued acquires of a node out of reach",
				zap.Int("shard", g.idx), zap.Uint32("lost", node), zap.Bool("member", g.members(m)[node] != ""), zap.Bool("refused", crashed))
		}
		if count == 0 {
			continue
		}
		n.stats.reaped.Add(int64(count))
		g.reapRun.Store(true)
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			defer g.reapRun.Store(false)
			g.propose(header{node: self, inc: n.inc, count: count}, b)
		}()
	}
}

// crashed tells whether node, a member of g out of this node's reach, has
// no process at its raft address: the address refuses connections, so the
// process that queued the acquires seen before this call is gone, and with
// it every connection it had. Its acquires go at once, not after the
// lostAfter wait that lets a node merely cut off tell its own clients
// first: a release meanwhile handed the key to nobody, held for the dead
// waiter's lease (a review: 15 s and more after a kill -9). A node that
// refuses while it runs (a firewall or proxy that rejects) is told by the
// withdraw itself, as after a cut: it closes those connections with
// E unavailable, their clients a cut's time early.
// up holds the nodes found up in this pass: a refusal is asked again for
// each shard, after its acquires were seen (a refusal is quick, and a
// process started since then has connections of its own).
func (n *Node) crashed(g *group, m *memberSet, node uint32, up map[uint32]bool) bool {
	if up[node] {
		return false
	}
	addr, member := g.members(m)[node]
	if member && n.downFor(addr, 0) && n.refusedNow(addr) {
		return true
	}
	up[node] = true
	return false
}

// refusedNow is refused, given up at the node's stop.
func (n *Node) refusedNow(addr string) bool {
	ctx, cancel := n.untilStop(context.Background())
	defer cancel()
	return refused(ctx, addr)
}

// refused tells whether addr refuses a TCP connection within probeFor:
// nothing listens there, or a firewall or proxy on the way rejects it. A
// variable for tests.
var refused = func(ctx context.Context, addr string) bool {
	ctx, cancel := context.WithTimeout(ctx, probeFor)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err == nil {
		c.Close()
		return false
	}
	return errors.Is(err, syscall.ECONNREFUSED)
}

// probeFor bounds refused: a refusal comes within a round trip, and an
// address whose packets are dropped holds reapLoop's pass this long.
const probeFor = 250 * time.Millisecond

// readMembers reads g's voting members through the log (a leader's view is
// then current); nil if that fails within a second.
func (n *Node) readMembers(g *group) map[uint64]string {
	ctx, cancel := n.untilStop(context.Background())
	defer cancel()
	ctx, cancelRead := context.WithTimeout(ctx, time.Second)
	defer cancelRead()
	m, err := n.nh.SyncGetShardMembership(ctx, g.id)
	if err != nil {
		return nil
	}
	return m.Nodes
}

// members is the shard's own voting members where known, else the set all
// shards agree on: while a replace is part-way through, that set still
// lacks the new node, a member of the shards done already.
func (g *group) members(m *memberSet) map[uint32]string {
	if rs := g.replicas.Load(); rs != nil {
		return *rs
	}
	return m.addrs
}

// lostNode tells whether reapLoop withdraws node's queued acquires on g: it
// is no member of the shard, or it has been out of reach for lostAfter
// unavailable timeouts.
func (n *Node) lostNode(g *group, m *memberSet, node uint32) bool {
	addr, member := g.members(m)[node]
	return !member || n.downFor(addr, lostAfter*n.opt.UnavailableTimeout)
}

// LeaderUpdated implements raftio.IRaftEventListener.
func (n *Node) LeaderUpdated(info raftio.LeaderInfo) {
	if info.ShardID == 0 || info.ShardID > uint64(len(n.grps)) {
		return
	}
	g := n.grps[info.ShardID-1]
	prev := g.leader.Swap(info.LeaderID)
	g.term.Store(info.Term)
	if info.LeaderID == uint64(n.opt.NodeID) && prev != info.LeaderID {
		g.ledSince.Store(monoNow())
	}
	if info.LeaderID == 0 {
		g.leaderless.CompareAndSwap(0, monoNow())
	} else {
		g.leaderless.Store(0)
	}
	// An election or transfer passes through "no leader": compare with the
	// last leader known.
	if info.LeaderID != 0 {
		self := uint64(n.opt.NodeID)
		last := g.lastLeader.Swap(info.LeaderID)
		if want := uint64(n.preferred(g)); last == want && want != self && info.LeaderID == self {
			now := time.Now()
			g.handedAt.Store(&now)
		}
	}
	if h := g.hold.Load(); h != nil && info.LeaderID != 0 && info.LeaderID != uint64(h.from) {
		g.endHold(h) // handed over
	}
	if prev != info.LeaderID {
		n.kickTimers() // a new leader takes over the shard's timers at once
		g.changeMu.Lock()
		if g.changeCh != nil {
			close(g.changeCh)
			g.changeCh = nil
		}
		g.changeMu.Unlock()
		n.stats.leaderChanges.Add(1)
		n.log.Info("shard leader changed",
			zap.Int("shard", g.idx), zap.Uint64("term", info.Term),
			zap.Uint64("leader", info.LeaderID), zap.Uint32("node", n.opt.NodeID))
	}
}

// Ready is true once every shard has agreed with this node's settings
// (which also means the node has applied what the shard had committed when
// it started: a rolling restart may take the next node down), while it
// knows a leader for every shard, has no proposal given up on the clock
// still without a result (stalled: its disk or raft step stalls), and is
// neither stopping (it no longer carries out what it reads) nor failed.
// While its shards are quiet, a write to its data dir stands in for the
// proposals (probeLoop); one that failed or took an unavailable timeout,
// or has been in flight that long, makes it not ready while busy too.
func (n *Node) Ready() bool { return n.NotReady() == "" }

// NotReady says why Ready is false, for /readyz's answer; "" when it is
// true.
func (n *Node) NotReady() string {
	switch err := n.Err(); {
	case n.closing.Load():
		return "stopping"
	case err != nil:
		return "stopped: " + err.Error()
	}
	if d := n.probeStalled(); d > 0 {
		return fmt.Sprintf("a write to the data dir has taken %v, --unavailable-timeout (%v) or more: the disk stalls?", d.Round(time.Millisecond), n.opt.UnavailableTimeout)
	}
	if n.probeBad.Load() {
		return "the last write to the data dir failed, or took --unavailable-timeout or more"
	}
	for _, g := range n.grps {
		switch {
		case g.leader.Load() == 0:
			return fmt.Sprintf("shard %d knows no leader (no quorum, or an election)", g.idx)
		case !g.agreed.Load():
			return fmt.Sprintf("shard %d has not agreed with this node's settings yet", g.idx)
		case g.stalled.Load() > 0:
			return fmt.Sprintf("shard %d: a request has waited --unavailable-timeout to commit", g.idx)
		}
	}
	return ""
}

// ErrRefused matches (errors.Is) a Replace refused for what it was asked:
// ids or an address that do not fit the members, a node that is up, or
// another replace that ran at the same time. Asked again the same way, it
// is refused again.
var ErrRefused = errors.New("replica: refused")

type refusal struct{ error }

func (refusal) Is(target error) bool { return target == ErrRefused }

func refuse(format string, a ...any) error { return refusal{fmt.Errorf(format, a...)} }

// Replace takes node old out of every shard and adds node new at raft
// address addr in its place (old first: with old down, a fourth member would
// leave two of four live, no quorum). Run it on a live node once a node's
// data dir is lost, then start the new node with Join. A node must never
// come back under its old id with an empty data dir: it would have
// forgotten its votes and the entries it acknowledged.
func (n *Node) Replace(ctx context.Context, old, new uint32, addr string) error {
	if old == 0 || new == 0 || old == new {
		return refuse("replica: replace needs two different positive node ids")
	}
	if old == n.opt.NodeID {
		return refuse("replica: node %d is this node, which is up: run the replace on a live node in place of one whose data dir is lost", old)
	}
	if !config.IsValidAddress(addr) {
		// Dragonboat refuses to add it only after old is out: the
		// shard would stay a member short while the add is retried.
		return refuse("replica: %q is not a raft address (host:port)", addr)
	}
	leave, err := n.enter()
	if err != nil {
		return err
	}
	defer leave()
	ctx, cancel := n.untilStop(ctx)
	defer cancel()
	if err := n.checkReplace(ctx, old, new, addr); err != nil {
		return err
	}
	for _, g := range n.grps {
		// A change forwarded to a leader that just went is lost silently
		// (like a proposal): each step is tried in short attempts, each
		// against the members read through the log just before, and
		// ordered after them (their config change id): a change another
		// replace made in between fails it, and the next read shows that.
		removed, err := n.changeMembers(ctx, g, func(m map[uint64]string) bool { _, ok := m[uint64(old)]; return !ok }, nil,
			func(ctx context.Context, cc uint64) error {
				return n.nh.SyncRequestDeleteReplica(ctx, g.id, uint64(old), cc)
			})
		if err != nil {
			return fmt.Errorf("shard %d: removing node %d: %w", g.idx, old, err)
		}
		full := func(m map[uint64]string) error {
			if len(m) >= len(n.opt.Peers) {
				// Another replace added its node in between (two run
				// at once): adding this one too would make the shard
				// one member larger, with a member nobody starts.
				return refuse("replica: shard %d has its %d members already (%v): another replace ran at the same time; check the members (/debug/cluster) before anything else",
					g.idx, len(m), slices.Sorted(maps.Keys(m)))
			}
			return nil
		}
		added, err := n.changeMembers(ctx, g, func(m map[uint64]string) bool { _, ok := m[uint64(new)]; return ok }, full,
			func(ctx context.Context, cc uint64) error {
				return n.nh.SyncRequestAddReplica(ctx, g.id, uint64(new), addr, cc)
			})
		if err != nil {
			return fmt.Errorf("shard %d: adding node %d: %w", g.idx, new, err)
		}
		if removed || added { // a replace run again skips the shards done, and says nothing of them
			n.log.Info("shard members changed", zap.Int("shard", g.idx), zap.Uint32("removed", old), zap.Uint32("added", new), zap.String("addr", addr))
		}
	}
	return nil
}

// replaceSeenDown is how long Replace waits for the node it takes out to be
// seen unreachable (a node stopped just before is, within a heartbeat or
// two), before it refuses. A variable for tests.
var replaceSeenDown = 5 * time.Second

// checkReplace refuses a replace that would cost a shard its quorum or add
// a member nobody will start: old must be a member of every shard not yet
// changed (or the shard a member short: a replace cut short between its
// steps), and down (a replace is for a node whose data dir is lost, which
// is down: taking out a live one, by a wrong id, would leave a shard with
// two live members of three while the lost one is still counted); new must
// not be a member yet, nor addr another member's. A shard already changed
// (old out, new in) is skipped, so a replace that was cut short can be run
// again. The members are read through the log, so a shard still loading,
// or without quorum, is waited for (bounded), never taken as empty.
func (n *Node) checkReplace(ctx context.Context, old, new uint32, addr string) error {
	var oldAddrs []string
	for _, g := range n.grps {
		mb, err := n.shardMembers(ctx, g)
		if err != nil {
			return err
		}
		m := mb.Nodes
		if _, gone := mb.Removed[uint64(new)]; gone {
			// Raft never takes a removed id back: the add would be
			// refused for ever, with old already out.
			return refuse("replica: node %d was removed from shard %d before, and raft does not take a removed id back: give the new node an id never used", new, g.idx)
		}
		oldAddr, hasOld := m[uint64(old)]
		_, hasNew := m[uint64(new)]
		switch {
		case !hasOld && hasNew:
			continue // changed before
		case hasNew:
			return refuse("replica: node %d is already a member of shard %d", new, g.idx)
		case !hasOld && len(m) >= len(n.opt.Peers):
			// Not a replace cut short between its two steps (which
			// leaves the shard a member short): a wrong id.
			return refuse("replica: node %d is not a member of shard %d", old, g.idx)
		}
		for id, a := range m {
			if a == addr && id != uint64(old) {
				return refuse("replica: %s is the raft address of node %d", addr, id)
			}
		}
		if hasOld && !slices.Contains(oldAddrs, oldAddr) {
			oldAddrs = append(oldAddrs, oldAddr)
		}
	}
	seenUp := time.Now().Add(replaceSeenDown)
	for {
		up := ""
		for _, a := range oldAddrs {
			// Dialled afresh: this node's own raft connection to old says
			// little (a follower sends to leaders alone, and one not used
			// since old stopped still counts as up).
			if listening(ctx, a) {
				up = a
				break
			}
		}
		if up == "" {
			return nil
		}
		if time.Now().After(seenUp) && up == addr {
			return refuse("replica: node %d's raft address %s takes connections: node %d is up (stop it first, and check the ids), or its replacement, given the same address, was started before the replace (stop it, run the replace, then start it again)", old, up, old)
		}
		if time.Now().After(seenUp) {
			return refuse("replica: node %d is up (its raft address %s takes connections): a replace takes out a node whose data dir is lost, which is down; stop it first, and check the ids", old, up)
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// listening tells whether addr accepts a TCP connection within a second. A
// variable for tests.
var listening = func(ctx context.Context, addr string) bool {
	dctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(dctx, "tcp", addr)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// memberRead bounds shardMembers. A variable for tests.
var memberRead = 15 * time.Second

// shardMembers reads g's members through its log (a linearizable read),
// retrying for up to memberRead: a shard still loading (just after a
// start) or without quorum has none to give yet.
func (n *Node) shardMembers(ctx context.Context, g *group) (*dragonboat.Membership, error) {
	until := time.Now().Add(memberRead)
	for {
		if n.opt.memberAttempt != nil {
			n.opt.memberAttempt()
		}
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		mctx, cancel := context.WithTimeout(ctx, time.Second)
		m, err := n.nh.SyncGetShardMembership(mctx, g.id)
		cancel()
		switch {
		case err == nil:
			return m, nil
		case errors.Is(err, dragonboat.ErrClosed):
			return nil, errStopping
		case ctx.Err() == nil && time.Now().After(until):
			return nil, fmt.Errorf("replica: shard %d: cannot read its members within %v (no quorum, or still loading): %w", g.idx, memberRead, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// anyShard tells whether raft/ holds this node's replica of some shard.
func anyShard(nh *dragonboat.NodeHost, node uint32, shards int) bool {
	for id := uint64(1); id <= uint64(shards); id++ {
		if nh.HasNodeInfo(id, uint64(node)) {
			return true
		}
	}
	return false
}

// errStopping answers an operator's call made while the node closes.
var errStopping = errors.New("the node is stopping")

// enter admits an operator's call (Replace, SetLimits) that uses the
// NodeHost outside the node's own goroutines (those Close waits for in
// n.wg). Close waits for the calls admitted before it closes the NodeHost,
// and later ones are refused: Dragonboat's calls are not safe against its
// Close (a Replace beside it raced on the NodeHost's gossip state). Such a
// call also ends once n.stop closes, so Close does not wait long.
func (n *Node) enter() (leave func(), err error) {
	n.useMu.RLock()
	if n.useEnded {
		n.useMu.RUnlock()
		return nil, errStopping
	}
	return n.useMu.RUnlock, nil
}

// untilStop is ctx, also ended (with errStopping as its cause) once the
// node begins to close.
func (n *Node) untilStop(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	go func() {
		select {
		case <-n.stop:
			cancel(errStopping)
		case <-ctx.Done():
		}
	}()
	return ctx, func() { cancel(context.Canceled) }
}

// changeMembers runs change until done reports it applied, or ctx ends,
// and tells whether it had to (false: done before). Before each attempt it
// reads the members through the log; check, if not nil, may refuse the
// change on them, and change gets their config change id, so that it fails
// if the members changed after the read.
func (n *Node) changeMembers(ctx context.Context, g *group, done func(map[uint64]string) bool,
	check func(map[uint64]string) error, change func(ctx context.Context, cc uint64) error) (changed bool, err error) {
	var last error
	for tried := false; ; tried = true {
		m, err := n.shardMembers(ctx, g)
		if err != nil {
			if last != nil && !errors.Is(err, errStopping) {
				return tried, fmt.Errorf("%w (the last attempt: %v)", err, last)
			}
			return tried, err
		}
		if done(m.Nodes) {
			return tried, nil
		}
		if check != nil {
			if err := check(m.Nodes); err != nil {
				return tried, err
			}
		}
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		last = change(actx, m.ConfigChangeID)
		cancel()
		if errors.Is(last, dragonboat.ErrInvalidAddress) || errors.Is(last, dragonboat.ErrInvalidOperation) {
			// No retry changes these. (ErrRejected may: an attempt that
			// timed out but committed, or a change made in between,
			// makes the next read differ.)
			return tried, last
		}
		if last != nil {
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}

// ShardStatus is one shard as this node sees it.
type ShardStatus struct {
	Shard   int    `json:"shard"`
	Leader  uint64 `json:"leader"` // node id; 0: none known
	Term    uint64 `json:"term"`
	Applied uint64 `json:"applied"`          // last log index applied here
	Digest  string `json:"digest,omitempty"` // hash of the replica's state at Applied
	// Members are the shard's voting members as this node has applied
	// them (Members fills them; empty until the shard has loaded).
	Members []uint32 `json:"members,omitempty"`
	// Addrs are those members' raft addresses, by id: what a replace's
	// addr and every node's --peers must match.
	Addrs map[uint32]string `json:"addrs,omitempty"`
	// Limits are the cluster's --max-keys, --max-waiters and
	// --max-waiters-per-key as this replica applied them (POST
	// /cluster/limits changes them; a node must start with them); nil
	// until the shard's first settings notice.
	Limits *limits `json:"limits,omitempty"`
}

// Members fills st's members from what membersLoop read after each change
// this node applied: what an operator checks after a replace.
func (n *Node) Members(st []ShardStatus) {
	for i := range min(len(st), len(n.grps)) {
		if rs := n.grps[i].replicas.Load(); rs != nil {
			st[i].Members = slices.Sorted(maps.Keys(*rs))
			st[i].Addrs = maps.Clone(*rs)
		}
	}
}

// Status reports every shard. With digest, each replica's state is hashed
// too (it serialises the table: for checks, not for every scrape); replicas
// of a shard at the same index must have the same digest.
func (n *Node) Status(digest bool) []ShardStatus {
	out := make([]ShardStatus, len(n.grps))
	for i, g := range n.grps {
		out[i] = ShardStatus{Shard: i, Leader: g.leader.Load(), Term: g.term.Load()}
		f := g.fsm.Load()
		if f == nil {
			continue
		}
		if set, _, _, ok := f.settingsAt(); ok {
			out[i].Limits = &set.limits
		}
		if !digest {
			f.mu.Lock()
			out[i].Applied = f.applied
			f.mu.Unlock()
			continue
		}
		if applied, sum, err := f.digest(); err == nil && applied != 0 {
			// 0: a snapshot restored whose index is not known yet.
			out[i].Applied, out[i].Digest = applied, fmt.Sprintf("%x", sum[:8])
		}
	}
	return out
}

// Counters are this node's cumulative figures.
type Counters struct {
	Proposals, Retries     int64 // batches proposed; attempts after the first
	Unavailable            int64 // connections closed with E unavailable
	TimerCommands          int64 // Expire and WaitTimeout commands proposed as leader
	LeaderChanges, Orphans int64
	SnapshotsReceived      int64
	Renewals               int64 // grants applied too late to answer, renewed (fsm.judge)
	LostNodeWithdrawals    int64 // withdraws of a lost node's queued acquires proposed as leader (reapLoop)
	GivenUp                int64 // batches that could not commit within the unavailable timeout
	Queued                 int64 // clients' commands on their way through the log now (Options.MaxQueued)
}

// Counters reads the counters.
func (n *Node) Counters() Counters {
	s := &n.stats
	return Counters{
		Proposals: s.proposals.Load(), Retries: s.retries.Load(), Unavailable: s.failed.Load(),
		TimerCommands: s.expiries.Load(), LeaderChanges: s.leaderChanges.Load(), Orphans: s.orphans.Load(),
		SnapshotsReceived: s.snapshotsReceived.Load(), Renewals: s.renewals.Load(),
		LostNodeWithdrawals: s.reaped.Load(), GivenUp: s.givenUp.Load(), Queued: n.queued.Load(),
	}
}

// Stats sums the replicas' tables as this node has applied them.
func (n *Node) Stats() shard.Stats {
	var s shard.Stats
	for _, g := range n.grps {
		if f := g.fsm.Load(); f != nil {
			f.mu.Lock()
			s.Add(f.t.Stats())
			f.mu.Unlock()
		}
	}
	return s
}

// Quiesce stops taking requests, waits (up to the unavailable timeout) until
// those already taken have committed, so that their answers go out before
// the network side closes, and ends this node's queued acquires through the
// log: they are answered T (tried until the unavailable timeout). Locks stay held
// in the cluster.
func (n *Node) Quiesce() {
	if n.closing.Swap(true) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), n.opt.UnavailableTimeout)
	n.waitIdle(ctx)
	cancel()
	var wg sync.WaitGroup
	for _, g := range n.grps {
		f := g.fsm.Load()
		if f == nil {
			continue
		}
		f.mu.Lock()
		cmds := f.t.Waiting(n.opt.NodeID, nil)
		var b []byte
		count := uint64(0)
		for i := range cmds {
			if cmds[i].From.Conn>>connBits == n.inc {
				b = appendCommand(b, &cmds[i])
				count++
			}
		}
		f.mu.Unlock()
		if count == 0 {
			continue
		}
		entry := appendHeader(nil, header{node: n.opt.NodeID, inc: n.inc, stamp: n.now(), count: count})
		entry = append(entry, b...)
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Tried again until the unavailable timeout: a drop (a
			// leader change, a transfer) would leave the acquires
			// unanswered and queued, to be granted to nobody in turn.
			// The commands are harmless to apply twice.
			until := time.Now().Add(n.opt.UnavailableTimeout)
			for {
				rs, err := n.nh.Propose(g.sess, entry, n.opt.ProposeTimeout)
				if err == nil {
					r := <-rs.ResultC()
					rs.Release()
					if r.Completed() {
						return
					}
				}
				if time.Now().After(until) {
					n.log.Warn("queued acquires not answered T before stopping: the shard did not commit their timeouts",
						zap.Int("shard", g.idx), zap.Uint64("acquires", count))
					return
				}
				select {
				case <-n.stop:
					return
				case <-time.After(n.opt.RTT):
				}
			}
		}()
	}
	wg.Wait()
}

// Shutdown waits (within ctx) for what is queued or in flight to commit,
// such as the release of grants that could not be delivered, then closes the
// NodeHost. Call it after the network side has closed its connections.
func (n *Node) Shutdown(ctx context.Context) error {
	n.closing.Store(true)
	if !n.waitIdle(ctx) {
		n.log.Warn("stopping with proposals in flight", zap.Error(ctx.Err()))
		n.Close()
		return nil
	}
	n.handOver(ctx)
	n.Close()
	return nil
}

// handOver asks another node to lead each shard this one leads, and waits
// until every shard has a new leader, transferTime has passed, or ctx ends.
// A node that stops then leaves its shards answering within a few raft
// ticks, or one election timeout under load (see transfer), instead of an
// election timeout after it has gone plus the election. What it cannot
// hand over (no peer reachable, a transfer that does not complete) is left
// to an election, as after a crash.
func (n *Node) handOver(ctx context.Context) {
	self := uint64(n.opt.NodeID)
	var mine []*group
	for _, g := range n.grps {
		if g.leader.Load() == self {
			mine = append(mine, g)
		}
	}
	if len(mine) == 0 {
		return
	}
	start := time.Now()
	until := deadline(ctx, start.Add(n.transferTime()))
	n.quiesce(ctx.Done(), mine, until)
	moved, left := n.transfer(ctx.Done(), mine, n.successor, until)
	n.log.Info("handed shard leadership over before stopping",
		zap.Int("shards", moved), zap.Int("left_to_election", left), zap.Duration("took", time.Since(start)))
}

// transfer asks for the leadership of each of gs that this node leads to
// move to to(g) (0: nowhere), and waits until each has another leader, the
// deadline passes, or stop closes. It returns how many moved and how many
// are still led here or by nobody.
//
// The request is made again every quarter tick: raft ignores it while a
// transfer is under way, and a transfer fails whenever the target still has
// committed entries to apply when told to campaign (Dragonboat skips the
// campaign then; under load it often does) until the leader gives it up an
// election timeout later, having dropped proposals meanwhile. Asked again
// at once, before new entries reach the log (this node's own proposals
// wait for the transfer to end instead of retrying, see propose), the
// target has applied everything and takes over within a few ticks. The
// proposals that other nodes forwarded to this one meanwhile, lost without
// a word, are retried there as soon as the new leader is known instead of
// at their timeout.
//
// After the first, no request is made in the last election timeout before
// the deadline, so that no transfer it starts is still dropping proposals
// when this node's own go back to retrying.
func (n *Node) transfer(stop <-chan struct{}, gs []*group, to func(*group) uint32, deadline time.Time) (moved, left int) {
	self := uint64(n.opt.NodeID)
	lastAsk := deadline.Add(-n.opt.election())
	// One transfer at a time marks a shard (a hand-back may still run when
	// a stopping node hands everything over): each unmarks only its own.
	marks := make([]*chan struct{}, len(gs))
	for i, g := range gs {
		done := make(chan struct{})
		if g.handing.CompareAndSwap(nil, &done) {
			marks[i] = &done
		}
	}
	ended := func(i int) {
		if h := marks[i]; h != nil {
			gs[i].handing.CompareAndSwap(h, nil)
			close(*h)
			marks[i] = nil
		}
	}
	defer func() {
		for i := range gs {
			ended(i)
		}
	}()
	for first := true; ; first = false {
		ask := first || time.Now().Before(lastAsk)
		led, nowhere := 0, 0
		for i, g := range gs {
			// Moved once another leader is known: between, the target is
			// still collecting votes (this node's among them).
			l := g.leader.Load()
			if l != self && l != 0 {
				ended(i)
				continue
			}
			led++
			if t := to(g); t == 0 {
				nowhere++
			} else if l == self && ask {
				_ = n.nh.RequestLeaderTransfer(g.id, uint64(t))
			}
		}
		if led == nowhere || time.Now().After(deadline) {
			return len(gs) - led, led
		}
		select {
		case <-stop:
			return len(gs) - led, led
		case <-time.After(n.opt.RTT / 4):
		}
	}
}

// quiesce makes the logs of the shards of gs that this node leads go quiet
// before their leadership is handed over. A transfer fails whenever the
// target still has committed entries to apply when told to campaign
// (Dragonboat then skips the campaign), and under load it nearly always
// has: the transfer is given up an election timeout later, having dropped
// every proposal meanwhile. So this node first commits a hand-over notice
// to each shard. Every node that applies it holds its proposals to the
// shard (holdOn) and, once those it has in flight are settled, commits a
// drained notice. When the drained notices of the other reachable nodes
// have been applied here, and nothing more for a raft tick, the log is
// quiet and the target has applied all of it: the transfer asked next goes
// through at once. A shard not quiet within quiesceTime (a node that does
// not answer, say of an older version, or one still catching up) is handed
// over as before. It returns, for each of gs, the nodes whose drained
// notice was applied here.
func (n *Node) quiesce(stop <-chan struct{}, gs []*group, until time.Time) (drained [][]uint32) {
	self := uint64(n.opt.NodeID)
	drained = make([][]uint32, len(gs))
	until = minTime(until, time.Now().Add(n.quiesceTime()))
	var others []uint32
	ids := n.members.Load().ids
	for _, id := range ids {
		if id != n.opt.NodeID && n.reachable(id) {
			others = append(others, id)
		}
	}
	var wg sync.WaitGroup
	for i, g := range gs {
		if g.leader.Load() != self {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ch := make(chan uint32, 2*len(ids))
			g.drained.Store(&ch)
			defer g.drained.Store(nil)
			if !g.notify(noticeHandOver, stop, until) {
				return
			}
			timeout := time.NewTimer(time.Until(until))
			defer timeout.Stop()
			for left := slices.Clone(others); len(left) > 0; {
				select {
				case id := <-ch:
					if slices.Contains(left, id) {
						drained[i] = append(drained[i], id)
					}
					left = slices.DeleteFunc(left, func(x uint32) bool { return x == id })
				case <-timeout.C:
					return
				case <-stop:
					return
				}
			}
			g.awaitQuiet(stop, cmp.Or(n.opt.quietFor, n.opt.RTT), until)
		}()
	}
	wg.Wait()
	return drained
}

// quiesceTime bounds quiesce: eight ticks, or half an election timeout if
// less. Quiet comes within a few ticks; a shard that does not get there
// (its transfer then likely fails and drops proposals for an election
// timeout) should not have its proposals held much longer on top of that.
func (n *Node) quiesceTime() time.Duration {
	if n.opt.quiesceMax > 0 {
		return n.opt.quiesceMax
	}
	return min(n.opt.election()/2, 8*n.opt.RTT)
}

// holdTime bounds a hold: past quiesceTime and two ticks, the leader has
// asked for the transfer, and proposals held longer would only wait for
// the end of one that failed.
func (n *Node) holdTime() time.Duration { return n.quiesceTime() + 2*n.opt.RTT }

// notify commits a notice of the hand-over protocol to the shard: one
// attempt, as a shard that cannot commit it is handed over as before.
func (g *group) notify(kind uint64, stop <-chan struct{}, until time.Time) bool {
	n := g.n
	b := appendHeader(nil, header{node: n.opt.NodeID, inc: n.inc, floor: kind, stamp: n.now()})
	rs, err := n.nh.Propose(g.sess, b, max(time.Until(until), n.opt.RTT))
	if err != nil {
		return false
	}
	defer rs.Release()
	select {
	case r := <-rs.ResultC():
		return r.Completed()
	case <-stop:
		return false
	}
}

// awaitQuiet waits until this replica of the shard has applied no entry for
// quiet, or until passes.
func (g *group) awaitQuiet(stop <-chan struct{}, quiet time.Duration, until time.Time) {
	f := g.fsm.Load()
	if f == nil {
		return
	}
	applied := func() uint64 {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.applied
	}
	last, since := applied(), time.Now()
	tick := time.NewTicker(quiet / 10)
	defer tick.Stop()
	for time.Since(since) < quiet && time.Now().Before(until) {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		if a := applied(); a != last {
			last, since = a, time.Now()
		}
	}
}

// holdOn is a hand-over notice applied: the node that sent it leads the
// shard, and this node's proposals to the shard wait until another leader
// is known, or for holdTime at most (a transfer that fails, or the leader
// gone), after which they go out as they would have without it.
type holdOn struct {
	from uint32
	done chan struct{}
}

// notice implements sink.
func (n *Node) notice(idx int, node uint32, kind uint64, stamp int64) {
	g := n.grps[idx]
	limit := n.holdTime()
	if time.Duration(n.now()-stamp) > limit+n.opt.MaxClockSkew {
		return // replayed at start, or applied late: long over
	}
	switch kind {
	case noticeDrained:
		if ch := g.drained.Load(); ch != nil {
			select {
			case *ch <- node:
			default:
			}
		}
	case noticeHandOver:
		h := &holdOn{from: node, done: make(chan struct{})}
		if old := g.hold.Swap(h); old != nil {
			close(old.done)
		}
		time.AfterFunc(limit, func() { g.endHold(h) })
		// LeaderUpdated ends a hold it finds; this one may have come after it.
		if l := g.leader.Load(); l != 0 && l != uint64(node) {
			g.endHold(h)
			return
		}
		if node != n.opt.NodeID {
			// Applied on Dragonboat's goroutine, which n.wg does not
			// cover: enter keeps Close from closing the NodeHost under it.
			if leave, err := n.enter(); err == nil {
				go func() {
					defer leave()
					g.drain(h, time.Now().Add(limit))
				}()
			}
		}
	}
}

// drain commits this node's drained notice once its proposals to the shard
// in flight have settled, unless the hold ends first.
func (g *group) drain(h *holdOn, until time.Time) {
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for g.flying.Load() > 0 {
		select {
		case <-h.done:
			return
		case <-g.n.stop:
			return
		case <-tick.C:
		}
	}
	select {
	case <-g.n.stop:
		return
	default:
	}
	g.notify(noticeDrained, h.done, until)
}

func (g *group) endHold(h *holdOn) {
	if g.hold.CompareAndSwap(h, nil) {
		close(h.done)
	}
}

// takeOff counts a proposal in flight (drain waits for those to settle),
// once no hold stops it; false if stop closed first. The count goes up
// before the hold is looked at, and a hold is set before drain looks at the
// count: one of them sees the other.
func (g *group) takeOff(stop <-chan struct{}) bool {
	for {
		g.flying.Add(1)
		h := g.hold.Load()
		if h == nil {
			return true
		}
		g.flying.Add(-1)
		select {
		case <-h.done:
		case <-stop:
			return false
		}
	}
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// transferTime bounds a transfer: a first try that fails, one more that
// succeeds, and the ticks it takes the target to win its election.
func (n *Node) transferTime() time.Duration { return 2*n.opt.election() + 10*n.opt.RTT }

// deadline is the earlier of ctx's deadline and d.
func deadline(ctx context.Context, d time.Time) time.Time {
	if dl, ok := ctx.Deadline(); ok && dl.Before(d) {
		return dl
	}
	return d
}

// preferred is the node that g's leadership belongs on (memberSet.preferred).
func (n *Node) preferred(g *group) uint32 { return n.members.Load().preferred(g.idx) }

// successor is the node to hand g's leadership to: the shard's preferred
// node if that is another one and reachable; else one of the others that
// is, taken in turn over this node's shards so that they spread; 0 if none
// is reachable.
func (n *Node) successor(g *group) uint32 {
	m := n.members.Load()
	n.mu.Lock()
	defer n.mu.Unlock()
	nodes := len(m.ids)
	if want := m.preferred(g.idx); want != n.opt.NodeID && n.reach[m.addrs[want]] {
		return want
	}
	others := make([]uint32, 0, nodes)
	for _, id := range m.ids {
		if id != n.opt.NodeID {
			others = append(others, id)
		}
	}
	for k := range others {
		id := others[(g.idx/nodes+k)%len(others)]
		if n.reach[m.addrs[id]] {
			return id
		}
	}
	return 0
}

// waitIdle waits until nothing is queued or in flight (idle), or until ctx
// ends; false in the second case.
func (n *Node) waitIdle(ctx context.Context) bool {
	for !n.idle() {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(time.Millisecond):
		}
	}
	return true
}

func (n *Node) idle() bool {
	for _, g := range n.grps {
		g.mu.Lock()
		busy := g.pendN > 0 || len(g.slots) > 0
		g.mu.Unlock()
		if busy {
			return false
		}
	}
	return true
}

// Close stops the node at once (start-up failures, tests), but for handing
// over the shards it leads when it stops for its settings (see Failed).
func (n *Node) Close() error {
	n.closeOnce.Do(func() {
		if n.Err() != nil {
			// It can lead shards it won before its notice to shard 0
			// committed; gone without a word, they would wait an election
			// timeout for a leader.
			ctx, cancel := context.WithTimeout(context.Background(), n.transferTime())
			n.handOver(ctx)
			cancel()
		}
		n.closing.Store(true)
		close(n.stop)
		n.wg.Wait()
		n.useMu.Lock()
		n.useEnded = true
		n.useMu.Unlock()
		n.release()
	})
	return nil
}

// Failed is closed when the node finds its settings are not the cluster's,
// or that it was removed from a shard (Err says so). A node that cannot write its log stops inside Dragonboat,
// which halts the process.
func (n *Node) Failed() <-chan struct{} { return n.failed }

// Err is why Failed closed; nil until it has.
func (n *Node) Err() error {
	select {
	case <-n.failed:
		return n.failErr
	default:
		return nil
	}
}

// System events (raftio.ISystemEventListener): connection outcomes tell
// whether a peer is worth handing leadership to; a snapshot restored gives
// its replica's applied index.
func (n *Node) ConnectionEstablished(info raftio.ConnectionInfo) {
	n.setReach(info.Address, true, info.SnapshotConnection)
}
func (n *Node) ConnectionFailed(info raftio.ConnectionInfo) {
	n.setReach(info.Address, false, info.SnapshotConnection)
	if !info.SnapshotConnection {
		select {
		case n.reapKick <- struct{}{}:
		default:
		}
	}
}
func (n *Node) setReach(addr string, ok, snapshot bool) {
	if snapshot && !ok {
		// A snapshot's stream can fail while messages flow. One that
		// connects counts: it resets the circuit breaker the message
		// stream shares, whose reconnection then goes unreported.
		return
	}
	n.mu.Lock()
	if ok && !n.reach[addr] {
		n.reconnected[addr] = !n.reachSince[addr].IsZero()
		n.reachSince[addr] = time.Now()
	}
	if ok {
		delete(n.downSince, addr)
	} else if _, down := n.downSince[addr]; !down {
		n.downSince[addr] = time.Now()
	}
	n.reach[addr] = ok
	n.mu.Unlock()
}

// downFor tells whether addr has been out of reach for longer than d.
func (n *Node) downFor(addr string, d time.Duration) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	since, down := n.downSince[addr]
	return down && !n.reach[addr] && time.Since(since) > d
}
func (n *Node) NodeHostShuttingDown() {}
func (n *Node) NodeUnloaded(info raftio.NodeInfo) {
	if n.closing.Load() || info.ReplicaID != uint64(n.opt.NodeID) {
		return
	}
	// Unloaded while running: this node applied its own removal (a
	// replace took it out while it was down, and it came back). It must
	// not serve, nor look ready: it stops.
	n.failOnce.Do(func() {
		n.failErr = fmt.Errorf("this node (node %d) was removed from shard %d: a replace took it out while it was down, and the new node has its place; it must not run again (README: replacing a node)",
			n.opt.NodeID, info.ShardID-1)
		n.log.Error("stopping: removed from the cluster", zap.Error(n.failErr))
		close(n.failed)
	})
}
func (n *Node) NodeDeleted(raftio.NodeInfo) {}
func (n *Node) NodeReady(raftio.NodeInfo)   {}
func (n *Node) MembershipChanged(raftio.NodeInfo) {
	select {
	case n.membersChanged <- struct{}{}:
	default:
	}
}
func (n *Node) SendSnapshotStarted(raftio.SnapshotInfo)   {}
func (n *Node) SendSnapshotCompleted(raftio.SnapshotInfo) {}
func (n *Node) SendSnapshotAborted(raftio.SnapshotInfo)   {}
func (n *Node) SnapshotReceived(raftio.SnapshotInfo)      { n.stats.snapshotsReceived.Add(1) }
func (n *Node) SnapshotCreated(raftio.SnapshotInfo)       {}
func (n *Node) SnapshotCompacted(raftio.SnapshotInfo)     {}
func (n *Node) LogCompacted(raftio.EntryInfo)             {}
func (n *Node) LogDBCompacted(raftio.EntryInfo)           {}

// SnapshotRecovered gives the replica restored its applied index (fsm.recovered).
func (n *Node) SnapshotRecovered(info raftio.SnapshotInfo) {
	if info.Index == 0 || info.ShardID == 0 || info.ShardID > uint64(len(n.grps)) {
		return
	}
	if f := n.grps[info.ShardID-1].fsm.Load(); f != nil {
		f.recovered(info.Index)
	}
}
