package single

import (
	"strconv"
	"strings"
	"testing"

	"github.com/ticketd/ticketd/codec"
	"github.com/ticketd/ticketd/netloop"
	"github.com/ticketd/ticketd/shard"
)

// shardsOf maps every frame as shard.Index does, for every count of shards
// and frames.
func TestShardsOf(t *testing.T) {
	reqs := make([]codec.Request, netloop.MaxBatch)
	for i := range reqs {
		reqs[i].Key = []byte(strings.Repeat("x", i%13) + strconv.Itoa(i*7919))
	}
	for _, n := range []int{1, 2, 3, 16, 100, 128, maxShards} {
		for _, m := range []int{0, 1, 2, 63, netloop.MaxBatch} {
			var sh [netloop.MaxBatch]uint16
			var touched, want [maxShards / 64]uint64
			shardsOf(reqs[:m], n, &sh, &touched)
			for i := range m {
				s := shard.Index(reqs[i].Key, n)
				if int(sh[i]) != s {
					t.Fatalf("%d shards, %d frames: frame %d on shard %d, want %d", n, m, i, sh[i], s)
				}
				want[s/64] |= 1 << (s % 64)
			}
			if touched != want {
				t.Fatalf("%d shards, %d frames: touched %x, want %x", n, m, touched, want)
			}
		}
	}
}
