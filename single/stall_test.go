package single

import (
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// A disk that stalls makes the runner not ready once a synced write of the
// state has taken StallTimeout, and ready again when it ends; an idle runner
// writes the state again after half of it, so that the stall shows before a
// grant waits on it (a grant's write holds its event loop and every
// connection on it, with /readyz 200 throughout before this).
func TestStalledDiskMakesAnIdleRunnerNotReady(t *testing.T) {
	const stall = 300 * time.Millisecond
	var (
		mu      sync.Mutex
		blocked chan struct{} // non-nil: saves wait for it to close
	)
	core, logs := observer.New(zap.InfoLevel)
	r, err := open(Options{DataDir: t.TempDir(), Shards: 1, StallTimeout: stall, Logger: zap.New(core)}, env{
		wrapStore: func(d durable) durable {
			f := &faultStore{durable: d}
			f.saveErr = func(state) error {
				mu.Lock()
				ch := blocked
				mu.Unlock()
				if ch != nil {
					<-ch
				}
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
	waitFor(t, 10*time.Second, "the stall in the log", func() bool {
		return logs.FilterMessageSnippet("a synced write of the state has not ended").Len() == 1
	})

	mu.Lock()
	blocked = nil
	mu.Unlock()
	disk()
	waitFor(t, 10*time.Second, "ready again after the disk came back", r.Ready)
	waitFor(t, 10*time.Second, "the stall's end in the log", func() bool {
		return logs.FilterMessageSnippet("the synced write of the state that stalled has ended").Len() == 1
	})
}

func waitFor(t *testing.T, limit time.Duration, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(limit); !ok(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %v", what, limit)
		}
	}
}
