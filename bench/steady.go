package bench

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The steady scenario runs the same closed-loop load on a fresh server
// each round, for several server set-ups in turn: how much one binary's
// figures move from run to run (against the echo ceiling's own spread),
// and what the event-loop placement costs or gains (ticketd's default
// against one loop per core, echo with either).

// SteadySetup is one server set-up of the steady scenario.
type SteadySetup struct {
	Name   string
	Role   SteadyRole
	System System
	Flags  []string
	Env    []string
}

// SteadyRole is what the targets compare a set-up as; they find set-ups
// by role, so that the list's order is free.
type SteadyRole string

const (
	RoleDefault SteadyRole = "default"  // ticketd as shipped
	RolePerCore SteadyRole = "per-core" // ticketd, one loop per core
	RoleEchoOne SteadyRole = "echo-one" // the echo ceiling on the default's share of the cores
	RoleCeiling SteadyRole = "ceiling"  // the echo ceiling, one loop per core
	RolePeer    SteadyRole = "peer"     // Redis
)

// SteadyRun is one fresh server's run at one depth.
type SteadyRun struct {
	Setup       string
	Depth       int
	Round       int
	PairsPerSec float64
	P99         time.Duration
	ServerCores float64
	// Time the server's and the generator's threads spent runnable but
	// waiting for a core, per second of the run (schedstat run_delay).
	ServerRunDelay, BenchRunDelay time.Duration
}

// SteadyReport is the steady scenario's outcome.
type SteadyReport struct {
	Rounds int
	Setups []SteadySetup
	Runs   []SteadyRun
	// EqualRate is the load offered alike to ticketd's default and Redis in
	// the equal-load rounds (pairs/s, open loop): the lower of their
	// depth-1 medians; EqualRuns their runs at it (Depth 0).
	EqualRate float64     `json:",omitempty"`
	EqualRuns []SteadyRun `json:",omitempty"`
}

func steadySetups(redis bool) []SteadySetup {
	cores := runtime.NumCPU()
	half := max(1, cores/2)
	procs := func(n int) []string { return []string{"GOMAXPROCS=" + strconv.Itoa(n)} }
	s := []SteadySetup{
		{Name: "ticketd (default)", Role: RoleDefault, System: Ticketd},
		{Name: fmt.Sprintf("ticketd --loops %d, GOMAXPROCS=%d", cores, 2*cores), Role: RolePerCore, System: Ticketd,
			Flags: []string{"--loops", strconv.Itoa(cores)}, Env: procs(2 * cores)},
		{Name: fmt.Sprintf("echo -loops %d, GOMAXPROCS=%d", half, half), Role: RoleEchoOne, System: Echo,
			Flags: []string{"-loops", strconv.Itoa(half)}, Env: procs(half)},
		{Name: fmt.Sprintf("echo, %d loops", cores), Role: RoleCeiling, System: Echo},
	}
	if redis {
		s = append(s, SteadySetup{Name: "Redis", Role: RolePeer, System: Redis})
	}
	return s
}

func (s *suite) steady(ctx context.Context) error {
	p := s.plan
	rep := &SteadyReport{Rounds: p.SteadyRounds, Setups: steadySetups(s.env.Redis != "")}
	s.rep.Steady = rep
	for round := 1; round <= p.SteadyRounds; round++ {
		for _, st := range rep.Setups {
			for _, d := range p.SteadyDepths {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				run, err := s.steadyRun(ctx, st, d)
				if err != nil {
					return fmt.Errorf("%s: %w", st.Name, err)
				}
				run.Round = round
				rep.Runs = append(rep.Runs, run)
			}
		}
	}
	return s.steadyEqualLoad(ctx, rep)
}

// steadyEqualLoad offers ticketd's default and Redis the same load, open
// loop, in interleaved rounds: in the closed loop each sets its own pace,
// and the faster one loads the shared cores (the generator's included)
// more, which lengthens its own tail (bench/results/depth1-equal-rate.txt).
func (s *suite) steadyEqualLoad(ctx context.Context, rep *SteadyReport) error {
	var pair []SteadySetup
	for _, role := range []SteadyRole{RoleDefault, RolePeer} {
		if st, ok := rep.setup(role); ok {
			pair = append(pair, st)
		}
	}
	def, ok1 := rep.roleStat(RoleDefault, 1)
	peer, ok2 := rep.roleStat(RolePeer, 1)
	if len(pair) != 2 || !ok1 || !ok2 {
		return nil
	}
	rep.EqualRate = min(def.Median, peer.Median)
	if rep.EqualRate >= 1000 {
		rep.EqualRate = 1000 * math.Floor(rep.EqualRate/1000)
	}
	for round := 1; round <= s.plan.SteadyRounds; round++ {
		for _, st := range pair {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			run, err := s.steadyOpen(ctx, st, rep.EqualRate)
			if err != nil {
				return fmt.Errorf("%s: %w", st.Name, err)
			}
			run.Round = round
			rep.EqualRuns = append(rep.EqualRuns, run)
		}
	}
	return nil
}

// steadyRun starts a fresh server of set-up st, runs one closed loop at
// depth and stops the server.
func (s *suite) steadyRun(ctx context.Context, st SteadySetup, depth int) (SteadyRun, error) {
	return s.steadyLoad(ctx, st, depth, 0)
}

// steadyOpen is steadyRun for one open loop at rate pairs/s (Depth 0).
func (s *suite) steadyOpen(ctx context.Context, st SteadySetup, rate float64) (SteadyRun, error) {
	return s.steadyLoad(ctx, st, 0, rate)
}

func (s *suite) steadyLoad(ctx context.Context, st SteadySetup, depth int, rate float64) (run SteadyRun, err error) {
	var srv *Proc
	switch st.System {
	case Ticketd:
		srv, err = StartTicketdEnv(s.env.Ticketd, st.Env, st.Flags...)
	case Echo:
		srv, err = StartEcho(s.env.Echo, st.Flags, st.Env)
	case Redis:
		srv, err = StartRedis(s.env.Redis, 1000+s.plan.Conns)
	}
	if err != nil {
		return run, err
	}
	defer stopInto(&err, srv)
	p := s.plan
	l := Load{System: st.System, Addr: srv.Addr, Conns: p.Conns, Warmup: p.Warmup,
		Keys: Dist{Keys: p.Keys}, KeyPrefix: "k", LeaseMs: 30000, Depth: depth, Rate: rate, Duration: p.SteadyDuration,
		Label: fmt.Sprintf("steady %s depth %d", st.Name, depth)}
	if rate > 0 {
		l.Label = fmt.Sprintf("steady %s, open loop at %s pairs/s", st.Name, human(rate))
	}
	fmt.Fprintf(s.env.Log, "-> %s\n", l.Label)
	cpu0, _ := srv.CPU()
	srvDelay0, genDelay0, t0 := runDelay(srv.Pid()), runDelay(os.Getpid()), time.Now()
	res, err := Run(ctx, l)
	if err != nil {
		return run, err
	}
	wall := time.Since(t0).Seconds()
	cpu1, _ := srv.CPU()
	perSec := func(d time.Duration) time.Duration { return time.Duration(float64(d) / wall) }
	run = SteadyRun{Setup: st.Name, Depth: depth, PairsPerSec: res.PairsPerSec(), P99: Q(res.Latency, 99),
		ServerCores:    (cpu1 - cpu0).Seconds() / wall,
		ServerRunDelay: perSec(runDelay(srv.Pid()) - srvDelay0),
		BenchRunDelay:  perSec(runDelay(os.Getpid()) - genDelay0)}
	fmt.Fprintf(s.env.Log, "   %s pairs/s, p99 %s; server %.2f cores, waited for a core %s/s (generator %s/s)\n",
		human(run.PairsPerSec), fmtDur(run.P99), run.ServerCores,
		fmtDur(run.ServerRunDelay), fmtDur(run.BenchRunDelay))
	return run, nil
}

// runDelay sums the time pid's threads spent runnable without a core
// (the second field of /proc/PID/task/TID/schedstat); 0 where the kernel
// does not keep it. Threads that ended are not counted.
func runDelay(pid int) time.Duration {
	dirs, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	var sum time.Duration
	for _, f := range dirs {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if fs := strings.Fields(string(b)); len(fs) >= 2 {
			if v, err := strconv.ParseInt(fs[1], 10, 64); err == nil {
				sum += time.Duration(v)
			}
		}
	}
	return sum
}

// SteadyStat sums up one set-up's runs at one depth.
type SteadyStat struct {
	Runs             int
	Median, Min, Max float64 // pairs/s
	Spread           float64 // (max-min)/median
	P99              time.Duration
	ServerRunDelay   time.Duration // medians
	BenchRunDelay    time.Duration
	ServerCores      float64
}

// roleStat is stat for the set-up that plays role.
func (r *SteadyReport) roleStat(role SteadyRole, depth int) (SteadyStat, bool) {
	if st, ok := r.setup(role); ok {
		return r.stat(st.Name, depth)
	}
	return SteadyStat{}, false
}

// setup is the set-up that plays role, if one ran.
func (r *SteadyReport) setup(role SteadyRole) (SteadySetup, bool) {
	if i := slices.IndexFunc(r.Setups, func(st SteadySetup) bool { return st.Role == role }); i >= 0 {
		return r.Setups[i], true
	}
	return SteadySetup{}, false
}

func (r *SteadyReport) stat(setup string, depth int) (st SteadyStat, ok bool) {
	var pairs []float64
	var p99, srvDelay, genDelay []time.Duration
	var cores []float64
	for _, x := range r.Runs {
		if x.Setup == setup && x.Depth == depth {
			pairs = append(pairs, x.PairsPerSec)
			p99 = append(p99, x.P99)
			srvDelay = append(srvDelay, x.ServerRunDelay)
			genDelay = append(genDelay, x.BenchRunDelay)
			cores = append(cores, x.ServerCores)
		}
	}
	if len(pairs) == 0 {
		return st, false
	}
	st = SteadyStat{Runs: len(pairs), Median: medianOf(pairs), Min: slices.Min(pairs), Max: slices.Max(pairs),
		P99: medianOf(p99), ServerRunDelay: medianOf(srvDelay), BenchRunDelay: medianOf(genDelay),
		ServerCores: medianOf(cores)}
	if st.Median > 0 {
		st.Spread = (st.Max - st.Min) / st.Median
	}
	return st, true
}

func medianOf[T int64 | float64 | time.Duration](v []T) T {
	v = slices.Clone(v)
	slices.Sort(v)
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}

// evaluateSteady adds the steady scenario's targets.
func (r *Report) evaluateSteady(skip func(name, why string)) {
	const (
		spreadName  = "steady: ticketd depth-64 spread over fresh runs < 15% of the median, or no more than the echo ceiling's"
		tradeName   = "loops: ticketd's default keeps >= 90% of one loop per core's pairs/s at depth 64"
		ceilingName = "steady: ticketd's default depth-64 pairs/s >= 60% of the echo ceiling's, medians of the interleaved rounds"
		tailName    = "steady: ticketd's default depth-1 p99 <= Redis p99, medians of the interleaved rounds"
		equalName   = "steady: at the same offered load (open loop at the lower of the two depth-1 medians), ticketd's default p99 <= Redis p99, medians of the rounds"
	)
	sr := r.Steady
	if sr == nil || len(sr.Runs) == 0 {
		skip(equalName, "the steady scenario did not run")
		skip(tailName, "the steady scenario did not run")
		skip(spreadName, "the steady scenario did not run")
		skip(tradeName, "the steady scenario did not run")
		skip(ceilingName, "the steady scenario did not run")
		return
	}
	// The uncontended section's depth-1 p99 is one run of each system,
	// minutes apart, and a tail is what a slow spell moves most; here both
	// run in every round, under a minute apart.
	if def, ok := sr.roleStat(RoleDefault, 1); !ok {
		skip(tailName, "ticketd did not run at depth 1")
	} else if peer, ok := sr.roleStat(RolePeer, 1); !ok {
		skip(tailName, "Redis did not run ("+RedisInstall+" if it is missing)")
	} else {
		r.Targets = append(r.Targets, Target{tailName,
			fmt.Sprintf("%s vs %s (medians of %d rounds)", fmtDur(def.P99), fmtDur(peer.P99), min(def.Runs, peer.Runs)),
			verdict(def.P99 <= peer.P99)})
	}
	// The closed loop above lets each set its own pace; here both get the
	// same load, so that the faster does not lengthen its own tail.
	if def, n1 := sr.equalP99(RoleDefault); n1 == 0 {
		skip(equalName, "ticketd did not run at depth 1")
	} else if peer, n2 := sr.equalP99(RolePeer); n2 == 0 {
		skip(equalName, "Redis did not run ("+RedisInstall+" if it is missing)")
	} else {
		r.Targets = append(r.Targets, Target{equalName,
			fmt.Sprintf("%s vs %s at %s pairs/s (medians of %d rounds)", fmtDur(def), fmtDur(peer),
				human(sr.EqualRate), min(n1, n2)),
			verdict(def <= peer)})
	}
	deep := slices.Max(r.plan.SteadyDepths)
	def, ok1 := sr.roleStat(RoleDefault, deep)
	perCore, ok2 := sr.roleStat(RolePerCore, deep)
	echo, ok3 := sr.roleStat(RoleCeiling, deep)
	if !ok1 || !ok2 || !ok3 {
		skip(spreadName, "a set-up did not run")
		skip(tradeName, "a set-up did not run")
		skip(ceilingName, "a set-up did not run")
		return
	}
	r.Targets = append(r.Targets, Target{spreadName,
		fmt.Sprintf("%.1f%% over %d runs (%s to %s pairs/s); echo %.1f%%", 100*def.Spread, def.Runs,
			human(def.Min), human(def.Max), 100*echo.Spread),
		verdict(def.Spread < 0.15 || def.Spread <= echo.Spread)})
	ratio := def.Median / perCore.Median
	r.Targets = append(r.Targets, Target{tradeName,
		fmt.Sprintf("%s vs %s pairs/s (medians) = %.1f%%", human(def.Median), human(perCore.Median), 100*ratio),
		verdict(ratio >= 0.9)})
	// The uncontended section's depth-64 ratio compares one run of each
	// system, minutes apart; a slow spell of a shared machine that falls on
	// one of them moves it by a tenth or more. Here every round runs both
	// within seconds, and the medians over the rounds are compared. The
	// ceiling is echo with one loop per core, as in the uncontended section.
	if ceil, ok := sr.roleStat(RoleCeiling, deep); ok && ceil.Median > 0 {
		ratio := def.Median / ceil.Median
		r.Targets = append(r.Targets, Target{ceilingName,
			fmt.Sprintf("%s vs %s pairs/s (medians of %d rounds) = %.1f%%", human(def.Median), human(ceil.Median), def.Runs, 100*ratio),
			verdict(ratio >= 0.6)})
	} else {
		skip(ceilingName, "the echo ceiling did not run")
	}
}

// equalP99 is the median p99 of role's equal-load runs, and their count.
func (r *SteadyReport) equalP99(role SteadyRole) (time.Duration, int) {
	st, ok := r.setup(role)
	if !ok {
		return 0, 0
	}
	var p99 []time.Duration
	for _, x := range r.EqualRuns {
		if x.Setup == st.Name {
			p99 = append(p99, x.P99)
		}
	}
	if len(p99) == 0 {
		return 0, 0
	}
	return medianOf(p99), len(p99)
}

func (r *Report) mdSteady(w func(string, ...any)) {
	sr := r.Steady
	p := r.plan
	w("\n## 5. Steadiness and event-loop placement\n\n")
	w("%d rounds; in each, every set-up gets a fresh server and one closed-loop run of %s per depth "+
		"(%d connections, %s keys uniform). Figures are medians over the rounds; spread is (max - min) / median "+
		"of pairs/s. *Waited* is the time the process's threads were runnable but had no core, per second of "+
		"the run (`run_delay` of `/proc/PID/task/*/schedstat`): the queueing behind a depth-1 tail.\n\n",
		sr.Rounds, p.SteadyDuration, p.Conns, commas(int64(p.Keys)))
	w("| set-up | depth | pairs/s (median) | min | max | spread | p99 | server cores | server waited | generator waited |\n")
	w("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, st := range sr.Setups {
		for _, d := range p.SteadyDepths {
			x, ok := sr.stat(st.Name, d)
			if !ok {
				continue
			}
			w("| %s | %d | %s | %s | %s | %.0f%% | %s | %.2f | %s/s | %s/s |\n", st.Name, d, human(x.Median),
				human(x.Min), human(x.Max), 100*x.Spread, fmtDur(x.P99), x.ServerCores,
				fmtDur(x.ServerRunDelay), fmtDur(x.BenchRunDelay))
		}
	}
	if len(sr.EqualRuns) == 0 {
		return
	}
	w("\nThe same load for ticketd and Redis: open loop at %s pairs/s (the lower of their depth-1 medians above), "+
		"one run of each per round on a fresh server; latency counts from the intended send. "+
		"In the closed loop each sets its own pace, and the faster one loads the shared cores more.\n\n", human(sr.EqualRate))
	w("| set-up | round | pairs/s | p99 |\n|---|--:|--:|--:|\n")
	for _, x := range sr.EqualRuns {
		w("| %s | %d | %s | %s |\n", x.Setup, x.Round, human(x.PairsPerSec), fmtDur(x.P99))
	}
}
