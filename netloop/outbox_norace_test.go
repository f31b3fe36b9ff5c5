//go:build !race

package netloop

import (
	"testing"

	"github.com/ticketd/ticketd/shard"
)

func TestOutboxDoesNotAllocate(t *testing.T) {
	var o Outbox
	a := shard.Answer{Result: shard.Acquired, Token: 12345, Owner: []byte("owner"), Key: []byte("some-key")}
	orphan := func(Grant) {}
	run := func() {
		for c := uint64(1); c <= 8; c++ {
			o.Add(c, &a)
			o.Add(c, &a)
		}
		o.Flush(noConns{}, orphan)
	}
	run()
	if n := testing.AllocsPerRun(100, run); n != 0 {
		t.Fatalf("%v allocations per flush of 16 answers", n)
	}
}
