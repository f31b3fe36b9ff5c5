//go:build !race

package shard

import (
	"fmt"
	"runtime"
	"testing"
)

// totalAllocs counts every allocation over n calls of f. testing.AllocsPerRun divides
// with integer arithmetic, so it would let up to n-1 rare allocations (say a map growing
// now and then) pass as 0. The count is process-wide, and the runtime allocates now and
// then on its own (the scavenger's timers): on a loaded machine a round takes long
// enough to catch one (CI once saw 1 in each of three rounds). So it is the best of up
// to ten rounds, stopping at the first with none; the table is deterministic, so an
// allocation of its own shows in every round.
func totalAllocs(n int, f func()) uint64 {
	best := ^uint64(0)
	for range 10 {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for range n {
			f()
		}
		runtime.ReadMemStats(&after)
		if best = min(best, after.Mallocs-before.Mallocs); best == 0 {
			break
		}
	}
	return best
}

// The hot paths allocate nothing once the table is warm. (Not under the race detector,
// which allocates on its own.)

func TestAllocsAcquireRelease(t *testing.T) {
	// Released keys leave the index; their entries come back through the free list.
	tb := New(Config{MaxKeys: 1000, ReserveTokens: func(next uint64) uint64 { return next + 1<<20 }})
	keys := make([][]byte, 100)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "key-%d", i)
	}
	out := make([]Answer, 0, 4)
	owner := []byte("w")
	var now int64
	i := 0
	cycle := func() {
		k := keys[i%len(keys)]
		i++
		now += 1e6
		acq := Command{Op: OpAcquire, From: Requester{Conn: 1, Seq: uint64(i)}, Owner: owner, Key: k, LeaseMs: 30000}
		out = tb.Apply(now, &acq, out[:0])
		if len(out) != 1 || out[0].Result != Acquired {
			t.Fatalf("acquire: %v", out)
		}
		rel := Command{Op: OpRelease, From: Requester{Conn: 1, Seq: uint64(i)}, Key: k, Token: out[0].Token}
		out = tb.Apply(now, &rel, out[:0])
		if len(out) != 1 || out[0].Result != Released {
			t.Fatalf("release: %v", out)
		}
	}
	for range 2 * len(keys) {
		cycle()
	}
	if a := testing.AllocsPerRun(1000, cycle); a != 0 {
		t.Errorf("acquire+release: %v allocations, want 0", a)
	}
	if a := totalAllocs(100000, cycle); a != 0 {
		t.Errorf("acquire+release: %d allocations in 100000 cycles, want 0", a)
	}
}

func TestAllocsHandOver(t *testing.T) {
	tb := New(Config{})
	key, owner := []byte("hot"), []byte("worker-7")
	out := make([]Answer, 0, 4)
	var now int64
	var seq uint64
	acquire := func(conn, wait uint64) []Answer {
		seq++
		c := Command{Op: OpAcquire, From: Requester{Conn: conn, Seq: seq}, Owner: owner, Key: key, LeaseMs: 30000, WaitMs: wait}
		return tb.Apply(now, &c, out[:0])
	}
	tok := acquire(1, 0)[0].Token
	for i := range 8 {
		acquire(uint64(1+i), 3600000)
	}
	cycle := func() {
		now += 1e3
		rel := Command{Op: OpRelease, From: Requester{Conn: 99, Seq: seq}, Key: key, Token: tok}
		out = tb.Apply(now, &rel, out[:0])
		if len(out) != 2 || out[1].Result != Acquired {
			t.Fatalf("release: %v", out)
		}
		tok = out[1].Token
		if out = acquire(1+seq%8, 3600000); len(out) != 0 {
			t.Fatalf("acquire did not queue: %v", out)
		}
		// Waits that end, and a connection that goes away with its queued acquires.
		acquire(100, 1)
		acquire(100, 3600000)
		now += 1e6
		if out = tb.Tick(now, out[:0]); len(out) != 1 || out[0].Result != TimedOut {
			t.Fatalf("tick: %v", out)
		}
		w := Command{Op: OpWithdraw, From: Requester{Conn: 100}}
		out = tb.Apply(now, &w, out[:0])
	}
	for range 100 {
		cycle()
	}
	if a := testing.AllocsPerRun(1000, cycle); a != 0 {
		t.Errorf("hand-over: %v allocations, want 0", a)
	}
	if a := totalAllocs(100000, cycle); a != 0 {
		t.Errorf("hand-over: %d allocations in 100000 cycles, want 0", a)
	}
}
