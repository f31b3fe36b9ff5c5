package netloop

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/ticketd/ticketd/codec"
	"github.com/ticketd/ticketd/shard"
)

func TestShardGroupsKeepsRequestOrderWithinAShard(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, shards := range []int{1, 2, 16, 4096} {
		for range 50 {
			reqs := make([]codec.Request, 1+rng.IntN(MaxBatch))
			for i := range reqs {
				reqs[i].Key = []byte(fmt.Sprintf("k%d", rng.IntN(40)))
			}
			var g ShardGroups
			g.Group(reqs, shards)
			seen := make([]bool, len(reqs))
			last := -1
			for i := 0; i < g.Len(); {
				s, run := g.Run(i)
				if s <= last {
					t.Fatalf("shard %d after %d", s, last)
				}
				last = s
				for k, j := range run {
					if k > 0 && run[k-1] >= j {
						t.Fatalf("run %v not ascending", run)
					}
					if want := 0; shards > 1 {
						want = shard.Index(reqs[j].Key, shards)
						if want != s {
							t.Fatalf("frame %d of shard %d in run of %d", j, want, s)
						}
					} else if s != want {
						t.Fatalf("one shard, got %d", s)
					}
					seen[j] = true
				}
				i += len(run)
			}
			for j, ok := range seen {
				if !ok {
					t.Fatalf("frame %d in no run", j)
				}
			}
		}
	}
}
