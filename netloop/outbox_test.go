package netloop

import (
	"testing"

	"github.com/ticketd/ticketd/shard"
)

type noConns struct{}

func (noConns) Conn(uint64) *Conn { return nil }

func TestOutboxReturnsGrantsOfGoneConnections(t *testing.T) {
	var o Outbox
	o.Add(7, &shard.Answer{Result: shard.Acquired, Token: 3, Owner: []byte("a"), Key: []byte("k1")})
	o.Add(7, &shard.Answer{Result: shard.TimedOut, Owner: []byte("b"), Key: []byte("k2")})
	o.Add(9, &shard.Answer{Result: shard.Acquired, Token: 4, Owner: []byte("c"), Key: []byte("k3")})
	if o.Len() != 2 {
		t.Fatalf("Len %d", o.Len())
	}
	var got []string
	o.Flush(noConns{}, func(g Grant) { got = append(got, string(g.Key)+"/"+string(rune('0'+g.Token))) })
	if len(got) != 2 || got[0] != "k1/3" || got[1] != "k3/4" {
		t.Fatalf("orphans %q", got)
	}
	if o.Len() != 0 {
		t.Fatal("not emptied")
	}
	got = nil
	o.Add(1, &shard.Answer{Result: shard.Released, Token: 5, Key: []byte("k")})
	o.Flush(nil, func(g Grant) { got = append(got, string(g.Key)) })
	if len(got) != 0 {
		t.Fatalf("a release came back as an orphan: %q", got)
	}
}
