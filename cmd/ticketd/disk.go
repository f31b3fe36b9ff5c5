package main

import (
	"time"

	"go.uber.org/zap"
)

// lowDisk is the free space under which the data dir's filesystem counts
// as nearly full: 1 GiB, or a tenth of a smaller filesystem.
func lowDisk(total uint64) uint64 { return min(1<<30, total/10) }

// diskWarnEvery spaces the warnings of a disk that stays nearly full.
const diskWarnEvery = 5 * time.Minute

// diskWatch warns, before it happens, of what a full disk does to the
// mode: single mode stops granting and exits, and a cluster node ends at
// its raft log's next write (Dragonboat cannot go on without it), so the
// nodes on one full disk, or on disks that fill alike, take the cluster's
// quorum with them.
type diskWatch struct {
	dir     string
	cluster bool
	log     *zap.Logger
	free    func(dir string) (free, total uint64, err error)
	warned  time.Time
	failed  bool // a failed look was logged
}

func (w *diskWatch) check(now time.Time) {
	free, total, err := w.free(w.dir)
	if err != nil && !w.failed {
		w.failed = true
		w.log.Info("cannot tell the data dir's free space; no warning comes before its disk fills",
			zap.String("data_dir", absDir(w.dir)), zap.Error(err))
	}
	if err != nil || total == 0 || free >= lowDisk(total) || now.Sub(w.warned) < diskWarnEvery {
		return
	}
	w.warned = now
	what := "a synced write that meets a full disk stops every grant and ends the process (safely: the next start recovers)"
	if w.cluster {
		what = "a raft log write that meets a full disk ends the process, and nodes whose disks fill alike take the cluster's quorum with them"
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
