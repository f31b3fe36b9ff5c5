package client_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketd/ticketd/client"
	"github.com/ticketd/ticketd/internal/serverproc"
)

// delayProxy listens on a loopback port, returned, and forwards every connection to upstream,
// delaying each chunk by delay in both directions (a network path of
// 2*delay round trip, as a sidecar or a remote node behind a local
// balancer has). The client's handshake is with the proxy, at once.
func delayProxy(t *testing.T, upstream string, delay time.Duration) string {
	t.Helper()
	d := func() time.Duration { return delay }
	return proxy(t, upstream, d, d)
}

// proxy is delayProxy with each chunk's delay read as it comes: up for the
// client's bytes, down for the server's.
func proxy(t *testing.T, upstream string, up, down func() time.Duration) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	pipe := func(dst, src net.Conn, delay func() time.Duration) {
		defer wg.Done()
		type chunk struct {
			b   []byte
			due time.Time
		}
		ch := make(chan chunk, 1024)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := range ch {
				time.Sleep(time.Until(c.due))
				if _, err := dst.Write(c.b); err != nil {
					break
				}
			}
			dst.Close()
		}()
		buf := make([]byte, 64<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				ch <- chunk{append([]byte(nil), buf[:n]...), time.Now().Add(delay())}
			}
			if err != nil {
				close(ch)
				return
			}
		}
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", upstream)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, u)
			mu.Unlock()
			wg.Add(2)
			go pipe(u, c, up)
			go pipe(c, u, down)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// A client whose path to a single-mode ticketd takes 40 ms round trip
// (20 ms each way, behind a proxy that accepts locally) acquires a free key
// with a wait, first thing on its connection: the handshake, answered by
// the proxy, says nothing of the path. Its Lock.Deadline must not be later than the end of the
// lease the server counts; a second client that takes the key as soon as
// the server lets it must not get it before that Deadline.
func TestDeadlineOfAWaitingGrantBehindASlowPath(t *testing.T) {
	srv := startServer(t, "", "")
	farAddr := delayProxy(t, srv.addr, 20*time.Millisecond)
	near := dial(t, srv.addr, client.WithConns(1))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	for _, tc := range []struct {
		name      string
		warmFirst bool // control: a request that does not wait is answered first, so the path's round trip is measured
	}{
		{"first request waits", false},
		{"control: round trip measured first", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "deadline-" + tc.name[:5]
			far := dial(t, farAddr, client.WithConns(1))
			if tc.warmFirst {
				if err := far.Release(ctx, client.Lock{Key: "warm", Token: 1}); err != client.ErrNotHeld {
					t.Fatal(err)
				}
			}
			const lease = 300 * time.Millisecond
			l, err := far.Acquire(ctx, key, lease, 5*time.Second) // a wait, as in the README's example
			if err != nil {
				t.Fatal(err)
			}
			// The other client takes the key the moment the server lets it.
			got := grantedAt(ctx, t, near, key)
			if got.Before(l.Deadline) {
				t.Fatalf("another client was granted the key %v before the first holder's Lock.Deadline "+
					"(lease %v, path 40ms round trip): the Deadline is later than the lease the server counts",
					l.Deadline.Sub(got), lease)
			}
			t.Logf("second grant %v after the first holder's Deadline", got.Sub(l.Deadline))
		})
	}
}

// A grant to an acquire with a wait whose answer is held up on its way
// (a retransmission; the same as a reader that stalls before it reads),
// after a round trip measured quick on the same connection: the lease
// runs on the server from the grant, and Lock.Deadline must not be later.
// Dated from the answer's arrival less that round trip, it was later by
// the hold-up, and another client got the key before it.
func TestDeadlineOfAWaitingGrantWhoseAnswerIsHeldUp(t *testing.T) {
	srv := startServer(t, "", "")
	var down atomic.Int64
	farAddr := proxy(t, srv.addr, func() time.Duration { return 0 }, func() time.Duration { return time.Duration(down.Load()) })
	far := dial(t, farAddr, client.WithConns(1))
	near := dial(t, srv.addr, client.WithConns(1))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for range 3 { // round trips measured quick
		if err := far.Release(ctx, client.Lock{Key: "warm", Token: 1}); err != client.ErrNotHeld {
			t.Fatal(err)
		}
	}
	const lease, holdUp = 300 * time.Millisecond, 200 * time.Millisecond
	down.Store(int64(holdUp))
	l, err := far.Acquire(ctx, "held-up", lease, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	down.Store(0)
	got := grantedAt(ctx, t, near, "held-up")
	if got.Before(l.Deadline) {
		t.Fatalf("another client was granted the key %v before the first holder's Lock.Deadline (lease %v, its answer held up %v)",
			l.Deadline.Sub(got), lease, holdUp)
	}
}

// An acquire whose caller gave up while it was queued, granted as Close
// runs: Close waits for its answer and releases the grant, so that the key
// does not stay held to the lease's end. (It returned once the releases
// queued were answered, and the grant, written by the server, stayed.)
func TestCloseReleasesAGrantItsCallerGaveUpOn(t *testing.T) {
	closeAsAHandOverComes(t, "given-up", func(ctx context.Context, c *client.Client) func() {
		gave, giveUp := context.WithTimeout(ctx, 100*time.Millisecond)
		defer giveUp()
		if _, err := c.Acquire(gave, "given-up", 30*time.Second, 10*time.Second); err == nil {
			t.Fatal("granted a held key")
		}
		return nil
	})
}

// An acquire still waiting when Close runs fails with ErrClosed, and a
// grant already on its way to it is released by Close: its caller can no
// longer use the lock, nor release it.
func TestCloseReleasesAGrantItsCallerStillWaitsFor(t *testing.T) {
	closeAsAHandOverComes(t, "still-waited-for", func(ctx context.Context, c *client.Client) func() {
		waited := make(chan error, 1)
		go func() {
			_, err := c.Acquire(ctx, "still-waited-for", 30*time.Second, 10*time.Second)
			waited <- err
		}()
		time.Sleep(200 * time.Millisecond) // queued on the server by now
		return func() {
			if err := <-waited; !errors.Is(err, client.ErrClosed) {
				t.Fatalf("the acquire waiting as Close ran: %v, want ErrClosed", err)
			}
		}
	})
}

// closeAsAHandOverComes has x hold key, a client c behind a 20 ms proxy
// queue an acquire of it (queue, which returns a check to run once c has
// closed, or nil), then x release it: the key is handed over to c's
// acquire, and its answer is on its way to c as c closes. Close must
// release that grant, so x gets the key again within its wait.
func closeAsAHandOverComes(t *testing.T, key string, queue func(ctx context.Context, c *client.Client) func()) {
	t.Helper()
	srv := startServer(t, "", "")
	farAddr := delayProxy(t, srv.addr, 20*time.Millisecond)
	x := dial(t, srv.addr, client.WithConns(1))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	held, err := x.Acquire(ctx, key, time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.Dial(ctx, farAddr, client.WithConns(1))
	if err != nil {
		t.Fatal(err)
	}
	after := queue(ctx, c)
	if err := x.Release(ctx, held); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if after != nil {
		after()
	}
	if _, err := x.Acquire(ctx, key, time.Second, 2*time.Second); err != nil {
		t.Fatalf("%s, granted as Close ran to the closing client's acquire, is not released: %v", key, err)
	}
}

// grantedAt polls key through cl with acquires that do not wait until one
// is granted, releases it, and returns when it was: the first moment the
// server let another client have the key.
func grantedAt(ctx context.Context, t *testing.T, cl *client.Client, key string) time.Time {
	t.Helper()
	for {
		l, err := cl.Acquire(ctx, key, time.Second, 0)
		if err == nil {
			got := time.Now()
			_ = cl.Release(ctx, l)
			return got
		}
		if err != client.ErrHeld {
			t.Fatal(err)
		}
		time.Sleep(500 * time.Microsecond)
	}
}

// Clients closed in the middle of contended traffic (acquires queued and
// granted, releases in flight, callers that give up) leave no key held but
// by the locks their callers had and could not release once the client was
// closed (Close releases nothing its callers hold): every lease is a
// minute, so a grant that reached no caller, or a release that was lost,
// would still hold its key when those have been released by another
// client.
//
// In single mode every other client is behind a proxy that holds each
// answer up a millisecond; in a 3-node cluster answers come as requests
// commit, and Close's shut waits for those in flight.
func TestCloseInTheMiddleLeavesNoKeyHeld(t *testing.T) {
	t.Run("single", func(t *testing.T) {
		srv := startServer(t, "", "")
		closeInTheMiddle(t, []string{srv.addr, delayProxy(t, srv.addr, time.Millisecond)}, 30*time.Millisecond)
	})
	t.Run("cluster", func(t *testing.T) {
		if testing.Short() {
			t.Skip("starts a 3-node cluster")
		}
		c, err := serverproc.StartCluster("", 3, startTimeout)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Stop(10 * time.Second) })
		closeInTheMiddle(t, []string{strings.Join(c.Addrs(), ",")}, 100*time.Millisecond)
	})
}

// closeInTheMiddle runs TestCloseInTheMiddleLeavesNoKeyHeld's rounds, each
// with a client of the next of addrs (comma-separated addresses of one
// server or cluster), closed after a round's time from least on.
func closeInTheMiddle(t *testing.T, addrs []string, least time.Duration) {
	ctx := testCtx(t)
	keys := []string{"mid-0", "mid-1", "mid-2", "mid-3"}
	x := dial(t, addrs[0])
	var mu sync.Mutex
	var kept []client.Lock // granted to a caller, and not released by it
	total, grants := 0, 0
	for round := range 8 {
		c, err := client.Dial(ctx, addrs[round%len(addrs)], client.WithConns(2))
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for g := range 16 {
			wg.Go(func() {
				key := keys[g%len(keys)]
				for i := 0; ; i++ {
					wait := 5 * time.Second
					if i%3 == 0 {
						wait = time.Duration(5+g) * time.Millisecond // gives up
					}
					actx, cancel := context.WithTimeout(ctx, wait)
					l, err := c.Acquire(actx, key, time.Minute, 2*time.Second)
					cancel()
					if errors.Is(err, client.ErrClosed) {
						return
					}
					if err != nil {
						continue // gave up, or the wait passed
					}
					mu.Lock()
					grants++
					mu.Unlock()
					time.Sleep(time.Duration(i%3) * time.Millisecond)
					if i%2 == 0 {
						err = c.Release(ctx, l)
					} else {
						err = c.ReleaseNoWait(l) // Close sends it if it is queued
					}
					if err != nil {
						mu.Lock()
						kept = append(kept, l)
						mu.Unlock()
					}
					if errors.Is(err, client.ErrClosed) {
						return
					}
				}
			})
		}
		time.Sleep(least + time.Duration(round)*least/3)
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		for _, l := range kept {
			if err := x.Release(ctx, l); err != nil && !errors.Is(err, client.ErrNotHeld) {
				t.Fatalf("releasing %v, kept by its caller: %v", l, err)
			}
		}
		total += len(kept)
		kept = kept[:0]
		for _, key := range keys {
			l, err := x.Acquire(ctx, key, time.Second, 0)
			if err != nil {
				t.Fatalf("round %d: %s, after its client closed and every lock its callers kept was released: %v", round, key, err)
			}
			if err := x.Release(ctx, l); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Logf("%d grants, %d locks kept by their callers as their clients closed", grants, total)
}
