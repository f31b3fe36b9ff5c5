package bench

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/ticketd/ticketd/internal/serverproc"
)

const usage = `usage:
  bench [-quick] [-only SCENARIOS] [-out DIR] [-ticketd BIN] [-echo BIN] [-redis BIN|none] [-etcd BIN|none] [-profile]
        run every scenario: ticketd, Redis and the echo ceiling side by side;
        ticketd's cluster mode beside etcd and single mode
  bench load -system ticketd|redis|echo -addr HOST:PORT[,HOST:PORT...] [flags]
        one load run against a server that is already up
  bench hold -addr HOST:PORT -conns N [-sources IP,...]
        hold idle connections until stdin closes (used by the suite)
  bench burst -addr HOST:PORT [-conns N]
        dial N connections at once, one round trip on each, and say how long the slowest took
  bench flood -addr HOST:PORT [-conns N] [-duration D]
        N connections that pipeline acquires and never read (what --max-queued bounds)
`

func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	return fs
}

// Main runs the bench command with args (the program name left out) and
// returns its exit code: 0 when every scenario ran (a missed target is
// reported, not failed), 1 when one failed, 2 for bad usage.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	sub := "run"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		sub, args = args[0], args[1:]
	}
	var err error
	switch sub {
	case "run":
		return suiteMain(ctx, args, stdout, stderr)
	case "load":
		err = loadMain(ctx, args, stdout, stderr)
	case "hold":
		err = holdMain(args, stdin, stdout)
	case "burst":
		err = burstMain(ctx, args, stdout)
	case "flood":
		err = floodMain(ctx, args, stdout)
	default:
		fmt.Fprint(stderr, usage)
		return 2
	}
	if err == flag.ErrHelp {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 1
	}
	return 0
}

func suiteMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("bench")
	fs.SetOutput(stderr)
	quick := fs.Bool("quick", false, "the short plan (about a minute and a half) instead of the full one (about 10 minutes)")
	out := fs.String("out", "", "results directory (default: bench/results of the module)")
	ticketd := fs.String("ticketd", "", "ticketd binary (default: go build ./cmd/ticketd)")
	echo := fs.String("echo", "", "echo ceiling binary (default: go build ./bench/cmd/echo)")
	redis := fs.String("redis", "", `redis-server binary (default: from PATH; "none" skips Redis)`)
	etcd := fs.String("etcd", "", `etcd server binary (default: from PATH; "none" skips etcd)`)
	profile := fs.Bool("profile", os.Getenv("PROFILE") == "1",
		"capture ticketd's CPU and allocation profiles during the uncontended run (default: PROFILE=1)")
	only := fs.String("only", "", "comma-separated scenarios to run: uncontended, contended, scale, cluster, steady (default: all)")
	cpuprofile := fs.String("cpuprofile", "", "write the generator's own CPU profile to this file")
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	stopProfile, err := startCPUProfile(*cpuprofile)
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 1
	}
	defer stopProfile()
	plan := FullPlan()
	if *quick {
		plan = QuickPlan()
	}
	env, cleanup, err := prepare(ctx, *out, *ticketd, *echo, *redis, *etcd, *profile, stderr)
	defer cleanup()
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 1
	}
	if *only != "" {
		env.Only = strings.Split(*only, ",")
		for _, o := range env.Only {
			if !slices.Contains([]string{"uncontended", "contended", "scale", "cluster", "steady"}, o) {
				fmt.Fprintf(stderr, "bench: -only: unknown scenario %q\n", o)
				return 2
			}
		}
	}
	fmt.Fprintf(stderr, "bench: %s plan; results in %s\n", plan.Name, env.Out)
	rep := RunSuite(ctx, plan, env)
	name := plan.Name
	if env.Only != nil {
		// A partial run does not overwrite the whole suite's results.
		if name == "full" {
			name = strings.Join(env.Only, "-") // bench-cluster.md
		} else {
			name += "-" + strings.Join(env.Only, "-") // bench-quick-cluster.md
		}
	}
	dir := env.Out
	if len(rep.Errors) > 0 {
		// A run that failed part-way must not stand in for the last good
		// one in the results a README quotes.
		fmt.Fprintf(stderr, "bench: %d errors: nothing written to %s, the report is on stdout only\n", len(rep.Errors), dir)
		dir = ""
	}
	md, err := writeResults(rep, dir, name)
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
	}
	fmt.Fprint(stdout, md)
	if len(rep.Errors) > 0 || err != nil {
		return 1
	}
	return 0
}

// prepare builds what it was not given and finds Redis and etcd.
// absPath makes a binary's path given as a relative one absolute: the
// servers start in directories of their own, where "bin/ticketd" is not
// found (the README's -only cluster example failed so, after 80 s of runs).
// A bare name is left to the PATH, and "" stays "".
func absPath(p string) string {
	if p == "" || !strings.ContainsRune(p, filepath.Separator) {
		return p
	}
	if abs, err := filepath.Abs(p); err == nil {
		return abs
	}
	return p
}

func prepare(ctx context.Context, out, ticketd, echo, redis, etcd string, profile bool, log io.Writer) (Env, func(), error) {
	env := Env{Log: log, Profile: profile, Ticketd: absPath(ticketd), Echo: absPath(echo)}
	cleanup := func() {}
	root, err := serverproc.ModuleRoot()
	if err != nil && (ticketd == "" || echo == "" || out == "") {
		return env, cleanup, err
	}
	if out == "" {
		out = filepath.Join(root, "bench", "results")
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return env, cleanup, err
	}
	env.Out = out
	if ticketd == "" || echo == "" {
		dir, err := os.MkdirTemp("", "ticketd-bench-bin-")
		if err != nil {
			return env, cleanup, err
		}
		cleanup = func() { os.RemoveAll(dir) }
		for _, b := range []struct {
			dst *string
			pkg string
		}{{&env.Ticketd, "./cmd/ticketd"}, {&env.Echo, "./bench/cmd/echo"}} {
			if *b.dst != "" {
				continue
			}
			fmt.Fprintf(log, "bench: go build %s\n", b.pkg)
			if *b.dst, err = serverproc.Build(ctx, root, b.pkg, dir); err != nil {
				return env, cleanup, err
			}
		}
	}
	switch redis {
	case "none":
		env.RedisMissing = "skipped by -redis none"
	case "":
		if env.Redis, err = FindRedis(); err != nil {
			env.RedisMissing = err.Error()
		}
	default:
		env.Redis = absPath(redis)
	}
	switch etcd {
	case "none":
		env.EtcdMissing = "skipped by -etcd none"
	case "":
		if env.Etcd, err = serverproc.FindEtcd(); err != nil {
			env.EtcdMissing = err.Error()
		}
	default:
		env.Etcd = absPath(etcd)
	}
	self, err := os.Executable()
	if err != nil {
		return env, cleanup, err
	}
	env.Self = []string{self}
	return env, cleanup, nil
}

// writeResults writes the Markdown, the chart and the JSON into out and
// returns the Markdown.
func writeResults(rep *Report, out, name string) (string, error) {
	base := "bench"
	if name != "full" {
		base = "bench-" + name
	}
	if out == "" {
		return rep.Markdown(""), nil
	}
	chart := base + ".png"
	var firstErr error
	if err := rep.Chart(filepath.Join(out, chart)); err != nil {
		firstErr = fmt.Errorf("chart: %w", err)
		chart = ""
	}
	var failover string
	if rep.Cluster != nil && rep.Cluster.Failover != nil && len(rep.Cluster.Failover.Timeline.At) > 0 {
		failover = base + ".failover.png" // bench-quick.* stays out of git with the rest
		if err := rep.FailoverChart(filepath.Join(out, failover)); err != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("failover chart: %w", err)
			}
			failover = ""
		}
	}
	md := rep.Markdown(chart, failover)
	if err := os.WriteFile(filepath.Join(out, base+".md"), []byte(md), 0o644); err != nil && firstErr == nil {
		firstErr = err
	}
	js, err := rep.JSON()
	if err == nil {
		err = os.WriteFile(filepath.Join(out, base+".json"), js, 0o644)
	}
	if err != nil && firstErr == nil {
		firstErr = fmt.Errorf("json: %w", err)
	}
	return md, firstErr
}

func loadMain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("load")
	fs.SetOutput(stderr)
	var l Load
	sys := fs.String("system", "ticketd", "ticketd, redis or echo")
	addr := fs.String("addr", "", "server address; several, comma-separated, spread the connections over them (cluster nodes)")
	fs.BoolVar(&l.Reconnect, "reconnect", false, "ticketd, closed loop: dial again (the next address) when the server closes a connection or answers E unavailable")
	fs.IntVar(&l.Conns, "conns", 50, "connections")
	fs.IntVar(&l.Depth, "depth", 0, "lock pairs in flight per connection (0: 1 closed loop, 256 open loop)")
	fs.Float64Var(&l.Rate, "rate", 0, "open loop: acquires per second over all connections (0: closed loop)")
	fs.DurationVar(&l.Warmup, "warmup", time.Second, "warm-up before measuring")
	fs.DurationVar(&l.Duration, "duration", 5*time.Second, "measured time (0: until -pairs)")
	fs.Int64Var(&l.Pairs, "pairs", 0, "with -duration 0: stop after this many lock pairs")
	fs.IntVar(&l.Keys.Keys, "keys", 1_000_000, "keys, chosen uniformly")
	fs.IntVar(&l.Keys.Hot, "hot", 0, "hot keys among them")
	fs.Float64Var(&l.Keys.HotFrac, "hot-frac", 0, "share of acquires on the hot keys")
	fs.StringVar(&l.KeyPrefix, "key-prefix", "k", "key prefix")
	fs.Uint64Var(&l.LeaseMs, "lease", 30000, "lease, ms")
	fs.Uint64Var(&l.WaitMs, "wait", 0, "ticketd: wait, ms (0: T at once when held)")
	sources := fs.String("sources", "", "comma-separated local addresses to dial from")
	quiet := fs.Bool("quiet", false, "no progress lines")
	cpuprofile := fs.String("cpuprofile", "", "write the generator's own CPU profile to this file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	stopProfile, err := startCPUProfile(*cpuprofile)
	if err != nil {
		return err
	}
	defer stopProfile()
	l.System = System(*sys)
	if strings.Contains(*addr, ",") {
		l.Addrs = strings.Split(*addr, ",")
	} else {
		l.Addr = *addr
	}
	if *sources != "" {
		l.Sources = strings.Split(*sources, ",")
	}
	if !*quiet {
		l.Progress = stderr
	}
	res, err := Run(ctx, l)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s %s: %d conns, depth %d, %s\n", res.Load.System, res.Load.Addr, res.Load.Conns, res.Load.Depth, res.Load.Keys)
	fmt.Fprintf(stdout, "window %s: %s pairs/s, %s lines/s (%d granted, %d refused, %d released, %d not released)\n",
		res.Window.Round(time.Millisecond), human(res.PairsPerSec()), human(res.LinesPerSec()),
		res.Acquired, res.Refused, res.Released, res.NotReleased)
	fmt.Fprintf(stdout, "latency p50 %s p99 %s p99.9 %s max %s; acquire p99 %s",
		fmtDur(Q(res.Latency, 50)), fmtDur(Q(res.Latency, 99)), fmtDur(Q(res.Latency, 99.9)),
		fmtDur(time.Duration(res.Latency.Max())), fmtDur(Q(res.Acquire, 99)))
	if l.Rate > 0 {
		fmt.Fprintf(stdout, "; generator lag p99 %s, %d overruns", fmtDur(Q(res.SendLag, 99)), res.Overruns)
	}
	if res.Reconnects > 0 {
		fmt.Fprintf(stdout, "; %d reconnects (%d after E unavailable), %d requests lost, longest outage %s",
			res.Reconnects, res.Unavailable, res.Lost, fmtDur(res.Outage))
	}
	fmt.Fprintln(stdout)
	return nil
}

// startCPUProfile profiles this process into path ("": does nothing) until
// the returned function is called.
func startCPUProfile(path string) (func(), error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}
