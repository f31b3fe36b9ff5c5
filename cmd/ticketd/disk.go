package main

import (
	"fmt"
	"time"

	"go.uber.org/zap"
)

// lowDisk is the free space under which the data dir's filesystem counts
// as nearly full: 1 GiB, or a tenth of a smaller filesystem.
func lowDisk(total uint64) uint64 { return min(1<<30, total/10) }

// diskWarnEvery spaces the warnings of a disk that stays nearly full.
const diskWarnEvery = 5 * time.Minute

// diskReserve is the free space a cluster node keeps on its data dir's
// filesystem: 128 MiB, or a twentieth of a smaller filesystem. Under it
// the node stops cleanly (its shards' leadership handed over, what it
// took answered) instead of meeting a full disk in the middle of a raft
// log write, which ends it in Dragonboat's panic with its leaderships
// left to elections; and it does not start, so that a supervisor's
// restarts do not each run into that.
func diskReserve(total uint64) uint64 { return min(128<<20, total/20) }

// diskCheckCluster is how often a cluster node looks at its free space:
// a log under load can fill megabytes a second.
const diskCheckCluster = time.Second

// diskWatch warns, before it happens, of what a full disk does to the
// mode: single mode stops granting and exits, and a cluster node stops
// (Dragonboat cannot go on without its raft log), so the nodes on one
// full disk, or on disks that fill alike, take the cluster's quorum with
// them. A cluster node's watch also tells it when to stop (low).
type diskWatch struct {
	dir     string
	cluster bool
	log     *zap.Logger
	free    func(dir string) (free, total uint64, err error)
	warned  time.Time
	failed  bool // a failed look was logged
	// low is closed when a cluster node's free space falls under
	// diskReserve: the node is to stop.
	low      chan struct{}
	lowFree  uint64 // the free space and the size that closed it
	lowTotal uint64
	stopping bool
}

func (w *diskWatch) check(now time.Time) {
	free, total, err := w.free(w.dir)
	if err != nil && !w.failed {
		w.failed = true
		w.log.Info("cannot tell the data dir's free space; no warning comes before its disk fills",
			zap.String("data_dir", absDir(w.dir)), zap.Error(err))
	}
	if err != nil || total == 0 {
		return
	}
	if w.cluster && w.low != nil && !w.stopping && free < diskReserve(total) {
		w.stopping, w.lowFree, w.lowTotal = true, free, total
		close(w.low)
		return
	}
	if free >= lowDisk(total) || now.Sub(w.warned) < diskWarnEvery {
		return
	}
	w.warned = now
	what := "a synced write that meets a full disk stops every grant and ends the process (safely: the next start recovers)"
	if w.cluster {
		what = "a node stops under its reserve of free space, before its raft log meets a full disk, and nodes whose disks fill alike take the cluster's quorum with them"
	}
	w.log.Warn("the data dir's filesystem is nearly full; free space or move the data dir: "+what,
		zap.String("data_dir", absDir(w.dir)), zap.Uint64("free_bytes", free), zap.Uint64("total_bytes", total))
}

// run checks every interval until stop is closed.
func (w *diskWatch) run(interval time.Duration, stop <-chan struct{}) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		w.check(time.Now())
		select {
		case <-stop:
			return
		case <-t.C:
		}
	}
}

// lowDiskError is why a cluster node stops, or does not start, for want of
// free space.
func lowDiskError(dir string, free, total uint64) error {
	return fmt.Errorf("the data dir's filesystem (%s) has %d bytes free, under the %d a cluster node keeps in reserve "+
		"(128 MiB, or a twentieth of a smaller filesystem), so that its raft log never meets a full disk; "+
		"free space or move the data dir, then start the node again: it catches up from the others", absDir(dir), free, diskReserve(total))
}
