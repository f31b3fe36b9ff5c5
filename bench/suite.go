package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"
)

// Plan sets the size of every scenario; FullPlan is `make bench`,
// QuickPlan `make bench-quick`, SmokePlan the test suite's check.
type Plan struct {
	Name     string
	Warmup   time.Duration
	Duration time.Duration // each closed-loop run

	// 1. uncontended
	Conns         int
	Keys          int
	Depths        []int
	OpenFractions []float64 // open-loop rates, as fractions of the system's best closed-loop pairs/s
	OpenDuration  time.Duration

	// 2. contended
	Waiters           int
	ContendedKeys     int
	ContendedDuration time.Duration

	// 3. connection scale
	Active        int     // active clients
	ActiveRate    float64 // their lock pairs/s together, open loop
	Idle          []int   // idle connections wanted, in steps
	ScaleDuration time.Duration
	PerProc       int // idle connections per hold process
	// IdleRounds: rounds of the active load at the most idle connections
	// held against ticketd, none, and held against another server (the
	// control), back to back, for the p99 targets (0: none).
	IdleRounds int

	// 4. cluster (0 nodes: not run)
	ClusterNodes    int
	ClusterShards   int
	ClusterConns    int
	ClusterDepths   []int
	ClusterDuration time.Duration // each ticketd run
	EtcdDuration    time.Duration
	// The failover run: kill -9 of a node FailoverKillAfter into the
	// window (0 duration: not run).
	FailoverDuration  time.Duration
	FailoverKillAfter time.Duration
	FailoverDepth     int
	// RejoinDuration is the rejoin run's window (0: FailoverDuration), the
	// start FailoverKillAfter into it. It must outlast the node's catch-up and the leaders' wait
	// before they hand shards back (3 s after its raft connection is up), or
	// the run ends before the hand-back it is there to measure.
	RejoinDuration time.Duration

	// 5. steady (0 rounds: not run)
	SteadyRounds   int
	SteadyDepths   []int
	SteadyDuration time.Duration
}

func FullPlan() Plan {
	return Plan{
		Name: "full", Warmup: time.Second, Duration: 8 * time.Second,
		Conns: 50, Keys: 1_000_000, Depths: []int{1, 16, 64},
		OpenFractions: []float64{0.25, 0.5, 0.75}, OpenDuration: 5 * time.Second,
		Waiters: 5000, ContendedKeys: 100, ContendedDuration: 15 * time.Second,
		Active: 1000, ActiveRate: 10_000, Idle: []int{10_000, 50_000, 100_000},
		ScaleDuration: 8 * time.Second, PerProc: 10_000, IdleRounds: 4,
		ClusterNodes: 3, ClusterShards: 16, ClusterConns: 50, ClusterDepths: []int{1, 16, 64},
		ClusterDuration: 8 * time.Second, EtcdDuration: 8 * time.Second,
		FailoverDuration: 10 * time.Second, FailoverKillAfter: 4 * time.Second, FailoverDepth: 16,
		RejoinDuration: 16 * time.Second, SteadyRounds: 5, SteadyDepths: []int{1, 64}, SteadyDuration: 5 * time.Second,
	}
}

func QuickPlan() Plan {
	return Plan{
		Name: "quick", Warmup: 300 * time.Millisecond, Duration: time.Second,
		Conns: 50, Keys: 1_000_000, Depths: []int{1, 16, 64},
		OpenFractions: []float64{0.5}, OpenDuration: time.Second,
		Waiters: 1000, ContendedKeys: 100, ContendedDuration: 2 * time.Second,
		Active: 200, ActiveRate: 4_000, Idle: []int{5_000},
		ScaleDuration: 1500 * time.Millisecond, PerProc: 10_000, IdleRounds: 2,
		ClusterNodes: 3, ClusterShards: 16, ClusterConns: 50, ClusterDepths: []int{1, 16},
		ClusterDuration: time.Second, EtcdDuration: 2 * time.Second,
		FailoverDuration: 4 * time.Second, FailoverKillAfter: 1500 * time.Millisecond, FailoverDepth: 16,
		RejoinDuration: 9 * time.Second, SteadyRounds: 2, SteadyDepths: []int{1, 64}, SteadyDuration: time.Second,
	}
}

func SmokePlan() Plan {
	return Plan{
		Name: "smoke", Warmup: 50 * time.Millisecond, Duration: 200 * time.Millisecond,
		Conns: 4, Keys: 1000, Depths: []int{1, 8},
		OpenFractions: []float64{0.3}, OpenDuration: 200 * time.Millisecond,
		Waiters: 40, ContendedKeys: 4, ContendedDuration: 300 * time.Millisecond,
		Active: 10, ActiveRate: 500, Idle: []int{200},
		ScaleDuration: 200 * time.Millisecond, PerProc: 150, IdleRounds: 2,
	}
}

// Env is what the suite runs: binaries, where results go, and how to run
// this program's own subcommands in another process.
type Env struct {
	Ticketd string // server binary
	Echo    string // echo ceiling binary
	Redis   string // redis-server; "" when missing, with RedisMissing saying why
	// RedisMissing is the note printed instead of Redis's figures.
	RedisMissing string
	Etcd         string // etcd server; "" when missing, with EtcdMissing saying why
	EtcdMissing  string
	Self         []string // argv that runs this program (its "hold" subcommand)
	SelfEnv      []string
	Out          string    // results directory ("" writes nothing)
	Profile      bool      // capture ticketd's CPU and allocation profiles
	Log          io.Writer // progress
	// Only names the scenarios to run (uncontended, contended, scale,
	// cluster, steady); nil: all.
	Only []string
}

// RunSuite runs every scenario of plan and returns the report. A scenario
// that fails is noted in the report and the others still run.
func RunSuite(ctx context.Context, plan Plan, env Env) *Report {
	if env.Log == nil {
		env.Log = io.Discard
	}
	rep := newReport(plan, env)
	t0 := time.Now()
	s := &suite{plan: plan, env: env, rep: rep}
	steps := []struct {
		name string
		fn   func(context.Context) error
	}{
		{"uncontended", s.uncontended},
		{"contended", s.contended},
		{"scale", s.scale},
		{"cluster", s.cluster},
		{"steady", s.steady},
	}
	for _, st := range steps {
		if ctx.Err() != nil {
			break
		}
		if env.Only != nil && !slices.Contains(env.Only, st.name) {
			continue
		}
		if st.name == "cluster" && plan.ClusterNodes == 0 || st.name == "steady" && plan.SteadyRounds == 0 {
			continue
		}
		fmt.Fprintf(env.Log, "== %s\n", st.name)
		if err := st.fn(ctx); err != nil {
			rep.Errors = append(rep.Errors, fmt.Sprintf("%s: %v", st.name, err))
			fmt.Fprintf(env.Log, "   FAILED: %v\n", err)
		}
	}
	rep.Elapsed = time.Since(t0).Round(time.Second)
	rep.evaluate()
	return rep
}

type suite struct {
	plan Plan
	env  Env
	rep  *Report
}

func (s *suite) startTicketd(extra ...string) (*Proc, error) {
	p, err := StartTicketd(s.env.Ticketd, extra...)
	if err == nil && s.rep.ServerFDLimit == 0 {
		s.rep.ServerFDLimit, _ = p.FDLimit()
	}
	return p, err
}

// stopInto stops srv, for a defer: its error becomes *err unless that is
// already set.
func stopInto(err *error, srv *Proc) {
	if serr := srv.Stop(); serr != nil && *err == nil {
		*err = serr
	}
}

// run runs l against srv and adds it to the report under sc.
func (s *suite) run(ctx context.Context, sc Scenario, srv *Proc, l Load) (*Row, error) {
	l.Progress = s.env.Log
	return s.measure(ctx, sc, "", srv.CPU, l, func() (*Result, error) { return Run(ctx, l) })
}

// measure runs do, the load l, and adds its row to the report under sc,
// with System sys if given; cpu reads the server's CPU time so far.
func (s *suite) measure(ctx context.Context, sc Scenario, sys System, cpu func() (time.Duration, error), l Load, do func() (*Result, error)) (*Row, error) {
	fmt.Fprintf(s.env.Log, "-> %s\n", l.Label)
	srvCPU0, _ := cpu()
	genCPU0, allCPU0, t0 := selfCPU(), machineCPU(), time.Now()
	res, err := do()
	if err != nil {
		return nil, err
	}
	wall := time.Since(t0).Seconds()
	srvCPU1, _ := cpu()
	row := rowOf(sc, res)
	if sys != "" {
		row.System = sys
	}
	row.ServerCores = (srvCPU1 - srvCPU0).Seconds() / wall
	row.BenchCores = (selfCPU() - genCPU0).Seconds() / wall
	row.OtherCores = max(0, (machineCPU()-allCPU0).Seconds()/wall-row.ServerCores-row.BenchCores)
	fmt.Fprintf(s.env.Log, "   %s pairs/s, %s lines/s, p50 %s p99 %s p99.9 %s; CPU cores: server %.2f, bench %.2f, others %.2f\n",
		human(row.PairsPerSec), human(row.LinesPerSec), fmtDur(row.P50), fmtDur(row.P99), fmtDur(row.P999),
		row.ServerCores, row.BenchCores, row.OtherCores)
	if row.Reconnects > 0 {
		fmt.Fprintf(s.env.Log, "   %d reconnects (%d after E unavailable), %d requests lost with their connections\n",
			row.Reconnects, row.Unavailable, row.Lost)
	}
	if sc != ScenarioScale {
		s.rep.Rows = append(s.rep.Rows, row)
	}
	return &row, nil
}

// uncontended: acquire+release on uniformly chosen keys of a million, closed
// loop at each depth, then open loop at fractions of the best closed rate;
// for ticketd, Redis and the echo ceiling alike.
func (s *suite) uncontended(ctx context.Context) error {
	systems := []System{Ticketd, Redis, Echo}
	for _, sys := range systems {
		if sys == Redis && s.env.Redis == "" {
			s.rep.Skipped = append(s.rep.Skipped, "Redis: "+s.env.RedisMissing)
			fmt.Fprintf(s.env.Log, "   skipping Redis: %s\n", s.env.RedisMissing)
			continue
		}
		if err := s.uncontendedOn(ctx, sys); err != nil {
			return fmt.Errorf("%s: %w", sys, err)
		}
	}
	return nil
}

func (s *suite) uncontendedOn(ctx context.Context, sys System) (err error) {
	p := s.plan
	var srv *Proc
	switch sys {
	case Ticketd:
		srv, err = s.startTicketd()
	case Redis:
		srv, err = StartRedis(s.env.Redis, 1000+p.Conns)
	case Echo:
		srv, err = StartEcho(s.env.Echo, nil, nil)
	}
	if err != nil {
		return err
	}
	defer stopInto(&err, srv)

	base := Load{System: sys, Addr: srv.Addr, Conns: p.Conns, Warmup: p.Warmup,
		Keys: Dist{Keys: p.Keys}, KeyPrefix: "k", LeaseMs: 30000}
	var best float64
	for _, d := range p.Depths {
		l := base
		l.Depth, l.Duration = d, p.Duration
		l.Label = fmt.Sprintf("uncontended %s depth %d", sys, d)
		res, err := s.run(ctx, ScenarioUncontended, srv, l)
		if err != nil {
			return err
		}
		best = max(best, res.PairsPerSec)
	}
	for _, f := range p.OpenFractions {
		l := base
		l.Rate, l.Depth, l.Duration = f*best, 256, p.OpenDuration
		l.Label = fmt.Sprintf("uncontended %s open loop %s pairs/s", sys, human(l.Rate))
		if _, err := s.run(ctx, ScenarioUncontended, srv, l); err != nil {
			return err
		}
	}
	if sys == Ticketd && s.env.Profile {
		return s.profiled(ctx, base)
	}
	return nil
}

// profiled runs the deepest pipeline once more on a ticketd of its own,
// with --admin, and saves its profiles and metrics. Kept out of the table,
// and off the measured server: profiling costs the server CPU, and --admin
// turns on the per-batch latency observer, so that every measured row is
// taken the same way for every system.
func (s *suite) profiled(ctx context.Context, base Load) (err error) {
	p := s.plan
	port, err := freePort()
	if err != nil {
		return err
	}
	adminAddr := "127.0.0.1:" + strconv.Itoa(port)
	srv, err := s.startTicketd("--admin", adminAddr)
	if err != nil {
		return err
	}
	defer stopInto(&err, srv)
	l := base
	l.Addr = srv.Addr
	l.Depth, l.Duration = slices.Max(p.Depths), p.Duration
	l.Label = fmt.Sprintf("uncontended %s depth %d, profiled (not in the table)", Ticketd, l.Depth)
	l.Progress = s.env.Log
	fmt.Fprintf(s.env.Log, "-> %s\n", l.Label)
	prof := make(chan error, 1)
	go func() { prof <- s.captureCPU(ctx, adminAddr, p.Warmup, p.Duration) }()
	if _, err := Run(ctx, l); err != nil {
		return err
	}
	if perr := <-prof; perr != nil {
		s.rep.Errors = append(s.rep.Errors, "profile: "+perr.Error())
	}
	if perr := s.captureAfter(adminAddr); perr != nil {
		s.rep.Errors = append(s.rep.Errors, "profile: "+perr.Error())
	}
	return nil
}

// captureCPU takes the server's CPU profile over the measured window.
func (s *suite) captureCPU(ctx context.Context, admin string, warmup, d time.Duration) error {
	select {
	case <-time.After(warmup):
	case <-ctx.Done():
		return ctx.Err()
	}
	secs := max(1, int(d.Seconds()))
	return s.fetch(admin, fmt.Sprintf("/debug/pprof/profile?seconds=%d", secs), "ticketd-cpu.prof")
}

// captureAfter saves the allocation profile and the metrics once the run ended.
func (s *suite) captureAfter(admin string) error {
	if err := s.fetch(admin, "/debug/pprof/allocs", "ticketd-allocs.prof"); err != nil {
		return err
	}
	return s.fetch(admin, "/metrics", "ticketd-metrics.txt")
}

func (s *suite) fetch(admin, path, name string) error {
	if s.env.Out == "" {
		return nil
	}
	cl := &http.Client{Timeout: 2 * time.Minute}
	resp, err := cl.Get("http://" + admin + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	f, err := os.Create(filepath.Join(s.env.Out, name))
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	s.rep.Profiles = append(s.rep.Profiles, name)
	return f.Close()
}

// contended: many clients, each with one acquire waiting at a time on a few
// keys, releasing at once when granted; every grant but a key's first is a
// hand-over from the queue.
func (s *suite) contended(ctx context.Context) (err error) {
	p := s.plan
	s.rep.Skipped = append(s.rep.Skipped,
		"Redis, contended: no equivalent (Redis has no wait queue: its clients poll SET NX)")
	srv, err := s.startTicketd()
	if err != nil {
		return err
	}
	defer stopInto(&err, srv)
	l := Load{System: Ticketd, Addr: srv.Addr, Conns: p.Waiters, Depth: 1,
		Warmup: p.Warmup, Duration: p.ContendedDuration,
		Keys: Dist{Keys: p.ContendedKeys}, KeyPrefix: "hot", LeaseMs: 30000, WaitMs: 120_000,
		Drain: 5 * time.Second,
		Label: fmt.Sprintf("contended ticketd %d waiters on %d keys", p.Waiters, p.ContendedKeys)}
	_, err = s.run(ctx, ScenarioContended, srv, l)
	return err
}

// scale: the active clients' latency alone, then with more and more idle
// connections held by other processes, and the server's memory for them.
func (s *suite) scale(ctx context.Context) (err error) {
	p := s.plan
	srv, err := s.startTicketd()
	if err != nil {
		return err
	}
	defer stopInto(&err, srv)
	limit, _ := srv.FDLimit()
	s.rep.ServerFDLimit = limit
	room := p.Idle[len(p.Idle)-1]
	if limit > 0 {
		// The server also holds the active clients, its listener, its store.
		room = int(limit) - p.Active - 500
		if room > 1000 {
			room -= room % 1000
		}
	}

	active := Load{System: Ticketd, Addr: srv.Addr, Conns: p.Active, Depth: 64,
		Rate: p.ActiveRate, Warmup: p.Warmup, Duration: p.ScaleDuration,
		Keys: Dist{Keys: p.Keys}, KeyPrefix: "a", LeaseMs: 30000}
	active.Label = fmt.Sprintf("scale: %d active, no idle", p.Active)
	base, err := s.run(ctx, ScenarioScale, srv, active)
	if err != nil {
		return err
	}
	rssBase, err := srv.RSS()
	if err != nil {
		return err
	}
	s.rep.Scale = append(s.rep.Scale, ScaleRow{RSSBefore: rssBase, RSSAfter: rssBase, Active: base})

	var h Holders
	defer h.Stop()
	for _, want := range p.Idle {
		n := min(want, room)
		row := ScaleRow{Wanted: want, Idle: n, RSSBefore: rssBase}
		if n <= h.Conns {
			row.Idle = h.Conns
			row.Note = fmt.Sprintf("not run: the server's descriptor limit (%d) allows %s idle beside %d active",
				limit, commas(int64(room)), p.Active)
			s.rep.Scale = append(s.rep.Scale, row)
			continue
		}
		if n < want {
			row.Note = fmt.Sprintf("capped at %s by the server's descriptor limit (%d)", commas(int64(n)), limit)
		}
		fmt.Fprintf(s.env.Log, "-> opening %s idle connections (%d per process)\n", commas(int64(n-h.Conns)), p.PerProc)
		if err := h.Add(s.env.Self, s.env.SelfEnv, srv.Addr, n-h.Conns, p.PerProc, 2, true); err != nil {
			return err
		}
		time.Sleep(500 * time.Millisecond) // let the server settle its buffers
		if row.RSSAfter, err = srv.RSS(); err != nil {
			return err
		}
		fmt.Fprintf(s.env.Log, "   server VmRSS %s -> %s: %s bytes per idle connection\n",
			fmtBytes(rssBase), fmtBytes(row.RSSAfter), commas((row.RSSAfter-rssBase)/int64(n)))
		l := active
		l.Label = fmt.Sprintf("scale: %d active, %s idle", p.Active, commas(int64(n)))
		if row.Active, err = s.run(ctx, ScenarioScale, srv, l); err != nil {
			return err
		}
		s.rep.Scale = append(s.rep.Scale, row)
	}
	return s.idleRounds(ctx, srv, active, &h)
}

// idleRounds runs the active load in three states, IdleRounds times: no
// idle connections, h's n idle connections held against ticketd, and the
// same n held against another server (an echo process) instead. The third
// is the control: it puts the machine's own cost of holding n more sockets
// (kernel memory, their timers, the holders) beside ticketd's, which
// ticketd cannot remove. One run of each, a minute apart, is at the mercy
// of a shared machine's slow spells: a step's p99 has moved 0.4x to 2.9x
// between runs of the same binary. So each round runs the three back to
// back, starting in the state the last one ended in, and the order turns
// from round to round so that no state always runs first or last.
func (s *suite) idleRounds(ctx context.Context, srv *Proc, active Load, h *Holders) (err error) {
	p := s.plan
	n := h.Conns
	if p.IdleRounds == 0 || n == 0 {
		return nil
	}
	// Fresh source addresses for every opening: the last one's are in
	// TIME_WAIT. The steps' holders have 127.0.0.2 up to before source;
	// a round opens them at most twice.
	procs := (n + p.PerProc - 1) / p.PerProc
	state, source := IdleAtTicketd, 2+len(h.procs)
	if last := source + 2*p.IdleRounds*procs - 1; last > 254 {
		return fmt.Errorf("%d rounds of %d idle connections need source addresses up to 127.0.0.%d", p.IdleRounds, n, last)
	}
	other, err := StartEcho(s.env.Echo, nil, nil)
	if err != nil {
		return fmt.Errorf("control server: %w", err)
	}
	defer stopInto(&err, other) // an error if it died: the control would have held nothing
	enter := func(to IdleState) error {
		h.Stop()
		state = to
		if to == IdleNone {
			return nil
		}
		addr, touch := srv.Addr, true
		if to == IdleElsewhere {
			addr, touch = other.Addr, false // the echo has no lock pair to touch
		}
		first := source
		source += procs
		return h.Add(s.env.Self, s.env.SelfEnv, addr, n, p.PerProc, first, touch)
	}
	for r := range p.IdleRounds {
		round := IdleRound{Idle: n}
		for _, st := range idleOrder(state) {
			if st != state {
				if err := enter(st); err != nil {
					return err
				}
				time.Sleep(500 * time.Millisecond) // let the server settle, as for the steps
			}
			l := active
			l.Label = fmt.Sprintf("scale, round %d of %d: %d active, %s", r+1, p.IdleRounds, p.Active, st.label(n))
			row, err := s.run(ctx, ScenarioScale, srv, l)
			if err != nil {
				return err
			}
			if st == IdleElsewhere && other.Exited() {
				return fmt.Errorf("the control server exited, so its run held no idle connections:\n%s", other.Log())
			}
			round.Order = append(round.Order, st)
			*round.row(st) = row
		}
		s.rep.IdleRounds = append(s.rep.IdleRounds, round)
	}
	return nil
}

// idleOrder is a round's order of the three states, starting in from. A
// round starts in the state the last one ended in, so over three rounds
// each state takes each place (at ticketd, none, elsewhere; elsewhere, at
// ticketd, none; none, elsewhere, at ticketd).
func idleOrder(from IdleState) []IdleState {
	next := map[IdleState]IdleState{IdleAtTicketd: IdleNone, IdleNone: IdleElsewhere, IdleElsewhere: IdleAtTicketd}
	return []IdleState{from, next[from], next[next[from]]}
}
