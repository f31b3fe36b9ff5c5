package main

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// fakeWatch is a diskWatch that reads *free and *total, logging to logs.
func fakeWatch(t *testing.T, cluster bool, free, total *uint64) (*diskWatch, *observer.ObservedLogs) {
	core, logs := observer.New(zapcore.InfoLevel)
	return &diskWatch{dir: t.TempDir(), cluster: cluster, log: zap.New(core),
		free: func(string) (uint64, uint64, error) { return *free, *total, nil }}, logs
}

func TestDiskWatchWarnsOfANearlyFullDisk(t *testing.T) {
	for _, cluster := range []bool{false, true} {
		free, total := uint64(5<<30), uint64(100<<30)
		w, logs := fakeWatch(t, cluster, &free, &total)
		now := time.Now()
		w.check(now)
		if n := logs.Len(); n != 0 {
			t.Fatalf("%d lines with 5 GiB free", n)
		}
		free = 900 << 20
		w.check(now.Add(time.Second))
		w.check(now.Add(diskWarnEvery / 2))
		warns := logs.FilterMessageSnippet("nearly full").All()
		if len(warns) != 1 {
			t.Fatalf("%d warnings with 900 MiB free, within %v; want 1", len(warns), diskWarnEvery)
		}
		if raft := strings.Contains(warns[0].Message, "raft log"); raft != cluster {
			t.Errorf("cluster %v: the warning says %q", cluster, warns[0].Message)
		}
		if got := warns[0].ContextMap()["free_bytes"]; got != uint64(900<<20) {
			t.Errorf("free_bytes %v", got)
		}
		w.check(now.Add(diskWarnEvery + time.Second))
		if n := logs.FilterMessageSnippet("nearly full").Len(); n != 2 {
			t.Fatalf("%d warnings after %v still nearly full; want 2", n, diskWarnEvery)
		}
	}
	// A look that fails is said once, and warns of nothing; nor does a
	// filesystem that gives no size.
	core, logs := observer.New(zapcore.InfoLevel)
	var total uint64
	var err error = errors.New("statfs: permission denied")
	w := &diskWatch{dir: t.TempDir(), log: zap.New(core),
		free: func(string) (uint64, uint64, error) { return 0, total, err }}
	w.check(time.Now())
	w.check(time.Now().Add(2 * diskWarnEvery))
	err = nil
	w.check(time.Now().Add(4 * diskWarnEvery))
	if n, said := logs.Len(), logs.FilterMessageSnippet("cannot tell").Len(); n != 1 || said != 1 {
		t.Errorf("%d lines, %d of them of the failed look; want that one alone", n, said)
	}
	// A small filesystem is nearly full under a tenth of its size.
	if got := lowDisk(4 << 30); got != 4<<30/10 {
		t.Errorf("lowDisk(4 GiB) = %d", got)
	}
}

// A cluster node's watch says to stop once its free space is under the
// reserve, once; it warns before that, and single mode's never says it.
func TestDiskWatchStopsAClusterNodeUnderItsReserve(t *testing.T) {
	for _, cluster := range []bool{false, true} {
		free, total := uint64(900<<20), uint64(100<<30)
		w, logs := fakeWatch(t, cluster, &free, &total)
		if cluster {
			w.low = make(chan struct{})
		}
		low := func() bool {
			select {
			case <-w.low:
				return true
			default:
				return false
			}
		}
		now := time.Now()
		w.check(now)
		if low() || logs.FilterMessageSnippet("nearly full").Len() != 1 {
			t.Fatalf("cluster %v, 900 MiB free of 100 GiB: low %v, %d warnings; want a warning, not a stop", cluster, low(), logs.Len())
		}
		free = 128<<20 - 1
		w.check(now.Add(time.Second))
		w.check(now.Add(2 * time.Second)) // once: the channel is closed once
		if low() != cluster {
			t.Fatalf("cluster %v, a byte under 128 MiB free: low %v", cluster, low())
		}
		if cluster && (w.lowFree != free || w.lowTotal != total) {
			t.Errorf("low at %d of %d bytes, want %d of %d", w.lowFree, w.lowTotal, free, total)
		}
	}
	// The reserve of a small filesystem is a twentieth of it, and the
	// error says what it was and what to do.
	if got := diskReserve(96 << 20); got != 96<<20/20 {
		t.Errorf("diskReserve(96 MiB) = %d", got)
	}
	err := lowDiskError("d", 1<<20, 96<<20)
	for _, want := range []string{"1048576 bytes free", fmt.Sprint(96 << 20 / 20), "free space", "catches up"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
}

func TestDataDirFreeBytesOnMetrics(t *testing.T) {
	s := startServer(t, 4096)
	resp, err := http.Get("http://" + s.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := regexp.MustCompile(`(?m)^ticketd_data_dir_free_bytes (\S+)$`).FindSubmatch(body)
	if m == nil {
		t.Fatal("no ticketd_data_dir_free_bytes on /metrics")
	}
	if v, err := strconv.ParseFloat(string(m[1]), 64); err != nil || v <= 0 {
		t.Fatalf("ticketd_data_dir_free_bytes %s", m[1])
	}
}
