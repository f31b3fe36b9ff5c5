package shard

import (
	"fmt"
	"testing"
)

// go test ./shard -run '^$' -bench . -benchmem

// BenchmarkAcquireRelease: uncontended acquire and release of keys already seen, spread
// over 1M keys (so the index and entries are out of cache). One
// iteration is one command: acquires and releases alternate.
func BenchmarkAcquireRelease(b *testing.B) {
	const nkeys = 1 << 20
	keys := make([][]byte, nkeys)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "tenant-%03d/job-%07d", i%1000, i)
	}

	tb := New(Config{ReserveTokens: func(next uint64) uint64 { return next + 1<<16 }})
	owner := []byte("worker-7")
	out := make([]Answer, 0, 4)
	var now int64
	for _, k := range keys { // warm: every key seen once
		c := Command{Op: OpAcquire, From: Requester{Conn: 1}, Owner: owner, Key: k, LeaseMs: 30000}
		out = tb.Apply(now, &c, out[:0])
		c = Command{Op: OpRelease, From: Requester{Conn: 1}, Key: k, Token: out[0].Token}
		out = tb.Apply(now, &c, out[:0])
	}
	var tok uint64
	var key []byte
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		now += 1000
		if i&1 == 0 {
			key = keys[(uint32(i>>1)*0x9E3779B1)&(nkeys-1)] // a fixed pseudo-random walk
			c := Command{Op: OpAcquire, From: Requester{Conn: 1, Seq: uint64(i)}, Owner: owner, Key: key, LeaseMs: 30000}
			out = tb.Apply(now, &c, out[:0])
			tok = out[0].Token
		} else {
			c := Command{Op: OpRelease, From: Requester{Conn: 1, Seq: uint64(i)}, Key: key, Token: tok}
			out = tb.Apply(now, &c, out[:0])
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}

// BenchmarkHandOver: one contended key with a queue of 64 acquires from 64 connections,
// each waiting up to an hour. One iteration is a release that hands the key to the queue
// head plus a new acquire that queues at the tail (two commands).
func BenchmarkHandOver(b *testing.B) {
	const queue = 64
	tb := New(Config{ReserveTokens: func(next uint64) uint64 { return next + 1<<16 }})
	key, owner := []byte("invoices"), []byte("worker-7")
	out := make([]Answer, 0, 4)
	var now int64
	var seq uint64
	acquire := func() []Answer {
		seq++
		c := Command{Op: OpAcquire, From: Requester{Conn: 1 + seq%queue, Seq: seq}, Owner: owner, Key: key, LeaseMs: 30000, WaitMs: 3600000}
		return tb.Apply(now, &c, out[:0])
	}
	tok := acquire()[0].Token
	for range queue {
		acquire()
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		now += 1000
		c := Command{Op: OpRelease, From: Requester{Conn: 1000, Seq: uint64(i)}, Key: key, Token: tok}
		out = tb.Apply(now, &c, out[:0])
		tok = out[1].Token
		acquire()
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "handovers/s")
	if len(tb.heap) != queue+1 { // the hour-long waits of granted acquires left no timers behind
		b.Fatalf("heap holds %d timers, want %d", len(tb.heap), queue+1)
	}
}

// benchShards is a variable, as a server's shard count is: with a constant
// the compiler folds the modulo into a mask and the figure flatters.
var benchShards, benchSink = 16, 0

func BenchmarkIndex(b *testing.B) {
	key := []byte("tenant-042/job-0012345")
	sum := 0
	for i := 0; i < b.N; i++ {
		sum += Index(key, benchShards)
	}
	benchSink = sum
}
