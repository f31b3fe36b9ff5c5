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
	"runtime"
	"runtime/debug"
	"syscall"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/ticketd/ticketd/codec"
	"github.com/ticketd/ticketd/netloop"
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
	if os.Getenv("GOMAXPROCS") == "" {
		// Each event loop blocks in epoll_wait holding an OS thread; with
		// spare Ps a loop that wakes runs at once instead of waiting for a P
		// behind the other loops (measured: +10-35% pairs/s at pipeline depths
		// 1 to 64 on 2 cores, same p99).
		runtime.GOMAXPROCS(2 * runtime.NumCPU())
	}
	log := newLogger(cfg, stderr)
	defer func() { _ = log.Sync() }()
	if err := serve(cfg, log); err != nil {
		log.Error("ticketd stopped", zap.Error(err))
		fmt.Fprintf(stderr, "ticketd: %v\n", err)
		return 1
	}
	return 0
}

func serve(cfg *config, log *zap.Logger) error {
	adm, err := startAdmin(cfg, log)
	if err != nil {
		return err
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
	})
	if err != nil {
		adm.stop(context.Background())
		return err
	}
	switch {
	case runner.Crashed:
		log.Warn("last run did not shut down cleanly",
			zap.Uint64("tokens_above", runner.TokenFloor),
			zap.Time("no_grants_before", time.Unix(0, runner.GraceUntil)))
	case runner.Restored > 0:
		log.Info("restored locks from clean shutdown", zap.Int("keys", runner.Restored))
	}

	ln, err := net.Listen("tcp", cfg.listen)
	if err != nil {
		_ = runner.Close()
		adm.stop(context.Background())
		return fmt.Errorf("cannot listen on --listen %s: %w", cfg.listen, err)
	}
	srv, err := netloop.New(netloop.Config{
		Backend:     runner,
		Limits:      codec.Limits{MaxLeaseMs: ms(cfg.maxLease), MaxWaitMs: ms(cfg.maxWait)},
		MaxConns:    cfg.maxConns,
		MaxInflight: cfg.maxInflight,
		Loops:       cfg.loops,
		Logger:      log.Named("gnet").WithOptions(zap.IncreaseLevel(zapcore.WarnLevel)),
		Latency:     adm.latency(),
	})
	if err != nil {
		_ = ln.Close()
		_ = runner.Close()
		return err
	}
	// Before "listening": a signal sent as soon as that line appears must
	// find the handler in place and shut down cleanly.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	runner.Attach(srv)
	if err := srv.Serve(ln); err != nil {
		_ = runner.Close()
		return err
	}
	adm.ready(srv, runner)
	log.Info("listening",
		zap.String("addr", ln.Addr().String()),
		zap.String("data_dir", cfg.dataDir),
		zap.Int("shards", cfg.shards),
		zap.Int("max_conns", cfg.maxConns),
		zap.String("version", buildVersion()))

	s := <-sig
	log.Info("shutting down", zap.String("signal", s.String()))
	signal.Stop(sig)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	srv.StopAccepting()
	serr := runner.Shutdown(ctx)
	if err := srv.Stop(ctx); err != nil {
		log.Warn("stopping the event loops", zap.Error(err))
	}
	adm.stop(ctx)
	if serr != nil {
		return fmt.Errorf("saving the lock table: %w", serr)
	}
	log.Info("stopped cleanly")
	return nil
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
