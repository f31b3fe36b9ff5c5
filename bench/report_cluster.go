package bench

import (
	"fmt"
	"image/color"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/ticketd/ticketd/internal/serverproc"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Cluster targets: from issue 7's benchmark section.
const (
	clusterVsEtcd     = 100                     // ticketd cluster pairs/s over etcd's, same clients
	clusterDepth1P99  = 10 * time.Millisecond   // ticketd cluster p99 at depth 1
	clusterFailoverIn = 2000 * time.Millisecond // killed leader's shards answered again
)

func (r *Report) findCluster(sys System, depth int) *Row {
	for i := range r.Rows {
		x := &r.Rows[i]
		if x.Scenario == ScenarioCluster && x.System == sys && (depth == 0 || x.Depth == depth) {
			return x
		}
	}
	return nil
}

// bestCluster is sys's cluster-section row with the most pairs/s.
func (r *Report) bestCluster(sys System) *Row {
	var best *Row
	for i := range r.Rows {
		x := &r.Rows[i]
		if x.Scenario == ScenarioCluster && x.System == sys && (best == nil || x.PairsPerSec > best.PairsPerSec) {
			best = x
		}
	}
	return best
}

// evaluateCluster adds the cluster targets, when the plan has the section.
func (r *Report) evaluateCluster(skip func(name, why string)) {
	if r.plan.ClusterNodes == 0 || r.Cluster == nil {
		return
	}
	n := r.plan.ClusterNodes
	name := fmt.Sprintf("cluster: ticketd (%d nodes, pipelined) >= %dx etcd's concurrency.Mutex pairs/s, same clients", n, clusterVsEtcd)
	t, e := r.bestCluster(TicketdCluster), r.findCluster(Etcd, 0)
	switch {
	case t == nil:
		skip(name, "the ticketd cluster did not run")
	case e == nil:
		skip(name, "etcd did not run ("+serverproc.EtcdInstall+" if it is missing)")
	default:
		ratio := t.PairsPerSec / e.PairsPerSec
		got := fmt.Sprintf("%s (depth %d) vs %s pairs/s = %s", human(t.PairsPerSec), t.Depth, human(e.PairsPerSec), fmtRatio(ratio))
		if t1 := r.findCluster(TicketdCluster, 1); t1 != nil && t1 != t {
			got += "; at depth 1 " + fmtRatio(t1.PairsPerSec/e.PairsPerSec)
		}
		got, clean := withLosses(got, t)
		r.Targets = append(r.Targets, Target{name, got, verdict(ratio >= clusterVsEtcd && clean)})
	}
	name = fmt.Sprintf("cluster: ticketd p99 at depth 1 < %s", fmtDur(clusterDepth1P99))
	if t1 := r.findCluster(TicketdCluster, 1); t1 == nil {
		skip(name, "the ticketd cluster did not run at depth 1")
	} else {
		got, clean := withLosses(fmtDur(t1.P99), t1)
		r.Targets = append(r.Targets, Target{name, got, verdict(t1.P99 < clusterDepth1P99 && clean)})
	}
	name = fmt.Sprintf("cluster: after kill -9 of a leader's node, its shards answered again within %s", fmtDur(clusterFailoverIn))
	if f := r.Cluster.Failover; f == nil || len(f.Shards) == 0 {
		skip(name, "the failover run did not run")
	} else if len(f.KilledShards) == 0 {
		// Nothing to judge: a gap of 0 on no shard is no recovery.
		r.Targets = append(r.Targets, Target{name, "no shard known to be led by the killed node (no leaders in the logs)", verdict(false)})
	} else {
		got := fmt.Sprintf("gap %s (no answer for %s, a request waited up to %s)", fmtDur(f.Gap), fmtDur(f.Quiet), fmtDur(f.MaxLatency))
		ok := f.Gap <= clusterFailoverIn && len(f.Unrecovered) == 0
		if len(f.Unrecovered) > 0 {
			got += fmt.Sprintf("; shards %v never answered again", f.Unrecovered)
		}
		r.Targets = append(r.Targets, Target{name, got, verdict(ok)})
	}
}

// withLosses adds to got what a run without faults should not have had:
// connections ended by E unavailable or closed, with their requests; clean
// is false if there were any (the run's figures leave those requests out).
func withLosses(got string, x *Row) (string, bool) {
	if x.Reconnects == 0 && x.Lost == 0 {
		return got, true
	}
	return got + fmt.Sprintf(" (depth %d: %d reconnects, %d after E unavailable, %d requests lost)", x.Depth, x.Reconnects, x.Unavailable, x.Lost), false
}

func (r *Report) mdCluster(w func(string, ...any), failoverChart string) {
	p, c := r.plan, r.Cluster
	w("\n## 4. Cluster: %d ticketd nodes beside a %d-member etcd and single-mode ticketd\n\n", p.ClusterNodes, p.ClusterNodes)
	w("All on this machine, on loopback, sharing its %d cores with the generator. ticketd: %d nodes in cluster mode, "+
		"%d shards (one raft group each), the %d connections spread over the nodes' listeners in turn, acquire+release "+
		"pipelined at each depth, %s keys uniform; single mode: one ticketd with the same shards, clients and depths. "+
		"etcd (%s, 3 members, default settings, data on the same disk): the same number of clients, each with its "+
		"own session (a 30s lease) doing `concurrency.Mutex` Lock then Unlock (client go.etcd.io/etcd/client/v3) on "+
		"keys chosen the same way; the Mutex API blocks, so etcd runs at depth 1 only. Each run warms up %s and "+
		"measures %s (etcd %s). Ratios are against the other systems of this run.\n\n",
		r.Cores, p.ClusterNodes, p.ClusterShards, p.ClusterConns, commas(int64(p.Keys)),
		orDash(c.EtcdVersion), p.Warmup, p.ClusterDuration, p.EtcdDuration)
	if len(c.LeadersPerNode) > 0 {
		w("Shard leaders per node before the runs: %s", fmtPerNode(c.LeadersPerNode, func(n int) string { return fmt.Sprint(n) }))
		if f := c.Failover; f != nil && len(f.LeadersPerNode) > 0 {
			w("; at the kill: %s", fmtPerNode(f.LeadersPerNode, func(n int) string { return fmt.Sprint(n) }))
		}
		w(". Leader changes (a new term: an election or a transfer) logged while the load ran, before any kill: %d.\n\n", c.LeaderChanges)
	}
	e := r.findCluster(Etcd, 0)
	w("| depth | system | pairs/s | lines/s | p50 | p99 | p99.9 | pairs/s vs etcd | vs single mode | reconnects / E unavailable / lost | CPU cores server / bench / others |\n")
	w("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	depths := slices.Clone(p.ClusterDepths)
	for _, d := range depths {
		single := r.findCluster(Ticketd, d)
		for _, sys := range []System{TicketdCluster, Ticketd, Etcd} {
			x := r.findCluster(sys, d)
			if x == nil {
				continue
			}
			vsEtcd, vsSingle, rc := "-", "-", "-"
			if e != nil {
				vsEtcd = fmtRatio(x.PairsPerSec / e.PairsPerSec)
			}
			if single != nil && sys != Ticketd {
				vsSingle = fmt.Sprintf("%.0f%%", 100*x.PairsPerSec/single.PairsPerSec)
			}
			if sys == TicketdCluster {
				rc = fmt.Sprintf("%d / %d / %d", x.Reconnects, x.Unavailable, x.Lost)
			}
			name := string(sys)
			switch sys {
			case TicketdCluster:
				name = fmt.Sprintf("ticketd, %d-node cluster", p.ClusterNodes)
			case Ticketd:
				name = "ticketd, single mode"
			case Etcd:
				name = "etcd, concurrency.Mutex"
			}
			w("| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", d, name, human(x.PairsPerSec), human(x.LinesPerSec),
				fmtDur(x.P50), fmtDur(x.P99), fmtDur(x.P999), vsEtcd, vsSingle, rc, x.cpu())
		}
	}
	if len(c.DiskUse) > 0 {
		w("\nData directories on disk after the runs (Dragonboat's log and snapshots): %s.\n", fmtPerNode(c.DiskUse, fmtBytes))
	}
	if f := c.CleanStop; f != nil && len(f.Shards) > 0 {
		w("\n### Clean stop: SIGTERM of node %d under load\n\n", f.Killed)
		w("The load of the failover run below; %s into the measured window the node leading the most shards "+
			"(node %d: shards %v) was sent SIGTERM. It answers its queued acquires T, closes its client connections "+
			"(its clients dial the next node), hands the leadership of its shards to the other nodes and exits. "+
			"Measured as below; it was then started again (next), and the kill -9 run had all %d nodes.\n\n",
			fmtDur(f.KillAfter), f.Killed, f.KilledShards, p.ClusterNodes)
		mdStopTable(w, f)
	}
	if rj := c.Rejoin; rj != nil {
		w("\n### Rejoin: node %d started again under load\n\n", rj.Node)
		w("The same load on the other nodes; %s into a measured window of %s node %d was started again on its data "+
			"directory. It catches up on what it missed, and the leaders hand it back the shards it prefers. "+
			"Every shard counts here: a request on any of them may wait on a hand-back.\n\n", fmtDur(rj.StartAfter), fmtDur(rj.Window), rj.Node)
		w("| measured | figure |\n|---|---:|\n")
		w("| **longest wait of a request** on any shard after the start | **%s** |\n", fmtDur(rj.MaxLatency))
		w("| no answer on one of the shards, longest | %s |\n", fmtDur(rj.Quiet))
		w("| no answer on any shard before the start, longest (noise floor) | %s |\n", fmtDur(rj.Baseline))
		w("| from the start to the node serving clients | %s |\n", fmtDur(rj.Ready))
		if len(rj.LeadingIn) > 0 {
			var ds []time.Duration
			for _, d := range rj.LeadingIn {
				ds = append(ds, d)
			}
			w("| shards it came to lead (handed back, or by an election) / logged after the start | %d / %s to %s |\n", len(ds), fmtDur(slices.Min(ds)), fmtDur(slices.Max(ds)))
		} else {
			w("| shards it came to lead | 0 |\n")
		}
		w("| lock pairs/s over the whole window, start included | %s |\n", human(rj.PairsPerSec))
	}
	f := c.Failover
	if f == nil || len(f.Shards) == 0 {
		return
	}
	w("\n### Failover: kill -9 of node %d under load\n\n", f.Killed)
	w("%d connections at depth %d spread over the %d nodes; %s into the measured window the node leading the most "+
		"shards (node %d: shards %v) was killed with SIGKILL. Its clients dial the next node and start their pairs "+
		"again (the requests they had in flight are lost: their outcome is unknown). Every answer is counted per shard "+
		"in 1 ms steps: *no answer* is the longest stretch in which no request of a shard was answered, *longest wait* "+
		"the longest any request of a shard waited for its answer after the kill. The load is closed loop, so "+
		"the other shards dip too: one by one a connection's slots end up waiting on a killed shard.\n\n",
		f.Conns, f.Depth, p.ClusterNodes, fmtDur(f.KillAfter), f.Killed, f.KilledShards)
	mdStopTable(w, f)
	if failoverChart != "" {
		w("\n![answers per second around the kill](%s)\n", failoverChart)
	}
}

// mdStopTable writes the figures of a failover run, kill -9 or clean stop.
func mdStopTable(w func(string, ...any), f *Failover) {
	node, event := "killed", "kill"
	if f.Clean {
		node, event = "stopped", "stop"
	}
	w("| measured | figure |\n|---|---:|\n")
	w("| **failover gap** on the %s node's shards (the longer of the next two) | **%s** |\n", node, fmtDur(f.Gap))
	w("| no answer on one of its shards, longest | %s |\n", fmtDur(f.Quiet))
	w("| longest wait of a request on its shards | %s |\n", fmtDur(f.MaxLatency))
	w("| no answer on one of the other shards, longest | %s |\n", fmtDur(f.OtherQuiet))
	w("| longest wait of a request on the other shards | %s |\n", fmtDur(f.OtherMaxLatency))
	w("| no answer on any shard before the %s, longest (noise floor) | %s |\n", event, fmtDur(f.Baseline))
	if len(f.ElectedIn) > 0 {
		var ds []time.Duration
		for _, d := range f.ElectedIn {
			ds = append(ds, d)
		}
		w("| new leader logged by a surviving node after the %s, per shard | %s to %s |\n", event, fmtDur(slices.Min(ds)), fmtDur(slices.Max(ds)))
	}
	w("| client connections dialled again / of them after E unavailable | %d / %d |\n", f.Reconnects, f.Unavailable)
	w("| requests lost with the %s node's connections | %s |\n", node, commas(f.Lost))
	w("| longest a reconnecting client went between answers | %s |\n", fmtDur(f.Outage))
	w("| lock pairs/s over the whole window, %s included | %s |\n", event, human(f.PairsPerSec))
	if len(f.Unrecovered) > 0 {
		w("| shards still without answers when the window ended | %v |\n", f.Unrecovered)
	}
	if len(f.NewLeaders) > 0 {
		w("\nNew leaders of the %s node's shards: %s.\n", node, fmtShardNode(f.NewLeaders))
	}
}

// fmtRatio writes 0.53x, 6.2x, 150x.
func fmtRatio(v float64) string {
	switch {
	case v < 1:
		return fmt.Sprintf("%.2fx", v)
	case v < 10:
		return fmt.Sprintf("%.1fx", v)
	}
	return fmt.Sprintf("%.0fx", v)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// fmtPerNode writes "node 1: 5, node 2: 6".
func fmtPerNode[V any](m map[int]V, format func(V) string) string {
	var parts []string
	for _, id := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("node %d: %s", id, format(m[id])))
	}
	return strings.Join(parts, ", ")
}

func fmtShardNode(m map[int]int) string {
	var parts []string
	for _, sh := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("shard %d: node %d", sh, m[sh]))
	}
	return strings.Join(parts, ", ")
}

// FailoverChart draws the failover run's answers per second on the killed
// node's shards and on the others against the time from the kill.
func (r *Report) FailoverChart(path string) error {
	f := r.Cluster.Failover
	p := plot.New()
	p.Title.Text = fmt.Sprintf("ticketd cluster (%s): kill -9 of node %d at 0 s", r.Plan, f.Killed)
	p.X.Label.Text = "seconds from the kill"
	p.Y.Label.Text = "answers / s (20 ms steps)"
	p.Add(plotter.NewGrid())
	for i, s := range []struct {
		name string
		ys   []float64
		c    color.Color
	}{
		{fmt.Sprintf("shards node %d led %v", f.Killed, f.KilledShards), f.Timeline.Killed, color.RGBA{R: 214, G: 39, B: 40, A: 255}},
		{"the other shards", f.Timeline.Others, color.RGBA{R: 31, G: 119, B: 180, A: 255}},
	} {
		pts := make(plotter.XYs, len(s.ys))
		for j := range s.ys {
			pts[j] = plotter.XY{X: f.Timeline.At[j], Y: s.ys[j]}
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return err
		}
		l.Color = s.c
		l.Width = vg.Points(1 + float64(1-i)*0.5)
		p.Add(l)
		p.Legend.Add(s.name, l)
	}
	p.Legend.Top, p.Legend.Left = true, true
	var top float64
	for _, ys := range [][]float64{f.Timeline.Killed, f.Timeline.Others} {
		for _, y := range ys {
			top = max(top, y)
		}
	}
	p.Y.Min, p.Y.Max = 0, top*1.35 // room for the legend above the lines
	img := vgimg.New(24*vg.Centimeter, 10*vg.Centimeter)
	dc := draw.New(img)
	img.SetColor(color.White)
	img.Fill(dc.Rectangle.Path())
	p.Draw(dc)
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(out); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
