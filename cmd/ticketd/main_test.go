package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
)

// steps records the calls a shutdown makes, in order.
type steps []string

type fakeNet struct{ s *steps }

func (f fakeNet) StopAccepting()             { *f.s = append(*f.s, "stop accepting") }
func (f fakeNet) Stop(context.Context) error { *f.s = append(*f.s, "close connections"); return nil }

type fakeRunner struct{ s *steps }

func (f fakeRunner) Quiesce()                       { *f.s = append(*f.s, "quiesce") }
func (f fakeRunner) Shutdown(context.Context) error { *f.s = append(*f.s, "snapshot"); return nil }
func (f fakeRunner) Close() error                   { *f.s = append(*f.s, "close"); return nil }
func (f fakeRunner) Err() error                     { return nil }
func (f fakeRunner) Orphaned(uint64, []byte)        {}
func (fakeAdmin) stop(context.Context)              {}

type fakeAdmin struct{}

// The snapshot is taken after the connections are closed: closing them is
// what releases grants that could not be delivered, so the snapshot holds
// only grants someone received. Waiters are answered before that.
func TestShutdownOrder(t *testing.T) {
	var s steps
	if err := shutdown(t.Context(), fakeNet{&s}, fakeRunner{&s}, fakeAdmin{}, zap.NewNop()); err != nil {
		t.Fatal(err)
	}
	want := steps{"stop accepting", "quiesce", "close connections", "snapshot"}
	if !slices.Equal(s, want) {
		t.Fatalf("shutdown order %q, want %q", s, want)
	}
	s = nil
	_ = abort(t.Context(), fakeNet{&s}, fakeRunner{&s}, fakeAdmin{}, zap.NewNop())
	if want := (steps{"stop accepting", "quiesce", "close connections", "close"}); !slices.Equal(s, want) {
		t.Fatalf("abort order %q, want %q", s, want)
	}
}

// Values the protocol cannot express are refused, never reinterpreted:
// below a millisecond (0 would reach the codec as "no limit"), fractions of
// one, and leases beyond the cap.
func TestDurationFlags(t *testing.T) {
	bad := []struct{ flag, value string }{
		{"max-wait", "0"},
		{"max-wait", "0s"},
		{"max-wait", "500us"},
		{"max-wait", "1500us"},
		{"max-lease", "999us"},
		{"max-lease", "1500us"},
		{"max-lease", "2562047h"},
		{"max-lease", "721h"},
		{"shutdown-timeout", "0s"},
		{"shutdown-timeout", "1ms"}, // every stop a crash restart
		{"sweep-interval", "1ns"},   // an idle server kept busy
		{"send-buffer", "-1"},
		{"unavailable-timeout", "50ms"}, // both modes: /readyz's stall timeout
		// Cluster mode's flags, in single mode: a skew that does not
		// apply would pass a test without testing anything.
		{"max-clock-skew", "1s"},
		{"node-id", "1"},
		{"raft-snapshot-entries", "100"},
		{"raft-rtt", "10ms"},
		{"max-queued", "1000"},
	}
	for _, tc := range bad {
		_, err := parseConfig([]string{"--" + tc.flag, tc.value}, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.flag) {
			t.Errorf("--%s %s: %v; want an error naming the flag", tc.flag, tc.value, err)
		}
	}
	if _, err := parseConfig([]string{"--bootstrap"}, io.Discard); err == nil || !strings.Contains(err.Error(), "bootstrap") {
		t.Errorf("--bootstrap in single mode: %v; want an error naming it", err)
	}
	if _, err := parseConfig([]string{"--peers", "1=127.0.0.1:1,2=127.0.0.1:2,3=127.0.0.1:3", "--node-id", "1", "--bootstrap", "--join"}, io.Discard); err == nil ||
		!strings.Contains(err.Error(), "bootstrap") {
		t.Errorf("--bootstrap --join: %v; want an error naming --bootstrap", err)
	}
	peers := []string{"--peers", "1=127.0.0.1:1,2=127.0.0.1:2,3=127.0.0.1:3", "--node-id", "1", "--bootstrap"}
	if _, err := parseConfig(append(peers, "--raft-rtt", "1500us"), io.Discard); err == nil || !strings.Contains(err.Error(), "raft-rtt") {
		t.Errorf("--raft-rtt 1500us: %v; want an error naming it (Dragonboat counts whole ms)", err)
	}
	if _, err := parseConfig([]string{"--listen", "127.0.0.1:7411", "--admin", "127.0.0.1:7411"}, io.Discard); err == nil || !strings.Contains(err.Error(), "--listen's address too") {
		t.Errorf("--admin at --listen's address: %v; want an error saying so (the second bind failed with 'address already in use')", err)
	}
	for _, port := range []string{"0", ""} {
		a := "127.0.0.1:" + port
		if _, err := parseConfig([]string{"--listen", a, "--admin", a}, io.Discard); err != nil {
			t.Errorf("--listen and --admin both at %q (two ports the kernel picks): %v", a, err)
		}
	}
	for _, v := range []string{"1s", "1ms"} { // 1ms: told the flag is not the mode's, not only the minimum
		if _, err := parseConfig(append(peers, "--sweep-interval", v), io.Discard); err == nil || !strings.Contains(err.Error(), "is for single mode") {
			t.Errorf("--sweep-interval %s in cluster mode: %v; want an error saying it is for single mode (a cluster has no sweep)", v, err)
		}
	}
	for _, args := range [][]string{
		{"--peers", ""}, // single mode, asked for by name
		{"--max-lease", "720h"},
		{"--max-lease", "1ms", "--max-wait", "1ms"},
		{"--max-wait", "2562047h"},
		{"--unavailable-timeout", "2s"}, // single mode's /readyz on a stalled disk
	} {
		c, err := parseConfig(args, io.Discard)
		if err != nil {
			t.Errorf("%q: %v", args, err)
			continue
		}
		if ms(c.maxLease) == 0 || ms(c.maxWait) == 0 {
			t.Errorf("%q reaches the codec as 0 (no limit)", args)
		}
	}
	if c, err := parseConfig(nil, io.Discard); err != nil || c.shutdownTimeout != 10*time.Second || c.recoverDamaged {
		t.Errorf("defaults: %+v, %v", c, err)
	}
}

// A duration without a unit gets one line that names the unit, not the
// flag package's "parse error" followed by the whole flag list; --help
// still prints the list.
func TestBadFlagValueIsOneLine(t *testing.T) {
	var stderr strings.Builder
	_, err := parseConfig([]string{"--max-lease", "30"}, &stderr)
	if err == nil || !strings.Contains(err.Error(), "want a duration with a unit") {
		t.Fatalf("--max-lease 30: %v; want an error that asks for a unit", err)
	}
	if stderr.Len() != 0 {
		t.Fatalf("--max-lease 30 also wrote %d bytes: %q", stderr.Len(), stderr.String())
	}
	stderr.Reset()
	if _, err := parseConfig([]string{"--help"}, &stderr); !errors.Is(err, flag.ErrHelp) || !strings.Contains(stderr.String(), "-max-lease") {
		t.Fatalf("--help: %v, wrote %q; want the flag list", err, stderr.String())
	}
}

// Single mode takes the test clock's offset too, read once at its start:
// the fault campaign restarts it on a wall clock ahead.
func TestSingleModeReadsTheClockOffsetAtItsStart(t *testing.T) {
	f := filepath.Join(t.TempDir(), "clock")
	if err := os.WriteFile(f, []byte("1h\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := parseConfig([]string{"--unsafe-test-clock-offset-file", f}, io.Discard)
	if err != nil {
		t.Fatalf("single mode refused the clock offset file: %v", err)
	}
	if d, err := readClockOffset(cfg.cluster.clockOffsetFile); err != nil || d != time.Hour {
		t.Fatalf("offset %v (%v), want 1h", d, err)
	}
}
