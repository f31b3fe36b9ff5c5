package single

import (
	"fmt"
	"testing"
	"time"
)

// A long lease released early stops setting the crash grace after the next
// sweep: the durable lease ceiling comes down to the latest lease still
// held, and no lower. Every grant, after the lowering too, is checked
// against what the store made durable as it leaves (rig.check).
func TestReleasedLongLeaseNoLongerSetsTheCrashGrace(t *testing.T) {
	dir := t.TempDir()
	g := startRig(t, dir, rigOpts{sweep: 5 * time.Second})
	c := g.dial()
	long := c.acquire("o", "long", 3_600_000)
	c.send(fmt.Sprintf("R %d long", long))
	c.expect(fmt.Sprintf("R %d long", long))
	held := g.clock.now() + int64(20*time.Second)
	c.acquire("o", "held", 20_000)
	if ceil := g.store.state().LeaseCeil; ceil < testStart+int64(time.Hour) {
		t.Fatalf("the hour's lease was granted under a ceiling of %v", time.Duration(ceil-testStart))
	}

	g.clock.Advance(5 * time.Second) // a sweep
	deadline := time.Now().Add(10 * time.Second)
	for g.store.state().LeaseCeil >= testStart+int64(time.Hour) {
		if time.Now().After(deadline) {
			t.Fatalf("the lease ceiling stayed %v after the hour's lease was released and a sweep ran",
				time.Duration(g.store.state().LeaseCeil-testStart))
		}
		time.Sleep(5 * time.Millisecond)
	}
	if ceil := g.store.state().LeaseCeil; ceil < held {
		t.Fatalf("the lease ceiling came down to %v, before the end of a lease still held (%v)",
			time.Duration(ceil-testStart), time.Duration(held-testStart))
	}
	c.acquire("o", "later", 30_000) // above the lowered ceiling: raised before it leaves
	g.crash()

	g2 := startRig(t, dir, rigOpts{clock: newFakeClock(g.clock.now())})
	if left := time.Duration(g2.r.GraceUntil - g.clock.now()); left > time.Minute {
		t.Fatalf("crash grace of %v after the hour's lease was released", left)
	}
	if g2.r.GraceUntil < g.clock.now()+int64(30*time.Second) {
		t.Fatalf("crash grace ends %v from the crash, before a lease granted after the lowering",
			time.Duration(g2.r.GraceUntil-g.clock.now()))
	}
}
