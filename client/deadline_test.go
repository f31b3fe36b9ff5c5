package client_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/ticketd/ticketd/client"
)

// delayProxy listens on a loopback port, returned, and forwards every connection to upstream,
// delaying each chunk by delay in both directions (a network path of
// 2*delay round trip, as a sidecar or a remote node behind a local
// balancer has). The client's handshake is with the proxy, at once.
func delayProxy(t *testing.T, upstream string, delay time.Duration) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	pipe := func(dst, src net.Conn) {
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
				ch <- chunk{append([]byte(nil), buf[:n]...), time.Now().Add(delay)}
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
			go pipe(u, c)
			go pipe(c, u)
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
			var got time.Time
			for {
				l2, err := near.Acquire(ctx, key, time.Second, 0)
				if err == nil {
					got = time.Now()
					_ = near.Release(ctx, l2)
					break
				}
				if err != client.ErrHeld {
					t.Fatal(err)
				}
				time.Sleep(500 * time.Microsecond)
			}
			if got.Before(l.Deadline) {
				t.Fatalf("another client was granted the key %v before the first holder's Lock.Deadline "+
					"(lease %v, path 40ms round trip): the Deadline is later than the lease the server counts",
					l.Deadline.Sub(got), lease)
			}
			t.Logf("second grant %v after the first holder's Deadline", got.Sub(l.Deadline))
		})
	}
}
