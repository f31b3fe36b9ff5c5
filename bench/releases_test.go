package bench

import (
	"math/rand/v2"
	"strconv"
	"testing"
)

// The release table against a plain model, with tokens drawn from a small
// range so that equal tokens on different keys and long probe runs happen.
func TestReleaseTableModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const nslots = 64
	slots := make([]slot, nslots)
	for i := range slots {
		slots[i] = slot{index: int32(i), key: []byte("k" + strconv.Itoa(rng.IntN(8)))}
	}
	tab := newReleaseTable(4) // grows on the way
	inFlight := map[int32]bool{}
	for step := range 200_000 {
		si := int32(rng.IntN(nslots))
		if !inFlight[si] {
			slots[si].token = uint64(1 + rng.IntN(6))
			tab.put(slots[si].token, si)
			inFlight[si] = true
			continue
		}
		got := tab.take(slots[si].token, slots[si].key, slots)
		if got < 0 || slots[got].token != slots[si].token || string(slots[got].key) != string(slots[si].key) {
			t.Fatalf("step %d: take(%d, %s) = %d", step, slots[si].token, slots[si].key, got)
		}
		// Another slot with the same token and key may have been taken:
		// it is the same release as far as the answer can tell.
		delete(inFlight, got)
		if got := tab.take(99, []byte("none"), slots); got != -1 {
			t.Fatalf("step %d: a release never sent found slot %d", step, got)
		}
		if tab.n != len(inFlight) {
			t.Fatalf("step %d: %d in the table, %d in flight", step, tab.n, len(inFlight))
		}
	}
}
