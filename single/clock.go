package single

import (
	"bytes"
	"io"
	"time"
)

// clock is what the runner reads time from and sleeps on; tests replace it
// with virtual time.
type clock interface {
	// now is unix nanoseconds; it never goes back within a run.
	now() int64
	// ahead is how far the wall clock now reads ahead of now (0 if it does
	// not): a step forward since the start, which the next run will read.
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
}

func newWallClock() wallClock {
	t := time.Now()
	return wallClock{start: t, base: t.UnixNano()}
}

func (c wallClock) now() int64 { return c.base + int64(time.Since(c.start)) }

func (c wallClock) ahead() int64 { return max(time.Now().UnixNano()-c.now(), 0) }

func (wallClock) newTimer(d time.Duration) timer { return realTimer{time.NewTimer(d)} }

type realTimer struct{ t *time.Timer }

func (t realTimer) C() <-chan time.Time   { return t.t.C }
func (t realTimer) Reset(d time.Duration) { t.t.Reset(d) }
func (t realTimer) Stop()                 { t.t.Stop() }

type bytesWriter []byte

func (w *bytesWriter) Write(p []byte) (int, error) { *w = append(*w, p...); return len(p), nil }

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }
