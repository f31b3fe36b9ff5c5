package client_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ticketd/ticketd/client"
	"github.com/ticketd/ticketd/codec"
)

// A Release whose connection breaks with it in flight is sent again on the
// next connection, also when its caller's ctx ended first: the caller
// wants the lock released whether or not it waits for the answer, and
// dropped, the lock stayed held to the end of its lease. As ReleaseNoWait.
func TestAbandonedReleaseIsSentAgain(t *testing.T) {
	for _, noWait := range []bool{true, false} {
		t.Run(fmt.Sprintf("noWait=%v", noWait), func(t *testing.T) { abandonedRelease(t, noWait) })
	}
}

func abandonedRelease(t *testing.T, noWait bool) {
	addr, seen := releaseServer(t, func(_ net.Conn, f []string) bool {
		return f[0] == "R" // break with the release in flight
	})
	cl := dial(t, addr, client.WithConns(1), client.WithBackoff(400*time.Millisecond, 400*time.Millisecond))
	l, err := cl.Acquire(testCtx(t), "k", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if noWait { // control: sent again on the next connection
		if err := cl.ReleaseNoWait(l); err != nil {
			t.Fatal(err)
		}
	} else if err := cl.Release(ctx, l); !errors.Is(err, context.DeadlineExceeded) {
		t.Logf("Release: %v", err)
	}
	select {
	case f := <-seen:
		if !slices.Equal(f, []string{"R", "5", "k"}) {
			t.Fatalf("next connection read %q", f)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the release, in flight when its connection broke, was not sent again (its caller's ctx ended first)")
	}
}

// An answer timeout under the watch's tick (here 3ns) is watched at 1ms,
// not given to time.NewTicker as 0, which panics in a client goroutine.
func TestTinyAnswerTimeout(t *testing.T) {
	addr, _ := fakeServer(t, func(nc net.Conn, r *bufio.Reader) { _, _ = r.ReadByte() })
	dial(t, addr, client.WithConns(1), client.WithAnswerTimeout(3))
	time.Sleep(50 * time.Millisecond)
}

// doneCtx: Err is nil at Release's first look, Done is already closed, so
// the release is queued and its caller gives up at once (deterministic
// abandonment right after the push).
type doneCtx struct {
	context.Context
	ch   chan struct{}
	once sync.Once
	n    int
	mu   sync.Mutex
}

func (c *doneCtx) Done() <-chan struct{} { return c.ch }
func (c *doneCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
	if c.n == 1 {
		return nil
	}
	return context.Canceled
}

// A Release queued but not yet written when its connection ends (here an
// E line read in the same batch as the grant: the connection writes
// nothing more), whose caller has given up, is held for the next
// connection when no other is up, as ReleaseNoWait's is; failed instead,
// with nobody to tell, it left the lock held to the end of its lease.
func TestAbandonedUnsentReleaseIsHeld(t *testing.T) {
	for _, noWait := range []bool{true, false} {
		t.Run(fmt.Sprintf("noWait=%v", noWait), func(t *testing.T) { abandonedUnsent(t, noWait) })
	}
}

func abandonedUnsent(t *testing.T, noWait bool) {
	addr, seen := releaseServer(t, func(nc net.Conn, f []string) bool {
		if f[0] != "A" {
			return false
		}
		b := fmt.Appendf(nil, "A 5 %s %s\n", f[1], f[2])
		b = codec.AppendError(b, codec.ErrUnavailable)
		_, _ = nc.Write(b)
		time.Sleep(50 * time.Millisecond)
		return true
	})
	cl := dial(t, addr, client.WithConns(1), client.WithBackoff(200*time.Millisecond, 200*time.Millisecond))
	queued := make(chan error, 1)
	err := cl.AcquireFunc("k", time.Minute, 0, func(l client.Lock, err error) {
		if err != nil {
			queued <- err
			return
		}
		// On the reader, after it set ending for the E line: the release
		// stays queued for failUnsent.
		if noWait {
			queued <- cl.ReleaseNoWait(l)
		} else {
			queued <- cl.Release(&doneCtx{Context: context.Background(), ch: closedCh()}, l)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	<-queued
	select {
	case f := <-seen:
		if !slices.Equal(f, []string{"R", "5", "k"}) {
			t.Fatalf("next connection read %q", f)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the release, queued when its connection ended and abandoned by its caller, was never sent")
	}
}

func closedCh() chan struct{} { c := make(chan struct{}); close(c); return c }

// releaseServer is a fake server whose first connection hands each frame
// to first (true: it breaks the connection), and whose later ones grant
// every acquire with token 5 and pass the releases they read on, fields
// split, to the channel returned before answering them R.
func releaseServer(t *testing.T, first func(nc net.Conn, f []string) bool) (string, <-chan []string) {
	var mu sync.Mutex
	conns := 0
	seen := make(chan []string, 8)
	addr, _ := fakeServer(t, func(nc net.Conn, r *bufio.Reader) {
		mu.Lock()
		conns++
		n := conns
		mu.Unlock()
		for f := readFields(t, r); f != nil; f = readFields(t, r) {
			if n == 1 && first(nc, f) {
				return
			}
			switch f[0] {
			case "A":
				fmt.Fprintf(nc, "A 5 %s %s\n", f[1], f[2])
			case "R":
				seen <- f
				fmt.Fprintf(nc, "R %s %s\n", f[1], f[2])
			}
		}
	})
	return addr, seen
}

// Close writes the releases already queued, and waits for their answers: a
// lock given up with ReleaseNoWait just before Close (as in
// ExampleClient_AcquireFunc) is free once Close returns, not held to the
// end of its lease.
func TestCloseWritesQueuedReleases(t *testing.T) {
	srv := startServer(t, "", "")
	probe := dial(t, srv.addr)
	ctx := testCtx(t)
	for i := range 50 {
		key := fmt.Sprintf("close-after-nowait-%d", i)
		cl, err := client.Dial(ctx, srv.addr, client.WithConns(1))
		if err != nil {
			t.Fatal(err)
		}
		l, err := cl.Acquire(ctx, key, time.Minute, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := cl.ReleaseNoWait(l); err != nil {
			t.Fatal(err)
		}
		if err := cl.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := probe.Acquire(ctx, key, time.Second, 0); err != nil {
			t.Fatalf("round %d: after ReleaseNoWait and Close the key is not free: %v", i, err)
		}
	}
}

// A Release whose context ended before the call (a deferred Release on the
// request's context) is sent all the same, as one whose context ends while
// it is queued: its caller wants the lock released.
func TestReleaseWithAnEndedContextIsSent(t *testing.T) {
	srv := startServer(t, "", "")
	cl := dial(t, srv.addr)
	probe := dial(t, srv.addr)
	bg := testCtx(t)
	ctx, cancel := context.WithCancel(bg)
	l, err := cl.Acquire(ctx, "ended-ctx", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := cl.Release(ctx, l); !errors.Is(err, context.Canceled) {
		t.Fatalf("Release: %v, want context.Canceled", err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		_, err := probe.Acquire(bg, "ended-ctx", time.Second, 0)
		if err == nil {
			return
		}
		if !errors.Is(err, client.ErrHeld) || time.Now().After(deadline) {
			t.Fatalf("after Release with an ended context the key is still held: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Clients that close while their releases are unanswered, on connections
// the server then drops (a node that dies, a server shutting down): Close's
// flush stops with its connection, and never takes the mark that the
// teardown puts on the queue, which every slot shares, for a call (a race,
// caught under -race, between the clients' flushes writing it).
func TestCloseFlushStopsWithItsConnection(t *testing.T) {
	gotR := make(chan struct{}, 2)
	drop := make(chan struct{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := serveFake(t, ln, func(nc net.Conn, r *bufio.Reader) {
		if f := readFields(t, r); len(f) == 0 || f[0] != "R" {
			return
		}
		gotR <- struct{}{}
		<-drop // then close, the release unanswered
	})
	var cls []*client.Client
	for range 2 {
		cl := dial(t, addr, client.WithConns(1), client.WithDialTimeout(2*time.Second))
		if err := cl.ReleaseNoWait(client.Lock{Key: "k", Token: 7, Deadline: time.Now().Add(time.Minute)}); err != nil {
			t.Fatal(err)
		}
		cls = append(cls, cl)
	}
	<-gotR
	<-gotR
	var wg sync.WaitGroup
	for _, cl := range cls {
		wg.Go(func() { cl.Close() })
	}
	time.Sleep(50 * time.Millisecond) // both flushes wait for their answers
	close(drop)
	wg.Wait()
}
