package single

import (
	"bytes"
	"io"
	"sync/atomic"
	"time"
)

// clock is what the runner reads time from and sleeps on; tests replace it
// with virtual time.
type clock interface {
	// now is unix nanoseconds; it never goes back within a run.
	now() int64
	// ahead is the most the wall clock has read ahead of now so far (0 if
	// never): a step forward since the start, which the next run will read.
	ahead() int64
	newTimer(d time.Duration) timer
}

// timer is the part of time.Timer the runner uses (Go 1.23 semantics: after
// Stop or Reset no stale tick is received).
type timer interface {
	C() <-chan time.Time
	Reset(d time.Duration)
	Stop()
}

// wallClock is wall time at start plus monotonic time since: it never goes
// back within a run, and deadlines written to the data dir stay meaningful
// to the next run (as far as the wall clock is right across the restart; a
// step forward during the run is added to what is written, see ahead).
type wallClock struct {
	start time.Time
	base  int64
	// most is the largest step ahead of the wall clock seen by now, which
	// reads it anyway (the request path does, once per batch), so that a
	// grant after a step already finds it.
	most   atomic.Int64
	offset int64 // see newWallClock
}

// newWallClock reads the wall clock off by offset (tests only: a host whose
// clock is wrong when the run starts).
func newWallClock(offset time.Duration) *wallClock {
	t := time.Now()
	return &wallClock{start: t, base: t.UnixNano() + int64(offset), offset: int64(offset)}
}

func (c *wallClock) now() int64 {
	t := time.Now()
	n := c.base + int64(t.Sub(c.start))
	a := t.UnixNano() + c.offset - n
	for m := c.most.Load(); a > m+int64(time.Millisecond); m = c.most.Load() {
		// A step: rare. Only ever larger, also when two reads race.
		if c.most.CompareAndSwap(m, a) {
			break
		}
	}
	return n
}

func (c *wallClock) ahead() int64 { return c.most.Load() }

func (*wallClock) newTimer(d time.Duration) timer { return realTimer{time.NewTimer(d)} }

type realTimer struct{ t *time.Timer }

func (t realTimer) C() <-chan time.Time   { return t.t.C }
func (t realTimer) Reset(d time.Duration) { t.t.Reset(d) }
func (t realTimer) Stop()                 { t.t.Stop() }

type bytesWriter []byte

func (w *bytesWriter) Write(p []byte) (int, error) { *w = append(*w, p...); return len(p), nil }

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }
