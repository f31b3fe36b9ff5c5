package bench

import (
	"bufio"
	"context"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ticketd/ticketd/codec"
)

// bench flood sends well-formed acquires on every connection until its
// time is up, reads nothing, and says how much went out.
func TestFloodSendsAcquiresWithoutReading(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var frames, bad, conns atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			wg.Go(func() {
				defer nc.Close()
				rd := bufio.NewReader(nc)
				for {
					// A write cut by the flood's end leaves its last frame
					// unfinished: not read as one.
					line, err := rd.ReadBytes('\n')
					if err != nil {
						return
					}
					var req codec.Request
					if n, perr := codec.ParseRequest(line, codec.Limits{}, &req); perr != nil || n == 0 || req.Kind != codec.Acquire || req.WaitMs != 0 {
						bad.Add(1)
					}
					frames.Add(1)
				}
			})
		}
	})
	var out strings.Builder
	err = floodMain(context.Background(), []string{"-addr", ln.Addr().String(), "-conns", "3", "-duration", "200ms", "-keys", "10"}, &out)
	ln.Close()
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if conns.Load() != 3 || frames.Load() == 0 || bad.Load() != 0 {
		t.Fatalf("%d connections, %d frames, %d not acquires with wait 0", conns.Load(), frames.Load(), bad.Load())
	}
	if !strings.Contains(out.String(), "3 connections sent") {
		t.Fatalf("output %q", out.String())
	}
}
