package netloop

import (
	"slices"

	"github.com/ticketd/ticketd/codec"
	"github.com/ticketd/ticketd/shard"
)

// MaxBatch is the most frames one Backend.Handle call is given.
const MaxBatch = maxBatch

// ShardGroups orders the frames of one read by shard, request order kept
// within a shard, so that a backend takes each shard once per batch (single
// mode: one lock; cluster mode: one proposal). The zero value is ready; it
// holds no pointers and lives well on the stack of Handle.
type ShardGroups struct {
	shard [maxBatch]uint16
	order [maxBatch]uint16
	n     int
}

// Group fills g for reqs (at most MaxBatch frames) over shards shards
// (at most 65536), with shard.Index.
func (g *ShardGroups) Group(reqs []codec.Request, shards int) {
	if len(reqs) > maxBatch {
		panic("netloop: more frames than MaxBatch")
	}
	g.n = len(reqs)
	for i := range reqs {
		s := 0
		if shards > 1 {
			s = shard.Index(reqs[i].Key, shards)
		}
		g.shard[i], g.order[i] = uint16(s), uint16(i)
	}
	o := g.order[:g.n]
	sorted := true
	for i := 1; i < len(o); i++ {
		if g.shard[i] < g.shard[i-1] {
			sorted = false
			break
		}
	}
	if !sorted {
		slices.SortStableFunc(o, func(a, b uint16) int { return int(g.shard[a]) - int(g.shard[b]) })
	}
}

// Len is the number of frames grouped.
func (g *ShardGroups) Len() int { return g.n }

// Run returns the shard of the frame at position i of the grouped order and
// the indices (into reqs, ascending) of every frame of that shard from i on:
// iterate with i += len(run).
func (g *ShardGroups) Run(i int) (shardIdx int, run []uint16) {
	s := g.shard[g.order[i]]
	j := i + 1
	for j < g.n && g.shard[g.order[j]] == s {
		j++
	}
	return int(s), g.order[i:j]
}
