package client

import (
	"testing"
	"time"
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
