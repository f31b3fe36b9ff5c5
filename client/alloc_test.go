//go:build !race

package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/ticketd/ticketd/client"
)

// An acquire and its release allocate nothing once the client is warm (with
// a generated owner or the caller's), nor do AcquireFunc and ReleaseFunc with funcs made once: the calls come from
// a pool, the generated owner is written straight into the outgoing batch,
// and Lock keeps it in parts. (Not under the race detector, which allocates
// on its own.) The count is process-wide, so it covers the connection's
// reader and writer goroutines too.
func TestClientAcquireReleaseAllocs(t *testing.T) {
	srv := startServer(t, "", "")
	cl := dial(t, srv.addr)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var failed error
	acquire := func(key string) (client.Lock, error) { return cl.Acquire(ctx, key, 30*time.Second, 0) }
	for _, tc := range []struct {
		name, key string
		acquire   func(key string) (client.Lock, error)
		release   func(client.Lock) error
	}{
		{"Acquire+Release", "alloc-key", acquire, func(l client.Lock) error { return cl.Release(ctx, l) }},
		{"Acquire+ReleaseNoWait", "alloc-key-2", acquire, cl.ReleaseNoWait},
		{"AcquireAs+Release", "alloc-key-3", func(key string) (client.Lock, error) {
			return cl.AcquireAs(ctx, "worker-7", key, 30*time.Second, 0)
		}, func(l client.Lock) error { return cl.Release(ctx, l) }},
	} {
		cycle := func() {
			l, err := tc.acquire(tc.key)
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

	// AcquireFunc and ReleaseFunc with funcs made once.
	done := make(chan error, 1)
	onRelease := func(err error) { done <- err }
	onAcquire := func(l client.Lock, err error) {
		if err == nil {
			err = cl.ReleaseFunc(l, onRelease)
		}
		if err != nil {
			done <- err
		}
	}
	cycle := func() {
		err := cl.AcquireFunc("alloc-key-3", 30*time.Second, 0, onAcquire)
		if err == nil {
			err = <-done
		}
		if err != nil && failed == nil {
			failed = err
		}
	}
	for range 100 {
		cycle()
	}
	if a := testing.AllocsPerRun(1000, cycle); a != 0 {
		t.Errorf("AcquireFunc+ReleaseFunc: %v allocations per pair, want 0", a)
	}
	if failed != nil {
		t.Fatal(failed)
	}
}
