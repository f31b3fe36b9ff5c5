package chaos

import (
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Config is one campaign.
type Config struct {
	Name     string        // report file stem, e.g. "single-quick"
	Mode     string        // "single" or "cluster"
	Bin      string        // the ticketd binary
	Duration time.Duration // time under faults (plus a few seconds of calm at the end)
	Seed     uint64
	// Nemeses to use (nil: every one that applies). With Phased, each gets
	// a phase of its own, in order, and a last phase mixes them all.
	Nemeses []string
	Phased  bool
	// Gap between the end of one fault and the start of the next.
	GapMin, GapMax time.Duration
	// Workers per role (nil: a default mix).
	Workers map[string]int
	Netns   bool // cluster: put the nodes in network namespaces (partitions)
	// RequireNetns fails the cluster campaign when its partitions cannot
	// run, rather than running it without them.
	RequireNetns bool
	Out          string // results directory ("": no files)
	// Progress receives a line every couple of seconds (nil: none).
	Progress io.Writer `json:"-"`
}

// Outcome is what a campaign found.
type Outcome struct {
	Config   Config
	History  *History
	Check    *CheckResult
	Skipped  []string // what could not run, and why
	Problems []string // harness trouble: a restart that failed, a shutdown not clean
	Started  time.Time
	Elapsed  time.Duration
	Report   string // path of the Markdown report
	Shards   int    // the servers' --shards
}

// Failed reports whether the campaign found a violation, could not decide
// a check, or could not do what it was asked.
func (o *Outcome) Failed() bool {
	return o.Check == nil || o.Check.Failed() || len(o.Problems) > 0
}

// DefaultWorkers is the workload mix: contended mutexes with fenced writes,
// many keys, waiters that time out, leases that expire.
func DefaultWorkers() map[string]int {
	return map[string]int{RoleMutex: 10, RoleManyKeys: 6, RoleWaiter: 6, RoleExpirer: 6}
}

// Run runs one campaign to its end. It starts and stops its own servers in
// a temporary directory, which it removes.
func Run(cfg Config) (*Outcome, error) {
	if cfg.Workers == nil {
		cfg.Workers = DefaultWorkers()
	}
	if cfg.GapMin == 0 {
		cfg.GapMin, cfg.GapMax = 2*time.Second, 4*time.Second
	}
	out := &Outcome{Config: cfg, Started: time.Now(), Shards: campaignShards}
	logf := func(format string, args ...any) {
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, format+"\n", args...)
		}
	}
	dir, err := os.MkdirTemp("", "ticketd-chaos-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)

	var tg *target
	switch cfg.Mode {
	case "single":
		tg, err = newSingle(cfg.Bin, dir, logf)
	case "cluster":
		var why string
		tg, why, err = newCluster(cfg.Bin, dir, cfg.Netns, cfg.RequireNetns, logf)
		if why != "" {
			out.Skipped = append(out.Skipped, why)
			logf("%s: %s", cfg.Name, why)
		}
	default:
		return nil, fmt.Errorf("unknown mode %q", cfg.Mode)
	}
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", cfg.Mode, err)
	}
	closed := false
	defer func() {
		if !closed {
			tg.close()
		}
	}()

	nems := cfg.Nemeses
	avail := NemesesFor(cfg.Mode, tg.net != nil)
	if nems == nil {
		nems = avail
	} else {
		var ok []string
		for _, n := range nems {
			if contains(avail, n) || n == NemClockUnsafe && cfg.Mode == "cluster" {
				ok = append(ok, n)
			} else {
				out.Skipped = append(out.Skipped, fmt.Sprintf("nemesis %s: not available in %s mode here", n, cfg.Mode))
			}
		}
		if len(ok) == 0 {
			// A campaign without a fault would pass and say "no violation".
			return nil, fmt.Errorf("none of the nemeses asked for can run: %s", strings.Join(out.Skipped, "; "))
		}
		nems = ok
	}

	h := NewHistory()
	out.History = h
	rng := rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15))
	reg := &registers{max: map[string]uint64{}, h: h}
	var stop atomic.Bool
	var conns atomic.Int64
	var wg sync.WaitGroup
	wid := 0
	for _, role := range []string{RoleMutex, RoleManyKeys, RoleWaiter, RoleExpirer} {
		for range cfg.Workers[role] {
			wid++
			w := &worker{id: wid, role: role, rng: rand.New(rand.NewPCG(cfg.Seed, uint64(wid))), h: h, tg: tg, reg: reg,
				stop: &stop, conns: &conns}
			wg.Go(w.run)
		}
	}

	var curMu sync.Mutex
	cur := ""
	nm := &nemesis{tg: tg, h: h, rng: rng, current: func(s string) { curMu.Lock(); cur = s; curMu.Unlock() }}
	progressDone := make(chan struct{})
	var progressWG sync.WaitGroup
	progressWG.Go(func() {
		t := time.NewTicker(2 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-progressDone:
				return
			case <-t.C:
				curMu.Lock()
				c := cur
				curMu.Unlock()
				ok, fail, unk := counts(h)
				if c == "" {
					c = "no fault"
				}
				logf("[%s %3.0fs/%v] ops ok %d, refused %d, unknown %d | %s", cfg.Name, time.Since(out.Started).Seconds(), cfg.Duration, ok, fail, unk, c)
			}
		}
	})

	// The schedule: calm first, then faults with gaps, until Duration.
	end := time.Now().Add(cfg.Duration)
	time.Sleep(2 * time.Second)
	phaseLen := cfg.Duration
	if cfg.Phased && len(nems) > 0 {
		phaseLen = cfg.Duration / time.Duration(len(nems)+1)
	}
	// Mixed faults come in shuffled rounds, so a short campaign still has
	// each of them.
	var round []string
	for len(nems) > 0 && time.Now().Before(end) {
		var next string
		if p := int(time.Since(out.Started) / phaseLen); cfg.Phased && p < len(nems) {
			next = nems[p]
		} else {
			if len(round) == 0 {
				round = slices.Clone(nems)
				rng.Shuffle(len(round), func(i, j int) { round[i], round[j] = round[j], round[i] })
			}
			next, round = round[0], round[1:]
		}
		nm.run(next)
		gap := cfg.GapMin + time.Duration(rng.Int64N(int64(cfg.GapMax-cfg.GapMin)+1))
		if time.Now().Add(gap).After(end) {
			break
		}
		time.Sleep(gap)
	}
	for time.Now().Before(end) {
		time.Sleep(100 * time.Millisecond)
	}
	nm.heal()
	if err := tg.waitReady(60 * time.Second); err != nil {
		nm.fail("at the end: %v", err)
	}
	// Calm at the end: every surviving grant and queue drains under load.
	time.Sleep(4 * time.Second)
	stop.Store(true)
	doneWorkers := make(chan struct{})
	go func() { wg.Wait(); close(doneWorkers) }()
	select {
	case <-doneWorkers:
	case <-time.After(60 * time.Second):
		nm.fail("workers did not stop within 60s of the end")
	}
	close(progressDone)
	progressWG.Wait()

	// A clean shutdown of every node must succeed.
	for _, nd := range tg.nodes {
		if err := tg.term(nd.id); err != nil {
			nm.fail("final clean shutdown: %v", err)
		}
	}
	tg.close()
	closed = true
	out.Problems = nm.errs
	out.Skipped = append(out.Skipped, nm.skipped...)
	out.Elapsed = time.Since(out.Started)
	return out, record(out, Check, logf)
}

// record writes the history, checks it and writes the report. The history
// is written first, so that a check that hangs or is killed leaves it; the
// check runs even if writing fails.
func record(out *Outcome, check func(*History, CheckConfig) *CheckResult, logf func(string, ...any)) error {
	cfg, h := out.Config, out.History
	var errs []error
	if cfg.Out != "" {
		err := os.MkdirAll(cfg.Out, 0o755)
		if err == nil {
			err = writeHistory(filepath.Join(cfg.Out, cfg.Name+".history.jsonl.gz"), h, &cfg)
		}
		errs = append(errs, err)
	}
	logf("[%s] checking %d operations...", cfg.Name, len(h.Ops))
	t0 := time.Now()
	out.Check = check(h, checkConfig(cfg.Mode, h))
	logf("[%s] checked in %v", cfg.Name, time.Since(t0).Round(time.Millisecond))
	if cfg.Out != "" {
		var err error
		out.Report, err = writeReport(cfg.Out, out)
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// checkConfig is what a campaign in mode promised; the crash grace is
// bounded by the longest lease in the history.
func checkConfig(mode string, h *History) CheckConfig {
	var maxLease uint64
	for _, o := range h.Ops {
		maxLease = max(maxLease, o.LeaseMs)
	}
	cfg := CheckConfig{Mode: mode, MaxLease: int64(maxLease) * int64(time.Millisecond), Shards: campaignShards}
	if mode == "cluster" {
		cfg.Skew = int64(clusterSkew)
		cfg.MaxLate = int64(clusterUnavailable + clusterPropose + clusterSkew)
	}
	return cfg
}

func counts(h *History) (ok, fail, unknown int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, o := range h.Ops {
		switch o.Result {
		case ResGranted, ResReleased, ResAccepted:
			ok++
		case ResUnknown:
			if o.Complete < 0 && o.Why != "" {
				unknown++
			}
		default:
			fail++
		}
	}
	return
}

func writeHistory(path string, h *History, cfg *Config) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	zw := gzip.NewWriter(f)
	if err := json.NewEncoder(zw).Encode(map[string]any{"config": cfg}); err != nil {
		f.Close()
		return err
	}
	if err := h.WriteJSON(zw); err != nil {
		f.Close()
		return err
	}
	if err := zw.Close(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// Recheck runs the checker again on a history a campaign wrote, and writes
// its report in cfg.Out. cfg fills in what the file does not say. If
// writing the report fails, the outcome comes back with the error.
func Recheck(path string, cfg Config) (*Outcome, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return nil, err
	}
	h, saved, err := ReadHistory(zr)
	if err != nil {
		return nil, err
	}
	if saved != nil {
		out := cfg.Out // where the report goes now, not where it went then
		cfg = *saved
		cfg.Out = out
	}
	if cfg.Workers == nil {
		cfg.Workers = DefaultWorkers()
	}
	if saved == nil && !strings.HasSuffix(cfg.Name, "-quick") {
		cfg.Phased = true // the long campaign's phases
	}
	out := &Outcome{Config: cfg, History: h, Shards: campaignShards}
	out.Check = Check(h, checkConfig(cfg.Mode, h))
	if cfg.Out != "" {
		if err := os.MkdirAll(cfg.Out, 0o755); err != nil {
			return out, err
		}
		if out.Report, err = writeReport(cfg.Out, out); err != nil {
			return out, err
		}
	}
	return out, nil
}
