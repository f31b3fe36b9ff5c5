package client_test

import (
	"errors"
	"testing"
	"time"

	"github.com/ticketd/ticketd/client"
	"github.com/ticketd/ticketd/internal/serverproc"
)

// The connections make their first attempts at once: two homed on an
// address that drops its SYNs hold Dial one dial timeout, not one each.
func TestDialAttemptsTheConnectionsAtOnce(t *testing.T) {
	srv := startServer(t, "", "")
	hole, release, err := serverproc.BlackHole()
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	const dialTimeout = 2 * time.Second
	start := time.Now()
	cl := dial(t, srv.addr+","+hole, client.WithConns(4), client.WithDialTimeout(dialTimeout))
	if took := time.Since(start); took >= dialTimeout*3/2 {
		t.Fatalf("Dial took %v with 2 connections homed on the black hole (dial timeout %v): they dialled in turn", took, dialTimeout)
	}
	l, err := cl.Acquire(testCtx(t), "dial-first", time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.Release(testCtx(t), l); err != nil {
		t.Fatal(err)
	}
}

// An address that is not host:port is the caller's mistake: ErrInvalid at
// once, not a *ConnError after a dial.
func TestDialRefusesAMalformedAddress(t *testing.T) {
	for _, addr := range []string{"foo", "127.0.0.1:1,foo:bar:9", "host:"} {
		cl, err := client.Dial(t.Context(), addr)
		if !errors.Is(err, client.ErrInvalid) {
			if cl != nil {
				cl.Close()
			}
			t.Errorf("Dial(%q): %v, want ErrInvalid", addr, err)
		}
	}
}
