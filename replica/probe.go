package replica

import (
	"encoding/binary"
	"fmt"
	"path/filepath"
	"time"

	"github.com/lni/vfs"
	"go.uber.org/zap"
)

// probeName is the file in the data dir that probeLoop writes.
const probeName = "disk-probe"

// probeLoop writes and syncs a small file in the data dir while no proposal
// of this node has committed for half an unavailable timeout. Ready counts
// proposals that go that long without a result, but a node whose disk
// stalls while its shards are quiet has none: it stayed ready until a
// client's request had waited out the timeout. A probe that has taken an
// unavailable timeout, or failed, makes the node not ready until one takes
// less; until then it probes busy or not (commits alone would not clear it).
func (n *Node) probeLoop() {
	every := n.opt.UnavailableTimeout / 2
	fs := n.opt.fs
	if fs == nil {
		fs = vfs.Default
	}
	path := filepath.Join(n.opt.DataDir, probeName)
	n.every(every, func() {
		if !n.probeBad.Load() {
			for _, g := range n.grps {
				if sinceMono(g.lastOK.Load()) < every {
					return // the raft log was written and synced since
				}
			}
		}
		start := monoNow()
		n.probing.Store(start)
		err := probe(fs, path, start)
		took := sinceMono(start)
		bad := err != nil || took >= n.opt.UnavailableTimeout
		n.probeMu.Lock()
		// probeBad before probing: Ready, which reads them the other way
		// round, never sees neither.
		n.probeBad.Store(bad)
		n.probing.Store(0)
		was := n.probeSaid
		n.probeSaid = bad
		n.probeMu.Unlock()
		switch {
		case bad && !was:
			n.log.Warn("a synced write to the data dir failed or took the unavailable timeout or more: this node is not ready until one takes less",
				zap.Duration("took", took), zap.Error(err))
		case !bad && was:
			n.log.Info("a synced write to the data dir took less than the unavailable timeout again: ready", zap.Duration("took", took))
		}
	})
}

func probe(fs vfs.FS, path string, stamp int64) error {
	f, err := fs.Create(path)
	if err != nil {
		return fmt.Errorf("cannot create %s: %w", path, err)
	}
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(stamp))
	_, err = f.Write(b[:])
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("cannot write %s: %w", path, err)
	}
	return nil
}

// probeStalled is how long the probe in flight has taken, if an
// unavailable timeout or more; 0 otherwise.
func (n *Node) probeStalled() time.Duration {
	if at := n.probing.Load(); at != 0 && sinceMono(at) >= n.opt.UnavailableTimeout {
		return sinceMono(at)
	}
	return 0
}

// sayProbeStall logs a probe that has stalled, once until one takes less
// (probeLoop cannot: it waits on the disk).
func (n *Node) sayProbeStall() {
	n.probeMu.Lock()
	d := n.probeStalled()
	say := d > 0 && !n.probeSaid
	n.probeSaid = n.probeSaid || say
	n.probeMu.Unlock()
	if say {
		n.log.Warn("a synced write to the data dir has taken the unavailable timeout or more: this node is not ready until one takes less (its disk stalls?)",
			zap.Duration("for", d), zap.Duration("unavailable_timeout", n.opt.UnavailableTimeout), zap.String("data_dir", n.opt.DataDir))
	}
}
