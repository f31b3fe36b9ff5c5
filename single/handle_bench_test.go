package single

import (
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/ticketd/ticketd/codec"
	"github.com/ticketd/ticketd/netloop"
)

// BenchmarkHandle is the server's work for one read at pipeline depth 64
// without the sockets: 64 acquire lines of keys drawn from a million are
// parsed and handled, then the 64 releases of what was granted, with one
// event loop (the default: a batch in request order under its shards'
// locks). One op is one request line (b.N is rounded down to whole rounds);
// it includes building the lines and reading the answers, the same in every
// version. On a shared machine compare interleaved runs, not one of each.
//
//	go test ./single -run '^$' -bench Handle -count 10
func BenchmarkHandle(b *testing.B) {
	const depth, nkeys = 64, 1 << 20
	p, stop := startServer(b, b.TempDir(), 16, 1)
	defer stop()
	r, srv := p.r, p.srv
	nc, err := net.Dial("tcp", p.addr)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	// The connection stays silent, so its loop never runs Handle beside the
	// benchmark's calls.
	var c *netloop.Conn
	for deadline := time.Now().Add(5 * time.Second); c == nil && time.Now().Before(deadline); {
		for id := uint64(1); id < 10 && c == nil; id++ {
			c = srv.Conn(id)
		}
		time.Sleep(time.Millisecond)
	}
	if c == nil {
		b.Fatal("the connection never registered")
	}

	keys := make([][]byte, nkeys)
	for i := range keys {
		keys[i] = []byte("k" + strconv.Itoa(i))
	}
	owner := []byte("bench-17")
	var (
		wire, out []byte
		reqs      = make([]codec.Request, depth)
		toks      = make([]uint64, depth)
		held      = make([][]byte, depth)
		a         codec.Answer
		x         uint32
	)
	handle := func() {
		at := 0
		for i := range reqs {
			n, err := codec.ParseRequest(wire[at:], codec.Limits{}, &reqs[i])
			if err != nil || n == 0 {
				b.Fatalf("parse: %v", err)
			}
			at += n
		}
		out, _, _ = r.Handle(c, reqs, out[:0])
	}
	round := func() {
		wire = wire[:0]
		for i := range depth {
			x = x*1664525 + 1013904223
			held[i] = keys[x>>12]
			wire = codec.AppendAcquire(wire, owner, held[i], 30000, 0)
		}
		handle()
		line := out
		for i := range depth {
			n, err := codec.ParseAnswer(line, &a)
			if err != nil {
				b.Fatalf("answer: %v", err)
			}
			line = line[n:]
			toks[i] = max(a.Token, 1) // the rare T: its release answers N
		}
		wire = wire[:0]
		for i := range depth {
			wire = codec.AppendRelease(wire, toks[i], held[i])
		}
		handle()
	}
	for range 1000 {
		round()
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N / (2 * depth) {
		round()
	}
	b.StopTimer() // the deferred shutdown writes a snapshot: not the path measured
}
