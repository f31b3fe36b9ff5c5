package shard

import (
	"bytes"
	"hash/maphash"
)

// keyIndex finds a key's entry. It is an open-addressing hash table with
// linear probing and backward-shift deletion, so that deletes leave no
// tombstones behind: the lock table inserts and deletes keys at the request
// rate, and Go's built-in map, whose deletes leave tombstones that lookups
// must probe past, spent a third of the server's CPU in lookups under that
// churn (measured with pprof on the uncontended benchmark).
//
// Iteration order depends on a per-process seed; nothing that must be
// deterministic (snapshots, answers) depends on it.
type keyIndex struct {
	slots []islot // len is a power of two, or 0
	n     int
	seed  maphash.Seed
}

type islot struct {
	h uint64 // hash of e.key; meaningful only when e != nil
	e *entry
}

func newKeyIndex() keyIndex { return keyIndex{seed: maphash.MakeSeed()} }

func (x *keyIndex) hash(k []byte) uint64 { return maphash.Bytes(x.seed, k) }

func (x *keyIndex) len() int { return x.n }

func (x *keyIndex) get(k []byte) *entry {
	e, _ := x.find(k)
	return e
}

// find is get that also returns k's hash, so that an insert that follows a
// miss (most acquires) does not hash the key again.
func (x *keyIndex) find(k []byte) (*entry, uint64) {
	h := x.hash(k)
	if x.n == 0 {
		return nil, h
	}
	mask := uint64(len(x.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		s := &x.slots[i]
		if s.e == nil {
			return nil, h
		}
		if s.h == h && bytes.Equal(s.e.key, k) {
			return s.e, h
		}
	}
}

// put adds e, whose key must not be in the index.
func (x *keyIndex) put(e *entry) { x.putHashed(e, x.hash(e.key)) }

// putHashed is put for an entry whose key hashes to h (from find).
func (x *keyIndex) putHashed(e *entry, h uint64) {
	if (x.n+1)*2 > len(x.slots) { // load factor at most 1/2
		x.grow()
	}
	e.hash = h
	x.insert(islot{h, e})
	x.n++
}

func (x *keyIndex) insert(s islot) {
	mask := uint64(len(x.slots) - 1)
	i := s.h & mask
	for x.slots[i].e != nil {
		i = (i + 1) & mask
	}
	x.slots[i] = s
}

func (x *keyIndex) grow() {
	old := x.slots
	size := max(16, 2*len(old))
	x.slots = make([]islot, size)
	for _, s := range old {
		if s.e != nil {
			x.insert(s)
		}
	}
}

// del removes e, which must be in the index.
func (x *keyIndex) del(e *entry) {
	mask := uint64(len(x.slots) - 1)
	i := e.hash & mask
	for x.slots[i].e != e {
		i = (i + 1) & mask
	}
	// Shift later members of the probe run back into the hole, so that no
	// lookup ever has to probe past a deleted slot.
	for j := (i + 1) & mask; x.slots[j].e != nil; j = (j + 1) & mask {
		home := x.slots[j].h & mask
		// The member at j may move to i only if its home is not in (i, j].
		if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
			x.slots[i] = x.slots[j]
			i = j
		}
	}
	x.slots[i] = islot{}
	x.n--
}

// each calls fn for every entry; fn must not change the index.
func (x *keyIndex) each(fn func(e *entry)) {
	for i := range x.slots {
		if e := x.slots[i].e; e != nil {
			fn(e)
		}
	}
}
