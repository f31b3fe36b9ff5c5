package client_test

import (
	"bufio"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketd/ticketd/client"
)

// tokenNode answers as a fake node that grants every acquire with its own
// id as the token (after delay, for keys starting with "slow") and releases
// every release.
func tokenNode(t *testing.T, id int, delay time.Duration) func(nc net.Conn, r *bufio.Reader) {
	return recordingNode(t, id, delay, nil)
}

// recordingNode is tokenNode that also sends each release it answers, as
// "node <id>: R <token> <key>", to released (if not nil).
func recordingNode(t *testing.T, id int, delay time.Duration, released chan<- string) func(nc net.Conn, r *bufio.Reader) {
	return func(nc net.Conn, r *bufio.Reader) {
		for f := readFields(t, r); f != nil; f = readFields(t, r) {
			switch {
			case f[0] == "A" && strings.HasPrefix(f[2], "slow"):
				time.Sleep(delay)
				fmt.Fprintf(nc, "A %d %s %s\n", id, f[1], f[2])
			case f[0] == "A":
				fmt.Fprintf(nc, "A %d %s %s\n", id, f[1], f[2])
			case f[0] == "R":
				if released != nil {
					released <- fmt.Sprintf("node %d: R %s %s", id, f[1], f[2])
				}
				fmt.Fprintf(nc, "R %s %s\n", f[1], f[2])
			}
		}
	}
}

// downAddr reserves a loopback address with nothing listening on it.
func downAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func listenOn(t *testing.T, addr string) net.Listener {
	for range 50 {
		if ln, err := net.Listen("tcp", addr); err == nil {
			return ln
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("cannot listen on %s again", addr)
	return nil
}

// A connection whose own node was down when it dialled (or that moved off
// it) goes back once the node is up, with no call failing on the way.
func TestGoesHomeOnceBack(t *testing.T) {
	t.Cleanup(client.SetGoHome(20*time.Millisecond, time.Second))
	home := downAddr(t)
	other, _ := fakeServer(t, tokenNode(t, 2, 0))
	cl := dial(t, home+","+other, client.WithConns(1))
	ctx := testCtx(t)
	acquire := func() uint64 {
		t.Helper()
		l, err := cl.Acquire(ctx, "k", time.Second, 0)
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		if err := cl.Release(ctx, l); err != nil {
			t.Fatalf("Release: %v", err)
		}
		return l.Token
	}
	if tok := acquire(); tok != 2 {
		t.Fatalf("answered by node %d with node 1 down, want 2", tok)
	}
	serveFake(t, listenOn(t, home), tokenNode(t, 1, 0))
	deadline := time.Now().Add(10 * time.Second)
	for acquire() != 1 {
		if time.Now().After(deadline) {
			t.Fatal("still on node 2 after 10s with node 1 back")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Going home waits for the answers to what was sent on the old connection;
// calls made meanwhile wait too, then go out on the new one.
func TestGoingHomeDrainsFirst(t *testing.T) {
	t.Cleanup(client.SetGoHome(50*time.Millisecond, 5*time.Second))
	home := downAddr(t)
	other, _ := fakeServer(t, tokenNode(t, 2, 400*time.Millisecond))
	cl := dial(t, home+","+other, client.WithConns(1))
	serveFake(t, listenOn(t, home), tokenNode(t, 1, 400*time.Millisecond))
	ctx := testCtx(t)

	// Slow acquires keep the old connection busy past goHomeAfter; quick
	// ones go on beside them. Every call must succeed; the quick ones end
	// up on node 1.
	var failed atomic.Pointer[error]
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 5; i++ {
			if _, err := cl.Acquire(ctx, "slow-"+strconv.Itoa(i), time.Second, 0); err != nil {
				failed.CompareAndSwap(nil, &err)
				return
			}
		}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; ; i++ {
		l, err := cl.Acquire(ctx, "quick-"+strconv.Itoa(i), time.Second, 0)
		if err != nil {
			t.Fatalf("quick Acquire %d: %v", i, err)
		}
		if l.Token == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("still on node 2 after 10s with node 1 up")
		}
		time.Sleep(5 * time.Millisecond)
	}
	<-done
	if p := failed.Load(); p != nil {
		t.Fatalf("slow Acquire: %v", *p)
	}
}

// While an acquire that may wait in the server's queue is pending, a
// connection does not go home: holding new calls until the queued one is
// answered would hold them for as long as it waits.
func TestNoGoingHomeWhileAcquireQueued(t *testing.T) {
	t.Cleanup(client.SetGoHome(10*time.Millisecond, 5*time.Second))
	home := downAddr(t)
	// Node 2 answers at once, except an acquire with a wait, which it
	// grants 1.5 s later.
	other, _ := fakeServer(t, func(nc net.Conn, r *bufio.Reader) {
		var mu sync.Mutex
		for f := readFields(t, r); f != nil; f = readFields(t, r) {
			switch {
			case f[0] == "A" && f[4] != "0":
				go func() {
					time.Sleep(1500 * time.Millisecond)
					mu.Lock()
					fmt.Fprintf(nc, "A 2 %s %s\n", f[1], f[2])
					mu.Unlock()
				}()
			case f[0] == "A":
				mu.Lock()
				fmt.Fprintf(nc, "A 2 %s %s\n", f[1], f[2])
				mu.Unlock()
			}
		}
	})
	cl := dial(t, home+","+other, client.WithConns(1))
	serveFake(t, listenOn(t, home), tokenNode(t, 1, 0))
	ctx := testCtx(t)

	queued := make(chan time.Time, 1)
	go func() {
		if _, err := cl.Acquire(ctx, "queued", time.Second, 10*time.Second); err != nil {
			t.Errorf("queued Acquire: %v", err)
		}
		queued <- time.Now()
	}()
	time.Sleep(500 * time.Millisecond) // ten go-home periods
	sent := time.Now()
	l, err := cl.Acquire(ctx, "quick", time.Second, 0)
	answered := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-queued:
		t.Fatalf("the queued acquire was answered (%v after the quick one was sent) before the quick one (%v, token %d): calls were held behind it",
			at.Sub(sent), answered.Sub(sent), l.Token)
	default:
	}
	if l.Token != 2 {
		t.Errorf("quick acquire answered by node %d while the queued one is pending on node 2, want 2", l.Token)
	}
	<-queued
}

// A Close while a connection waits to go home (its new requests held back
// until the old connection drains) still sends the releases held back:
// their locks are freed now rather than at the end of their leases.
func TestCloseWhileGoingHomeSendsHeldReleases(t *testing.T) {
	t.Cleanup(client.SetGoHome(20*time.Millisecond, 5*time.Second))
	released := make(chan string, 4)
	node := func(id int) func(nc net.Conn, r *bufio.Reader) {
		return recordingNode(t, id, 600*time.Millisecond, released)
	}
	home := downAddr(t)
	other, _ := fakeServer(t, node(2))
	cl := dial(t, home+","+other, client.WithConns(1))
	ctx := testCtx(t)
	l, err := cl.Acquire(ctx, "k", time.Minute, 0)
	if err != nil || l.Token != 2 {
		t.Fatalf("Acquire with node 1 down: token %d, %v; want node 2's", l.Token, err)
	}

	// A slow acquire keeps the connection to node 2 from draining, so the
	// move home, once it has its connection, holds new requests back.
	go func() { _, _ = cl.Acquire(ctx, "slow", time.Minute, 0) }()
	time.Sleep(50 * time.Millisecond)
	dialled := make(chan struct{}, 1)
	homeNode := node(1)
	serveFake(t, listenOn(t, home), func(nc net.Conn, r *bufio.Reader) {
		select {
		case dialled <- struct{}{}:
		default:
		}
		homeNode(nc, r)
	})
	select {
	case <-dialled:
	case <-time.After(5 * time.Second):
		t.Fatal("the connection did not try to go home within 5s")
	}
	time.Sleep(50 * time.Millisecond) // the slow acquire is still unanswered: the move waits

	if err := cl.ReleaseNoWait(l); err != nil {
		t.Fatal(err)
	}
	cl.Close()
	select {
	case got := <-released:
		if want := "R 2 k"; !strings.HasSuffix(got, want) {
			t.Fatalf("released %q, want %q", got, want)
		}
	default:
		t.Fatal("Close returned without sending the release held back for the move home: the lock stays held to its lease's end")
	}
}

// A Close just after a move home was decided waits for the connection home
// and sends the releases held back for it there.
func TestCloseAsAMoveHomeIsDecidedSendsHeldReleases(t *testing.T) {
	t.Cleanup(client.SetGoHome(20*time.Millisecond, 5*time.Second))
	released := make(chan string, 4)
	node := func(id int) func(nc net.Conn, r *bufio.Reader) {
		return recordingNode(t, id, 600*time.Millisecond, released)
	}
	// Set before the client starts: its goroutines read it.
	decided, resume := make(chan struct{}), make(chan struct{})
	var once sync.Once
	t.Cleanup(client.SetBeforeMoveHome(func() {
		once.Do(func() { close(decided); <-resume })
	}))
	home := downAddr(t)
	other, _ := fakeServer(t, node(2))
	cl := dial(t, home+","+other, client.WithConns(1))
	ctx := testCtx(t)
	l, err := cl.Acquire(ctx, "k", time.Minute, 0)
	if err != nil || l.Token != 2 {
		t.Fatalf("Acquire with node 1 down: token %d, %v; want node 2's", l.Token, err)
	}

	serveFake(t, listenOn(t, home), node(1))
	select {
	case <-decided:
	case <-time.After(5 * time.Second):
		t.Fatal("no move home within 5s")
	}
	if err := cl.ReleaseNoWait(l); err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	go func() { cl.Close(); close(closed) }()
	time.Sleep(50 * time.Millisecond) // Close is under way
	close(resume)
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return within 10s")
	}
	select {
	case got := <-released:
		if want := "node 1: R 2 k"; got != want {
			t.Fatalf("released %q, want %q", got, want)
		}
	default:
		t.Fatal("Close returned without sending the release held back for the move home: the lock stays held to its lease's end")
	}
}

// A connection that goes home dates the grants of acquires that may have
// waited from their send until an answer there measures its round trip:
// the round trip of the node it left is another path's, maybe nearer. (The
// home node here answers "slow" keys late, as a far node would.)
func TestGoingHomeForgetsTheOtherNodesRoundTrip(t *testing.T) {
	t.Cleanup(client.SetGoHome(20*time.Millisecond, time.Second))
	const delay, lease = 100 * time.Millisecond, 10 * time.Second
	home := downAddr(t)
	other, _ := fakeServer(t, tokenNode(t, 2, 0))
	cl := dial(t, home+","+other, client.WithConns(1))
	ctx := testCtx(t)
	// A request that does not wait measures the near node's round trip.
	if l, err := cl.Acquire(ctx, "near", lease, 0); err != nil || l.Token != 2 {
		t.Fatalf("Acquire with node 1 down: %+v, %v", l, err)
	}
	serveFake(t, listenOn(t, home), tokenNode(t, 1, delay))
	// Acquires that may wait show the move and measure nothing.
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; ; i++ {
		l, err := cl.Acquire(ctx, "k"+strconv.Itoa(i), lease, time.Second)
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		if l.Token == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("still on node 2 after 10s with node 1 back")
		}
		time.Sleep(5 * time.Millisecond)
	}
	l, err := cl.Acquire(ctx, "slow", lease, time.Second)
	answered := time.Now()
	if err != nil || l.Token != 1 {
		t.Fatalf("Acquire of slow at home: %+v, %v", l, err)
	}
	// Granted anywhere between the send and the answer, as the client
	// knows: its Deadline counts from the send, at least delay before.
	if latest := answered.Add(lease - delay/2); l.Deadline.After(latest) {
		t.Fatalf("Deadline %v after the answer less %v plus the lease: dated by the other node's round trip",
			l.Deadline.Sub(answered.Add(lease)), delay/2)
	}
}
