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
	rel := &call{kind: 'R', internal: true, key: key, token: 7, until: time.Now().Add(time.Minute)}
	acq := &call{kind: 'A', key: key, seq: 1, leaseMs: 60000}
	other := &call{kind: 'A', key: key, seq: 2, leaseMs: 60000}
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
