package bench

import "bytes"

// releaseTable finds a connection's release in flight by its answer's token
// and key: open addressing on the token, linear probing, backward-shift
// deletion, the key compared with the slot's own. It replaced a Go map keyed
// by token and key hash, whose hashing, assigns and deletes were a fifth of
// the generator's CPU at depth 64 (pprof), CPU the server then lacked.
// Tokens of different keys may be equal (cluster shards count apart), so a
// probe run can hold the same token more than once.
type releaseTable struct {
	cells []releaseCell // len is a power of two, at least twice the slots
	n     int
}

type releaseCell struct {
	token uint64
	slot  int32 // -1: empty
}

func newReleaseTable(slots int) releaseTable {
	size := 16
	for size < 2*slots {
		size *= 2
	}
	t := releaseTable{cells: make([]releaseCell, size)}
	t.clear()
	return t
}

func (t *releaseTable) home(token uint64) int {
	return int((token * 0x9E3779B97F4A7C15) >> 32 & uint64(len(t.cells)-1))
}

func (t *releaseTable) clear() {
	for i := range t.cells {
		t.cells[i] = releaseCell{slot: -1}
	}
	t.n = 0
}

func (t *releaseTable) put(token uint64, slot int32) {
	if 2*(t.n+1) > len(t.cells) {
		old := t.cells
		t.cells = make([]releaseCell, 2*len(old))
		t.clear()
		for _, c := range old {
			if c.slot >= 0 {
				t.put(c.token, c.slot)
			}
		}
	}
	mask := len(t.cells) - 1
	i := t.home(token)
	for t.cells[i].slot >= 0 {
		i = (i + 1) & mask
	}
	t.cells[i] = releaseCell{token, slot}
	t.n++
}

// take removes and returns the slot whose release of key has token, or -1.
func (t *releaseTable) take(token uint64, key []byte, slots []slot) int32 {
	mask := len(t.cells) - 1
	i := t.home(token)
	for ; t.cells[i].slot >= 0; i = (i + 1) & mask {
		c := t.cells[i]
		if c.token == token && bytes.Equal(slots[c.slot].key, key) {
			t.del(i)
			return c.slot
		}
	}
	return -1
}

func (t *releaseTable) del(i int) {
	mask := len(t.cells) - 1
	for j := (i + 1) & mask; t.cells[j].slot >= 0; j = (j + 1) & mask {
		h := t.home(t.cells[j].token)
		// The cell at j may move to i only if its home is not in (i, j].
		if (j > i && (h <= i || h > j)) || (j < i && h <= i && h > j) {
			t.cells[i] = t.cells[j]
			i = j
		}
	}
	t.cells[i] = releaseCell{slot: -1}
	t.n--
}
