package client_test

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketd/ticketd/client"
)

type lockResult struct {
	l   client.Lock
	err error
}

// acquireFunc calls AcquireFunc and returns the channel its func answers on.
func acquireFunc(t *testing.T, cl *client.Client, key string, lease, wait time.Duration) <-chan lockResult {
	t.Helper()
	ch := make(chan lockResult, 1)
	if err := cl.AcquireFunc(key, lease, wait, func(l client.Lock, err error) { ch <- lockResult{l, err} }); err != nil {
		t.Fatalf("AcquireFunc(%s): %v", key, err)
	}
	return ch
}

func releaseFunc(t *testing.T, cl *client.Client, l client.Lock) <-chan error {
	t.Helper()
	ch := make(chan error, 1)
	if err := cl.ReleaseFunc(l, func(err error) { ch <- err }); err != nil {
		t.Fatalf("ReleaseFunc(%s): %v", l.Key, err)
	}
	return ch
}

func recvWithin[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(20 * time.Second):
		t.Fatalf("%s: no call of the func after 20s", what)
		panic("unreachable")
	}
}

// AcquireFunc and ReleaseFunc give their funcs what Acquire and Release
// return, and refuse bad arguments without calling them.
func TestAcquireFunc(t *testing.T) {
	srv := startServer(t, "", "")
	cl := dial(t, srv.addr)

	before := time.Now()
	r := recvWithin(t, acquireFunc(t, cl, "invoices", 30*time.Second, 0), "AcquireFunc")
	if r.err != nil || r.l.Key != "invoices" || r.l.Token == 0 || r.l.Owner() == "" {
		t.Fatalf("AcquireFunc gave %+v, %v; want key invoices, a token and an owner", r.l, r.err)
	}
	if r.l.Deadline.Before(before.Add(30*time.Second)) || r.l.Deadline.After(time.Now().Add(30*time.Second)) {
		t.Errorf("Deadline %v not within [send, answer] + 30s", r.l.Deadline)
	}
	if h := recvWithin(t, acquireFunc(t, cl, "invoices", 30*time.Second, 0), "second AcquireFunc"); h.err != client.ErrHeld {
		t.Fatalf("second AcquireFunc gave %v, want ErrHeld", h.err)
	}

	// A queued acquire is granted by the release, with a higher token.
	other := dial(t, srv.addr, client.WithConns(1))
	queued := acquireFunc(t, other, "invoices", 30*time.Second, 10*time.Second)
	time.Sleep(50 * time.Millisecond) // let it queue; a grant before the release would be a double grant
	select {
	case q := <-queued:
		t.Fatalf("AcquireFunc of a held key returned %+v, %v before the release", q.l, q.err)
	default:
	}
	if err := recvWithin(t, releaseFunc(t, cl, r.l), "ReleaseFunc"); err != nil {
		t.Fatalf("ReleaseFunc: %v", err)
	}
	q := recvWithin(t, queued, "queued AcquireFunc")
	if q.err != nil || q.l.Token <= r.l.Token {
		t.Fatalf("queued AcquireFunc gave %+v, %v; want a token above %d", q.l, q.err, r.l.Token)
	}
	if err := recvWithin(t, releaseFunc(t, cl, r.l), "second ReleaseFunc"); err != client.ErrNotHeld {
		t.Fatalf("second ReleaseFunc: %v, want ErrNotHeld", err)
	}

	called := func(client.Lock, error) { t.Error("func called for a refused AcquireFunc") }
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"bad key", cl.AcquireFunc("a key", time.Second, 0, called)},
		{"no lease", cl.AcquireFunc("k", 0, 0, called)},
		{"negative wait", cl.AcquireFunc("k", time.Second, -time.Second, called)},
		{"nil func", cl.AcquireFunc("k", time.Second, 0, nil)},
		{"release of token 0", cl.ReleaseFunc(client.Lock{Key: "k"}, func(error) { t.Error("func called for a refused ReleaseFunc") })},
		{"nil release func", cl.ReleaseFunc(client.Lock{Key: "k", Token: 1}, nil)},
	} {
		if !errors.Is(tc.err, client.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", tc.name, tc.err)
		}
	}
	cl.Close()
	if err := cl.AcquireFunc("k", time.Second, 0, called); err != client.ErrClosed {
		t.Fatalf("AcquireFunc after Close: %v, want ErrClosed", err)
	}
}

// Funcs that queue the next acquire and release from inside themselves run
// chains of lock pairs with no goroutine of their own, beside callers that
// block on the same connections; every key's tokens grow.
func TestFuncChains(t *testing.T) {
	const (
		chains = 64
		pairs  = 200
	)
	srv := startServer(t, "", "")
	cl := dial(t, srv.addr, client.WithConns(2))
	var (
		wg     sync.WaitGroup
		failed atomic.Pointer[error]
	)
	fail := func(err error) {
		failed.CompareAndSwap(nil, &err)
		wg.Done()
	}
	type chain struct {
		key        string
		left       int
		last       uint64
		onAcq      func(client.Lock, error)
		onRel      func(error)
		start      func()
		releaseNow bool // ReleaseNoWait instead of ReleaseFunc, every other pair
	}
	wg.Add(chains)
	all := make([]*chain, chains)
	for i := range all {
		c := &chain{key: fmt.Sprintf("chain-%d", i), left: pairs}
		c.start = func() {
			if c.left == 0 {
				wg.Done()
				return
			}
			c.left--
			if err := cl.AcquireFunc(c.key, 30*time.Second, 0, c.onAcq); err != nil {
				fail(err)
			}
		}
		c.onAcq = func(l client.Lock, err error) {
			switch {
			case err != nil:
				fail(fmt.Errorf("%s: %w", c.key, err))
			case l.Token <= c.last:
				fail(fmt.Errorf("%s: token %d after %d", c.key, l.Token, c.last))
			default:
				c.last = l.Token
				c.releaseNow = !c.releaseNow
				if c.releaseNow {
					if err := cl.ReleaseNoWait(l); err != nil {
						fail(err)
						return
					}
					c.start()
				} else if err := cl.ReleaseFunc(l, c.onRel); err != nil {
					fail(err)
				}
			}
		}
		c.onRel = func(err error) {
			if err != nil {
				fail(fmt.Errorf("%s: release: %w", c.key, err))
				return
			}
			c.start()
		}
		all[i] = c
	}
	ctx := testCtx(t)
	var blocking sync.WaitGroup
	for i := range 8 {
		blocking.Go(func() {
			key := fmt.Sprintf("blocking-%d", i)
			for range pairs {
				l, err := cl.Acquire(ctx, key, 30*time.Second, 0)
				if err == nil {
					err = cl.Release(ctx, l)
				}
				if err != nil {
					t.Errorf("%s: %v", key, err)
					return
				}
			}
		})
	}
	for _, c := range all {
		c.start()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); blocking.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("chains not done after 60s")
	}
	if p := failed.Load(); p != nil {
		t.Fatal(*p)
	}
}

// A func gets a *ConnError that marks the outcome unknown when the
// connection breaks with its request in flight, and with nothing to connect
// to, AcquireFunc fails at once and the func is never called.
func TestFuncBrokenConnection(t *testing.T) {
	cl := brokenClient(t)
	r := recvWithin(t, acquireFunc(t, cl, "k", time.Second, 0), "AcquireFunc on a connection that breaks")
	var ce *client.ConnError
	if !errors.As(r.err, &ce) || !ce.Unknown || !errors.Is(r.err, client.ErrOutcomeUnknown) {
		t.Fatalf("AcquireFunc over a connection closed mid-call gave %v, want a ConnError with Unknown", r.err)
	}
	err := cl.ReleaseFunc(client.Lock{Key: "k", Token: 1}, func(error) { t.Error("func called for a release that was not queued") })
	if !errors.As(err, &ce) || ce.Unknown {
		t.Fatalf("ReleaseFunc with no connection: %v, want a ConnError without Unknown", err)
	}
}

// Close calls the func of an acquire in flight with ErrClosed.
func TestFuncClose(t *testing.T) {
	addr, _ := fakeServer(t, func(nc net.Conn, r *bufio.Reader) {
		for readFields(t, r) != nil { // never answers
		}
	})
	cl := dial(t, addr)
	ch := acquireFunc(t, cl, "k", time.Second, time.Minute)
	time.Sleep(50 * time.Millisecond)
	cl.Close()
	if r := recvWithin(t, ch, "AcquireFunc in flight at Close"); !errors.Is(r.err, client.ErrClosed) {
		t.Fatalf("AcquireFunc in flight at Close gave %v, want ErrClosed", r.err)
	}
}
