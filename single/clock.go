package single

import (
	"bytes"
	"io"
	"time"
)

// clock is wall time at start plus monotonic time since: it never goes back
// within a run, and deadlines written to the data dir stay meaningful to the
// next run (as far as the wall clock is right across the restart).
type clock struct {
	start time.Time
	base  int64
}

func newClock() clock {
	t := time.Now()
	return clock{start: t, base: t.UnixNano()}
}

func (c clock) now() int64 { return c.base + int64(time.Since(c.start)) }

type bytesWriter []byte

func (w *bytesWriter) Write(p []byte) (int, error) { *w = append(*w, p...); return len(p), nil }

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }
