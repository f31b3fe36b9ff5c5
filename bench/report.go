package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"image/color"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Scenario names a group of runs in the report.
type Scenario string

const (
	ScenarioUncontended Scenario = "uncontended"
	ScenarioContended   Scenario = "contended"
	ScenarioScale       Scenario = "connection scale"
	ScenarioCluster     Scenario = "cluster"
)

// Row is one run, reduced to what the report shows.
type Row struct {
	Scenario    Scenario
	System      System
	Label       string
	Conns       int
	Depth       int
	Open        bool
	Offered     float64 // open loop: pairs/s asked for
	PairsPerSec float64
	LinesPerSec float64
	// Latency per request line.
	P50, P99, P999, Max time.Duration
	// Acquire latency alone (for waiters: the wait).
	AcqP50, AcqP99, AcqP999, AcqMax time.Duration
	LagP99                          time.Duration // open loop: generator behind schedule
	Refused, NotReleased, Overruns  int64
	GrantsPerSec                    float64
	GrantsMin, GrantsMedian         int64
	GrantsMax                       int64
	Starved                         int // connections with no grant in the window
	Window                          time.Duration
	// Reconnect runs (cluster): see Result.
	Reconnects, Unavailable, Lost int64
	// CPU used while the run lasted (warm-up and drain included), in cores:
	// by the server, by the generator, and by anything else on the machine
	// (a busy neighbour makes every figure of the run worse).
	ServerCores, BenchCores, OtherCores float64
}

func rowOf(sc Scenario, r *Result) Row {
	g := slices.Clone(r.GrantsPerConn)
	slices.Sort(g)
	row := Row{
		Scenario: sc, System: r.Load.System, Label: r.Load.Label,
		Conns: r.Load.Conns, Depth: r.Load.Depth, Open: r.Load.Rate > 0, Offered: r.Load.Rate,
		PairsPerSec: r.PairsPerSec(), LinesPerSec: r.LinesPerSec(),
		P50: Q(r.Latency, 50), P99: Q(r.Latency, 99), P999: Q(r.Latency, 99.9), Max: time.Duration(r.Latency.Max()),
		AcqP50: Q(r.Acquire, 50), AcqP99: Q(r.Acquire, 99), AcqP999: Q(r.Acquire, 99.9), AcqMax: max(time.Duration(r.Acquire.Max()), r.LongestAcquire),
		LagP99:  Q(r.SendLag, 99),
		Refused: r.Refused, NotReleased: r.NotReleased, Overruns: r.Overruns,
		GrantsPerSec: float64(r.Acquired) / r.Window.Seconds(),
		Window:       r.Window,
		Reconnects:   r.Reconnects, Unavailable: r.Unavailable, Lost: r.Lost,
	}
	if len(g) > 0 {
		row.GrantsMin, row.GrantsMedian, row.GrantsMax = g[0], g[len(g)/2], g[len(g)-1]
		for _, n := range g {
			if n == 0 {
				row.Starved++
			}
		}
	}
	return row
}

// ScaleRow is one step of the connection-scale scenario.
type ScaleRow struct {
	Wanted    int // idle connections the plan asked for
	Idle      int // idle connections held
	RSSBefore int64
	RSSAfter  int64
	Note      string
	Active    *Row // the active clients' run; nil if the step did not run
}

// IdleState is where a round's idle connections are: none open, held
// against ticketd, or held against another server on the same machine.
type IdleState string

const (
	IdleNone      IdleState = "none"
	IdleAtTicketd IdleState = "ticketd"
	IdleElsewhere IdleState = "elsewhere"
)

func (st IdleState) label(n int) string {
	switch st {
	case IdleAtTicketd:
		return fmt.Sprintf("%s idle", commas(int64(n)))
	case IdleElsewhere:
		return fmt.Sprintf("%s idle held against another server", commas(int64(n)))
	}
	return "no idle"
}

// IdleRound is one run of the active clients in each IdleState, back to
// back, in Order: With has Idle idle connections held against ticketd,
// Elsewhere the same number held against another server.
type IdleRound struct {
	Idle                     int
	Order                    []IdleState
	With, Without, Elsewhere *Row
}

func (x *IdleRound) row(st IdleState) **Row {
	switch st {
	case IdleAtTicketd:
		return &x.With
	case IdleElsewhere:
		return &x.Elsewhere
	}
	return &x.Without
}

// PerConn is the server's resident memory per idle connection.
func (s ScaleRow) PerConn() float64 {
	if s.Idle == 0 {
		return 0
	}
	return float64(s.RSSAfter-s.RSSBefore) / float64(s.Idle)
}

// Target is one goal with its verdict: PASS, MISS, or SKIP with the reason.
type Target struct {
	Name    string
	Got     string
	Verdict string
}

// Report is everything one suite run found.
type Report struct {
	Plan      string
	Started   time.Time
	Elapsed   time.Duration
	CPU       string
	Cores     int
	GoVersion string
	// TicketdVersion is what the ticketd binary measured says of itself
	// (`ticketd --version`: its commit under make), so that a report can
	// be told apart from one of another build.
	TicketdVersion string `json:",omitempty"`
	RedisVersion   string
	BenchFDLimit   int64
	ServerFDLimit  int64
	Rows           []Row
	Scale          []ScaleRow
	IdleRounds     []IdleRound `json:",omitempty"`
	Targets        []Target
	Skipped        []string
	Errors         []string
	Profiles       []string
	Cluster        *ClusterReport `json:",omitempty"`
	Steady         *SteadyReport  `json:",omitempty"`
	plan           Plan
}

func newReport(p Plan, env Env) *Report {
	r := &Report{Plan: p.Name, Started: time.Now(), Cores: runtime.NumCPU(),
		GoVersion: runtime.Version(), CPU: cpuModel(), plan: p}
	if env.Redis != "" {
		r.RedisVersion = versionOf(env.Redis)
	}
	if env.Ticketd != "" {
		r.TicketdVersion = versionOf(env.Ticketd)
	}
	r.BenchFDLimit, _ = procFDLimit(os.Getpid())
	return r
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown CPU"
}

func (r *Report) find(sys System, depth int) *Row {
	for i := range r.Rows {
		x := &r.Rows[i]
		if x.Scenario == ScenarioUncontended && x.System == sys && x.Depth == depth && !x.Open {
			return x
		}
	}
	return nil
}

func verdict(ok bool) string {
	if ok {
		return "PASS"
	}
	return "MISS"
}

// evaluate sets the targets from the rows.
func (r *Report) evaluate() {
	r.Targets = nil
	skip := func(name, why string) { r.Targets = append(r.Targets, Target{name, "", "SKIP: " + why}) }
	missing := func(sys System) string {
		if sys == Redis && r.RedisVersion == "" {
			return "redis-server not installed (" + RedisInstall + ")"
		}
		return string(sys) + " did not run"
	}
	// vs judges ticketd's uncontended row at depth against other's, or skips
	// the target naming the system that did not run.
	vs := func(name string, other System, depth int, judge func(t, o *Row) (got string, ok bool)) {
		t, o := r.find(Ticketd, depth), r.find(other, depth)
		switch {
		case t == nil:
			skip(name, missing(Ticketd))
		case o == nil:
			skip(name, missing(other))
		default:
			got, ok := judge(t, o)
			r.Targets = append(r.Targets, Target{name, got, verdict(ok)})
		}
	}
	for _, d := range []int{16, 64} {
		vs(fmt.Sprintf("uncontended, depth %d: ticketd >= 2x Redis lock pairs/s", d), Redis, d, func(t, rd *Row) (string, bool) {
			ratio := t.PairsPerSec / rd.PairsPerSec
			return fmt.Sprintf("%s vs %s pairs/s = %.2fx", human(t.PairsPerSec), human(rd.PairsPerSec), ratio), ratio >= 2
		})
	}
	vs("uncontended, depth 64: ticketd >= 60% of the echo ceiling's lines/s", Echo, 64, func(t, e *Row) (string, bool) {
		ratio := t.LinesPerSec / e.LinesPerSec
		// One decimal: a verdict at the threshold must read as it was
		// judged (59.98% printed as 60% beside MISS).
		return fmt.Sprintf("%s vs %s lines/s = %.1f%%", human(t.LinesPerSec), human(e.LinesPerSec), 100*ratio), ratio >= 0.6
	})
	vs("uncontended, depth 1: ticketd p99 <= Redis p99", Redis, 1, func(t, rd *Row) (string, bool) {
		return fmt.Sprintf("%s vs %s", fmtDur(t.P99), fmtDur(rd.P99)), t.P99 <= rd.P99
	})
	var base, top *ScaleRow
	for i := range r.Scale {
		s := &r.Scale[i]
		if s.Active == nil {
			continue
		}
		if s.Idle == 0 {
			base = s
		} else if top == nil || s.Idle > top.Idle {
			top = s
		}
	}
	if top == nil || base == nil {
		skip("idle connections: <= 1 KiB server memory each", "the connection-scale scenario did not run")
		skip("idle connections: active p99 within 1.5x of no idle", "the connection-scale scenario did not run")
	} else {
		per := top.PerConn()
		r.Targets = append(r.Targets, Target{"idle connections: <= 1 KiB server memory each",
			fmt.Sprintf("%s B each at %s idle", commas(int64(math.Round(per))), commas(int64(top.Idle))), verdict(per <= 1024)})
		ratio := float64(top.Active.P99) / float64(base.Active.P99)
		r.Targets = append(r.Targets, Target{"idle connections: active p99 within 1.5x of no idle",
			fmt.Sprintf("%s with %s idle vs %s: %.2fx", fmtDur(top.Active.P99), commas(int64(top.Idle)), fmtDur(base.Active.P99), ratio),
			verdict(ratio <= 1.5)})
	}
	r.evaluateIdleRounds(skip)
	var cont *Row
	for i := range r.Rows {
		if r.Rows[i].Scenario == ScenarioContended {
			cont = &r.Rows[i]
		}
	}
	if cont == nil {
		skip("contended: no waiter starved", "the contended scenario did not run")
	} else {
		r.Targets = append(r.Targets, Target{"contended: no waiter starved",
			fmt.Sprintf("%d of %s clients without a grant, fewest grants %d, %d timed out, longest wait %s",
				cont.Starved, commas(int64(cont.Conns)), cont.GrantsMin, cont.Refused, fmtDur(cont.AcqMax)),
			verdict(cont.Starved == 0 && cont.Refused == 0)})
	}
	r.evaluateCluster(skip)
	if r.plan.SteadyRounds > 0 {
		r.evaluateSteady(skip)
	}
}

// Passed reports whether no target missed (skips do not count).
func (r *Report) Passed() bool {
	for _, t := range r.Targets {
		if t.Verdict == "MISS" {
			return false
		}
	}
	return true
}

func fmtDur(d time.Duration) string {
	switch {
	case d <= 0:
		return "-"
	case d < time.Millisecond:
		return fmt.Sprintf("%.0fµs", float64(d)/1e3)
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.2fms", float64(d)/1e6)
	case d < time.Second:
		return fmt.Sprintf("%.1fms", float64(d)/1e6)
	}
	return fmt.Sprintf("%.2fs", d.Seconds())
}

func fmtBytes(b int64) string {
	return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
}

func ratio(a, b float64) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", a/b)
}

// Markdown renders the report; chart is the PNG's file name ("" for none),
// failoverChart the failover run's.
func (r *Report) Markdown(chart string, failoverChart ...string) string {
	var b bytes.Buffer
	p := r.plan
	w := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	w("# ticketd bench (%s)\n\n", r.Plan)
	if r.TicketdVersion != "" {
		w("Measured: %s. ", r.TicketdVersion)
	}
	w("%s, %d cores shared by the generator and the server; %s", r.CPU, r.Cores, r.GoVersion)
	if r.RedisVersion != "" {
		w("; %s", r.RedisVersion)
	}
	w(". Open-descriptor limit per process: %d (bench)", r.BenchFDLimit)
	if r.ServerFDLimit > 0 { // read from a server that the scenarios run started
		w(", %d (ticketd)", r.ServerFDLimit)
	}
	w(". Ran %s on %s.\n\n", r.Elapsed, r.Started.UTC().Format("2006-01-02 15:04 UTC"))
	w("A lock pair is an acquire and, once granted, the release of that grant (ticketd: `A`/`R` lines; "+
		"Redis: `SET key owner NX PX 30000` and a compare-and-delete script by `EVALSHA`; echo: ticketd's own "+
		"request lines sent back unchanged, the ceiling for this frame size). Latency is per request line; "+
		"closed loop measures from the send, open loop from the intended send time (no coordinated omission). "+
		"Each run warms up %s, then measures %s (open loop %s). CPU columns give the cores the server, the "+
		"generator and everything else on the machine used during the run: where others is well above zero, "+
		"a neighbour took CPU and every figure of that run is worse than the machine can do.\n\n",
		p.Warmup, p.Duration, p.OpenDuration)

	w("## Targets\n\n| target | measured | result |\n|---|---|---|\n")
	for _, t := range r.Targets {
		w("| %s | %s | %s |\n", t.Name, t.Got, t.Verdict)
	}
	w("\n")

	if r.has(ScenarioUncontended) {
		r.mdUncontended(w)
	} else {
		w("## 1. Uncontended\n\nNot run.\n")
	}
	if r.has(ScenarioContended) {
		r.mdContended(w)
	} else {
		w("\n## 2. Contended\n\nNot run.\n")
	}
	if len(r.Scale) > 0 {
		r.mdScale(w)
	} else {
		w("\n## 3. Connection scale\n\nNot run.\n")
	}
	if r.Cluster != nil {
		r.mdCluster(w, strings.Join(failoverChart, ""))
	} else if r.plan.ClusterNodes > 0 {
		w("\n## 4. Cluster\n\nNot run.\n")
	}
	if r.Steady != nil {
		r.mdSteady(w)
	} else if r.plan.SteadyRounds > 0 {
		w("\n## 5. Steadiness and event-loop placement\n\nNot run.\n")
	}

	if chart != "" {
		w("\n![throughput against p99 latency](%s)\n", chart)
	}
	if len(r.Skipped) > 0 {
		w("\n## Skipped\n\n")
		for _, s := range r.Skipped {
			w("- %s\n", s)
		}
	}
	if len(r.Profiles) > 0 {
		w("\n## Profiles (ticketd, uncontended, deepest pipeline)\n\n")
		for _, s := range r.Profiles {
			w("- `%s`\n", s)
		}
		w("\nRead with `go tool pprof -top <binary> bench/results/ticketd-cpu.prof`.\n")
	}
	if len(r.Errors) > 0 {
		w("\n## Errors\n\n")
		for _, s := range r.Errors {
			w("- %s\n", strings.ReplaceAll(strings.TrimSpace(s), "\n", "\n  "))
		}
	}
	return b.String()
}

func (r *Report) mdUncontended(w func(string, ...any)) {
	p := r.plan
	w("## 1. Uncontended: %s keys uniform, %d connections\n\n", commas(int64(p.Keys)), p.Conns)
	w("Closed loop, depth = lock pairs in flight per connection.\n\n")
	w("| depth | system | pairs/s | lines/s | p50 | p99 | p99.9 | pairs/s vs Redis | lines/s vs ceiling | CPU cores server / bench / others |\n")
	w("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, d := range p.Depths {
		rd, e := r.find(Redis, d), r.find(Echo, d)
		for _, sys := range []System{Ticketd, Redis, Echo} {
			x := r.find(sys, d)
			if x == nil {
				continue
			}
			vsRedis, vsEcho := "-", "-"
			if rd != nil {
				vsRedis = ratio(x.PairsPerSec, rd.PairsPerSec)
			}
			if e != nil {
				vsEcho = fmt.Sprintf("%.0f%%", 100*x.LinesPerSec/e.LinesPerSec)
			}
			w("| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", d, sys, human(x.PairsPerSec), human(x.LinesPerSec),
				fmtDur(x.P50), fmtDur(x.P99), fmtDur(x.P999), vsRedis, vsEcho, x.cpu())
		}
	}
	var open []Row
	for _, x := range r.Rows {
		if x.Scenario == ScenarioUncontended && x.Open {
			open = append(open, x)
		}
	}
	if len(open) > 0 {
		w("\nOpen loop: acquires on a fixed schedule (a fraction of the system's best closed-loop pairs/s), " +
			"at most 256 pairs in flight per connection. Generator lag is how late the generator itself sent " +
			"(its timers); it is part of the latency.\n\n")
		w("| system | offered pairs/s | done pairs/s | p50 | p99 | p99.9 | generator lag p99 | CPU cores server / bench / others |\n")
		w("|---|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, x := range open {
			w("| %s | %s | %s | %s | %s | %s | %s | %s |\n", x.System, human(x.Offered), human(x.PairsPerSec),
				fmtDur(x.P50), fmtDur(x.P99), fmtDur(x.P999), fmtDur(x.LagP99), x.cpu())
		}
	}
}

func (x *Row) cpu() string {
	return fmt.Sprintf("%.2f / %.2f / %.2f", x.ServerCores, x.BenchCores, x.OtherCores)
}

func (r *Report) mdContended(w func(string, ...any)) {
	p := r.plan
	w("\n## 2. Contended: %s waiting clients on %d keys (ticketd)\n\n", commas(int64(p.Waiters)), p.ContendedKeys)
	w("Each client keeps one acquire queued (wait 120s) and releases as soon as it is granted, so every " +
		"grant after a key's first is a hand-over from the head of its queue. Waiter latency: acquire to grant.\n\n")
	w("| clients | keys | hand-overs (grants)/s | wait p50 | wait p99 | wait p99.9 | longest wait | grants per client min / median / max | timed out | starved | CPU cores server / bench / others |\n")
	w("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, x := range r.Rows {
		if x.Scenario != ScenarioContended {
			continue
		}
		w("| %s | %d | %s | %s | %s | %s | %s | %d / %d / %d | %d | %d | %s |\n", commas(int64(x.Conns)), p.ContendedKeys,
			human(x.GrantsPerSec), fmtDur(x.AcqP50), fmtDur(x.AcqP99), fmtDur(x.AcqP999), fmtDur(x.AcqMax),
			x.GrantsMin, x.GrantsMedian, x.GrantsMax, x.Refused, x.Starved, x.cpu())
	}
}

func (r *Report) mdScale(w func(string, ...any)) {
	p := r.plan
	w("\n## 3. Connection scale: %s active clients at %s pairs/s, plus idle connections\n\n", commas(int64(p.Active)), human(p.ActiveRate))
	w("Idle connections are held by separate client processes (at most %s each, each from its own source "+
		"address 127.0.0.2, 127.0.0.3, ...) and each did one lock pair first. Memory is the server's VmRSS "+
		"before and after they opened. The descriptor limit is %d per process and cannot be raised here, so "+
		"the server holds at most that many connections in all.\n\n", commas(int64(p.PerProc)), r.ServerFDLimit)
	w("| idle wanted | idle held | server VmRSS | per idle conn | active pairs/s | active p50 | active p99 | active p99.9 | p99 vs no idle | CPU cores server / bench / others | note |\n")
	w("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	var baseP99 time.Duration
	for _, s := range r.Scale {
		if s.Idle == 0 && s.Active != nil {
			baseP99 = s.Active.P99
		}
	}
	for _, s := range r.Scale {
		rss, per := fmtBytes(s.RSSAfter), "-"
		if s.Idle > 0 && s.Active != nil {
			rss = fmtBytes(s.RSSBefore) + " -> " + fmtBytes(s.RSSAfter)
			per = commas(int64(math.Round(s.PerConn()))) + " B"
		}
		if s.Active == nil {
			w("| %s | - | - | - | - | - | - | - | - | - | %s |\n", commas(int64(s.Wanted)), s.Note)
			continue
		}
		a := s.Active
		vs := "-"
		if s.Idle > 0 && baseP99 > 0 {
			vs = ratio(float64(a.P99), float64(baseP99))
		}
		w("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", commas(int64(s.Wanted)), commas(int64(s.Idle)),
			rss, per, human(a.PairsPerSec), fmtDur(a.P50), fmtDur(a.P99), fmtDur(a.P999), vs, a.cpu(), s.Note)
	}
	r.mdIdleRounds(w)
}

// evaluateIdleRounds adds the p99 targets of the interleaved rounds: the
// cost of idle connections to the active clients, and ticketd's own part
// of it, against the control (the same connections held elsewhere).
func (r *Report) evaluateIdleRounds(skip func(name, why string)) {
	const (
		name = "idle connections: active p99 within 1.5x of no idle, medians of the interleaved rounds"
		own  = "idle connections: ticketd's own cost, active p99 within 1.5x of the same idle held against another server, medians of the rounds"
	)
	if len(r.IdleRounds) == 0 {
		if r.plan.IdleRounds > 0 {
			skip(name, "the interleaved rounds did not run")
			skip(own, "the interleaved rounds did not run")
		}
		return
	}
	with, without, elsewhere := r.idleRoundP99s()
	mw, mo, me := medianOf(with), medianOf(without), medianOf(elsewhere)
	idle := commas(int64(r.IdleRounds[0].Idle))
	r.Targets = append(r.Targets, Target{name,
		fmt.Sprintf("%s with %s idle vs %s (medians of %d rounds): %s", fmtDur(mw), idle,
			fmtDur(mo), len(r.IdleRounds), ratio(float64(mw), float64(mo))),
		verdict(mo > 0 && float64(mw) <= 1.5*float64(mo))})
	r.Targets = append(r.Targets, Target{own,
		fmt.Sprintf("%s with %s idle at ticketd vs %s with them held elsewhere: %s (the machine's own cost: %s vs %s, %s)",
			fmtDur(mw), idle, fmtDur(me), ratio(float64(mw), float64(me)), fmtDur(me), fmtDur(mo), ratio(float64(me), float64(mo))),
		verdict(me > 0 && float64(mw) <= 1.5*float64(me))})
}

func (r *Report) idleRoundP99s() (with, without, elsewhere []time.Duration) {
	for _, x := range r.IdleRounds {
		with = append(with, x.With.P99)
		without = append(without, x.Without.P99)
		elsewhere = append(elsewhere, x.Elsewhere.P99)
	}
	return with, without, elsewhere
}

func (r *Report) mdIdleRounds(w func(string, ...any)) {
	if len(r.IdleRounds) == 0 {
		return
	}
	w("\nInterleaved rounds at %s idle: the active load with no idle connections (none), with them held "+
		"against ticketd, and with the same number held against another server on this machine (elsewhere: "+
		"the control, the machine's own cost of the sockets, which no server design removes). Each round "+
		"starts in the state the last one ended in; the targets compare the medians.\n\n", commas(int64(r.IdleRounds[0].Idle)))
	w("| round | order | p99 none | p99 at ticketd | p99 elsewhere | ticketd / none | elsewhere / none | ticketd / elsewhere | p99.9 none / ticketd / elsewhere |\n")
	w("|---:|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for i, x := range r.IdleRounds {
		order := make([]string, len(x.Order))
		for k, st := range x.Order {
			order[k] = string(st)
		}
		w("| %d | %s | %s | %s | %s | %s | %s | %s | %s / %s / %s |\n", i+1, strings.Join(order, ", "),
			fmtDur(x.Without.P99), fmtDur(x.With.P99), fmtDur(x.Elsewhere.P99),
			ratio(float64(x.With.P99), float64(x.Without.P99)), ratio(float64(x.Elsewhere.P99), float64(x.Without.P99)),
			ratio(float64(x.With.P99), float64(x.Elsewhere.P99)),
			fmtDur(x.Without.P999), fmtDur(x.With.P999), fmtDur(x.Elsewhere.P999))
	}
	with, without, elsewhere := r.idleRoundP99s()
	mw, mo, me := medianOf(with), medianOf(without), medianOf(elsewhere)
	w("| median | | %s | %s | %s | %s | %s | %s | |\n", fmtDur(mo), fmtDur(mw), fmtDur(me),
		ratio(float64(mw), float64(mo)), ratio(float64(me), float64(mo)), ratio(float64(mw), float64(me)))
}

func (r *Report) has(sc Scenario) bool {
	return slices.ContainsFunc(r.Rows, func(x Row) bool { return x.Scenario == sc })
}

// JSON is the report's data, for comparing runs.
func (r *Report) JSON() ([]byte, error) { return json.MarshalIndent(r, "", "  ") }

// Chart draws throughput (pairs/s) against p99 latency on log axes into a
// PNG file: one colour per system, one line style per scenario, the legend
// beside the plot.
func (r *Report) Chart(path string) error {
	type series struct {
		name   string
		sys    System
		kind   int // 0 closed loop, 1 open loop, 2 contended, 3 connection scale
		pts    plotter.XYs
		labels []string
	}
	var all []*series
	get := func(sys System, kind int, name string) *series {
		for _, s := range all {
			if s.sys == sys && s.kind == kind {
				return s
			}
		}
		s := &series{name: name, sys: sys, kind: kind}
		all = append(all, s)
		return s
	}
	add := func(s *series, x *Row, label string) {
		if x.PairsPerSec > 0 && x.P99 > 0 {
			s.pts = append(s.pts, plotter.XY{X: x.PairsPerSec, Y: float64(x.P99) / 1e6})
			s.labels = append(s.labels, label)
		}
	}
	for i := range r.Rows {
		x := &r.Rows[i]
		switch {
		case x.Scenario == ScenarioUncontended && !x.Open:
			add(get(x.System, 0, fmt.Sprintf("%s uncontended, closed loop (depth)", x.System)), x, fmt.Sprint(x.Depth))
		case x.Scenario == ScenarioUncontended:
			add(get(x.System, 1, fmt.Sprintf("%s uncontended, open loop", x.System)), x, "")
		case x.Scenario == ScenarioContended:
			add(get(x.System, 2, fmt.Sprintf("%s contended, %s waiters", x.System, commas(int64(x.Conns)))), x, "")
		case x.Scenario == ScenarioCluster:
			name := map[System]string{TicketdCluster: "ticketd cluster", Ticketd: "ticketd single",
				Etcd: "etcd Mutex"}[x.System]
			add(get(x.System, 4, name+", cluster section (depth)"), x, fmt.Sprint(x.Depth))
		}
	}
	for i := range r.Scale {
		if a := r.Scale[i].Active; a != nil {
			add(get(Ticketd, 3, "ticketd active clients (idle conns)"), a, kilo(float64(r.Scale[i].Idle)))
		}
	}
	if len(all) == 0 {
		return fmt.Errorf("bench: nothing to chart")
	}

	p := plot.New()
	p.Title.Text = fmt.Sprintf("ticketd bench (%s): throughput against p99 latency", r.Plan)
	p.X.Label.Text = "lock pairs / s"
	p.Y.Label.Text = "p99 latency per request (ms)"
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker = kiloTicks{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Add(plotter.NewGrid())
	sysColor := map[System]color.Color{
		Ticketd:        color.RGBA{R: 214, G: 39, B: 40, A: 255},
		Redis:          color.RGBA{R: 31, G: 119, B: 180, A: 255},
		Echo:           color.RGBA{R: 110, G: 110, B: 110, A: 255},
		TicketdCluster: color.RGBA{R: 255, G: 127, B: 14, A: 255},
		Etcd:           color.RGBA{R: 44, G: 160, B: 44, A: 255},
	}
	glyphs := []draw.GlyphDrawer{draw.CircleGlyph{}, draw.BoxGlyph{}, draw.TriangleGlyph{}, draw.PyramidGlyph{}, draw.CrossGlyph{}}
	dashes := [][]vg.Length{nil, {vg.Points(6), vg.Points(3)}, nil, {vg.Points(2), vg.Points(2)}, {vg.Points(1), vg.Points(3)}}
	legend := plot.NewLegend() // drawn beside the plot, not over the points
	legend.Top, legend.Left = true, true
	legend.YOffs = -vg.Points(30)
	minX, maxX, minY, maxY := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, s := range all {
		// Points stay in run order (depth, rate, idle connections going up),
		// so a line that turns back shows throughput falling as load rose.
		pts, labels := s.pts, s.labels
		for _, pt := range pts {
			minX, maxX = math.Min(minX, pt.X), math.Max(maxX, pt.X)
			minY, maxY = math.Min(minY, pt.Y), math.Max(maxY, pt.Y)
		}
		l, sc, err := plotter.NewLinePoints(pts)
		if err != nil {
			return err
		}
		c := sysColor[s.sys]
		l.Color, sc.Color = c, c
		l.Dashes = dashes[s.kind]
		if s.kind == 2 {
			l.Width = 0
		}
		sc.Shape = glyphs[s.kind]
		sc.Radius = vg.Points(3.5)
		p.Add(l, sc)
		legend.Add(s.name, l, sc)
		if slices.ContainsFunc(labels, func(x string) bool { return x != "" }) {
			lb, err := plotter.NewLabels(plotter.XYLabels{XYs: pts, Labels: labels})
			if err != nil {
				return err
			}
			for i := range lb.TextStyle {
				lb.TextStyle[i].Color = c
				lb.TextStyle[i].Font.Size = vg.Points(8)
			}
			lb.Offset = vg.Point{X: vg.Points(5), Y: vg.Points(3)}
			p.Add(lb)
		}
	}
	// Room around the points, so none sits on an edge and labels fit.
	p.X.Min, p.X.Max = minX/1.6, maxX*1.6
	p.Y.Min, p.Y.Max = minY/1.6, maxY*1.6

	const w, h, legendW = 30 * vg.Centimeter, 16 * vg.Centimeter, 9 * vg.Centimeter
	img := vgimg.New(w, h)
	dc := draw.New(img)
	img.SetColor(color.White)
	img.Fill(dc.Rectangle.Path())
	p.Draw(draw.Crop(dc, 0, -legendW, 0, 0))
	legend.Draw(draw.Crop(dc, w-legendW+vg.Points(8), 0, 0, 0))
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

// kilo writes 1500 as 1.5k, 2e6 as 2M.
func kilo(v float64) string {
	switch {
	case v >= 1e6:
		return strconv.FormatFloat(v/1e6, 'f', -1, 64) + "M"
	case v >= 1e3:
		return strconv.FormatFloat(v/1e3, 'f', -1, 64) + "k"
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}

// kiloTicks are log ticks labelled 10k, 100k, 1M.
type kiloTicks struct{}

func (kiloTicks) Ticks(min, max float64) []plot.Tick {
	ts := plot.LogTicks{}.Ticks(min, max)
	for i := range ts {
		if ts[i].Label != "" {
			ts[i].Label = kilo(ts[i].Value)
		}
	}
	return ts
}
