package single

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// stallDisk holds the runner's synced writes of the state at will: while
// stalled, each waits until the stall ends, and each takes slow longer.
type stallDisk struct {
	mu      sync.Mutex
	until   chan struct{} // closed when the stall ends; nil: no stall
	slow    time.Duration
	entered chan struct{} // a write met the stall (capacity 1)
}

func (s *stallDisk) save(state) error {
	s.mu.Lock()
	ch, d := s.until, s.slow
	s.mu.Unlock()
	if ch != nil {
		select {
		case s.entered <- struct{}{}:
		default:
		}
		<-ch
	}
	time.Sleep(d)
	return nil
}

func (s *stallDisk) start() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.until == nil {
		s.until = make(chan struct{})
	}
}

// end ends the stall; the writes then take slow longer each.
func (s *stallDisk) end(slow time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.until != nil {
		close(s.until)
		s.until = nil
	}
	s.slow = slow
}

// stallingRunner is a started runner of one shard on a disk that stalls at
// will, with the stall timeout given. The stall ends before its Close,
// which waits for a write the stall holds.
func stallingRunner(t *testing.T, timeout time.Duration, log *zap.Logger) (*Runner, *stallDisk) {
	t.Helper()
	disk := &stallDisk{entered: make(chan struct{}, 1)}
	r, err := open(Options{DataDir: t.TempDir(), Shards: 1, StallTimeout: timeout, Logger: log}, env{
		wrapStore: func(d durable) durable { return &faultStore{durable: d, saveErr: disk.save} },
	})
	if err != nil {
		t.Fatal(err)
	}
	r.start()
	t.Cleanup(func() { disk.end(0); _ = r.Close() })
	return r, disk
}

// A disk that stalls makes the runner not ready once a synced write of the
// state has taken StallTimeout, and ready again once one takes less; an
// idle runner writes the state again after half of it, so that the stall
// shows before a grant waits on it (a grant's write holds its event loop
// and every connection on it, with /readyz 200 throughout before this). A
// disk that slow on every write keeps it not ready, without flapping.
func TestStalledDiskMakesAnIdleRunnerNotReady(t *testing.T) {
	const stall = 300 * time.Millisecond
	core, logs := observer.New(zap.InfoLevel)
	r, disk := stallingRunner(t, stall, zap.New(core))
	if !r.Ready() {
		t.Fatal("not ready at the start")
	}

	disk.start()
	stalled := time.Now()
	waitFor(t, 10*time.Second, "not ready with an idle runner's disk stalled", func() bool { return !r.Ready() })
	if d := time.Since(stalled); d < stall {
		t.Fatalf("not ready %v into the stall, before the stall timeout (%v)", d, stall)
	}
	if why := r.NotReady(); !strings.Contains(why, "synced write of the state has taken") {
		t.Errorf("not ready for its stalled disk, and says %q", why)
	}
	stalledLog := func() int {
		return logs.FilterMessageSnippet("a synced write of the state has taken --unavailable-timeout or more").Len()
	}
	readyLog := func() int {
		return logs.FilterMessageSnippet("a synced write of the state took less than --unavailable-timeout again").Len()
	}
	waitFor(t, 10*time.Second, "the stall in the log", func() bool { return stalledLog() == 1 })

	// The disk comes back slow: every write takes longer than the timeout.
	disk.end(2 * stall)
	for end := time.Now().Add(8 * stall); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if r.Ready() {
			t.Fatal("ready between writes that each take longer than the stall timeout")
		}
	}
	if n := stalledLog(); n != 1 {
		t.Fatalf("the stall logged %d times, want once", n)
	}

	disk.end(0)
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
	r, disk := stallingRunner(t, 200*time.Millisecond, zap.NewNop())
	disk.start()
	select {
	case <-disk.entered:
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
