package main

import (
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/ticketd/ticketd/replica"
)

// clusterFlags are cluster mode's flags; cluster mode is on when --peers is
// given.
type clusterFlags struct {
	nodeID             uint
	peersFlag          string
	maxClockSkew       time.Duration
	unavailableTimeout time.Duration
	raftRTT            time.Duration
	electionRTT        uint
	snapshotEntries    uint64
	maxQueued          int
	join               bool
	bootstrap          bool
	clockOffsetFile    string

	peers map[uint32]string
	names []string        // the flags register made
	given map[string]bool // the flags the command line set
}

func (c *clusterFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.peersFlag, "peers", "", "cluster mode: every node's raft address by id, as 1=host:port,2=host:port,3=host:port (this node's included); off: single mode")
	fs.UintVar(&c.nodeID, "node-id", 0, "cluster mode: this node's id among --peers")
	fs.DurationVar(&c.maxClockSkew, "max-clock-skew", 500*time.Millisecond, "cluster mode: the most node clocks may differ (half of it for holders that count their lease from its answer); a lease ends this long after its deadline on the leader's clock")
	// Not "cluster mode:" first: that prefix makes a flag cluster-only.
	fs.DurationVar(&c.unavailableTimeout, "unavailable-timeout", 5*time.Second, "in cluster mode, how long a request may wait for a shard without quorum before its connection gets E unavailable (four election timeouts where the node knows no leader for the shard, if less); in both modes, /readyz answers 503 once a synced write to the data dir has taken this long or failed (a stalled disk), until one takes less")
	fs.DurationVar(&c.raftRTT, "raft-rtt", 10*time.Millisecond, "cluster mode: the raft tick (a round trip between nodes, or more)")
	fs.UintVar(&c.electionRTT, "election-rtt", 30, "cluster mode: election timeout in raft ticks")
	fs.BoolVar(&c.join, "join", false, "cluster mode: this node replaces a lost one and joins the existing shards (README: replacing a node); only on its first start")
	fs.BoolVar(&c.bootstrap, "bootstrap", false, "cluster mode: the first start of a new cluster, on empty data dirs (without it or --join, a node whose data dir holds no cluster state is refused); leave it out of later starts")
	fs.Uint64Var(&c.snapshotEntries, "raft-snapshot-entries", 20000, "cluster mode: log entries per shard between snapshots (a lagging node catches up from the latest one)")
	fs.IntVar(&c.maxQueued, "max-queued", replica.DefaultMaxQueued, "cluster mode: client requests this node holds on their way through the raft log; past it, connections with more than their share of it (it over the open connections) unanswered stop being read until it drains, and at twice it every connection")
	fs.StringVar(&c.clockOffsetFile, "unsafe-test-clock-offset-file", "", "FOR TESTS ONLY: read a signed offset (e.g. -1.5s) from this file and add it to the wall clock: in cluster mode every 50ms, to the clock this node stamps and times leases by; in single mode once, at the start, to the clock the run starts on")
	fs.VisitAll(func(f *flag.Flag) {
		if strings.HasPrefix(f.Usage, "cluster mode:") {
			c.names = append(c.names, f.Name)
		}
	})
}

// parsed records which of the cluster's flags the command line set.
func (c *clusterFlags) parsed(fs *flag.FlagSet) {
	c.given = make(map[string]bool)
	fs.Visit(func(f *flag.Flag) { c.given[f.Name] = true })
}

func (c *clusterFlags) enabled() bool { return c.peersFlag != "" }

func (c *clusterFlags) validate(bad func(flag, format string, args ...any) error) error {
	if c.unavailableTimeout < 100*time.Millisecond || c.unavailableTimeout > 30*time.Second {
		return bad("unavailable-timeout", "%v is not between 100ms and 30s", c.unavailableTimeout)
	}
	if !c.enabled() {
		// Ignored, one would mislead: a test's clock offset that does
		// not apply passes without testing anything.
		for _, name := range c.names {
			if name == "peers" {
				continue // --peers "" asks for single mode
			}
			if c.given[name] || name == "node-id" && c.nodeID != 0 || name == "join" && c.join || name == "bootstrap" && c.bootstrap {
				return bad(name, "cluster mode only, given without --peers")
			}
		}
		return nil
	}
	c.peers = make(map[uint32]string)
	addrs := make(map[string]uint32)
	for _, p := range strings.Split(c.peersFlag, ",") {
		id, addr, ok := strings.Cut(strings.TrimSpace(p), "=")
		n, err := strconv.ParseUint(id, 10, 32)
		if !ok || err != nil || n == 0 {
			return bad("peers", "%q is not id=host:port with a positive id", p)
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return bad("peers", "%q: %q is not host:port", p, addr)
		}
		if _, dup := c.peers[uint32(n)]; dup {
			return bad("peers", "node %d named twice", n)
		}
		// Caught here, not by Dragonboat: it panics on one, after the
		// data dir has recorded the list.
		if other, dup := addrs[addr]; dup {
			return bad("peers", "nodes %d and %d have the same address %s", other, n, addr)
		}
		addrs[addr] = uint32(n)
		c.peers[uint32(n)] = addr
	}
	if len(c.peers) < 3 || len(c.peers)%2 == 0 {
		return bad("peers", "%d nodes; a cluster has an odd number of nodes, at least 3", len(c.peers))
	}
	if _, ok := c.peers[uint32(c.nodeID)]; !ok || c.nodeID == 0 {
		return bad("node-id", "%d is not among --peers", c.nodeID)
	}
	if c.maxClockSkew <= 0 {
		return bad("max-clock-skew", "%v must be positive", c.maxClockSkew)
	}
	if c.raftRTT < time.Millisecond {
		return bad("raft-rtt", "%v must be at least 1ms", c.raftRTT)
	}
	if c.raftRTT%time.Millisecond != 0 {
		// Dragonboat counts it in whole ms: 1500us would be 1ms.
		return bad("raft-rtt", "%v is not a whole number of milliseconds", c.raftRTT)
	}
	if c.electionRTT < 5 {
		return bad("election-rtt", "%d must be at least 5", c.electionRTT)
	}
	if c.snapshotEntries < 10 {
		return bad("raft-snapshot-entries", "%d must be at least 10", c.snapshotEntries)
	}
	if c.maxQueued < 1 {
		return bad("max-queued", "%d must be at least 1", c.maxQueued)
	}
	if c.bootstrap && c.join {
		return bad("bootstrap", "with --join: a node founds a new cluster or joins one")
	}
	return nil
}

// testClock is the wall clock plus an offset read from a file: tests play a
// node whose clock is off, or jumps, without touching the machine's clock
// (Go reads time through the vDSO, so faketime cannot).
type testClock struct {
	off atomic.Int64
}

func newTestClock(file string, stop <-chan struct{}) (*testClock, error) {
	c := &testClock{}
	read := func() error {
		d, err := readClockOffset(file)
		if err == nil {
			c.off.Store(int64(d))
		}
		return err
	}
	if err := read(); err != nil {
		return nil, err
	}
	go func() {
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				_ = read() // a file being rewritten keeps the last offset
			}
		}
	}()
	return c, nil
}

func (c *testClock) now() int64 { return time.Now().UnixNano() + c.off.Load() }

// readClockOffset is the offset --unsafe-test-clock-offset-file holds (an
// empty file: none).
func readClockOffset(file string) (time.Duration, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("--unsafe-test-clock-offset-file %s: %w", file, err)
	}
	return d, nil
}

func (c *clusterFlags) options(cfg *config) replica.Options {
	return replica.Options{
		NodeID:             uint32(c.nodeID),
		Peers:              c.peers,
		DataDir:            cfg.dataDir,
		Shards:             cfg.shards,
		MaxKeys:            cfg.maxKeys,
		MaxWaitersPerKey:   cfg.maxWaitersPerKey,
		MaxWaiters:         cfg.maxWaiters,
		RTT:                c.raftRTT,
		ElectionRTT:        uint64(c.electionRTT),
		MaxClockSkew:       c.maxClockSkew,
		UnavailableTimeout: c.unavailableTimeout,
		SnapshotEntries:    c.snapshotEntries,
		MaxQueued:          c.maxQueued,
		Join:               c.join,
		Bootstrap:          c.bootstrap,
	}
}

// openCluster starts this node of the cluster: its raft node host and a
// replica of every shard.
func openCluster(cfg *config, log *zap.Logger, adm *admin) (backend, error) {
	opt := cfg.cluster.options(cfg)
	opt.Logger = log
	opt.ProposeSeconds, opt.BatchCommands = adm.clusterObservers()
	if f := cfg.cluster.clockOffsetFile; f != "" {
		stop := make(chan struct{}) // the clock lives as long as the process
		clk, err := newTestClock(f, stop)
		if err != nil {
			return nil, err
		}
		opt.Clock = clk.now
		log.Warn("the wall clock is offset from a file: for tests only", zap.String("file", f))
	}
	if free, total, err := freeSpace(cfg.dataDir); err == nil && total > 0 && free < diskReserve(total) {
		return nil, lowDiskError(cfg.dataDir, free, total)
	}
	n, err := replica.Start(opt)
	if err != nil {
		return nil, err
	}
	adm.cluster(n)
	return n, nil
}
