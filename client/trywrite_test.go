//go:build unix

package client

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// tcpPair is a connected loopback pair with small socket buffers, so that
// some tens of kilobytes fill them.
func tcpPair(t *testing.T) (a, b *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan net.Conn, 1)
	go func() {
		nc, _ := ln.Accept()
		done <- nc
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	a, b = nc.(*net.TCPConn), (<-done).(*net.TCPConn)
	for _, c := range []*net.TCPConn{a, b} {
		if err := smallBuffers(c); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
	}
	return a, b
}

func smallBuffers(c *net.TCPConn) error {
	if err := c.SetReadBuffer(32 << 10); err != nil {
		return err
	}
	return c.SetWriteBuffer(32 << 10)
}

// A try write takes what the socket takes, returns the rest at once instead
// of waiting, and loses and repeats nothing.
func TestTryWriterNeverWaits(t *testing.T) {
	a, b := tcpPair(t)
	var tw tryWriter
	tw.reset(a)
	if !tw.ok {
		t.Fatal("a TCP connection gives no descriptor to write to")
	}
	msg := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB: far more than the buffers hold
	// Nothing reads b yet: a write that waited for room would never return.
	rest, err := tw.write(msg)
	if err != nil {
		t.Fatal(err)
	}
	if len(rest) == 0 || len(rest) == len(msg) {
		t.Fatalf("rest %d of %d bytes: want some written and some left", len(rest), len(msg))
	}
	sent := len(msg) - len(rest)
	got := make([]byte, sent)
	if _, err := io.ReadFull(b, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, msg[:sent]) {
		t.Fatal("the bytes read are not the ones written")
	}
	// The socket drained: the rest goes out in later tries, in order.
	var all []byte
	all = append(all, got...)
	werr := make(chan error, 1)
	go func() {
		for left := rest; len(left) > 0; time.Sleep(time.Millisecond) {
			var err error
			if left, err = tw.write(left); err != nil {
				b.Close() // ends the read below
				werr <- err
				return
			}
		}
		werr <- nil
	}()
	tail := make([]byte, len(msg)-sent)
	_, rerr := io.ReadFull(b, tail)
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	if rerr != nil {
		t.Fatal(rerr)
	}
	all = append(all, tail...)
	if !bytes.Equal(all, msg) {
		t.Fatal("the stream read is not the one written")
	}
}

// A server that writes all its answers before it reads again must not wait
// on the client forever: while the client's replies fill the socket, its
// reader goes on draining answers (a reader that waited in a write would
// stop reading, and both sides would wait on each other).
func TestServerThatWritesBeforeReading(t *testing.T) {
	const n = 2000 // each way several hundred KiB, far over the 32 KiB buffers
	key := func(i int) string { return fmt.Sprintf("k%03d-%s", i, strings.Repeat("x", 200)) }

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	serverErr := make(chan error, 1)
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			serverErr <- err
			return
		}
		defer nc.Close()
		if err := smallBuffers(nc.(*net.TCPConn)); err != nil {
			serverErr <- err
			return
		}
		r := bufio.NewReader(nc)
		var grants bytes.Buffer
		for i := 0; i < n; i++ { // A owner key lease wait
			f, err := r.ReadString('\n')
			if err != nil {
				serverErr <- err
				return
			}
			p := strings.Fields(f)
			fmt.Fprintf(&grants, "A %d %s %s\n", i+1, p[1], p[2])
		}
		// All grants in one write, reading nothing meanwhile.
		if _, err := nc.Write(grants.Bytes()); err != nil {
			serverErr <- err
			return
		}
		for i := 0; i < n; i++ { // R token key
			f, err := r.ReadString('\n')
			if err != nil {
				serverErr <- err
				return
			}
			p := strings.Fields(f)
			if len(p) != 3 || p[0] != "R" {
				serverErr <- fmt.Errorf("release %d: %q", i, f)
				return
			}
			fmt.Fprintf(nc, "R %s %s\n", p[1], p[2])
		}
		serverErr <- nil
	}()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl, err := Dial(ctx, ln.Addr().String(), WithConns(1))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	s := cl.slots[0]
	for { // the connection's goroutine takes it over after Dial returns
		s.ncMu.Lock()
		nc := s.nc
		s.ncMu.Unlock()
		if nc != nil {
			if err := smallBuffers(nc.(*net.TCPConn)); err != nil {
				t.Fatal(err)
			}
			break
		}
		time.Sleep(time.Millisecond)
	}

	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := cl.Acquire(ctx, key(i), time.Minute, 0)
			if err == nil {
				err = cl.Release(ctx, l)
			}
			if err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("%v (the client and the server waited on each other)", err)
	}
	if err := <-serverErr; err != nil {
		t.Fatal(err)
	}
}
