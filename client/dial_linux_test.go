package client_test

import (
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/ticketd/ticketd/client"
)

// blackHole is a loopback address that takes no connection and refuses
// none: its listen queue holds one connection already, so the kernel drops
// further SYNs and a dial waits out its timeout, as for a host that is off.
func blackHole(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := (&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: sa.(*syscall.SockaddrInet4).Port}).String()
	filler, err := net.DialTimeout("tcp", addr, time.Second) // fills the queue
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { filler.Close() })
	if nc, err := net.DialTimeout("tcp", addr, 300*time.Millisecond); err == nil {
		nc.Close()
		t.Skip("the kernel took a connection beyond the listen queue: no black hole here")
	}
	return addr
}

// The connections make their first attempts at once: two homed on an
// address that drops its SYNs hold Dial one dial timeout, not one each.
func TestDialAttemptsTheConnectionsAtOnce(t *testing.T) {
	srv := startServer(t, "", "")
	hole := blackHole(t)
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
