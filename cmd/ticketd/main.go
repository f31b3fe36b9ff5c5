// Command ticketd is the ticketd lock server.
//
// With no flags it serves single mode on 127.0.0.1:7411 with its state in
// ./ticketd-data. See the README for the protocol and the flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"syscall"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/ticketd/ticketd/codec"
	"github.com/ticketd/ticketd/netloop"
	"github.com/ticketd/ticketd/shard"
	"github.com/ticketd/ticketd/single"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = ""

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

func run(args []string, stderr io.Writer) int {
	cfg, err := parseConfig(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "ticketd: %v\n", err)
		return 2
	}
	if cfg.version {
		fmt.Fprintf(os.Stdout, "ticketd %s\n", buildVersion())
		return 0
	}
	setProcs(cfg)
	log := newLogger(cfg, stderr)
	defer func() { _ = log.Sync() }()
	if err := serve(cfg, log); err != nil {
		// Through the logger only, so that --log-format json holds for
		// every line.
		log.Error("ticketd stopped", zap.Error(err))
		return 1
	}
	return 0
}

// setProcs picks the event loops and the Go scheduler's Ps unless flags or
// the environment did.
//
// Single mode: half the cores, at least one loop, and as many Ps as loops.
// A loop does its own reads and writes, so the kernel's network stack and
// (often) the clients need the rest; more runnable threads than cores leave
// a woken loop waiting a scheduler tick for a core. On 2 cores shared with
// the load generator, one loop on one P halved the p99 at depths 1 and 16
// against two loops on four Ps, for the same pairs/s at depth 64
// (bench/results/before/ against bench.md; `make bench`'s steadiness
// section runs both set-ups). A host of its own with remote clients may get
// more throughput from --loops equal to the cores.
//
// Cluster mode keeps one loop per core and twice the cores in Ps: the raft
// goroutines (steps, log fsync, transport) need Ps of their own while a
// loop sits in epoll_wait holding its thread.
func setProcs(cfg *config) {
	env := os.Getenv("GOMAXPROCS") != ""
	if cfg.cluster.enabled() {
		if !env {
			runtime.GOMAXPROCS(2 * runtime.NumCPU())
		}
		return
	}
	if cfg.loops == 0 {
		cfg.loops = max(1, runtime.GOMAXPROCS(0)/2)
	}
	if !env {
		runtime.GOMAXPROCS(cfg.loops)
	}
}

// backend is a mode as the binary sees it: the network side's Backend
// plus its life cycle and figures.
type backend interface {
	netloop.Backend
	backendStopper
	Attach(srv *netloop.Server)
	Failed() <-chan struct{}
	Stats() shard.Stats
}

// absDir is dir made absolute for the log ("" and errors: dir as given).
func absDir(dir string) string {
	if a, err := filepath.Abs(dir); err == nil {
		return a
	}
	return dir
}

func serve(cfg *config, log *zap.Logger) error {
	// First of all: a SIGTERM that came while the data dir is open, with
	// the default action, would end the process after the open took a
	// clean shutdown's snapshot in and before anything wrote it back, and
	// the next start would be a crash restart, its held keys forgotten.
	// Caught, it waits for the start to finish, then shuts down cleanly.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sig)
	// SIGHUP's default action ends the process at once, a crash to the
	// next start (a closed terminal, an operator's habitual "reload").
	// ticketd reloads nothing: it says so and goes on.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for range hup {
			log.Warn("SIGHUP ignored: ticketd reloads nothing; SIGTERM stops it cleanly")
		}
	}()
	adm, err := startAdmin(cfg, log)
	if err != nil {
		return err
	}
	// Before the data dir is opened: opening it takes a clean shutdown's
	// snapshot in, and a start that then fails on a busy port or a typo
	// would leave the next one a crash restart, its held locks forgotten.
	// Connections that arrive until Serve wait in the backlog.
	ln, err := net.Listen("tcp", cfg.listen)
	if err != nil {
		adm.stop(context.Background())
		return fmt.Errorf("cannot listen on --listen %s: %w", cfg.listen, err)
	}
	var runner backend
	if cfg.cluster.enabled() {
		runner, err = openCluster(cfg, log, adm)
	} else {
		runner, err = openSingle(cfg, log, adm)
	}
	if err != nil {
		_ = ln.Close()
		adm.stop(context.Background())
		return err
	}

	// Loops keep their threads in single mode, where it was measured (the
	// depth-1 p99). In cluster mode the raft log's fsync makes the tail.
	lockThreads := !cfg.cluster.enabled()
	// gnet's own logs from warn up; zap refuses (on stderr, in no format)
	// to "increase" a level that is already higher.
	gnetLog := log.Named("gnet")
	if cfg.level < zapcore.WarnLevel {
		gnetLog = gnetLog.WithOptions(zap.IncreaseLevel(zapcore.WarnLevel))
	}
	srv, err := netloop.New(netloop.Config{
		Backend:      runner,
		Limits:       codec.Limits{MaxLeaseMs: ms(cfg.maxLease), MaxWaitMs: ms(cfg.maxWait)},
		MaxConns:     cfg.maxConns,
		MaxInflight:  cfg.maxInflight,
		SendBuffer:   cfg.sendBuffer,
		Loops:        cfg.loops,
		LockThreads:  lockThreads,
		Logger:       gnetLog,
		Latency:      adm.latency(),
		IdleTimeout:  cfg.idleTimeout,
		FrameTimeout: cfg.frameTimeout,
	})
	if err != nil {
		_ = ln.Close()
		saveAfterFailedStart(cfg, runner, log)
		return err
	}
	runner.Attach(srv)
	if err := srv.Serve(ln); err != nil {
		saveAfterFailedStart(cfg, runner, log)
		return err
	}
	adm.ready(srv, runner)
	mode := zap.String("mode", "single")
	if cfg.cluster.enabled() {
		mode = zap.String("mode", fmt.Sprintf("cluster, node %d, %d nodes", cfg.cluster.nodeID, len(cfg.cluster.peers)))
	}
	log.Info("listening",
		zap.String("addr", ln.Addr().String()),
		mode,
		zap.String("data_dir", cfg.dataDir),
		zap.Int("shards", cfg.shards),
		zap.Int("max_conns", cfg.maxConns),
		zap.Int("loops", srv.Loops()),
		zap.Int("gomaxprocs", runtime.GOMAXPROCS(0)),
		zap.String("version", buildVersion()))

	stopDisk := make(chan struct{})
	defer close(stopDisk)
	disk := &diskWatch{dir: cfg.dataDir, cluster: cfg.cluster.enabled(), log: log, free: freeSpace}
	every := 30 * time.Second
	if disk.cluster {
		disk.low, every = make(chan struct{}), diskCheckCluster
	}
	go disk.run(every, stopDisk)

	var failed bool
	var stopErr error // a clean stop that still ends in exit status 1
	select {
	case s := <-sig:
		log.Info("shutting down", zap.String("signal", s.String()))
	case <-disk.low:
		stopErr = lowDiskError(cfg.dataDir, disk.lowFree, disk.lowTotal)
		log.Error("shutting down: the data dir's filesystem has less free space than a cluster node keeps in reserve",
			zap.Uint64("free_bytes", disk.lowFree), zap.Uint64("reserve_bytes", diskReserve(disk.lowTotal)))
	case <-runner.Failed():
		failed = true // the runner logged why
	}
	adm.unready()
	// Still caught: a second Ctrl-C or SIGTERM (an impatient operator, a
	// supervisor that signals twice) must not end the process before the
	// snapshot is written. The shutdown is bounded by --shutdown-timeout;
	// SIGKILL remains for whoever cannot wait.
	go func() {
		for s := range sig {
			log.Warn("already shutting down; the process exits once the shutdown is done (at most --shutdown-timeout)",
				zap.String("signal", s.String()), zap.Duration("shutdown_timeout", cfg.shutdownTimeout))
		}
	}()

	// Everything below is bounded: a process that cannot finish its
	// shutdown in time exits 1, and the next start recovers as after a
	// crash, which is safe.
	ctx, cancel := context.WithTimeout(context.Background(), cfg.shutdownTimeout)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		if failed {
			done <- abort(ctx, srv, runner, adm, log)
		} else {
			done <- shutdown(ctx, srv, runner, adm, log)
		}
	}()
	select {
	case err := <-done:
		if err != nil {
			return err
		}
	case <-time.After(cfg.shutdownTimeout + time.Second):
		if cfg.cluster.enabled() {
			return fmt.Errorf("shutdown did not finish within --shutdown-timeout %v; exiting (the raft log keeps what was committed)", cfg.shutdownTimeout)
		}
		return fmt.Errorf("shutdown did not finish within --shutdown-timeout %v; exiting without a snapshot (the next start recovers as after a crash)", cfg.shutdownTimeout)
	}
	log.Info("stopped cleanly")
	return stopErr
}

// saveAfterFailedStart ends a start that failed after the data dir was
// opened as a clean shutdown would, so that the keys it took in from the
// last one's snapshot are in the next start too.
func saveAfterFailedStart(cfg *config, runner backend, log *zap.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), cfg.shutdownTimeout)
	defer cancel()
	if err := runner.Shutdown(ctx); err != nil {
		log.Warn("could not save the lock table after the failed start (the next start recovers as after a crash)", zap.Error(err))
	}
}

// openSingle opens single mode's runner and says what the last run left.
func openSingle(cfg *config, log *zap.Logger, adm *admin) (backend, error) {
	var offset time.Duration
	if f := cfg.cluster.clockOffsetFile; f != "" {
		var err error
		if offset, err = readClockOffset(f); err != nil {
			return nil, err
		}
		log.Warn("the wall clock is offset from a file, for this run: for tests only", zap.String("file", f), zap.Duration("offset", offset))
	}
	runner, err := single.Open(single.Options{
		DataDir:          cfg.dataDir,
		Shards:           cfg.shards,
		MaxKeys:          cfg.maxKeys,
		MaxWaitersPerKey: cfg.maxWaitersPerKey,
		MaxWaiters:       cfg.maxWaiters,
		SweepInterval:    cfg.sweepInterval,
		Logger:           log,
		SweepObserver:    adm.sweeps(),
		MaxLease:         cfg.maxLease,
		RecoverDamaged:   cfg.recoverDamaged,
		StallTimeout:     cfg.cluster.unavailableTimeout,
		WallOffset:       offset,
	})
	if err != nil {
		if errors.Is(err, single.ErrDamaged) {
			err = fmt.Errorf("%w. Starting on it could grant a lock that is still held or repeat a token; nothing was written to it. "+
				"Start once with --recover-damaged-data-dir (and --max-lease at least as long as any earlier run's): "+
				"the damaged files are set aside, no key is granted for --max-lease plus 2s, and tokens restart above the current time in unix nanoseconds. "+
				"Do not put back an older copy of the data dir instead: its ceilings are behind this run's, so it would repeat tokens and grant held locks", err)
		}
		return nil, err
	}
	if runner.StateWrites > 0 {
		// Nothing in a data dir put back from an older copy tells it: its
		// write count, against the last run's log, does.
		fields := []zap.Field{zap.String("data_dir", cfg.dataDir), zap.Uint64("writes", runner.StateWrites)}
		if runner.StateWritten != 0 {
			fields = append(fields, zap.Time("last_written", time.Unix(0, runner.StateWritten)))
		}
		log.Info("data dir state found", fields...)
	}
	switch {
	case runner.Recovered != nil:
		log.Warn("recovered a damaged data dir",
			zap.Strings("damage", runner.Recovered),
			zap.Strings("set_aside", runner.SetAside),
			zap.Uint64("tokens_above", runner.TokenFloor),
			zap.Time("no_grants_before", time.Unix(0, runner.GraceUntil)))
	case runner.StaleSnapshot != "":
		log.Warn("found a snapshot that is not the last run's and removed it: restarting as after a crash",
			zap.String("why", runner.StaleSnapshot),
			zap.Uint64("tokens_above", runner.TokenFloor),
			zap.Time("no_grants_before", time.Unix(0, runner.GraceUntil)))
	case runner.Crashed:
		log.Warn("last run did not shut down cleanly",
			zap.Uint64("tokens_above", runner.TokenFloor),
			zap.Time("no_grants_before", time.Unix(0, runner.GraceUntil)))
	case runner.Clean && runner.GraceUntil != 0:
		// A crash's grace that was still running goes on: every key not
		// restored is answered as held until then.
		log.Warn("restored locks from clean shutdown, within an earlier crash's grace", zap.Int("keys", runner.Restored),
			zap.Duration("leases_moved_later_by", runner.Shifted),
			zap.Time("no_grants_before", time.Unix(0, runner.GraceUntil)))
	case runner.Clean:
		log.Info("restored locks from clean shutdown", zap.Int("keys", runner.Restored),
			zap.Duration("leases_moved_later_by", runner.Shifted))
	case runner.NewDir == "made":
		// Said, and loud, so that a typo in --data-dir, or a relative one
		// read from another working directory, shows: the server then
		// starts with no locks and tokens from 1, as on its first start.
		log.Warn("new data dir: made it; no locks or tokens of an earlier run", zap.String("data_dir", absDir(cfg.dataDir)))
	case runner.NewDir == "empty":
		log.Warn("new data dir: it was empty; no locks or tokens of an earlier run (if this server ran before, its data dir is elsewhere: a disk that did not mount?)",
			zap.String("data_dir", cfg.dataDir))
	}
	if left := runner.GraceLeft(); left > 0 {
		// Ready all along (it answers, T), the server grants no free key
		// until then: said when it ends, so that an operator reading why
		// acquires were refused finds when they stopped being.
		from := time.Now()
		time.AfterFunc(left, func() {
			log.Info("crash grace over: keys nobody holds are granted again", zap.Duration("lasted_since_start", time.Since(from).Round(time.Millisecond)))
		})
	}
	return runner, nil
}

// netStopper and backendStopper are what the shutdown needs of the network
// side and the runner.
type netStopper interface {
	StopAccepting()
	Stop(ctx context.Context) error
}

type backendStopper interface {
	Quiesce()
	Shutdown(ctx context.Context) error
	Close() error
	Err() error
}

type adminStopper interface{ stop(ctx context.Context) }

// shutdown is the clean path, in the order that makes the snapshot final:
// no new connections; no request applied and every queued acquire answered
// T; the network side writes what mailboxes hold and closes every
// connection, releasing grants that could not be delivered; only then the
// snapshot.
func shutdown(ctx context.Context, srv netStopper, r backendStopper, adm adminStopper, log *zap.Logger) error {
	srv.StopAccepting()
	r.Quiesce()
	stopNet(ctx, srv, log)
	adm.stop(ctx)
	if err := r.Shutdown(ctx); err != nil {
		return fmt.Errorf("saving the lock table: %w (the next start recovers as after a crash)", err)
	}
	return nil
}

// abort is the path after a failed durable write: waiters get T, answers
// already decided are written, and the process exits without a snapshot.
func abort(ctx context.Context, srv netStopper, r backendStopper, adm adminStopper, log *zap.Logger) error {
	srv.StopAccepting()
	r.Quiesce()
	stopNet(ctx, srv, log)
	adm.stop(ctx)
	_ = r.Close()
	return r.Err()
}

// stopNet gives the network side at most half of what is left, so that
// the snapshot has time too.
func stopNet(ctx context.Context, srv netStopper, log *zap.Logger) {
	nctx := ctx
	if dl, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		nctx, cancel = context.WithDeadline(ctx, dl.Add(-time.Until(dl)/2))
		defer cancel()
	}
	if err := srv.Stop(nctx); err != nil {
		log.Warn("stopping the event loops", zap.Error(err))
	}
}

func newLogger(cfg *config, w io.Writer) *zap.Logger {
	ec := zap.NewProductionEncoderConfig()
	ec.EncodeTime = zapcore.ISO8601TimeEncoder
	var enc zapcore.Encoder
	if cfg.logFormat == "json" {
		enc = zapcore.NewJSONEncoder(ec)
	} else {
		ec.EncodeLevel = zapcore.CapitalLevelEncoder
		enc = zapcore.NewConsoleEncoder(ec)
	}
	return zap.New(zapcore.NewCore(enc, zapcore.Lock(zapcore.AddSync(w)), cfg.level))
}

func buildVersion() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				return "dev-" + s.Value[:12]
			}
		}
		if bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			return bi.Main.Version
		}
	}
	return "dev"
}
