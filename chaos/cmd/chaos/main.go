// Command chaos runs ticketd's fault campaign: it starts ticketd (single
// mode, and a 3-node cluster when the binary has cluster mode), drives
// workloads from many connections, injects faults on a seeded schedule,
// checks the recorded history, and writes a Markdown report and a PNG
// timeline per campaign. It exits 1 if any check finds a violation or
// cannot decide.
//
//	chaos                  # the long campaign, both modes (about 10 minutes)
//	chaos -quick           # about a minute per mode
//	chaos -mode single -duration 2m -seed 7
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/ticketd/ticketd/chaos"
	"github.com/ticketd/ticketd/internal/serverproc"
)

func main() {
	mode := flag.String("mode", "both", "single, cluster, or both")
	quick := flag.Bool("quick", false, "about a minute per mode, every nemesis mixed")
	duration := flag.Duration("duration", 0, "time under faults per mode (default: 50s quick; 4m single, 6m cluster)")
	seed := flag.Uint64("seed", 0, "seed of the schedule and the workload (0: from the time)")
	out := flag.String("out", "chaos/results", "directory for the reports, timelines and histories")
	bin := flag.String("bin", "", "ticketd binary (default: build ./cmd/ticketd)")
	netns := flag.Bool("netns", true, "cluster: run each node in its own network namespace, for partitions (needs root)")
	requireNetns := flag.Bool("require-netns", false, "cluster: fail if the partitions cannot run (no root, no ip netns) instead of running without them")
	nemeses := flag.String("nemeses", "", "comma-separated nemeses (default: every one the mode allows)")
	recheck := flag.String("recheck", "", "check a recorded history (NAME.history.jsonl.gz) again and rewrite its report in -out; no servers (-mode, -seed, -duration describe it if the file does not)")
	flag.Parse()
	if *recheck != "" {
		os.Exit(recheckFile(os.Stdout, *recheck, chaos.Config{Mode: *mode, Out: *out, Seed: *seed, Duration: *duration}))
	}
	os.Exit(run(*mode, *quick, *duration, *seed, *out, *bin, *netns, *requireNetns, *nemeses))
}

func run(mode string, quick bool, duration time.Duration, seed uint64, out, bin string, netns, requireNetns bool, nemeses string) int {
	if seed == 0 {
		seed = uint64(time.Now().UnixNano() % 1_000_000)
	}
	if bin == "" {
		dir, err := os.MkdirTemp("", "chaos-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		defer os.RemoveAll(dir)
		root, err := serverproc.ModuleRoot()
		if err == nil {
			bin, err = serverproc.Build(context.Background(), root, "./cmd/ticketd", dir)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "build ticketd:", err)
			return 2
		}
	}
	var modes []string
	switch mode {
	case "both":
		modes = []string{"single", "cluster"}
	case "single", "cluster":
		modes = []string{mode}
	default:
		fmt.Fprintf(os.Stderr, "-mode %q: want single, cluster or both\n", mode)
		return 2
	}
	var nems []string
	if nemeses != "" {
		nems = strings.Split(nemeses, ",")
	}
	failed := false
	var summary, again []string
	for _, m := range modes {
		if m == "cluster" && !serverproc.SupportsCluster(bin) {
			msg := "cluster campaign SKIPPED: " + bin + " has no cluster mode (no --peers flag)"
			fmt.Println(msg)
			summary = append(summary, msg)
			continue
		}
		cfg := chaos.Config{Mode: m, Bin: bin, Seed: seed, Out: out, Netns: netns, RequireNetns: requireNetns, Nemeses: nems, Progress: os.Stdout, Duration: duration}
		if quick {
			cfg.Name = m + "-quick"
			if cfg.Duration == 0 {
				cfg.Duration = 50 * time.Second
			}
			cfg.GapMin, cfg.GapMax = 1500*time.Millisecond, 3*time.Second
		} else {
			cfg.Name = m
			cfg.Phased = true
			if cfg.Duration == 0 {
				cfg.Duration = 4 * time.Minute
				if m == "cluster" {
					cfg.Duration = 6 * time.Minute
				}
			}
			cfg.GapMin, cfg.GapMax = 2*time.Second, 5*time.Second
		}
		fmt.Printf("== %s: %s mode, %v under faults, seed %d\n", cfg.Name, m, cfg.Duration, seed)
		o, err := chaos.Run(cfg)
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", cfg.Name, err)
			failed = true
		}
		if o == nil || o.Check == nil {
			summary = append(summary, fmt.Sprintf("%s: could not run: %v", cfg.Name, err))
			continue
		}
		line := fmt.Sprintf("%s: seed %d, %d operations, %d faults, %d violations, %d undecided, %d problems; report %s",
			cfg.Name, seed, len(o.History.Ops), len(o.History.Events), len(o.Check.Violations), len(o.Check.Undecided), len(o.Problems), o.Report)
		if o.Failed() {
			// A CI log keeps only its tail, and the report stays on that
			// machine: the schedule and the seed come last, to run it again.
			a := fmt.Sprintf("%s failed; its faults:", cfg.Name)
			for _, e := range o.History.Events {
				a += fmt.Sprintf("\n  %v..%v %s: %s", time.Duration(e.Start).Round(time.Millisecond), time.Duration(e.End).Round(time.Millisecond), e.Kind, e.Detail)
			}
			flags := ""
			if quick {
				flags = " -quick"
			}
			if nemeses != "" {
				flags += " -nemeses " + nemeses
			}
			again = append(again, a+fmt.Sprintf("\n  again: chaos%s -mode %s -seed %d -duration %v", flags, m, seed, cfg.Duration))
		}
		if err != nil {
			line += "\n  ERROR writing the results: " + err.Error()
		}
		for _, s := range o.Skipped {
			line += "\n  skipped: " + s
		}
		for _, p := range o.Problems {
			line += "\n  PROBLEM: " + p
		}
		for i, v := range o.Check.Violations {
			if i == 10 {
				line += fmt.Sprintf("\n  ... %d more in the report", len(o.Check.Violations)-10)
				break
			}
			line += "\n  VIOLATION " + v.String()
		}
		for _, u := range o.Check.Undecided {
			line += "\n  NOT DECIDED " + u.String()
		}
		if o.Failed() {
			failed = true
		}
		fmt.Println(line)
		summary = append(summary, line)
	}
	fmt.Println("== summary")
	for _, s := range summary {
		fmt.Println(s)
	}
	for _, a := range again {
		fmt.Println(a)
	}
	if failed {
		fmt.Println("FAILED")
		return 1
	}
	fmt.Println("ok: no violation")
	return 0
}

// recheckFile checks a recorded history again and prints what it found to
// w, even when its report could not be written. It returns the exit code:
// 1 for a violation or an undecided check, 2 if it could not do its work.
func recheckFile(w io.Writer, path string, cfg chaos.Config) int {
	name := strings.TrimSuffix(filepath.Base(path), ".history.jsonl.gz")
	cfg.Name = name
	o, err := chaos.Recheck(path, cfg)
	if o == nil || o.Check == nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	for _, v := range o.Check.Violations {
		fmt.Fprintln(w, "VIOLATION "+v.String())
	}
	for _, u := range o.Check.Undecided {
		fmt.Fprintln(w, "NOT DECIDED "+u.String())
	}
	fmt.Fprintf(w, "%s: %d operations, %d violations, %d undecided; report %s\n", name, len(o.History.Ops), len(o.Check.Violations), len(o.Check.Undecided), o.Report)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	switch {
	case o.Check.Failed():
		return 1
	case err != nil:
		return 2
	}
	return 0
}
