package chaos

import (
	"testing"
	"time"
)

// wantFlagged checks b's history in both modes and fails unless the
// checker flags it: each history below holds a real double grant or a lost
// release, beside an operation that once let the lock model explain it away.
func wantFlagged(t *testing.T, name string, b *hist) {
	t.Helper()
	for _, mode := range []string{"single", "cluster"} {
		if r := Check(b.h, CheckConfig{Mode: mode, MaxLease: ms(5000), LinTimeout: 10 * time.Second}); !r.Failed() {
			t.Errorf("%s [%s]: accepted, with a safety violation in it", name, mode)
		}
	}
}

// queuedAfterRelease: H holds k (token 1, lease 1000 ms) from 0; X queues at
// 100 ms (lease lx, wait 2000 ms); H's release at 800 ms hands k to X, whose
// lease runs from 800 ms or later. X is answered at 810 ms.
func queuedAfterRelease(lx uint64) *hist {
	b := newHist()
	b.acq(1, "k", 1000, 0, 10, ResGranted, 1)
	b.add(&Op{Worker: 2, Kind: 'A', Owner: "x", Key: "k", LeaseMs: lx, WaitMs: 2000, Invoke: ms(100), Complete: ms(810), Result: ResGranted, Token: 2})
	b.rel(1, "k", 1, 800, 805, ResReleased)
	return b
}

// An acquire with an unknown outcome took the key over from X at X's lease
// end at the earliest; released as undeliverable, its hold still cannot end
// before it began. The model let it end at its LostAt less a margin, before
// X's lease even ended, and so erased X's lease: Z's grant at 900-910 ms,
// with X holding until 1300 ms or later, passed.
func TestUnknownAcquireDoesNotEraseALiveLease(t *testing.T) {
	for _, lost := range []struct{ sent, lost int64 }{{850, 900}, {20, 50}} {
		b := queuedAfterRelease(500)
		b.add(&Op{Worker: 4, Kind: 'A', Owner: "u", Key: "k", LeaseMs: 500, Invoke: ms(lost.sent), Result: ResUnknown, LostAt: ms(lost.lost), Why: "connection lost"})
		b.acq(3, "k", 500, 900, 910, ResGranted, 3)
		wantFlagged(t, "a double grant beside an unknown acquire", b)
	}
}

// An operation placed after a grant over a holder, or after an N to an
// expired holder, takes effect no earlier than that hold's end, and one that
// returned before then cannot be placed there. X holds from 800 ms to 1800
// ms or later; Z is granted at 1200-1210 ms; X's release, sent at 1205 ms,
// is answered N at 1850 ms. The model placed the N (at its call) before Z.
func TestNToAnExpiredHolderComesAfterItsLease(t *testing.T) {
	b := queuedAfterRelease(1000)
	b.acq(3, "k", 300, 1200, 1210, ResGranted, 3)
	b.rel(2, "k", 2, 1205, 1850, ResNotReleased)
	wantFlagged(t, "a double grant beside a slow release of the first holder", b)
}

// The same: X's own release is answered N at 1200-1210 ms while its lease
// runs (from 800 ms for 1000 ms): a lost holder. Y, sent at 1150 ms and
// granted at 1850 ms (legal: after X's lease), was placed before the N.
func TestGrantOverAHolderTakesEffectAtItsEnd(t *testing.T) {
	b := queuedAfterRelease(1000)
	b.rel(2, "k", 2, 1200, 1210, ResNotReleased)
	b.add(&Op{Worker: 3, Kind: 'A', Owner: "y", Key: "k", LeaseMs: 300, WaitMs: 1000, Invoke: ms(1150), Complete: ms(1850), Result: ResGranted, Token: 3})
	wantFlagged(t, "a lost release beside a concurrent legal acquire", b)
}
