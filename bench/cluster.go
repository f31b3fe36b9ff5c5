package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/ticketd/ticketd/internal/serverproc"
)

// TicketdCluster labels the rows of ticketd in cluster mode (its wire is
// ticketd's).
const TicketdCluster System = "ticketd-cluster"

// ClusterReport is the cluster section's setting and what it found beside
// its rows.
type ClusterReport struct {
	Nodes, Shards, Conns int
	EtcdVersion          string
	// Leaders is each shard's leader (node id) before the failover run, as
	// the nodes logged it; LeadersPerNode counts them per node.
	Leaders        map[int]int
	LeadersPerNode map[int]int
	// LeaderChanges counts the new terms with a leader (elections or
	// transfers) the nodes logged from then until the kill: under load,
	// with no fault, there should be none.
	LeaderChanges int
	// DiskUse is each node's data directory on disk after every run.
	DiskUse  map[int]int64
	Failover *Failover
	// CleanStop is the same run with SIGTERM instead of kill -9, before
	// it; the node is then started again for the kill.
	CleanStop *Failover
	// Rejoin is that start, under load: the second half of a rolling
	// restart.
	Rejoin *Rejoin
}

// Rejoin is a node started again under steady load on the other nodes,
// which give it back the leadership of the shards it prefers.
type Rejoin struct {
	Node         int
	Conns, Depth int
	StartAfter   time.Duration // into the measured window
	Window       time.Duration // the measured window
	Ready        time.Duration // from the start to the node serving
	PairsPerSec  float64       // over the whole window, the start included
	// Over every shard after the start: the longest stretch without an
	// answer and the longest a request waited; the longest quiet stretch
	// before it (the noise floor).
	Quiet, MaxLatency, Baseline time.Duration
	// LeadingIn: when a node first logged the rejoined node as leader of
	// each shard it came to lead after the start (handed back, or won in
	// an election).
	LeadingIn map[int]time.Duration
}

// Failover is the kill -9 (or, Clean, the SIGTERM) of one node under
// steady load.
type Failover struct {
	Clean        bool
	Killed       int   // node id
	KilledShards []int // the shards it led at the kill
	Conns, Depth int
	KillAfter    time.Duration // into the measured window
	// LeadersPerNode at the kill.
	LeadersPerNode map[int]int
	PairsPerSec    float64 // over the whole window, the kill included
	// Gap is the target's figure: over the killed node's shards, the
	// longer of Quiet and MaxLatency.
	Gap time.Duration
	// Over the killed node's shards: the longest stretch without an answer
	// on one of them, and the longest a request on them waited for its
	// answer after the kill; the same over the other shards; and the
	// longest quiet stretch of any shard before the kill (the noise floor).
	Quiet, MaxLatency           time.Duration
	OtherQuiet, OtherMaxLatency time.Duration
	Baseline                    time.Duration
	Unrecovered                 []int // killed shards still quiet when the window ended
	// The clients: connections to the killed node (and any ended with
	// E unavailable) dialled again, how many ends were E unavailable, the
	// requests those connections had in flight, and the longest a
	// reconnecting connection went between answers.
	Reconnects, Unavailable, Lost int64
	Outage                        time.Duration
	// NewLeaders of the killed shards, and when a surviving node first
	// logged a leader other than the killed node for each, after the kill.
	NewLeaders map[int]int
	ElectedIn  map[int]time.Duration
	Shards     []ShardGap
	// Timeline: answers/s on the killed node's shards and on the others,
	// in steps, with time relative to the kill (seconds).
	Timeline struct {
		At, Killed, Others []float64
	}
}

// clusterCPU is the CPU time the live processes of pids have used so far;
// a process that has gone counts no more, so a run that kills one reads low.
func clusterCPU(pids func() []int) func() (time.Duration, error) {
	return func() (time.Duration, error) {
		var sum time.Duration
		for _, pid := range pids() {
			if d, err := procCPU(pid); err == nil {
				sum += d
			}
		}
		return sum, nil
	}
}

// cluster: ticketd's 3-node cluster mode, single mode and an etcd cluster
// at the same clients; then the failover of a node under load.
func (s *suite) cluster(ctx context.Context) error {
	p := s.plan
	cr := &ClusterReport{Nodes: p.ClusterNodes, Shards: p.ClusterShards, Conns: p.ClusterConns}
	s.rep.Cluster = cr
	var errs []error
	if serverproc.SupportsCluster(s.env.Ticketd) {
		if err := s.clusterTicketd(ctx, cr); err != nil {
			errs = append(errs, fmt.Errorf("ticketd cluster: %w", err))
		}
	} else {
		s.rep.Skipped = append(s.rep.Skipped, "ticketd cluster: this ticketd has no --peers flag (cluster mode)")
		fmt.Fprintln(s.env.Log, "   skipping the ticketd cluster: no --peers flag")
	}
	if err := s.clusterSingle(ctx); err != nil {
		errs = append(errs, fmt.Errorf("ticketd single: %w", err))
	}
	if s.env.Etcd == "" {
		s.rep.Skipped = append(s.rep.Skipped, "etcd: "+s.env.EtcdMissing)
		fmt.Fprintf(s.env.Log, "   skipping etcd: %s\n", s.env.EtcdMissing)
	} else if err := s.clusterEtcd(ctx, cr); err != nil {
		errs = append(errs, fmt.Errorf("etcd: %w", err))
	}
	return errors.Join(errs...)
}

func (s *suite) clusterLoad(depth int, label string) Load {
	p := s.plan
	return Load{System: Ticketd, Conns: p.ClusterConns, Depth: depth, Warmup: p.Warmup,
		Duration: p.ClusterDuration, Keys: Dist{Keys: p.Keys}, KeyPrefix: "k", LeaseMs: 30000, Label: label}
}

func (s *suite) clusterSingle(ctx context.Context) (err error) {
	p := s.plan
	srv, err := s.startTicketd("--shards", strconv.Itoa(p.ClusterShards))
	if err != nil {
		return err
	}
	defer stopInto(&err, srv)
	for _, d := range p.ClusterDepths {
		l := s.clusterLoad(d, fmt.Sprintf("cluster section: ticketd single depth %d", d))
		l.Addr = srv.Addr
		if _, err := s.run(ctx, ScenarioCluster, srv, l); err != nil {
			return err
		}
	}
	return nil
}

func (s *suite) clusterTicketd(ctx context.Context, cr *ClusterReport) (err error) {
	p := s.plan
	fmt.Fprintf(s.env.Log, "-> starting %d ticketd nodes in cluster mode\n", p.ClusterNodes)
	c, err := serverproc.StartCluster(s.env.Ticketd, p.ClusterNodes, time.Minute, "--shards", strconv.Itoa(p.ClusterShards))
	if err != nil {
		return err
	}
	defer func() {
		cr.DiskUse = c.DiskUse()
		if serr := c.Stop(10 * time.Second); serr != nil && err == nil {
			err = serr
		}
	}()
	if !settleLeaders(c, p.ClusterShards, time.Second, 15*time.Second) {
		s.rep.Errors = append(s.rep.Errors, "cluster: the shards' leaders did not settle within 15s of the start; the runs went on")
	}
	terms0 := elections(c)
	cr.Leaders = c.Leaders()
	cr.LeadersPerNode = map[int]int{}
	for _, n := range cr.Leaders {
		cr.LeadersPerNode[n]++
	}
	fmt.Fprintf(s.env.Log, "   shard leaders per node: %v\n", cr.LeadersPerNode)
	pids := func() []int {
		var out []int
		for _, nd := range c.Nodes {
			if !nd.Proc.Exited() {
				out = append(out, nd.Proc.Pid())
			}
		}
		return out
	}
	for _, d := range p.ClusterDepths {
		l := s.clusterLoad(d, fmt.Sprintf("cluster section: ticketd %d-node cluster depth %d", p.ClusterNodes, d))
		l.Addrs, l.Reconnect = c.Addrs(), true
		if _, err := s.measure(ctx, ScenarioCluster, TicketdCluster, clusterCPU(pids), l, func() (*Result, error) {
			return Run(ctx, l)
		}); err != nil {
			return err
		}
	}
	if p.FailoverDuration == 0 {
		cr.LeaderChanges = elections(c) - terms0
		return nil
	}
	atStop := func() { cr.LeaderChanges = elections(c) - terms0 }
	if cr.CleanStop, err = s.failover(ctx, c, true, atStop); err != nil {
		return err
	}
	if cr.Rejoin, err = s.rejoin(ctx, c, cr.CleanStop.Killed); err != nil {
		return err
	}
	if !settleLeaders(c, p.ClusterShards, time.Second, 30*time.Second) {
		s.rep.Errors = append(s.rep.Errors, "cluster: the shards' leaders did not settle within 30s of the rejoin; the kill -9 went on")
	}
	cr.Failover, err = s.failover(ctx, c, false, nil)
	return err
}

// elections counts the distinct (shard, term) with a leader in the logs.
// (The name is loose: a leader transfer starts a term too.)
func elections(c *serverproc.Cluster) int {
	type st struct {
		shard int
		term  uint64
	}
	seen := map[st]bool{}
	for _, lc := range c.LeaderChanges() {
		if lc.Leader != 0 {
			seen[st{lc.Shard, lc.Term}] = true
		}
	}
	return len(seen)
}

// settleLeaders waits until the logs name a leader for every shard, no node
// leads more than its share (leaders are moved to spread them after a
// start, a few seconds apart when a move fails) and no leader changed for
// quiet; at most for limit. false if they did not settle by then.
func settleLeaders(c *serverproc.Cluster, shards int, quiet, limit time.Duration) bool {
	deadline := time.Now().Add(limit)
	share := (shards + len(c.Nodes) - 1) / len(c.Nodes)
	last, since := -1, time.Now()
	for time.Now().Before(deadline) {
		n := len(c.LeaderChanges())
		if n != last {
			last, since = n, time.Now()
		} else if leaders := c.Leaders(); len(leaders) >= shards && time.Since(since) >= quiet {
			per := map[int]int{}
			most := 0
			for _, nd := range leaders {
				per[nd]++
				most = max(most, per[nd])
			}
			if most <= share {
				return true
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return false
}

// failover kills (clean: stops with SIGTERM), under steady load spread over
// every node, the node that leads the most shards, and measures how long
// its shards went unanswered. atStop, if any, runs just before the signal.
func (s *suite) failover(ctx context.Context, c *serverproc.Cluster, clean bool, atStop func()) (*Failover, error) {
	p := s.plan
	how := "kill -9"
	if clean {
		how = "SIGTERM"
	}
	f := &Failover{Clean: clean, KillAfter: p.FailoverKillAfter}
	label := fmt.Sprintf("cluster section: failover, %s of a node after %s", how, p.FailoverKillAfter)
	res, tr, killedAt, err := s.underLoad(ctx, c, label, "f", "kill", p.FailoverDuration, func(mark func()) {
		if atStop != nil {
			atStop()
		}
		leaders := c.Leaders()
		per := map[int]int{}
		for _, n := range leaders {
			per[n]++
		}
		f.Killed = 1
		for _, nd := range c.Nodes {
			if per[nd.ID] > per[f.Killed] {
				f.Killed = nd.ID
			}
		}
		for sh, n := range leaders {
			if n == f.Killed {
				f.KilledShards = append(f.KilledShards, sh)
			}
		}
		slices.Sort(f.KilledShards)
		f.LeadersPerNode = per
		nd := c.Node(f.Killed)
		fmt.Fprintf(s.env.Log, "   %s node %d (pid %d), leader of shards %v\n", how, nd.ID, nd.Proc.Pid(), f.KilledShards)
		mark()
		if !clean {
			nd.Proc.Kill()
		} else if err := nd.Proc.Stop(30 * time.Second); err != nil {
			fmt.Fprintf(s.env.Log, "   node %d: %v\n", nd.ID, err)
			s.rep.Errors = append(s.rep.Errors, fmt.Sprintf("cluster: the clean stop of node %d: %v", nd.ID, err))
		} else if code := nd.Proc.ExitCode(); code != 0 {
			s.rep.Errors = append(s.rep.Errors, fmt.Sprintf("cluster: the clean stop of node %d ended with %s: its figures are of a stop that was not clean", nd.ID, nd.Proc.ExitState()))
		}
	})
	if err != nil {
		return nil, err
	}
	f.Conns, f.Depth = res.Load.Conns, res.Load.Depth
	f.PairsPerSec = res.PairsPerSec()
	f.Reconnects, f.Unavailable, f.Lost, f.Outage = res.Reconnects, res.Unavailable, res.Lost, res.Outage
	f.Shards = tr.Gaps()
	for _, g := range f.Shards {
		f.Baseline = max(f.Baseline, g.Baseline)
		if slices.Contains(f.KilledShards, g.Shard) {
			f.Quiet, f.MaxLatency = max(f.Quiet, g.Quiet), max(f.MaxLatency, g.MaxLatency)
			if g.Unrecovered {
				f.Unrecovered = append(f.Unrecovered, g.Shard)
			}
		} else {
			f.OtherQuiet, f.OtherMaxLatency = max(f.OtherQuiet, g.Quiet), max(f.OtherMaxLatency, g.MaxLatency)
		}
	}
	f.Gap = max(f.Quiet, f.MaxLatency)
	var others []int
	for sh := range p.ClusterShards {
		if !slices.Contains(f.KilledShards, sh) {
			others = append(others, sh)
		}
	}
	at, killedRate := tr.Rate(f.KilledShards, 20*time.Millisecond)
	_, otherRate := tr.Rate(others, 20*time.Millisecond)
	for i := range at {
		f.Timeline.At = append(f.Timeline.At, at[i].Seconds())
	}
	f.Timeline.Killed, f.Timeline.Others = killedRate, otherRate
	f.NewLeaders, f.ElectedIn = leadersAfter(c, killedAt, func(lc serverproc.LeaderChange) bool {
		return lc.Node != f.Killed && lc.Leader != 0 && lc.Leader != f.Killed && slices.Contains(f.KilledShards, lc.Shard)
	})
	fmt.Fprintf(s.env.Log, "   failover (%s): shards %v quiet up to %s, a request on them waited up to %s (before: quiet up to %s); "+
		"other shards quiet up to %s; %d reconnects, %d E unavailable, %d requests lost with their connections, longest client outage %s\n",
		how, f.KilledShards, fmtDur(f.Quiet), fmtDur(f.MaxLatency), fmtDur(f.Baseline), fmtDur(f.OtherQuiet),
		f.Reconnects, f.Unavailable, f.Lost, fmtDur(f.Outage))
	return f, nil
}

// rejoin starts the stopped node again under the failover run's load on
// the other nodes and measures the answers on every shard while it comes
// back and takes over the shards it prefers.
func (s *suite) rejoin(ctx context.Context, c *serverproc.Cluster, node int) (*Rejoin, error) {
	p := s.plan
	rj := &Rejoin{Node: node, StartAfter: p.FailoverKillAfter, Window: p.RejoinDuration}
	if rj.Window == 0 {
		rj.Window = p.FailoverDuration
	}
	var startErr error
	label := fmt.Sprintf("cluster section: node %d started again under load after %s", node, p.FailoverKillAfter)
	res, tr, startedAt, err := s.underLoad(ctx, c, label, "j", "start", rj.Window, func(mark func()) {
		fmt.Fprintf(s.env.Log, "   starting node %d again\n", node)
		mark()
		t0 := time.Now()
		startErr = c.Restart(node, time.Minute)
		rj.Ready = time.Since(t0)
	})
	if err == nil {
		err = startErr
	}
	if err != nil {
		return nil, err
	}
	rj.Conns, rj.Depth = res.Load.Conns, res.Load.Depth
	rj.PairsPerSec = res.PairsPerSec()
	for _, g := range tr.Gaps() {
		rj.Quiet, rj.MaxLatency = max(rj.Quiet, g.Quiet), max(rj.MaxLatency, g.MaxLatency)
		rj.Baseline = max(rj.Baseline, g.Baseline)
	}
	_, rj.LeadingIn = leadersAfter(c, startedAt, func(lc serverproc.LeaderChange) bool { return lc.Leader == node })
	fmt.Fprintf(s.env.Log, "   rejoin: node %d serving after %s, then leading %d shards; every shard quiet up to %s, "+
		"a request waited up to %s (before: quiet up to %s)\n",
		node, fmtDur(rj.Ready), len(rj.LeadingIn), fmtDur(rj.Quiet), fmtDur(rj.MaxLatency), fmtDur(rj.Baseline))
	return rj, nil
}

// underLoad runs the failover load over the live nodes for window, with a
// trace per shard, and calls event FailoverKillAfter into it; event calls
// mark at its instant, which marks the trace and is returned as at.
// It returns once both are over; what names the event in the error of a
// run that ended before it.
func (s *suite) underLoad(ctx context.Context, c *serverproc.Cluster, label, keyPrefix, what string,
	window time.Duration, event func(mark func())) (res *Result, tr *Trace, at time.Time, err error) {
	p := s.plan
	tr = NewTrace(p.ClusterShards, time.Millisecond)
	l := s.clusterLoad(p.FailoverDepth, label)
	l.Addrs, l.Reconnect, l.Trace = c.Addrs(), true, tr
	l.Duration, l.KeyPrefix, l.Progress = window, keyPrefix, s.env.Log
	done := make(chan struct{})
	timer := time.AfterFunc(p.Warmup+p.FailoverKillAfter, func() {
		defer close(done)
		event(func() { tr.Mark(); at = time.Now() })
	})
	fmt.Fprintf(s.env.Log, "-> %s\n", l.Label)
	res, err = Run(ctx, l)
	if !timer.Stop() {
		<-done
	} else if err == nil {
		err = errors.New("the run ended before the " + what)
	}
	return res, tr, at, err
}

// leadersAfter reads the leader lines logged from t0 on that keep accepts:
// per shard, the leader of the last such line read, and how soon after t0
// the first was logged.
func leadersAfter(c *serverproc.Cluster, t0 time.Time, keep func(serverproc.LeaderChange) bool) (map[int]int, map[int]time.Duration) {
	leader, after := map[int]int{}, map[int]time.Duration{}
	for _, lc := range c.LeaderChanges() {
		if !keep(lc) {
			continue
		}
		ts, ok := logTime(lc.TS)
		if !ok || ts.Before(t0) {
			continue
		}
		leader[lc.Shard] = lc.Leader
		if d, seen := after[lc.Shard]; !seen || ts.Sub(t0) < d {
			after[lc.Shard] = ts.Sub(t0)
		}
	}
	return leader, after
}

// logTime reads a zap JSON "ts": ISO 8601 text, or epoch seconds.
func logTime(v any) (time.Time, bool) {
	switch t := v.(type) {
	case string:
		for _, layout := range []string{"2006-01-02T15:04:05.000Z0700", time.RFC3339Nano} {
			if ts, err := time.Parse(layout, t); err == nil {
				return ts, true
			}
		}
	case float64:
		return time.Unix(0, int64(t*1e9)), true
	}
	return time.Time{}, false
}

func (s *suite) clusterEtcd(ctx context.Context, cr *ClusterReport) (err error) {
	p := s.plan
	cr.EtcdVersion = serverproc.EtcdVersion(s.env.Etcd)
	fmt.Fprintf(s.env.Log, "-> starting a %d-member etcd cluster (%s)\n", p.ClusterNodes, cr.EtcdVersion)
	e, err := serverproc.StartEtcd(s.env.Etcd, p.ClusterNodes, time.Minute)
	if err != nil {
		return err
	}
	defer func() {
		if serr := e.Stop(10 * time.Second); serr != nil && err == nil {
			err = serr
		}
	}()
	l := s.clusterLoad(1, "cluster section: etcd concurrency.Mutex Lock+Unlock")
	l.Duration = p.EtcdDuration
	_, err = s.measure(ctx, ScenarioCluster, Etcd, clusterCPU(e.Pids), l, func() (*Result, error) {
		return RunEtcdMutex(ctx, e.Endpoints(), l)
	})
	return err
}
