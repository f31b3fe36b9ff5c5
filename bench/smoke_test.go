package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ticketd/ticketd/internal/serverproc"
)

// TestSmokeSuite runs every scenario for a fraction of a second against the
// real ticketd and echo server (and Redis where installed), through the same
// code as `make bench`.
func TestSmokeSuite(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts servers")
	}
	root, err := serverproc.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin := t.TempDir()
	var env Env
	env.Ticketd = os.Getenv("TICKETD_BIN") // a prebuilt server saves the build
	var wg sync.WaitGroup
	var errT, errE error
	if env.Ticketd == "" {
		wg.Go(func() { env.Ticketd, errT = serverproc.Build(ctx, root, "./cmd/ticketd", bin) })
	}
	wg.Go(func() { env.Echo, errE = serverproc.Build(ctx, root, "./bench/cmd/echo", bin) })
	wg.Wait()
	if errT != nil || errE != nil {
		t.Fatal(errors.Join(errT, errE))
	}
	if env.Redis, err = FindRedis(); err != nil {
		env.RedisMissing = err.Error()
		t.Logf("without Redis: %v", err)
	}
	env.Self = []string{os.Args[0]}
	env.SelfEnv = []string{subprocessEnv + "=1"}
	env.Out = t.TempDir()
	var log bytes.Buffer
	env.Log = &stampWriter{w: &log, t0: time.Now()}

	start := time.Now()
	rep := RunSuite(ctx, SmokePlan(), env)
	md, err := writeResults(rep, env.Out, "smoke")
	t.Logf("suite took %s", time.Since(start).Round(time.Millisecond))
	if err != nil {
		t.Error(err)
	}
	if len(rep.Errors) > 0 {
		t.Errorf("errors: %s", strings.Join(rep.Errors, "\n"))
	}
	if t.Failed() || testing.Verbose() {
		t.Logf("progress:\n%s\nreport:\n%s", log.String(), md)
	}
	if t.Failed() {
		return
	}

	systems := map[System]int{}
	for _, r := range rep.Rows {
		if r.PairsPerSec <= 0 || r.P99 <= 0 {
			t.Errorf("%s: nothing measured: %+v", r.Label, r)
		}
		systems[r.System]++
	}
	p := SmokePlan()
	perSystem := len(p.Depths) + len(p.OpenFractions)
	if systems[Ticketd] != perSystem+1 || systems[Echo] != perSystem {
		t.Errorf("runs per system %v, want %d (+1 contended for ticketd)", systems, perSystem)
	}
	if env.Redis != "" && systems[Redis] != perSystem {
		t.Errorf("Redis runs %d, want %d", systems[Redis], perSystem)
	}
	if len(rep.Scale) != 2 || rep.Scale[1].Active == nil || rep.Scale[1].Idle != p.Idle[0] {
		t.Fatalf("scale rows %+v", rep.Scale)
	}
	if rep.Scale[1].RSSAfter <= 0 || rep.ServerFDLimit <= 0 {
		t.Errorf("no memory or limit read: %+v, limit %d", rep.Scale[1], rep.ServerFDLimit)
	}
	if len(rep.IdleRounds) != p.IdleRounds {
		t.Errorf("%d interleaved idle rounds, want %d", len(rep.IdleRounds), p.IdleRounds)
	}
	st := IdleAtTicketd // the steps leave the idle connections open
	for i, x := range rep.IdleRounds {
		if x.With == nil || x.Without == nil || x.Elsewhere == nil || x.With.P99 <= 0 || x.Without.P99 <= 0 ||
			x.Elsewhere.P99 <= 0 || x.Idle != p.Idle[0] || !slices.Equal(x.Order, idleOrder(st)) {
			t.Errorf("idle round %d: %+v", i+1, x)
		} else if !strings.HasSuffix(x.Without.Label, "no idle") || !strings.HasSuffix(x.With.Label, " idle") ||
			!strings.HasSuffix(x.Elsewhere.Label, "held against another server") {
			t.Errorf("idle round %d: runs filed under the wrong states: %q, %q, %q", i+1, x.Without.Label, x.With.Label, x.Elsewhere.Label)
		}
		st = x.Order[len(x.Order)-1]
	}
	if len(rep.Targets) != 9 {
		t.Errorf("%d targets", len(rep.Targets))
	}
	for _, f := range []string{"bench-smoke.md", "bench-smoke.png", "bench-smoke.json"} {
		if _, err := os.Stat(filepath.Join(env.Out, f)); err != nil {
			t.Error(err)
		}
	}
}

// stampWriter prefixes each write with the time since t0, to see where a
// slow smoke run spends it.
type stampWriter struct {
	w  io.Writer
	t0 time.Time
}

func (s *stampWriter) Write(p []byte) (int, error) {
	fmt.Fprintf(s.w, "%6.2fs %s", time.Since(s.t0).Seconds(), p)
	return len(p), nil
}

// Binaries named by relative paths (the README's `-ticketd bin/ticketd`)
// are run by their absolute paths: the servers start in directories of
// their own, where a relative path found nothing.
func TestRelativeBinaryPathsAreMadeAbsolute(t *testing.T) {
	env, cleanup, err := prepare(context.Background(), t.TempDir(), "bin/ticketd", "bin/echo", "none", "none", false, io.Discard)
	defer cleanup()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{env.Ticketd, env.Echo} {
		if !filepath.IsAbs(p) {
			t.Errorf("binary %q kept relative", p)
		}
	}
}

// The report names the build it measured, as that build names itself.
func TestReportNamesTheTicketdItMeasured(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "ticketd")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho ticketd abc1234\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	md := newReport(QuickPlan(), Env{Ticketd: bin}).Markdown("")
	if !strings.Contains(md, "Measured: ticketd abc1234.") {
		t.Fatalf("the report does not name the build:\n%s", md[:min(len(md), 400)])
	}
}
