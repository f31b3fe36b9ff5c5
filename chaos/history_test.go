package chaos

import (
	"bytes"
	"compress/gzip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// What a history records survives writing and reading: the times of E
// unavailable, when outcomes became unknown, when a killed process died.
func TestHistoryRoundTrip(t *testing.T) {
	h := &History{
		Events:  []*Event{{Start: 1, Killed: 2, End: 3, Kind: EvCrash, Nodes: []int{1}}},
		Unavail: []int64{5, 8},
		Ops:     []*Op{{ID: 1, Kind: 'A', Key: "k", LeaseMs: 100, Invoke: 4, Complete: -1, Result: ResUnknown, Why: "E unavailable", LostAt: 8}},
	}
	var buf bytes.Buffer
	if err := h.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	got, _, err := ReadHistory(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Unavail) != 2 || got.Unavail[0] != 5 || got.Unavail[1] != 8 {
		t.Errorf("unavailable times: got %v", got.Unavail)
	}
	if len(got.Events) != 1 || got.Events[0].Killed != 2 {
		t.Errorf("events: got %+v", got.Events)
	}
	if len(got.Ops) != 1 || got.Ops[0].LostAt != 8 {
		t.Errorf("ops: got %+v", got.Ops)
	}
}

// Lose records when the outcome became unknown, once.
func TestLoseRecordsWhen(t *testing.T) {
	h := NewHistory()
	op := h.Invoke(&Op{Kind: 'A', Key: "k"})
	time.Sleep(time.Millisecond)
	h.Lose(op, "connection lost")
	first := op.LostAt
	if first <= op.Invoke {
		t.Fatalf("LostAt %d not after Invoke %d", first, op.Invoke)
	}
	h.Lose(op, "again")
	if op.LostAt != first || op.Why != "connection lost" {
		t.Fatalf("a second loss moved LostAt or Why: %d %q", op.LostAt, op.Why)
	}
}

// The history is on disk before the check starts, so a check that hangs or
// is killed still leaves it.
func TestRecordWritesHistoryFirst(t *testing.T) {
	dir := t.TempDir()
	b := newHist()
	b.acq(1, "k", 100, 0, 1, ResGranted, 1)
	out := &Outcome{Config: Config{Name: "first", Mode: "single", Out: dir, Workers: DefaultWorkers()}, History: b.h, Shards: campaignShards}
	seen := false
	check := func(h *History, cfg CheckConfig) *CheckResult {
		f, err := os.Open(filepath.Join(dir, "first.history.jsonl.gz"))
		if err != nil {
			t.Errorf("no history while checking: %v", err)
			return Check(h, cfg)
		}
		defer f.Close()
		zr, err := gzip.NewReader(f)
		if err != nil {
			t.Errorf("history not readable while checking: %v", err)
			return Check(h, cfg)
		}
		rh, _, err := ReadHistory(zr)
		seen = err == nil && len(rh.Ops) == 1
		return Check(h, cfg)
	}
	if err := record(out, check, func(string, ...any) {}); err != nil {
		t.Fatal(err)
	}
	if !seen {
		t.Fatal("the history was not complete on disk while checking")
	}
}

// Recheck writes its report where it is told now, not in the directory the
// campaign's saved config names.
func TestRecheckKeepsOut(t *testing.T) {
	then, now := t.TempDir(), t.TempDir()
	b := newHist()
	b.acq(1, "k", 100, 0, 1, ResGranted, 1)
	cfg := Config{Name: "again", Mode: "single", Out: then, Workers: DefaultWorkers(), Duration: time.Minute}
	path := filepath.Join(then, "again.history.jsonl.gz")
	if err := writeHistory(path, b.h, &cfg); err != nil {
		t.Fatal(err)
	}
	o, err := Recheck(path, Config{Name: "again", Mode: "single", Out: now})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(o.Report, now+string(filepath.Separator)) {
		t.Fatalf("report written to %q, not in %q", o.Report, now)
	}
	if _, err := os.Stat(filepath.Join(then, "again.md")); err == nil {
		t.Fatal("report written in the saved directory")
	}
}
