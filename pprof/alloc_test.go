//go:build !race

package pprof

import "testing"

// The server observes on its request path, which must not allocate.
func TestHistogramObserveDoesNotAllocate(t *testing.T) {
	h := New().Histogram("x_seconds", "X.", nil)
	if n := testing.AllocsPerRun(1000, func() { h.Observe(42e-6) }); n != 0 {
		t.Fatalf("Observe allocates %.1f times", n)
	}
}
