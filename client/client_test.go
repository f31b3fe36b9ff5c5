package client_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketd/ticketd/client"
)

func dial(t testing.TB, addr string, opts ...client.Option) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cl, err := client.Dial(ctx, addr, opts...)
	if err != nil {
		t.Fatalf("Dial(%s): %v", addr, err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// A generated owner is the client id, a dot and a sequence that grows; a
// Lock made by hand has none.
func TestGeneratedOwner(t *testing.T) {
	srv := startServer(t, "", "")
	cl := dial(t, srv.addr, client.WithClientID("svc-a"))
	ctx := testCtx(t)
	var prev uint64
	for i := range 3 {
		l, err := cl.Acquire(ctx, fmt.Sprintf("owner-%d", i), time.Second, 0)
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		o := l.Owner()
		seq, err := strconv.ParseUint(strings.TrimPrefix(o, "svc-a."), 10, 64)
		if !strings.HasPrefix(o, "svc-a.") || err != nil || seq <= prev {
			t.Fatalf("Owner() = %q, want svc-a. and a sequence above %d", o, prev)
		}
		prev = seq
	}
	if o := (client.Lock{Key: "k", Token: 1}).Owner(); o != "" {
		t.Errorf("Owner() of a Lock made by hand = %q, want empty", o)
	}
}

func TestAcquireRelease(t *testing.T) {
	srv := startServer(t, "", "")
	cl := dial(t, srv.addr)
	ctx := testCtx(t)

	before := time.Now()
	l, err := cl.Acquire(ctx, "invoices", 30*time.Second, 0)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if l.Key != "invoices" || l.Token == 0 || l.Owner() == "" {
		t.Fatalf("Acquire = %+v, want key invoices, a token and an owner", l)
	}
	if l.Deadline.Before(before.Add(30*time.Second)) || l.Deadline.After(time.Now().Add(30*time.Second)) {
		t.Errorf("Deadline %v not within [send, answer] + 30s", l.Deadline)
	}
	if _, err := cl.Acquire(ctx, "invoices", 30*time.Second, 0); err != client.ErrHeld {
		t.Fatalf("second Acquire: %v, want ErrHeld", err)
	}
	if err := cl.Release(ctx, l); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if err := cl.Release(ctx, l); err != client.ErrNotHeld {
		t.Fatalf("second Release: %v, want ErrNotHeld", err)
	}
	if err := cl.Release(ctx, client.Lock{Key: "never-held", Token: 1}); err != client.ErrNotHeld {
		t.Fatalf("Release of an unregistered key: %v, want ErrNotHeld", err)
	}
	l2, err := cl.AcquireAs(ctx, "worker-7", "invoices", time.Second, 0)
	if err != nil {
		t.Fatalf("AcquireAs: %v", err)
	}
	if l2.Owner() != "worker-7" || l2.Token <= l.Token {
		t.Fatalf("AcquireAs = %+v, want owner worker-7 and a token above %d", l2, l.Token)
	}
	// The token, not the connection, proves holdership.
	other := dial(t, srv.addr, client.WithConns(1))
	if err := other.Release(ctx, l2); err != nil {
		t.Fatalf("Release from another client: %v", err)
	}
}

// ReleaseNoWait returns before the answer, and the same client's next
// acquire of the key comes after the release: it is granted at once, even
// with no wait, and its token is higher.
func TestReleaseNoWait(t *testing.T) {
	srv := startServer(t, "", "")
	cl := dial(t, srv.addr)
	ctx := testCtx(t)

	var last uint64
	for i := range 500 {
		l, err := cl.Acquire(ctx, "reports", 30*time.Second, 0)
		if err != nil {
			t.Fatalf("Acquire %d after ReleaseNoWait: %v", i, err)
		}
		if l.Token <= last {
			t.Fatalf("token %d after %d", l.Token, last)
		}
		last = l.Token
		if err := cl.ReleaseNoWait(l); err != nil {
			t.Fatalf("ReleaseNoWait: %v", err)
		}
	}
	// The last release reaches the server too: another client gets the key.
	other := dial(t, srv.addr, client.WithConns(1))
	if _, err := other.Acquire(ctx, "reports", time.Second, 5*time.Second); err != nil {
		t.Fatalf("Acquire from another client after ReleaseNoWait: %v", err)
	}
	// An answer of N (the lock was gone already) is not an error anywhere.
	if err := cl.ReleaseNoWait(client.Lock{Key: "never-held", Token: 1}); err != nil {
		t.Fatalf("ReleaseNoWait of a lock not held: %v", err)
	}
	if _, err := cl.Acquire(ctx, "still-up", time.Second, 0); err != nil {
		t.Fatalf("Acquire after an N to a ReleaseNoWait: %v", err)
	}
	if err := cl.ReleaseNoWait(client.Lock{Key: "x"}); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("ReleaseNoWait with token 0: %v, want ErrInvalid", err)
	}
	cl.Close()
	if err := cl.ReleaseNoWait(client.Lock{Key: "x", Token: 1}); !errors.Is(err, client.ErrClosed) {
		t.Fatalf("ReleaseNoWait after Close: %v, want ErrClosed", err)
	}
}

func TestWaitHandOver(t *testing.T) {
	srv := startServer(t, "", "")
	cl := dial(t, srv.addr)
	ctx := testCtx(t)
	holder, err := cl.Acquire(ctx, "k", 30*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		l   client.Lock
		err error
	}
	got := make(chan result, 1)
	go func() {
		l, err := cl.Acquire(ctx, "k", 10*time.Second, 10*time.Second)
		got <- result{l, err}
	}()
	time.Sleep(200 * time.Millisecond)
	released := time.Now()
	if err := cl.Release(ctx, holder); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("waiting Acquire: %v", r.err)
	}
	if r.l.Token <= holder.Token {
		t.Errorf("hand-over token %d not above %d", r.l.Token, holder.Token)
	}
	// The lease counts from the hand-over, not from the send 200ms earlier.
	if r.l.Deadline.Before(released.Add(10*time.Second - 50*time.Millisecond)) {
		t.Errorf("Deadline %v is %v before release + lease", r.l.Deadline, released.Add(10*time.Second).Sub(r.l.Deadline))
	}
	if err := cl.Release(ctx, r.l); err != nil {
		t.Fatal(err)
	}
}

func TestBusy(t *testing.T) {
	srv := startServer(t, "", "", "--max-waiters-per-key", "1")
	cl := dial(t, srv.addr)
	ctx := testCtx(t)
	holder, err := cl.Acquire(ctx, "k", 30*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	queued := make(chan error, 1)
	go func() {
		for {
			l, err := cl.Acquire(ctx, "k", 10*time.Second, 10*time.Second)
			if err == client.ErrBusy {
				continue // the poll below took the one place for a moment
			}
			if err == nil {
				err = cl.Release(ctx, l)
			}
			queued <- err
			return
		}
	}()
	// The queue is full once the first waiter is in: poll until B. A short
	// wait, so that a poll that queued first soon gives the place back.
	time.Sleep(100 * time.Millisecond)
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := cl.Acquire(ctx, "k", time.Second, 20*time.Millisecond)
		if err == client.ErrBusy {
			break
		}
		if err != nil && err != client.ErrHeld || time.Now().After(deadline) {
			t.Fatalf("second waiter: %v, want ErrBusy", err)
		}
	}
	// A held key with wait 0 needs no room: T, not B.
	if _, err := cl.Acquire(ctx, "k", time.Second, 0); err != client.ErrHeld {
		t.Errorf("wait 0 on a full queue: %v, want ErrHeld", err)
	}
	if err := cl.Release(ctx, holder); err != nil {
		t.Fatal(err)
	}
	if err := <-queued; err != nil {
		t.Fatalf("queued waiter: %v", err)
	}
}

// Many goroutines on few keys: no two hold one key at once, and in token
// order the hold intervals follow each other in time.
func TestContention(t *testing.T) {
	srv := startServer(t, "", "")
	cl := dial(t, srv.addr)
	ctx := testCtx(t)
	const (
		workers = 24
		rounds  = 40
		nkeys   = 3
	)
	type hold struct {
		token      uint64
		start, end time.Time
	}
	var (
		mu    sync.Mutex
		holds = map[string][]hold{}
		inUse [nkeys]atomic.Int32
		wg    sync.WaitGroup
	)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				k := rand.IntN(nkeys)
				key := fmt.Sprintf("contended-%d", k)
				l, err := cl.Acquire(ctx, key, 30*time.Second, 15*time.Second)
				if err != nil {
					t.Errorf("worker %d: Acquire(%s): %v", w, key, err)
					return
				}
				start := time.Now()
				if n := inUse[k].Add(1); n != 1 {
					t.Errorf("%s held by %d at once", key, n)
				}
				if rand.IntN(4) == 0 {
					time.Sleep(time.Duration(rand.IntN(500)) * time.Microsecond)
				}
				inUse[k].Add(-1)
				end := time.Now()
				mu.Lock()
				holds[key] = append(holds[key], hold{l.Token, start, end})
				mu.Unlock()
				if err := cl.Release(ctx, l); err != nil {
					t.Errorf("worker %d: Release(%s, %d): %v", w, key, l.Token, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	total := 0
	for key, hs := range holds {
		total += len(hs)
		slices.SortFunc(hs, func(a, b hold) int { return compareUint(a.token, b.token) })
		for i := 1; i < len(hs); i++ {
			if hs[i].token == hs[i-1].token {
				t.Fatalf("%s: token %d granted twice", key, hs[i].token)
			}
			if hs[i].start.Before(hs[i-1].end) {
				t.Fatalf("%s: token %d held from %v, before token %d ended at %v",
					key, hs[i].token, hs[i].start, hs[i-1].token, hs[i-1].end)
			}
		}
	}
	if total != workers*rounds && !t.Failed() {
		t.Fatalf("%d holds, want %d", total, workers*rounds)
	}
}

func compareUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// A cancelled acquire returns at once, and when the server grants it later
// the client releases it by itself.
func TestCancelLeaksNoLock(t *testing.T) {
	srv := startServer(t, "", "")
	cl := dial(t, srv.addr)
	other := dial(t, srv.addr, client.WithConns(1))
	ctx := testCtx(t)

	for _, mode := range []string{"cancel", "deadline"} {
		t.Run(mode, func(t *testing.T) {
			key := "cancel-" + mode
			holder, err := other.Acquire(ctx, key, 30*time.Second, 0)
			if err != nil {
				t.Fatal(err)
			}
			var wctx context.Context
			var cancel context.CancelFunc
			if mode == "cancel" {
				wctx, cancel = context.WithCancel(ctx)
				time.AfterFunc(200*time.Millisecond, cancel)
			} else {
				wctx, cancel = context.WithTimeout(ctx, 200*time.Millisecond)
			}
			defer cancel()
			t0 := time.Now()
			_, err = cl.Acquire(wctx, key, 30*time.Second, 30*time.Second)
			took := time.Since(t0)
			if mode == "cancel" && !errors.Is(err, context.Canceled) {
				t.Fatalf("cancelled Acquire: %v, want context.Canceled", err)
			}
			if mode == "deadline" && !errors.Is(err, context.DeadlineExceeded) && err != client.ErrHeld {
				t.Fatalf("Acquire past its deadline: %v, want DeadlineExceeded or ErrHeld", err)
			}
			if took > time.Second {
				t.Fatalf("Acquire returned %v after its context ended", took-200*time.Millisecond)
			}
			if err := other.Release(ctx, holder); err != nil {
				t.Fatal(err)
			}
			t0 = time.Now()
			l, err := other.Acquire(ctx, key, 30*time.Second, 5*time.Second)
			if err != nil {
				t.Fatalf("Acquire after the holder released: %v (the abandoned grant leaked?)", err)
			}
			if took := time.Since(t0); took > time.Second {
				t.Errorf("key free only %v after the holder released", took)
			}
			if mode == "cancel" && l.Token < holder.Token+2 {
				// The queued acquire got a grant in between (and gave it back).
				t.Errorf("token %d, want a grant between it and %d", l.Token, holder.Token)
			}
			if err := other.Release(ctx, l); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A restart of the server under traffic ends calls in errors, never in a
// hang, and the client reconnects by itself.
func TestServerRestart(t *testing.T) {
	dir := t.TempDir()
	srv := startServer(t, dir, "")
	addr := srv.addr
	cl := dial(t, addr, client.WithBackoff(10*time.Millisecond, 100*time.Millisecond))

	const workers = 16
	var (
		stop     atomic.Bool
		phase    atomic.Int32 // 0 before stop, 1 server down, 2 restarted
		okAfter  atomic.Int32 // successes after the restart
		errsDown atomic.Int32 // connection errors while down
		wg       sync.WaitGroup
	)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("restart-%d", w%4)
			for !stop.Load() {
				ctx := context.Background() // no deadline: the client alone must not hang
				l, err := cl.Acquire(ctx, key, 2*time.Second, time.Second)
				if err == nil {
					err = cl.Release(ctx, l)
					if err == nil && phase.Load() == 2 {
						okAfter.Add(1)
					}
				}
				var se *client.ServerError
				switch {
				case err == nil, err == client.ErrHeld, err == client.ErrNotHeld:
				case err == client.ErrWaitEnded: // queued when the server shut down
					if phase.Load() == 2 {
						t.Errorf("worker %d: the wait ended early with the server up: %v", w, err)
					}
				case errors.As(err, &se):
					t.Errorf("worker %d: the server refused a request the client sent: %v", w, err)
				case errors.Is(err, client.ErrConnBroken):
					if phase.Load() == 1 {
						errsDown.Add(1)
					}
					time.Sleep(5 * time.Millisecond)
				default:
					t.Errorf("worker %d: unexpected error: %v", w, err)
					time.Sleep(5 * time.Millisecond)
				}
			}
		}()
	}
	time.Sleep(300 * time.Millisecond)
	srv.stop()
	phase.Store(1)
	waitFor(t, 5*time.Second, "connection errors while the server is down", func() bool { return errsDown.Load() >= workers })

	startServer(t, dir, addr)
	phase.Store(2)
	waitFor(t, 10*time.Second, "successful calls after the restart", func() bool { return okAfter.Load() >= workers })

	stop.Store(true)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("workers still in a call 10s after traffic stopped")
	}
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %v", what, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// An E line fails every call still unanswered on that connection, changes no
// lock state, and the client reconnects.
func TestServerErrorFailsConnection(t *testing.T) {
	srv := startServer(t, "", "", "--max-lease", "1s")
	// The client is told a larger limit than the server has, so that a
	// frame the server refuses gets through.
	cl := dial(t, srv.addr, client.WithConns(1), client.WithBackoff(10*time.Millisecond, 50*time.Millisecond))
	other := dial(t, srv.addr, client.WithConns(1))
	ctx := testCtx(t)

	holder, err := cl.Acquire(ctx, "k", time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	queued := make(chan error, 1)
	go func() {
		_, err := cl.Acquire(ctx, "k", time.Second, 10*time.Second)
		queued <- err
	}()
	time.Sleep(100 * time.Millisecond)
	_, err = cl.Acquire(ctx, "other", 2*time.Second, 0)
	var se *client.ServerError
	if !errors.As(err, &se) || se.Code != "range" || !errors.Is(err, client.ErrConnBroken) {
		t.Fatalf("Acquire beyond --max-lease: %v, want a ConnError wrapping a range ServerError", err)
	}
	err = <-queued
	if !errors.As(err, &se) || !errors.Is(err, client.ErrOutcomeUnknown) {
		t.Fatalf("queued Acquire on the same connection: %v, want a ConnError wrapping the ServerError", err)
	}
	if err := other.Release(ctx, holder); err != nil {
		t.Fatalf("release of the lock held before the E line: %v", err)
	}
	waitFor(t, 5*time.Second, "acquire after reconnecting", func() bool {
		l, err := cl.Acquire(ctx, "k", time.Second, 0)
		if err == nil {
			cl.Release(ctx, l)
		}
		return err == nil
	})
}
