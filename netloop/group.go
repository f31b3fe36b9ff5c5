package netloop

import (
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
	tmp   [maxBatch]uint16
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
	sorted, high := true, false
	for i := 1; i < g.n; i++ {
		if g.shard[i] < g.shard[i-1] {
			sorted = false
		}
	}
	for i := 0; i < g.n; i++ {
		high = high || g.shard[i] > 0xff
	}
	if sorted {
		return
	}
	// A stable radix sort, a byte at a time: a comparison sort cost a
	// seventh of the server's CPU at pipeline depth 64.
	g.radix(g.order[:g.n], g.tmp[:g.n], 0)
	if high {
		g.radix(g.tmp[:g.n], g.order[:g.n], 8)
	} else {
		copy(g.order[:g.n], g.tmp[:g.n])
	}
}

// radix places src in dst ordered by the byte of the shard at shift,
// keeping the order of src among equal bytes.
func (g *ShardGroups) radix(src, dst []uint16, shift uint) {
	var at [257]int32
	for _, i := range src {
		at[(g.shard[i]>>shift)&0xff+1]++
	}
	for b := 1; b < len(at); b++ {
		at[b] += at[b-1]
	}
	for _, i := range src {
		b := (g.shard[i] >> shift) & 0xff
		dst[at[b]] = i
		at[b]++
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
