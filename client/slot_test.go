package client

import (
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/ticketd/ticketd/shard"
)

// The queue of a slot that made way for its connection home may be
// emptied twice when the client closes at that moment (by serve, then by
// run): the second time finds the closed mark and must leave it alone.
func TestFailUnsentTwice(t *testing.T) {
	cl := &Client{addrs: []string{"127.0.0.1:1"}}
	s := newSlot(cl, 0)
	s.head.Store(nil)
	done := make(chan struct{})
	go func() {
		s.failUnsent(ErrClosed)
		s.failUnsent(ErrClosed)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the second failUnsent did not return")
	}
	if s.head.Load() != closedCall {
		t.Fatal("queue not left closed")
	}
}

// Requests that a connection had not yet written when it broke go out on
// another in the order they were made: the release of a key before the
// next acquire of it, which sent first would find the key held.
func TestUnsentRequestsKeepTheirOrder(t *testing.T) {
	cl := &Client{addrs: []string{"127.0.0.1:1", "127.0.0.1:2"}}
	broken, up := newSlot(cl, 0), newSlot(cl, 1)
	cl.slots = []*slot{broken, up}
	broken.head.Store(nil)
	up.head.Store(nil)
	key := "k0"
	for i := 1; shard.Index(key, 2) != 0; i++ { // a key of the broken slot
		key = "k" + strconv.Itoa(i)
	}
	rel := testCall(func(c *call) {
		c.kind, c.internal, c.key, c.token = 'R', true, key, 7
		c.until, c.keep = time.Now().Add(time.Minute), time.Now().Add(time.Minute)
	})
	acq := testCall(func(c *call) { c.kind, c.key, c.seq, c.leaseMs = 'A', key, 1, 60000 })
	other := testCall(func(c *call) { c.kind, c.key, c.seq, c.leaseMs = 'A', key, 2, 60000 })
	for _, c := range []*call{rel, acq, other} {
		if !broken.push(c) {
			t.Fatal("push to an open slot failed")
		}
	}
	broken.failUnsent(errors.New("broken"))
	got := appendStack(nil, up.head.Swap(nil))
	if want := []*call{rel, acq, other}; !slices.Equal(got, want) {
		t.Errorf("the other connection's queue holds %d calls in the order %v, want release, acquire 1, acquire 2", len(got), kinds(got))
	}
}

func kinds(cs []*call) []string {
	var out []string
	for _, c := range cs {
		out = append(out, string(c.kind)+strconv.FormatUint(c.seq, 10))
	}
	return out
}

// A release sent again (its first copy's outcome unknown) that its new
// connection drops before writing it is held for the slot's next
// connection once more, and fails with its unknown outcome only at its
// lock's keep (past its Deadline). A release never sent fails at once, as
// not sent.
func TestResentReleaseDroppedUnsentIsHeldAgain(t *testing.T) {
	cl := &Client{addrs: []string{"127.0.0.1:1"}}
	s := newSlot(cl, 0)
	cl.slots = []*slot{s}
	s.head.Store(nil)
	outcome := make(chan error, 2)
	resent := testCall(func(c *call) {
		c.kind, c.key, c.token, c.resent = 'R', "k", 7, true
		c.until, c.keep = time.Now().Add(100*time.Millisecond), time.Now().Add(200*time.Millisecond)
		c.onRelease = func(err error) { outcome <- err }
	})
	fresh := testCall(func(c *call) {
		c.kind, c.key, c.token = 'R', "j", 8
		c.until, c.keep = time.Now().Add(time.Minute), time.Now().Add(time.Minute)
		c.onRelease = func(err error) { outcome <- err }
	})
	for _, c := range []*call{resent, fresh} {
		if !s.push(c) {
			t.Fatal("push to an open slot failed")
		}
	}
	start := time.Now()
	s.failUnsent(errors.New("broken"))
	// The fresh release fails at once, not sent; the one sent again is held.
	var ce *ConnError
	if err := <-outcome; !errors.As(err, &ce) || ce.Unknown {
		t.Fatalf("the release never sent: %v, want a ConnError that says it was not sent", err)
	}
	s.mu.Lock()
	held := len(s.held)
	s.mu.Unlock()
	if held != 1 {
		t.Fatalf("%d releases held for the next connection, want the one sent again", held)
	}
	err := <-outcome
	if !errors.As(err, &ce) || !ce.Unknown || !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("the release sent again: %v, want an unknown outcome", err)
	}
	if d := time.Since(start); d < 150*time.Millisecond {
		t.Errorf("failed after %v, before its lock's keep (200ms)", d)
	}
}

// testCall is a call from the pool, set by set: finish puts calls back in
// the pool, and one without its done channel would hang whichever caller
// got it next.
func testCall(set func(c *call)) *call {
	c := getCall()
	set(c)
	return c
}
