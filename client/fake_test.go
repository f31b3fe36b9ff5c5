package client_test

// Tests against a scripted server on loopback: answer orders and failures that
// a real ticketd produces only by chance.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketd/ticketd/client"
	"github.com/ticketd/ticketd/codec"
	"github.com/ticketd/ticketd/shard"
)

// fakeServer accepts connections on loopback and runs handle on each.
func fakeServer(t *testing.T, handle func(nc net.Conn, r *bufio.Reader)) (addr string, closeListener func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveFake(t, ln, handle)
}

// serveFake runs handle on each connection ln accepts. When the test ends
// it closes the listener and the connections still open (a server started
// after the client would otherwise wait for the client's close), and waits
// for the handlers.
func serveFake(t *testing.T, ln net.Listener, handle func(nc net.Conn, r *bufio.Reader)) (addr string, closeListener func()) {
	var (
		wg    sync.WaitGroup
		once  sync.Once
		mu    sync.Mutex
		conns []net.Conn
	)
	closeListener = func() { once.Do(func() { ln.Close() }) }
	// The accept loop counts too: a connection it takes as the test ends
	// adds to wg only while wg is not zero, never beside Wait.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, nc)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer nc.Close()
				handle(nc, bufio.NewReader(nc))
			}()
		}
	}()
	t.Cleanup(func() {
		closeListener()
		mu.Lock()
		for _, nc := range conns {
			nc.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String(), closeListener
}

// brokenClient is a client of one connection that breaks once it has read
// the first request, and that then has nothing to redial. opts come after
// its own (a short backoff: redials that are refused).
func brokenClient(t *testing.T, opts ...client.Option) *client.Client {
	accepted := make(chan struct{}, 1)
	addr, closeListener := fakeServer(t, func(nc net.Conn, r *bufio.Reader) {
		accepted <- struct{}{}
		readFields(t, r) // then close
	})
	cl := dial(t, addr, append([]client.Option{client.WithConns(1), client.WithBackoff(time.Hour, time.Hour)}, opts...)...)
	<-accepted
	closeListener()
	return cl
}

func readFields(t *testing.T, r *bufio.Reader) []string {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil
	}
	return strings.Fields(line)
}

// Answers in the reverse order of the requests reach the right callers.
func TestOutOfOrderAnswers(t *testing.T) {
	addr, _ := fakeServer(t, func(nc net.Conn, r *bufio.Reader) {
		var reqs [][]string
		for len(reqs) < 4 {
			f := readFields(t, r)
			if f == nil {
				return
			}
			reqs = append(reqs, f)
		}
		for i := len(reqs) - 1; i >= 0; i-- {
			f := reqs[i]
			switch f[0] {
			case "A": // A owner key lease wait: token from the key's number
				fmt.Fprintf(nc, "A %s %s %s\n", strings.TrimPrefix(f[2], "k"), f[1], f[2])
			case "R": // R token key: only key r1 is held
				if f[2] == "r1" {
					fmt.Fprintf(nc, "R %s %s\n", f[1], f[2])
				} else {
					fmt.Fprintf(nc, "N %s %s\n", f[1], f[2])
				}
			}
		}
		r.ReadByte() // until the client goes
	})
	cl := dial(t, addr, client.WithConns(1))
	ctx := testCtx(t)
	var wg sync.WaitGroup
	for _, n := range []int{7, 9} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := cl.Acquire(ctx, fmt.Sprintf("k%d", n), time.Second, 0)
			if err != nil || l.Token != uint64(n) {
				t.Errorf("Acquire(k%d) = %+v, %v; want token %d", n, l, err, n)
			}
		}()
	}
	// Same token, different keys: matched by token and key.
	for _, key := range []string{"r1", "r2"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := cl.Release(ctx, client.Lock{Key: key, Token: 5})
			if want := map[string]error{"r1": nil, "r2": client.ErrNotHeld}[key]; err != want {
				t.Errorf("Release(%s) = %v, want %v", key, err, want)
			}
		}()
	}
	wg.Wait()
}

// A connection that breaks with a request in flight fails it as unknown;
// with nothing to connect to, calls fail at once as not sent.
func TestBrokenConnection(t *testing.T) {
	cl := brokenClient(t)
	ctx := testCtx(t)
	_, err := cl.Acquire(ctx, "k", time.Second, 0)
	var ce *client.ConnError
	if !errors.As(err, &ce) || !ce.Unknown || !errors.Is(err, client.ErrOutcomeUnknown) || !errors.Is(err, client.ErrConnBroken) {
		t.Fatalf("Acquire over a connection closed mid-call: %v, want a ConnError with Unknown", err)
	}
	t0 := time.Now()
	err = cl.Release(ctx, client.Lock{Key: "k", Token: 1})
	if !errors.As(err, &ce) || ce.Unknown || errors.Is(err, client.ErrOutcomeUnknown) {
		t.Fatalf("Release with no connection: %v, want a ConnError without Unknown", err)
	}
	if time.Since(t0) > 100*time.Millisecond {
		t.Errorf("a call with no connection took %v", time.Since(t0))
	}
}

// An answer that matches nothing is a protocol violation: the connection goes.
func TestUnmatchedAnswer(t *testing.T) {
	addr, _ := fakeServer(t, func(nc net.Conn, r *bufio.Reader) {
		if readFields(t, r) == nil {
			return
		}
		fmt.Fprintf(nc, "A 5 stranger k\n")
		r.ReadByte()
	})
	cl := dial(t, addr, client.WithConns(1), client.WithBackoff(time.Hour, time.Hour))
	_, err := cl.Acquire(testCtx(t), "k", time.Second, 0)
	var pe *client.ProtocolError
	if !errors.As(err, &pe) || !errors.Is(err, client.ErrOutcomeUnknown) {
		t.Fatalf("Acquire answered for another owner: %v, want a ProtocolError", err)
	}
}

// Close fails calls in flight and refuses later ones.
func TestClose(t *testing.T) {
	addr, _ := fakeServer(t, func(nc net.Conn, r *bufio.Reader) {
		for readFields(t, r) != nil { // never answers
		}
	})
	cl := dial(t, addr)
	errc := make(chan error, 1)
	go func() {
		_, err := cl.Acquire(context.Background(), "k", time.Second, time.Minute)
		errc <- err
	}()
	time.Sleep(50 * time.Millisecond)
	cl.Close()
	if err := <-errc; !errors.Is(err, client.ErrClosed) {
		t.Fatalf("Acquire in flight at Close: %v, want ErrClosed", err)
	}
	if _, err := cl.Acquire(context.Background(), "k", time.Second, 0); err != client.ErrClosed {
		t.Fatalf("Acquire after Close: %v, want ErrClosed", err)
	}
}

func TestInvalidArguments(t *testing.T) {
	sent := make(chan string, 10)
	addr, _ := fakeServer(t, func(nc net.Conn, r *bufio.Reader) {
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			sent <- line
		}
	})
	cl := dial(t, addr, client.WithConns(1))
	ctx := testCtx(t)
	long := strings.Repeat("k", 251)
	for name, err := range map[string]error{
		"empty key":      errOf(cl.Acquire(ctx, "", time.Second, 0)),
		"space in key":   errOf(cl.Acquire(ctx, "a b", time.Second, 0)),
		"control byte":   errOf(cl.Acquire(ctx, "a\x01", time.Second, 0)),
		"long key":       errOf(cl.Acquire(ctx, long, time.Second, 0)),
		"zero lease":     errOf(cl.Acquire(ctx, "k", 0, 0)),
		"sub-ms lease":   errOf(cl.Acquire(ctx, "k", time.Microsecond, 0)),
		"long lease":     errOf(cl.Acquire(ctx, "k", 2*time.Hour, 0)),
		"negative wait":  errOf(cl.Acquire(ctx, "k", time.Second, -1)),
		"long wait":      errOf(cl.Acquire(ctx, "k", time.Second, 2*time.Hour)),
		"owner space":    errOf(cl.AcquireAs(ctx, "a b", "k", time.Second, 0)),
		"owner long":     errOf(cl.AcquireAs(ctx, strings.Repeat("o", 129), "k", time.Second, 0)),
		"token 0":        cl.Release(ctx, client.Lock{Key: "k"}),
		"release no key": cl.Release(ctx, client.Lock{Token: 1}),
	} {
		if !errors.Is(err, client.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	if _, err := client.Dial(ctx, addr, client.WithConns(0)); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("WithConns(0): %v, want ErrInvalid", err)
	}
	if _, err := client.Dial(ctx, addr, client.WithClientID("a b")); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("WithClientID(\"a b\"): %v, want ErrInvalid", err)
	}
	select {
	case line := <-sent:
		t.Errorf("an invalid call was sent: %q", line)
	case <-time.After(50 * time.Millisecond):
	}
}

func errOf(_ client.Lock, err error) error { return err }

func TestDialRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	_, err = client.Dial(testCtx(t), addr)
	if !errors.Is(err, client.ErrConnBroken) || !strings.Contains(err.Error(), "connection refused") ||
		!strings.Contains(err.Error(), addr) {
		t.Fatalf("Dial to a closed port: %v, want a ConnError naming the address and the refusal", err)
	}
}

// A grant that arrives after its caller gave up is released by the client.
func TestLateGrantReleased(t *testing.T) {
	queued := make(chan []string, 1)
	cancelled := make(chan struct{})
	released := make(chan []string, 1)
	addr, _ := fakeServer(t, func(nc net.Conn, r *bufio.Reader) {
		f := readFields(t, r)
		if f == nil {
			return
		}
		queued <- f // A owner key lease wait: keep it queued
		select {
		case <-cancelled:
		case <-time.After(10 * time.Second):
			return
		}
		fmt.Fprintf(nc, "A 77 %s %s\n", f[1], f[2])
		if f = readFields(t, r); f != nil {
			released <- f
			fmt.Fprintf(nc, "R %s %s\n", f[1], f[2])
		}
		r.ReadByte()
	})
	cl := dial(t, addr, client.WithConns(1))
	ctx, cancel := context.WithCancel(context.Background()) // no deadline: the wait is sent as is
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		_, err := cl.Acquire(ctx, "k", time.Second, time.Minute)
		errc <- err
	}()
	if f := <-queued; len(f) != 5 || f[4] != "60000" {
		t.Fatalf("acquire sent as %q, want wait 60000", f)
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Acquire: %v", err)
	}
	close(cancelled)
	select {
	case f := <-released:
		if strings.Join(f, " ") != "R 77 k" {
			t.Fatalf("after the late grant the client sent %q, want R 77 k", f)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the late grant was not released")
	}
}

// The wait sent is cut to the context's deadline.
func TestWaitCutToDeadline(t *testing.T) {
	got := make(chan []string, 1)
	addr, _ := fakeServer(t, func(nc net.Conn, r *bufio.Reader) {
		f := readFields(t, r)
		got <- f
		fmt.Fprintf(nc, "T %s %s\n", f[1], f[2])
		r.ReadByte()
	})
	cl := dial(t, addr, client.WithConns(1))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	// A T at once to a wait of about 2s: the server ended the wait.
	if _, err := cl.Acquire(ctx, "k", time.Second, time.Hour); err != client.ErrWaitEnded {
		t.Fatalf("Acquire: %v, want ErrWaitEnded", err)
	}
	f := <-got
	if w, _ := strconv.Atoi(f[4]); w > 2000 || w < 1500 {
		t.Fatalf("wait sent %s ms, want at most the 2s left", f[4])
	}
}

// A T that comes before the wait sent could have passed is ErrWaitEnded (the
// server gave up the wait, as at shutdown); one after it, or to wait 0, is
// ErrHeld.
func TestEarlyT(t *testing.T) {
	addr, _ := fakeServer(t, func(nc net.Conn, r *bufio.Reader) {
		for {
			f := readFields(t, r)
			if len(f) != 5 {
				return
			}
			if f[2] == "served" { // answer when the wait has passed
				w, _ := strconv.Atoi(f[4])
				time.Sleep(time.Duration(w) * time.Millisecond)
			}
			fmt.Fprintf(nc, "T %s %s\n", f[1], f[2])
		}
	})
	cl := dial(t, addr, client.WithConns(1))
	ctx := testCtx(t)
	for _, c := range []struct {
		key  string
		wait time.Duration
		want error
	}{
		{"at-once", 0, client.ErrHeld},
		{"served", 100 * time.Millisecond, client.ErrHeld},
		{"ended", 10 * time.Second, client.ErrWaitEnded},
	} {
		_, err := cl.Acquire(ctx, c.key, time.Second, c.wait)
		if err != c.want || !errors.Is(err, client.ErrHeld) {
			t.Errorf("Acquire(%s, wait %v) = %v, want %v (and errors.Is ErrHeld)", c.key, c.wait, err, c.want)
		}
	}
	if errors.Is(client.ErrHeld, client.ErrWaitEnded) {
		t.Error("ErrHeld matches ErrWaitEnded: a T in time would read as a wait the server ended")
	}
}

// With several addresses, an unreachable one is skipped, at Dial and after.
func TestSeveralAddresses(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	var mu sync.Mutex
	conns := 0
	addr, _ := fakeServer(t, func(nc net.Conn, r *bufio.Reader) {
		mu.Lock()
		conns++
		mu.Unlock()
		for f := readFields(t, r); f != nil; f = readFields(t, r) {
			fmt.Fprintf(nc, "T %s %s\n", f[1], f[2])
		}
	})
	cl := dial(t, dead+", "+addr, client.WithConns(3))
	for range 6 {
		if _, err := cl.Acquire(testCtx(t), "k", time.Second, 0); err != client.ErrHeld {
			t.Fatalf("Acquire: %v, want ErrHeld from the live address", err)
		}
	}
	// Dial returns once the kernel has accepted; the fake server counts a
	// connection only when its accept goroutine gets to it.
	count := func() int { mu.Lock(); defer mu.Unlock(); return conns }
	waitFor(t, 5*time.Second, "3 connections to the live address", func() bool { return count() >= 3 })
	if n := count(); n != 3 {
		t.Errorf("%d connections to the live address, want 3", n)
	}
}

// A rolling restart: the node a connection is on goes, then, once the
// first is back, the one it moved to. The connection goes back to its own
// node, not on to the third, where every connection of every client would
// end up. (The restarts here come a few milliseconds apart: the failure
// of the first is forgotten at once, as it is after recentFailure.)
func TestRollingRestartGoesHome(t *testing.T) {
	old := client.SetRecentFailure(0)
	t.Cleanup(func() { client.SetRecentFailure(old) })
	if got := answeringNodes(t, true, true); !slices.Equal(got, []uint64{1, 2, 1}) {
		t.Errorf("answered by nodes %v, want [1 2 1]: its own node, the next while that one is gone, then its own again", got)
	}
}

// A bridge: two nodes cut apart, each without a leader for the shards the
// other leads, both break the connection (E unavailable) in turn. The
// connection goes on to the third node instead of back and forth between
// the two.
func TestTwoFailingNodesLeadToTheThird(t *testing.T) {
	if got := answeringNodes(t, true, true); !slices.Equal(got, []uint64{1, 2, 3}) {
		t.Errorf("answered by nodes %v, want [1 2 3]: its own node, the next, then the one that did not fail", got)
	}
}

// answeringNodes runs one connection over three fake nodes, where node i
// answers with token i and nodes 1 and 2 break (if told to) their first
// connection after one answer, as a node that stops does, and returns the
// tokens of the first three answers.
func answeringNodes(t *testing.T, break1, break2 bool) []uint64 {
	var mu sync.Mutex
	conns := map[int]int{}
	node := func(id int, breakFirst bool) string {
		addr, _ := fakeServer(t, func(nc net.Conn, r *bufio.Reader) {
			mu.Lock()
			conns[id]++
			first := conns[id] == 1
			mu.Unlock()
			for f := readFields(t, r); f != nil; f = readFields(t, r) {
				fmt.Fprintf(nc, "A %d %s %s\n", id, f[1], f[2])
				if breakFirst && first {
					return
				}
			}
		})
		return addr
	}
	addrs := node(1, break1) + "," + node(2, break2) + "," + node(3, false)
	cl := dial(t, addrs, client.WithConns(1), client.WithBackoff(time.Millisecond, 2*time.Millisecond))
	ctx := testCtx(t)
	var tokens []uint64
	for len(tokens) < 3 {
		l, err := cl.Acquire(ctx, "k", time.Second, 0)
		switch {
		case err == nil:
			tokens = append(tokens, l.Token)
		case errors.Is(err, client.ErrConnBroken):
			time.Sleep(time.Millisecond) // between a break and the redial
		default:
			t.Fatal(err)
		}
	}
	return tokens
}

// Reconnects again and again: every frame the client sends stays valid and
// calls succeed once a connection is back.
func TestReconnect(t *testing.T) {
	var mu sync.Mutex
	var bad []string
	addr, _ := fakeServer(t, func(nc net.Conn, r *bufio.Reader) {
		line, err := r.ReadBytes('\n')
		if err != nil {
			return
		}
		var req codec.Request
		if n, perr := codec.ParseRequest(line, codec.Limits{}, &req); n == 0 || perr != nil {
			mu.Lock()
			bad = append(bad, string(line))
			mu.Unlock()
			return
		}
		fmt.Fprintf(nc, "T %s %s\n", req.Owner, req.Key) // then close: one answer per connection
	})
	cl := dial(t, addr, client.WithConns(1), client.WithBackoff(time.Millisecond, 2*time.Millisecond))
	ctx := testCtx(t)
	held := 0
	for held < 30 {
		_, err := cl.Acquire(ctx, "k", time.Second, 0)
		switch {
		case err == client.ErrHeld:
			held++
		case errors.Is(err, client.ErrConnBroken):
			// Sent on a connection about to close (unknown), or none up.
			time.Sleep(time.Millisecond)
		default:
			t.Fatalf("Acquire: %v", err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(bad) > 0 {
		t.Fatalf("invalid frames sent after reconnecting: %q", bad)
	}
}

// A cluster node without quorum answers E unavailable and closes: the call
// fails with an unknown outcome, and the client's next connection goes to
// the next address rather than back to that node.
func TestUnavailableMovesToAnotherNode(t *testing.T) {
	sick, _ := fakeServer(t, func(nc net.Conn, r *bufio.Reader) {
		if readFields(t, r) != nil {
			fmt.Fprintf(nc, "E unavailable a shard of this request has no quorum; outcome unknown, try another node\n")
		}
	})
	healthy, _ := fakeServer(t, func(nc net.Conn, r *bufio.Reader) {
		for f := readFields(t, r); f != nil; f = readFields(t, r) {
			fmt.Fprintf(nc, "A 5 %s %s\n", f[1], f[2])
		}
	})
	cl := dial(t, sick+","+healthy, client.WithConns(1), client.WithBackoff(time.Millisecond, 10*time.Millisecond))
	_, err := cl.Acquire(testCtx(t), "k", time.Second, 0)
	var se *client.ServerError
	if !errors.Is(err, client.ErrOutcomeUnknown) || !errors.As(err, &se) || se.Code != "unavailable" {
		t.Fatalf("Acquire: %v, want an unknown outcome wrapping E unavailable", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		l, err := cl.Acquire(testCtx(t), "k", time.Second, 0)
		if err == nil {
			if l.Token != 5 {
				t.Fatalf("token %d", l.Token)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still failing after 5s: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A release whose connection breaks before its answer is sent again on
// another connection, or on the slot's next one if no other is up, while the
// lock's Deadline has not passed, so that a node failing between a release
// and its answer does not leave the lock held to the end of its lease. The
// copy's R, or its N (the first copy may have released the key), both mean
// released; past the Deadline, or for a Lock without one, the outcome stays
// unknown and nothing is sent again.
func TestReleaseSentAgainAfterBreak(t *testing.T) {
	for _, tc := range []struct {
		name     string
		conns    int
		sickE    bool   // the first node answers E unavailable rather than close
		answer   string // the second node's answer: R or N
		deadline time.Duration
		call     string // Release, ReleaseFunc or ReleaseNoWait
		again    bool   // the release must reach the second node
	}{
		{"closed, R", 2, false, "R", 10 * time.Second, "Release", true},
		{"closed, N", 2, false, "N", 10 * time.Second, "Release", true},
		{"E unavailable, R", 2, true, "R", 10 * time.Second, "Release", true},
		{"ReleaseFunc, N", 2, true, "N", 10 * time.Second, "ReleaseFunc", true},
		{"ReleaseNoWait", 2, false, "R", 10 * time.Second, "ReleaseNoWait", true},
		{"one connection, R", 1, true, "R", 10 * time.Second, "Release", true},
		{"one connection, ReleaseFunc, N", 1, false, "N", 10 * time.Second, "ReleaseFunc", true},
		{"lease over", 2, false, "R", -time.Millisecond, "Release", false},
		{"no deadline", 2, false, "R", 0, "Release", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sick, _ := fakeServer(t, func(nc net.Conn, r *bufio.Reader) {
				if readFields(t, r) != nil && tc.sickE {
					fmt.Fprintf(nc, "E unavailable a shard of this request has no quorum; outcome unknown, try another node\n")
				}
			})
			seen := make(chan []string, 4)
			healthy, _ := fakeServer(t, func(nc net.Conn, r *bufio.Reader) {
				for f := readFields(t, r); f != nil; f = readFields(t, r) {
					seen <- f
					fmt.Fprintf(nc, "%s %s %s\n", tc.answer, f[1], f[2])
				}
			})
			// With two connections, the backoff keeps the first one down
			// once broken; with one, it redials to the second node at once.
			backoff := client.WithBackoff(time.Hour, time.Hour)
			if tc.conns == 1 {
				backoff = client.WithBackoff(time.Millisecond, 10*time.Millisecond)
			}
			cl := dial(t, sick+","+healthy, client.WithConns(tc.conns), backoff)
			key := "k0"
			for i := 1; shard.Index(key, tc.conns) != 0; i++ { // a key of the first connection
				key = "k" + strconv.Itoa(i)
			}
			l := client.Lock{Key: key, Token: 7}
			if tc.deadline != 0 {
				l.Deadline = time.Now().Add(tc.deadline)
			}
			var err error
			switch tc.call {
			case "Release":
				err = cl.Release(testCtx(t), l)
			case "ReleaseFunc":
				res := make(chan error, 1)
				if err := cl.ReleaseFunc(l, func(err error) { res <- err }); err != nil {
					t.Fatal(err)
				}
				err = <-res
			case "ReleaseNoWait":
				if err := cl.ReleaseNoWait(l); err != nil {
					t.Fatal(err)
				}
			}
			switch {
			case !tc.again && !errors.Is(err, client.ErrOutcomeUnknown):
				t.Fatalf("%s past the lease: %v, want an unknown outcome", tc.call, err)
			case tc.again && err != nil:
				t.Fatalf("%s sent again and answered %s: %v, want nil", tc.call, tc.answer, err)
			}
			select {
			case f := <-seen:
				if !tc.again {
					t.Fatalf("sent again past the lease: %q", f)
				}
				if want := []string{"R", "7", key}; !slices.Equal(f, want) {
					t.Fatalf("the second node read %q, want %q", f, want)
				}
			case <-time.After(time.Second):
				if tc.again {
					t.Fatal("the release never reached the second node")
				}
			}
		})
	}
}

// A release held for a connection that never comes up fails with an
// unknown outcome once the lock's Deadline passes, not later.
func TestReleaseHeldUntilDeadline(t *testing.T) {
	cl := brokenClient(t, client.WithBackoff(time.Millisecond, 10*time.Millisecond))
	l := client.Lock{Key: "k", Token: 7, Deadline: time.Now().Add(300 * time.Millisecond)}
	t0 := time.Now()
	err := cl.Release(testCtx(t), l)
	if !errors.Is(err, client.ErrOutcomeUnknown) {
		t.Fatalf("Release with no connection before the lease's end: %v, want an unknown outcome", err)
	}
	if d := time.Since(t0); d < 250*time.Millisecond || d > 5*time.Second {
		t.Fatalf("Release returned after %v, want at the lock's Deadline (300ms)", d)
	}
}

// Close fails a release held for the next connection at once.
func TestCloseFailsHeldRelease(t *testing.T) {
	cl := brokenClient(t, client.WithBackoff(time.Millisecond, 10*time.Millisecond))
	res := make(chan error, 1)
	go func() {
		res <- cl.Release(testCtx(t), client.Lock{Key: "k", Token: 7, Deadline: time.Now().Add(time.Minute)})
	}()
	select {
	case err := <-res:
		t.Fatalf("Release returned %v before Close, with its lease running and no connection", err)
	case <-time.After(200 * time.Millisecond):
	}
	cl.Close()
	select {
	case err := <-res:
		if !errors.Is(err, client.ErrOutcomeUnknown) {
			t.Fatalf("Release held at Close: %v, want an unknown outcome", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Release still held 5s after Close")
	}
}

// A held release whose Deadline passes as Close runs reaches its
// ReleaseFunc func before Close returns, as ReleaseFunc promises: Close
// waits for the timer's goroutine, here held up as it is about to fail it.
func TestReleaseFuncOfAHeldReleaseDueAtCloseIsCalledBeforeCloseReturns(t *testing.T) {
	failing, goOn := make(chan struct{}), make(chan struct{})
	var once sync.Once
	t.Cleanup(client.SetHeldFailing(func() {
		once.Do(func() { close(failing); <-goOn })
	}))
	cl := brokenClient(t, client.WithBackoff(time.Millisecond, 10*time.Millisecond))
	called := make(chan time.Time, 1)
	l := client.Lock{Key: "k", Token: 7, Deadline: time.Now().Add(300 * time.Millisecond)}
	if err := cl.ReleaseFunc(l, func(error) { called <- time.Now() }); err != nil {
		t.Fatal(err)
	}
	select {
	case <-failing: // the timer's goroutine, at the Deadline
	case <-time.After(5 * time.Second):
		t.Fatal("the held release did not fail at its Deadline")
	}
	closed := make(chan time.Time, 1)
	go func() { cl.Close(); closed <- time.Now() }()
	var done time.Time
	select {
	case done = <-closed: // too early: the func is yet to be called
	case <-time.After(200 * time.Millisecond):
	}
	close(goOn)
	at := <-called
	if done.IsZero() {
		select {
		case done = <-closed:
		case <-time.After(5 * time.Second):
			t.Fatal("Close did not return")
		}
	}
	if at.After(done) {
		t.Fatalf("the func was called %v after Close returned", at.Sub(done))
	}
}

// answerReleases answers each line it reads R for its token and key, and
// hands the line's fields to seen, until the client's end.
func answerReleases(t *testing.T, nc net.Conn, r *bufio.Reader, seen chan<- []string) {
	for f := readFields(t, r); f != nil; f = readFields(t, r) {
		seen <- f
		fmt.Fprintf(nc, "R %s %s\n", f[1], f[2])
	}
}

// releasingNode is a node that answers every release (answerReleases); the
// channel returned has each line it read.
func releasingNode(t *testing.T) (addr string, seen <-chan []string) {
	c := make(chan []string, 4)
	addr, _ = fakeServer(t, func(nc net.Conn, r *bufio.Reader) { answerReleases(t, nc, r, c) })
	return addr, c
}

// lateGrantNode reads an acquire and grants it with token 5 after, then,
// with thenRead, reads one more line (the client's release of it), and
// closes the connection with nothing more answered.
func lateGrantNode(t *testing.T, after time.Duration, thenRead bool) string {
	addr, _ := fakeServer(t, func(nc net.Conn, r *bufio.Reader) {
		f := readFields(t, r) // A owner key lease wait
		if f == nil {
			return
		}
		time.Sleep(after)
		fmt.Fprintf(nc, "A 5 %s %s\n", f[1], f[2])
		if thenRead {
			readFields(t, r)
		}
	})
	return addr
}

// A grant that arrives after its caller gave up is released by the client;
// when the connection that brought it breaks at once, the release goes out
// on the next connection rather than leave the lock to its lease.
func TestLateGrantReleasedOnNextConnection(t *testing.T) {
	first := lateGrantNode(t, 300*time.Millisecond, false) // the caller has given up by then
	next, seen := releasingNode(t)
	cl := dial(t, first+","+next, client.WithConns(1), client.WithBackoff(time.Millisecond, 10*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := cl.Acquire(ctx, "k", 10*time.Second, 5*time.Second); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire: %v, want the context's end", err)
	}
	select {
	case f := <-seen:
		if want := []string{"R", "5", "k"}; !slices.Equal(f, want) {
			t.Fatalf("the next node read %q, want %q", f, want)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the late grant was never released on the next connection")
	}
}

// A grant handed over after its acquire waited longer than the lease
// comes with its Deadline past, while the server's lease has only begun.
// Its release, and the release of such a grant nobody wants, must still
// go out again after a break, and at Close: it was dropped as if the
// lease had ended, and the key stayed held to the end of the lease.
func TestReleaseOfAGrantQueuedPastItsLeaseIsSentAgain(t *testing.T) {
	const lease, queued = time.Second, 1500 * time.Millisecond
	t.Run("Release", func(t *testing.T) {
		first := lateGrantNode(t, queued, true) // handed over only then; the release breaks unanswered
		next, seen := releasingNode(t)
		cl := dial(t, first+","+next, client.WithConns(1), client.WithBackoff(time.Millisecond, 10*time.Millisecond))
		l, err := cl.Acquire(testCtx(t), "k", lease, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if d := time.Until(l.Deadline); d > 0 {
			t.Fatalf("the grant's Deadline is %v ahead; the test needs one past", d)
		}
		if err := cl.Release(testCtx(t), l); err != nil {
			t.Fatalf("Release: %v, want nil: the next node released it", err)
		}
		if f := <-seen; !slices.Equal(f, []string{"R", "5", "k"}) {
			t.Fatalf("the next node read %q", f)
		}
	})
	t.Run("unwanted", func(t *testing.T) {
		first := lateGrantNode(t, queued, true) // the caller has given up by then; the client's release breaks unanswered
		next, seen := releasingNode(t)
		cl := dial(t, first+","+next, client.WithConns(1), client.WithBackoff(time.Millisecond, 10*time.Millisecond))
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		if _, err := cl.Acquire(ctx, "k", lease, 5*time.Second); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Acquire: %v, want the context's end", err)
		}
		select {
		case f := <-seen:
			if !slices.Equal(f, []string{"R", "5", "k"}) {
				t.Fatalf("the next node read %q", f)
			}
		case <-time.After(queued + 5*time.Second):
			t.Fatal("the release of the grant nobody wanted was dropped after the break")
		}
	})
	t.Run("Close", func(t *testing.T) {
		var conns atomic.Int32
		seen := make(chan []string, 4)
		addr, _ := fakeServer(t, func(nc net.Conn, r *bufio.Reader) {
			if conns.Add(1) > 1 { // Close's own connection
				answerReleases(t, nc, r, seen)
				return
			}
			f := readFields(t, r)
			readFields(t, r) // EOF: Close shut the sending side
			// A hand-over decided just before the server read the end.
			fmt.Fprintf(nc, "A 5 %s %s\n", f[1], f[2])
		})
		cl, err := client.Dial(testCtx(t), addr, client.WithConns(1))
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			_, err := cl.Acquire(context.Background(), "k", lease, 5*time.Second)
			done <- err
		}()
		time.Sleep(queued)
		cl.Close()
		<-done
		select {
		case f := <-seen:
			if !slices.Equal(f, []string{"R", "5", "k"}) {
				t.Fatalf("Close's connection sent %q", f)
			}
		default:
			t.Fatal("Close did not release the grant that came after its caller was failed")
		}
	})
}

// A server that takes each connection and closes it at once (over its
// --max-conns) is told apart from one that is not there: a call made while
// nothing is up says so, where it said only "no connection is up".
func TestServerThatClosesAtOnceIsNamed(t *testing.T) {
	addr, _ := fakeServer(t, func(nc net.Conn, r *bufio.Reader) {})
	cl := dial(t, addr, client.WithConns(1), client.WithBackoff(time.Hour, time.Hour))
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := cl.Acquire(testCtx(t), "k", time.Second, 0)
		if errors.Is(err, client.ErrClosedAtOnce) && !errors.Is(err, client.ErrOutcomeUnknown) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Acquire with the connection closed at once: %v, want ErrClosedAtOnce", err)
		}
		time.Sleep(20 * time.Millisecond) // the close not read yet: sent, or not yet failed
	}
}
