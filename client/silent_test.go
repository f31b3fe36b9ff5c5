package client_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketd/ticketd/client"
)

// answerAll is a fake node that grants every acquire and releases every
// release at once, counting the requests.
func answerAll(t *testing.T, seen *atomic.Int64) string {
	addr, _ := fakeServer(t, func(nc net.Conn, r *bufio.Reader) {
		for f := readFields(t, r); f != nil; f = readFields(t, r) {
			seen.Add(1)
			if f[0] == "A" {
				fmt.Fprintf(nc, "A 1 %s %s\n", f[1], f[2])
			} else {
				fmt.Fprintf(nc, "R %s %s\n", f[1], f[2])
			}
		}
	})
	return addr
}

// A connection that reads but never answers (a node gone without a reset,
// a cut link) is given up after WithAnswerTimeout: the acquire in flight on
// it fails with an unknown outcome, the release in flight is sent again to
// the other node, and new calls go there.
func TestSilentConnectionIsGivenUp(t *testing.T) {
	silent, _ := fakeServer(t, func(nc net.Conn, r *bufio.Reader) {
		for readFields(t, r) != nil {
		}
	})
	var seen atomic.Int64
	healthy := answerAll(t, &seen)
	cl := dial(t, silent+","+healthy, client.WithConns(1), client.WithAnswerTimeout(300*time.Millisecond),
		client.WithBackoff(10*time.Millisecond, 50*time.Millisecond))

	acq := make(chan error, 1)
	go func() {
		_, err := cl.Acquire(testCtx(t), "a", time.Minute, 0)
		acq <- err
	}()
	l := client.Lock{Key: "k", Token: 7, Deadline: time.Now().Add(time.Minute)}
	if err := cl.Release(testCtx(t), l); err != nil {
		t.Fatalf("Release = %v, want it carried out by the other node", err)
	}
	if err := <-acq; !errors.Is(err, client.ErrOutcomeUnknown) {
		t.Fatalf("the acquire left on the silent connection: %v, want an unknown outcome", err)
	}
	if _, err := cl.Acquire(testCtx(t), "b", time.Minute, 0); err != nil {
		t.Fatalf("a new acquire: %v", err)
	}
	if n := seen.Load(); n != 2 {
		t.Fatalf("the healthy node saw %d requests, want the release and the new acquire", n)
	}
}

// A connection that answers slowly but steadily is not silent: only a
// request overdue while nothing arrives counts.
func TestSlowAnswersAreNotSilence(t *testing.T) {
	addr, _ := fakeServer(t, func(nc net.Conn, r *bufio.Reader) {
		for f := readFields(t, r); f != nil; f = readFields(t, r) {
			time.Sleep(150 * time.Millisecond)
			fmt.Fprintf(nc, "A 1 %s %s\n", f[1], f[2])
		}
	})
	cl := dial(t, addr, client.WithConns(1), client.WithAnswerTimeout(400*time.Millisecond))
	errs := make(chan error, 8)
	for i := range 8 { // the last is answered 1.2 s after it was sent
		go func() {
			_, err := cl.Acquire(testCtx(t), fmt.Sprint("k", i), time.Minute, 0)
			errs <- err
		}()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// A release sent again after its connection broke, answered N after the
// lock's Deadline, has an unknown outcome: the lease may have ended and the
// key gone on before the first copy, if it was carried out, released it.
func TestResentReleaseAnsweredNAfterDeadline(t *testing.T) {
	broken, _ := fakeServer(t, func(nc net.Conn, r *bufio.Reader) {
		readFields(t, r) // read the release, close without answering
	})
	slow, _ := fakeServer(t, func(nc net.Conn, r *bufio.Reader) {
		for f := readFields(t, r); f != nil; f = readFields(t, r) {
			time.Sleep(400 * time.Millisecond)
			fmt.Fprintf(nc, "N %s %s\n", f[1], f[2])
		}
	})
	cl := dial(t, broken+","+slow, client.WithConns(1), client.WithBackoff(time.Millisecond, 10*time.Millisecond))
	l := client.Lock{Key: "k", Token: 7, Deadline: time.Now().Add(200 * time.Millisecond)}
	if err := cl.Release(testCtx(t), l); !errors.Is(err, client.ErrOutcomeUnknown) {
		t.Fatalf("Release = %v, want an unknown outcome", err)
	}
}

// A server that accepts and closes at once (over its --max-conns, a node
// crash-looping at start) is redialled with a growing pause, not at the
// shortest one for ever.
func TestAcceptThenCloseBacksOff(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var accepts atomic.Int64
	first := make(chan struct{})
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			if accepts.Add(1) == 1 {
				go func() { <-first; nc.Close() }() // up until the client is
				continue
			}
			nc.Close()
		}
	}()
	cl := dial(t, ln.Addr().String(), client.WithConns(1), client.WithBackoff(20*time.Millisecond, time.Second))
	close(first)
	time.Sleep(1500 * time.Millisecond)
	cl.Close()
	// Pauses of 10-20, 20-40, 40-80, ... ms: at most 8 redials in 1.5 s;
	// 20-40 ms each for ever would be 40 or more.
	if n := accepts.Load() - 1; n > 10 {
		t.Fatalf("%d redials in 1.5 s of a server that closes at once", n)
	}
}

// Close fails a release held for the next connection with an error that
// wraps ErrClosed, as Close says.
func TestCloseFailsAHeldReleaseWithErrClosed(t *testing.T) {
	cl := brokenClient(t, client.WithBackoff(time.Millisecond, 10*time.Millisecond))
	res := make(chan error, 1)
	go func() {
		res <- cl.Release(context.Background(), client.Lock{Key: "k", Token: 7, Deadline: time.Now().Add(time.Minute)})
	}()
	time.Sleep(200 * time.Millisecond)
	cl.Close()
	if err := <-res; !errors.Is(err, client.ErrClosed) || !errors.Is(err, client.ErrOutcomeUnknown) {
		t.Fatalf("Release = %v, want an unknown outcome that wraps ErrClosed", err)
	}
}

// A call made by a caller woken by an answer that came just before an E line
// is not written to the connection that the E ends: it is left to another
// connection, as one never sent (or carried out there).
func TestCallsAfterAnELineGoElsewhere(t *testing.T) {
	var after atomic.Int64
	ending, _ := fakeServer(t, func(nc net.Conn, r *bufio.Reader) {
		f := readFields(t, r)
		if f == nil {
			return
		}
		fmt.Fprintf(nc, "A 1 %s %s\nE syntax bad\n", f[1], f[2])
		for readFields(t, r) != nil {
			after.Add(1)
		}
	})
	cl := dial(t, ending, client.WithConns(1), client.WithBackoff(time.Hour, time.Hour))
	next := make(chan error, 1)
	err := cl.AcquireFunc("k1", time.Minute, 0, func(_ client.Lock, err error) {
		if err != nil {
			next <- err
			return
		}
		if err := cl.AcquireFunc("k2", time.Minute, 0, func(_ client.Lock, err error) { next <- err }); err != nil {
			next <- err
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	err = <-next
	if err == nil || errors.Is(err, client.ErrOutcomeUnknown) || !errors.Is(err, client.ErrConnBroken) {
		t.Fatalf("the call made after the answer before E: %v, want a *ConnError that it was not sent", err)
	}
	time.Sleep(50 * time.Millisecond)
	if n := after.Load(); n != 0 {
		t.Fatalf("the server read %d requests after its E line", n)
	}
}
