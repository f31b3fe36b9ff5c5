package bench

import (
	"sync/atomic"
	"time"

	"github.com/ticketd/ticketd/shard"
)

// Trace records a run's answers by shard (shard.Index of the key, as the
// server places it) in fixed time buckets, and each shard's longest request
// latency before and after a mark (the failover run's kill). A shard that
// goes quiet shows as a stretch of empty buckets.
type Trace struct {
	Shards int
	Bucket time.Duration

	origin, winStart, winEnd int64
	counts                   [][]atomic.Uint32 // [shard][bucket]
	mark                     atomic.Int64
	maxBefore, maxAfter      []atomic.Int64 // per shard, ns
}

// NewTrace traces shards shards in buckets of bucket.
func NewTrace(shards int, bucket time.Duration) *Trace {
	return &Trace{Shards: shards, Bucket: bucket,
		maxBefore: make([]atomic.Int64, shards), maxAfter: make([]atomic.Int64, shards)}
}

// begin sizes the trace for a run starting at origin and lasting span.
func (t *Trace) begin(origin int64, span time.Duration) {
	t.origin = origin
	n := int(span/t.Bucket) + 1
	t.counts = make([][]atomic.Uint32, t.Shards)
	for i := range t.counts {
		t.counts[i] = make([]atomic.Uint32, n)
	}
}

// end notes the measured window.
func (t *Trace) end(winStart, winEnd int64) { t.winStart, t.winEnd = winStart, winEnd }

// Mark records now as the event the trace is about, and returns it.
func (t *Trace) Mark() int64 {
	now := nanotime()
	t.mark.Store(now)
	return now
}

func (t *Trace) add(key []byte, sent, now int64) {
	s := shard.Index(key, t.Shards)
	if b := (now - t.origin) / int64(t.Bucket); b >= 0 && b < int64(len(t.counts[s])) {
		t.counts[s][b].Add(1)
	}
	m := &t.maxBefore[s]
	if mk := t.mark.Load(); mk != 0 && now >= mk {
		m = &t.maxAfter[s]
	}
	lat := now - sent
	for {
		old := m.Load()
		if lat <= old || m.CompareAndSwap(old, lat) {
			return
		}
	}
}

// ShardGap is what the trace saw of one shard around the mark.
type ShardGap struct {
	Shard int
	// Quiet is the longest stretch without any answer on the shard that
	// ends after the mark (it may start before); Baseline the longest
	// wholly between the window's start and the mark: the noise floor.
	Quiet, Baseline time.Duration
	// QuietFrom is where Quiet starts, relative to the mark.
	QuietFrom time.Duration
	// MaxLatency is the longest any request on the shard waited for an
	// answer that came after the mark; MaxBefore the same before it.
	MaxLatency, MaxBefore time.Duration
	// Unrecovered: the shard was still quiet when the window ended.
	Unrecovered bool
}

// Gaps reports every shard's gaps; the window must have ended.
func (t *Trace) Gaps() []ShardGap {
	mk := t.mark.Load()
	b := func(ns int64) int { return int((ns - t.origin) / int64(t.Bucket)) }
	from, to := max(0, b(t.winStart)), b(t.winEnd)
	at := to
	if mk != 0 {
		at = b(mk)
	}
	var out []ShardGap
	for s := range t.Shards {
		g := ShardGap{Shard: s, MaxLatency: time.Duration(t.maxAfter[s].Load()),
			MaxBefore: time.Duration(t.maxBefore[s].Load())}
		run := 0
		for i := from; i < to && i < len(t.counts[s]); i++ {
			if t.counts[s][i].Load() == 0 {
				run++
				d := time.Duration(run) * t.Bucket
				if i < at {
					g.Baseline = max(g.Baseline, d)
				} else if d > g.Quiet {
					g.Quiet = d
					g.QuietFrom = time.Duration(i+1-run-at) * t.Bucket
				}
				continue
			}
			run = 0
		}
		// The longest quiet stretch after the mark is still open at the end.
		g.Unrecovered = run > 0 && time.Duration(run)*t.Bucket >= g.Quiet && g.Quiet > 0
		out = append(out, g)
	}
	return out
}

// Rate is answers per second on the given shards in steps of step, from
// the window's start to its end, with the time of each step relative to the
// mark (or to the window's start without one).
func (t *Trace) Rate(shards []int, step time.Duration) (at []time.Duration, perSec []float64) {
	k := max(1, int(step/t.Bucket))
	b := func(ns int64) int { return int((ns - t.origin) / int64(t.Bucket)) }
	from, to := max(0, b(t.winStart)), b(t.winEnd)
	zero := t.winStart
	if mk := t.mark.Load(); mk != 0 {
		zero = mk
	}
	for i := from; i+k <= to; i += k {
		var n uint32
		for _, s := range shards {
			for j := i; j < i+k && j < len(t.counts[s]); j++ {
				n += t.counts[s][j].Load()
			}
		}
		at = append(at, time.Duration(t.origin+int64(i)*int64(t.Bucket)-zero))
		perSec = append(perSec, float64(n)/(time.Duration(k)*t.Bucket).Seconds())
	}
	return at, perSec
}
