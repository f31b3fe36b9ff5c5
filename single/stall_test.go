package single

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// A disk that stalls makes the runner not ready once a synced write of the
// state has taken StallTimeout, and ready again once one takes less; an
// idle runner writes the state again after half of it, so that the stall
// shows before a grant waits on it (a grant's write holds its event loop
// and every connection on it, with /readyz 200 throughout before this). A
// disk that slow on every write keeps it not ready, without flapping.
func TestStalledDiskMakesAnIdleRunnerNotReady(t *testing.T) {
	const stall = 300 * time.Millisecond
	var (
		mu      sync.Mutex
		blocked chan struct{} // non-nil: saves wait for it to close
		slow    time.Duration // each save takes this much longer
	)
	core, logs := observer.New(zap.InfoLevel)
	r, err := open(Options{DataDir: t.TempDir(), Shards: 1, StallTimeout: stall, Logger: zap.New(core)}, env{
		wrapStore: func(d durable) durable {
			f := &faultStore{durable: d}
			f.saveErr = func(state) error {
				mu.Lock()
				ch, d := blocked, slow
				mu.Unlock()
				if ch != nil {
					<-ch
				}
				time.Sleep(d)
				return nil
			}
			return f
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	r.start()
	defer func() { _ = r.Close() }()
	if !r.Ready() {
		t.Fatal("not ready at the start")
	}

	ch := make(chan struct{})
	var unblock sync.Once
	disk := func() { unblock.Do(func() { close(ch) }) }
	defer disk() // before Close, which waits for a write the stall holds
	mu.Lock()
	blocked = ch
	mu.Unlock()
	stalled := time.Now()
	waitFor(t, 10*time.Second, "not ready with an idle runner's disk stalled", func() bool { return !r.Ready() })
	if d := time.Since(stalled); d < stall {
		t.Fatalf("not ready %v into the stall, before the stall timeout (%v)", d, stall)
	}
	stalledLog := func() int {
		return logs.FilterMessageSnippet("a synced write of the state has taken --unavailable-timeout or more").Len()
	}
	readyLog := func() int {
		return logs.FilterMessageSnippet("a synced write of the state took less than --unavailable-timeout again").Len()
	}
	waitFor(t, 10*time.Second, "the stall in the log", func() bool { return stalledLog() == 1 })

	// The disk comes back slow: every write takes longer than the timeout.
	mu.Lock()
	blocked, slow = nil, 2*stall
	mu.Unlock()
	disk()
	for end := time.Now().Add(8 * stall); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if r.Ready() {
			t.Fatal("ready between writes that each take longer than the stall timeout")
		}
	}
	if n := stalledLog(); n != 1 {
		t.Fatalf("the stall logged %d times, want once", n)
	}

	mu.Lock()
	slow = 0
	mu.Unlock()
	waitFor(t, 10*time.Second, "ready again after the disk came back", r.Ready)
	waitFor(t, 10*time.Second, "the stall's end in the log", func() bool { return readyLog() == 1 })
}

func waitFor(t *testing.T, limit time.Duration, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(limit); !ok(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %v", what, limit)
		}
	}
}

// Shutdown's ctx bounds a wait on a stalled disk also when the write is the
// ceiling loop's (an idle runner's): before, it waited on the loops
// unbounded, and only the caller's own guard ended the wait.
func TestShutdownOnAStalledDiskEndsWithItsContext(t *testing.T) {
	const stall = 200 * time.Millisecond
	block := make(chan struct{})
	var unblock sync.Once
	disk := func() { unblock.Do(func() { close(block) }) }
	entered := make(chan struct{}, 1)
	stalled := false
	r, err := open(Options{DataDir: t.TempDir(), Shards: 1, StallTimeout: stall}, env{
		wrapStore: func(d durable) durable {
			f := &faultStore{durable: d}
			f.saveErr = func(state) error {
				if stalled {
					select {
					case entered <- struct{}{}:
					default:
					}
					<-block
				}
				return nil
			}
			return f
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	stalled = true // after open's own write; read by the ceiling loop only from here
	r.start()
	defer func() { disk(); r.stopLoops(); _ = r.store.close() }()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("no idle write of the state")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Shutdown(ctx) }()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Shutdown on a stalled disk: %v, want its context's deadline", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Shutdown still waits on the stalled disk 10s after its context ended")
	}
}
