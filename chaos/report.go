package chaos

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/ticketd/ticketd/shard"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Gap is the availability around one fault.
type Gap struct {
	Event *Event
	// Longest stretch with no answer at all, from the fault's start to 10s
	// after its end.
	Longest time.Duration
	// From the fault's end to the first answer of a request sent after it.
	Recovery time.Duration
	// The same longest gap counted per shard (keys hash to shards as the
	// server hashes them), for the worst shard: in a cluster the other
	// shards keep answering while one elects a leader.
	WorstShard    int
	WorstShardGap time.Duration
	// From the fault's end to each shard's first grant or release of a
	// request sent after it, for the shard that waited longest; -1 if one
	// made none before the next fault or the end of the run, -2 if no shard
	// was asked anything in that time.
	GrantsBack      time.Duration
	GrantsBackShard int
}

// Gaps measures availability around each fault; shards is the server's
// --shards.
func Gaps(h *History, shards int) []Gap {
	var done []int64
	perShard := make([][]int64, shards)
	progress, sent := make([][]*Op, shards), make([][]int64, shards)
	for _, o := range h.Ops {
		if o.Kind == 'W' {
			continue
		}
		s := shard.Index(o.Key, shards)
		sent[s] = append(sent[s], o.Invoke)
		if o.Complete >= 0 {
			done = append(done, o.Complete)
			perShard[s] = append(perShard[s], o.Complete)
		}
		if o.progressed() {
			progress[s] = append(progress[s], o)
		}
	}
	slices.Sort(done)
	for _, d := range perShard {
		slices.Sort(d)
	}
	for _, d := range sent {
		slices.Sort(d)
	}
	last := h.last()
	var out []Gap
	for k, e := range h.Events {
		g := Gap{Event: e, Recovery: -1}
		lo, hi := e.Start, e.End+int64(10*time.Second)
		if k+1 < len(h.Events) { // up to the next fault at most
			hi = min(hi, h.Events[k+1].Start)
		}
		hi = min(hi, last)
		g.Longest = longestGap(done, lo, hi)
		for s, d := range perShard {
			if gap := longestGap(d, lo, hi); gap > g.WorstShardGap {
				g.WorstShard, g.WorstShardGap = s, gap
			}
		}
		for _, o := range h.Ops {
			if o.Kind != 'W' && o.Invoke >= e.End && o.Complete >= 0 {
				if g.Recovery < 0 || time.Duration(o.Complete-e.End) < g.Recovery {
					g.Recovery = time.Duration(o.Complete - e.End)
				}
			}
		}
		next := last
		if k+1 < len(h.Events) {
			next = h.Events[k+1].Start
		}
		g.GrantsBack = -2
		for s, ops := range progress {
			if i, _ := slices.BinarySearch(sent[s], e.End); i == len(sent[s]) || sent[s][i] >= next {
				continue // nothing asked of this shard: nothing to grant
			}
			first := int64(-1)
			for _, o := range ops {
				if o.Invoke >= e.End && o.Complete <= next && (first < 0 || o.Complete < first) {
					first = o.Complete
				}
			}
			switch {
			case first < 0:
				g.GrantsBack, g.GrantsBackShard = -1, s
			case g.GrantsBack == -2 || g.GrantsBack >= 0 && time.Duration(first-e.End) >= g.GrantsBack:
				g.GrantsBack, g.GrantsBackShard = time.Duration(first-e.End), s
			}
			if g.GrantsBack < 0 {
				break
			}
		}
		out = append(out, g)
	}
	return out
}

// longestGap is the longest stretch of [lo, hi] holding none of the sorted
// times in done.
func longestGap(done []int64, lo, hi int64) time.Duration {
	var gap time.Duration
	prev := lo
	i, _ := slices.BinarySearch(done, lo)
	for ; i < len(done) && done[i] <= hi; i++ {
		gap = max(gap, time.Duration(done[i]-prev))
		prev = done[i]
	}
	return max(gap, time.Duration(hi-prev))
}

func (h *History) last() int64 {
	var t int64
	for _, o := range h.Ops {
		t = max(t, o.Invoke, o.Complete)
	}
	return t
}

type tally struct {
	granted, timedOut, busy, released, notReleased, acqUnknown, relUnknown, accepted, refused int
	again                                                                                     [3]int // releases sent again: R, N, unknown
}

func tallyOps(h *History) tally {
	var t tally
	for _, o := range h.Ops {
		if o.Again {
			switch o.Result {
			case ResReleased:
				t.again[0]++
			case ResNotReleased:
				t.again[1]++
			default:
				t.again[2]++
			}
		}
		switch {
		case o.Kind == 'W' && o.Result == ResAccepted:
			t.accepted++
		case o.Kind == 'W':
			t.refused++
		case o.Result == ResGranted:
			t.granted++
		case o.Result == ResTimedOut:
			t.timedOut++
		case o.Result == ResBusy:
			t.busy++
		case o.Result == ResReleased:
			t.released++
		case o.Result == ResNotReleased:
			t.notReleased++
		case o.Kind == 'A':
			t.acqUnknown++
		default:
			t.relUnknown++
		}
	}
	return t
}

func writeReport(dir string, o *Outcome) (string, error) {
	h, cfg := o.History, o.Config
	png := cfg.Name + ".png"
	if err := timeline(filepath.Join(dir, png), h, cfg.Name); err != nil {
		return "", err
	}
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	verdict := "no violation found"
	if o.Failed() {
		verdict = fmt.Sprintf("**FAILED**: %d violation(s), %d harness problem(s)", len(o.Check.Violations), len(o.Problems))
		if n := len(o.Check.Undecided); n > 0 {
			verdict += fmt.Sprintf(", %d key(s) not decided", n)
		}
	}
	p("# Fault campaign `%s`: %s", cfg.Name, verdict)
	p("")
	if o.Elapsed > 0 {
		p("ticketd in %s mode, %s of faults plus calm at each end (%s in all), seed %d, started %s.",
			cfg.Mode, cfg.Duration, o.Elapsed.Round(time.Second), cfg.Seed, o.Started.UTC().Format(time.RFC3339))
	} else {
		p("ticketd in %s mode, %s of faults, seed %d; checked again from the recorded history.", cfg.Mode, cfg.Duration, cfg.Seed)
	}
	flags := fmt.Sprintf("-mode %s -duration %s -seed %d", cfg.Mode, cfg.Duration, cfg.Seed)
	if !cfg.Phased {
		flags += " -quick"
	}
	if cfg.Nemeses != nil {
		flags += " -nemeses " + strings.Join(cfg.Nemeses, ",")
	}
	p("Rerun: `go run ./chaos/cmd/chaos %s` (timing differs from run to run; the schedule and choices follow the seed).", flags)
	p("")
	var roles []string
	for _, r := range []string{RoleMutex, RoleManyKeys, RoleWaiter, RoleExpirer} {
		roles = append(roles, fmt.Sprintf("%d %s", cfg.Workers[r], r))
	}
	p("Workload: %s workers, one connection and one request in flight each, spread over the nodes; mutex and waiter holders write their token to a fenced register per key.", strings.Join(roles, ", "))
	p("")
	p("![timeline](%s)", png)
	p("")
	t := tallyOps(h)
	p("## Operations")
	p("")
	p("| | ok | refused | unknown outcome |")
	p("|---|---:|---:|---:|")
	p("| acquire | %d granted | %d T, %d B | %d |", t.granted, t.timedOut, t.busy, t.acqUnknown)
	p("| release | %d R | %d N | %d |", t.released, t.notReleased, t.relUnknown)
	p("| fenced register write | %d accepted | %d refused | |", t.accepted, t.refused)
	p("")
	unavail := map[int]bool{}
	for _, op := range h.Ops {
		if strings.HasPrefix(op.Why, "E unavailable") {
			unavail[op.Conn] = true
		}
	}
	p("Connections closed with `E unavailable`: %d. Keys: %d. Grants checked: %d.", len(unavail), o.Check.Keys, o.Check.Grants)
	p("")
	p("Releases sent again after an unknown outcome, within the lease (as the Go client does): %d answered R, %d answered N, %d unknown again.", t.again[0], t.again[1], t.again[2])
	p("")
	p("## Checks")
	p("")
	p("| check | result |")
	p("|---|---|")
	per, undecided := map[string]int{}, map[string]int{}
	for _, v := range o.Check.Violations {
		per[v.Check]++
	}
	for _, u := range o.Check.Undecided {
		undecided[u.Check]++
	}
	for _, c := range []string{CheckExclusion, CheckTokens, CheckDurability, CheckOnce, CheckLiveness, CheckProgress, CheckRegister, CheckLinearLock, CheckLinearFence} {
		var res []string
		if n := per[c]; n > 0 {
			res = append(res, fmt.Sprintf("**%d violation(s)**", n))
		}
		if n := undecided[c]; n > 0 {
			res = append(res, fmt.Sprintf("**not decided** (%d key(s))", n))
		}
		if res == nil {
			res = []string{"pass"}
		}
		p("| %s | %s |", c, strings.Join(res, ", "))
	}
	p("")
	p("## Faults and availability")
	p("")
	p("Longest gap: the longest time with no answer at all, from the fault's start to 10 s after its end (or to the next fault); the same per shard, for the shard that waited longest (keys hashed as the server hashes them). Recovery: from the fault's end to the first answer to a request sent after it. Grants again: from the fault's end to each shard's first grant or release of a request sent after it, for the shard that waited longest (none: a shard asked made none before the next fault).")
	p("")
	p("| # | fault | nodes | start | end | longest gap | worst shard's gap | recovery | grants again | detail |")
	p("|---:|---|---|---:|---:|---:|---:|---:|---:|---|")
	for i, g := range Gaps(h, o.Shards) {
		e := g.Event
		rec := "none"
		if g.Recovery >= 0 {
			rec = g.Recovery.Round(time.Millisecond).String()
		}
		back := "-" // nothing asked before the next fault
		switch {
		case g.GrantsBack >= 0:
			back = fmt.Sprintf("%v (shard %d)", g.GrantsBack.Round(time.Millisecond), g.GrantsBackShard)
		case g.GrantsBack == -1:
			back = fmt.Sprintf("none (shard %d)", g.GrantsBackShard)
		}
		p("| %d | %s | %v | %s | %s | %v | %v (shard %d) | %s | %s | %s |", i+1, e.Kind, e.Nodes, fmtT(e.Start), fmtT(e.End),
			g.Longest.Round(time.Millisecond), g.WorstShardGap.Round(time.Millisecond), g.WorstShard, rec, back, e.Detail)
	}
	p("")
	if len(o.Skipped) > 0 || len(o.Problems) > 0 || len(o.Check.Undecided) > 0 {
		p("## Skipped, problems, undecided")
		p("")
		for _, s := range o.Skipped {
			p("- skipped: %s", s)
		}
		for _, s := range o.Problems {
			p("- **problem**: %s", s)
		}
		for _, u := range o.Check.Undecided {
			p("- **not decided**: %s", u)
		}
		p("")
	}
	if len(o.Check.Violations) > 0 {
		p("## Violations")
		p("")
		for i, v := range o.Check.Violations {
			if i == 50 {
				p("... and %d more (see the history file)", len(o.Check.Violations)-50)
				break
			}
			p("### %d. %s, key `%s`", i+1, v.Check, v.Key)
			p("")
			p("%s", v.What)
			p("")
			p("```")
			for _, op := range v.Ops {
				p("%s", op)
			}
			p("--- the key's history around %s:", fmtT(v.At))
			for _, op := range around(h, v.Key, v.At, 20) {
				p("%s", op)
			}
			for _, e := range h.Events {
				if e.Start < v.At+int64(3*time.Second) && e.End > v.At-int64(10*time.Second) {
					died := ""
					if e.Killed > 0 {
						died = " died " + fmtT(e.Killed)
					}
					p("fault %s %v [%s..%s]%s %s", e.Kind, e.Nodes, fmtT(e.Start), fmtT(e.End), died, e.Detail)
				}
			}
			p("```")
			p("")
		}
	}
	p("History: `%s.history.jsonl.gz` (faults, anomalies, then one operation per line; times in ns since the start).", cfg.Name)
	path := filepath.Join(dir, cfg.Name+".md")
	return path, os.WriteFile(path, []byte(b.String()), 0o644)
}

// around is up to n operations on key nearest to at.
func around(h *History, key string, at int64, n int) []*Op {
	var ops []*Op
	for _, o := range h.Ops {
		if o.Key == key {
			ops = append(ops, o)
		}
	}
	slices.SortFunc(ops, func(a, b *Op) int { return cmp64(a.Invoke, b.Invoke) })
	i, _ := slices.BinarySearchFunc(ops, at, func(o *Op, t int64) int { return cmp64(o.Invoke, t) })
	lo, hi := max(0, i-n/2), min(len(ops), i+n/2)
	return ops[lo:hi]
}

// timeline draws answers per second and latency over time, fault windows
// shaded, in the manner of Jepsen's charts.
func timeline(path string, h *History, title string) error {
	const bucket = 250 * time.Millisecond
	end := h.last()
	nb := int(end/int64(bucket)) + 1
	ok, refused, unknown := make([]float64, nb), make([]float64, nb), make([]float64, nb)
	var lat plotter.XYs
	for _, o := range h.Ops {
		if o.Kind == 'W' {
			continue
		}
		if o.Complete < 0 {
			unknown[o.Invoke/int64(bucket)] += 1 / bucket.Seconds()
			continue
		}
		i := o.Complete / int64(bucket)
		switch o.Result {
		case ResGranted, ResReleased:
			ok[i] += 1 / bucket.Seconds()
		default:
			refused[i] += 1 / bucket.Seconds()
		}
		if o.WaitMs == 0 { // a wait's latency is its wait, not the server's
			lat = append(lat, plotter.XY{X: float64(o.Complete) / 1e9, Y: math.Max(float64(o.Complete-o.Invoke)/1e6, 0.01)})
		}
	}
	series := func(v []float64) plotter.XYs {
		xy := make(plotter.XYs, len(v))
		for i := range v {
			xy[i] = plotter.XY{X: float64(i) * bucket.Seconds(), Y: v[i]}
		}
		return xy
	}
	maxY := 1.0
	for i := range ok {
		maxY = max(maxY, ok[i], refused[i], unknown[i])
	}

	tp := plot.New()
	tp.Title.Text = "ticketd fault campaign " + title + ": answers per second"
	tp.X.Label.Text = "seconds"
	tp.Y.Label.Text = "answers/s"
	tp.Y.Min, tp.Y.Max = 0, maxY*1.1
	shade(tp, h, 0, maxY*1.1)
	tp.Add(plotter.NewGrid())
	colors := []color.Color{color.RGBA{0, 120, 0, 255}, color.RGBA{200, 120, 0, 255}, color.RGBA{200, 0, 0, 255}}
	for i, s := range []struct {
		name string
		v    []float64
	}{{"ok (A granted, R)", ok}, {"refused (T, B, N)", refused}, {"unknown outcome", unknown}} {
		l, err := plotter.NewLine(series(s.v))
		if err != nil {
			return err
		}
		l.Color = colors[i]
		tp.Add(l)
		tp.Legend.Add(s.name, l)
	}
	tp.Legend.Top = true

	lp := plot.New()
	lp.Title.Text = "latency of each request without a wait (ms, log scale); shaded: faults"
	lp.X.Label.Text = "seconds"
	lp.Y.Label.Text = "ms"
	lp.Y.Scale = plot.LogScale{}
	lp.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	maxL := 1.0
	for _, p := range lat {
		maxL = max(maxL, p.Y)
	}
	lp.Y.Min, lp.Y.Max = 0.01, maxL*2
	shade(lp, h, 0.01, maxL*2)
	lp.Add(plotter.NewGrid())
	if len(lat) > 0 {
		sc, err := plotter.NewScatter(lat)
		if err != nil {
			return err
		}
		sc.GlyphStyle.Radius = vg.Points(0.8)
		sc.GlyphStyle.Color = color.NRGBA{0, 60, 160, 90}
		lp.Add(sc)
	}
	for _, p := range []*plot.Plot{tp, lp} {
		p.X.Min, p.X.Max = 0, float64(end)/1e9
	}

	img := vgimg.New(30*vg.Centimeter, 20*vg.Centimeter)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 2, Cols: 1, PadY: vg.Points(10), PadTop: vg.Points(5), PadBottom: vg.Points(5), PadLeft: vg.Points(5), PadRight: vg.Points(10)}
	canvases := plot.Align([][]*plot.Plot{{tp}, {lp}}, tiles, dc)
	tp.Draw(canvases[0][0])
	lp.Draw(canvases[1][0])
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// shade draws each fault window as a band, coloured by kind and labelled.
func shade(p *plot.Plot, h *History, lo, hi float64) {
	fill := map[string]color.NRGBA{
		EvCrash: {255, 80, 80, 60}, EvCrashAll: {200, 0, 0, 70}, EvPause: {80, 80, 255, 50},
		EvRestart: {120, 120, 120, 50}, EvPartition: {255, 170, 0, 60}, EvClock: {160, 0, 200, 40},
		EvSlowFsync: {0, 160, 120, 50},
	}
	for _, e := range h.Events {
		x0, x1 := float64(e.Start)/1e9, float64(e.End)/1e9
		if x1-x0 < 0.05 {
			x1 = x0 + 0.05
		}
		poly, err := plotter.NewPolygon(plotter.XYs{{X: x0, Y: lo}, {X: x1, Y: lo}, {X: x1, Y: hi}, {X: x0, Y: hi}})
		if err != nil {
			continue
		}
		poly.Color = fill[e.Kind]
		poly.LineStyle.Width = 0
		poly.LineStyle.Color = color.Transparent
		p.Add(poly)
	}
	var labels plotter.XYLabels
	for _, e := range h.Events {
		labels.XYs = append(labels.XYs, plotter.XY{X: float64(e.Start) / 1e9, Y: hi})
		labels.Labels = append(labels.Labels, e.Kind)
	}
	if len(labels.XYs) > 0 && lo == 0 {
		if l, err := plotter.NewLabels(labels); err == nil {
			for i := range l.TextStyle {
				l.TextStyle[i].Font.Size = vg.Points(7)
				l.TextStyle[i].YAlign = draw.YTop
				l.TextStyle[i].Rotation = -math.Pi / 2
			}
			p.Add(l)
		}
	}
}
