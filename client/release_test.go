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
	var mu sync.Mutex
	conns := 0
	seen := make(chan []string, 8)
	addr, _ := fakeServer(t, func(nc net.Conn, r *bufio.Reader) {
		mu.Lock()
		conns++
		n := conns
		mu.Unlock()
		for f := readFields(t, r); f != nil; f = readFields(t, r) {
			switch {
			case f[0] == "A":
				fmt.Fprintf(nc, "A 5 %s %s\n", f[1], f[2])
			case f[0] == "R" && n == 1:
				return // break with the release in flight
			case f[0] == "R":
				seen <- f
				fmt.Fprintf(nc, "R %s %s\n", f[1], f[2])
			}
		}
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
		mu.Lock()
		t.Logf("connections accepted: %d", conns)
		mu.Unlock()
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
