//go:build !race

package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/ticketd/ticketd/client"
)

// An acquire and its release allocate nothing once the client is warm: the
// calls come from a pool, the generated owner is written straight into the
// outgoing batch, and Lock keeps it in parts. (Not under the race detector,
// which allocates on its own.) The count is process-wide, so it covers the
// connection's reader and writer goroutines too.
func TestClientAcquireReleaseAllocs(t *testing.T) {
	srv := startServer(t, "", "")
	cl := dial(t, srv.addr)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var failed error
	for _, tc := range []struct {
		name, key string
		release   func(client.Lock) error
	}{
		{"Acquire+Release", "alloc-key", func(l client.Lock) error { return cl.Release(ctx, l) }},
		{"Acquire+ReleaseNoWait", "alloc-key-2", cl.ReleaseNoWait},
	} {
		cycle := func() {
			l, err := cl.Acquire(ctx, tc.key, 30*time.Second, 0)
			if err == nil {
				err = tc.release(l)
			}
			if err != nil && failed == nil {
				failed = err
			}
		}
		for range 100 {
			cycle()
		}
		if a := testing.AllocsPerRun(1000, cycle); a != 0 {
			t.Errorf("%s: %v allocations per pair, want 0", tc.name, a)
		}
	}
	if failed != nil {
		t.Fatal(failed)
	}
}
