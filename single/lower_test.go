package single

import (
	"fmt"
	"net"
	"sync"
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

// The synced write that lowers the lease ceiling holds no shard: a grant
// under the lower ceiling is answered while the write hangs, and one above
// it waits for the write and then raises the ceiling over its own lease,
// so that the lowering never lands under a lease that has left.
func TestLoweringTheLeaseCeilingHoldsNoShard(t *testing.T) {
	g := startRig(t, t.TempDir(), rigOpts{sweep: 5 * time.Second})
	c := g.dial()
	long := c.acquire("o", "long", 3_600_000)
	c.send(fmt.Sprintf("R %d long", long))
	c.expect(fmt.Sprintf("R %d long", long))
	c.acquire("o", "held", 20_000)

	high := testStart + int64(time.Hour)
	entered, hang := make(chan state, 1), make(chan struct{})
	var once sync.Once
	g.store.setSaveErr(func(s state) error {
		if s.LeaseCeil < high {
			once.Do(func() { entered <- s; <-hang })
		}
		return nil
	})
	let := sync.OnceFunc(func() { close(hang) })
	// A sweep. Advance returns once the sweep has run, after the write.
	advanced := make(chan struct{})
	go func() { defer close(advanced); g.clock.Advance(5 * time.Second) }()
	defer func() { let(); <-advanced }()
	var lowered state
	select {
	case lowered = <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the sweep did not lower the lease ceiling")
	}

	// Under the lower ceiling: answered while the write hangs.
	c.acquire("o", "short", 1_000)

	// Above it: not answered until its own lease is durable, which is
	// after the lowering.
	midLease := lowered.LeaseCeil - g.clock.now() + int64(30*time.Second)
	mid := g.dial()
	mid.send(fmt.Sprintf("A o mid %d 0", midLease/int64(time.Millisecond)))
	_ = mid.c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if line, err := mid.r.ReadString('\n'); err == nil {
		t.Fatalf("%q answered while the ceiling under its lease was being written", line)
	} else if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		t.Fatal(err)
	}
	let()
	mid.granted("o", "mid")
	midEnd := g.clock.now() + midLease
	if st := g.store.state(); st.LeaseCeil < midEnd {
		t.Fatalf("the lease ceiling on disk is %v, under a lease granted (ends %v)",
			time.Duration(st.LeaseCeil-testStart), time.Duration(midEnd-testStart))
	}
	if st := g.store.state(); st.LeaseCeil >= high {
		t.Fatalf("the lease ceiling stayed %v", time.Duration(st.LeaseCeil-testStart))
	}
}

// Crashes that follow each other within their graces, with acquires
// queued behind the grace (it stands for every key an earlier run may have
// granted): each restart's grace is as long as the first's at most. The
// sweep counted the queued acquires' phantom holder, whose deadline is the
// grace, as a lease still held; the ceiling was raised a leaseStep over the
// grace and written a sweep into the run, and each crash's grace, which
// lasts what the ceiling had left at its last write, came out a sweep
// interval longer than the one before (a fault campaign measured 4 s, then
// 5, 6, ... after crashes every 3-4 s).
func TestCrashGraceDoesNotGrowOverCrashesWithWaiters(t *testing.T) {
	dir := t.TempDir()
	g := startRig(t, dir, rigOpts{sweep: time.Second})
	c := g.dial()
	c.acquire("o", "k", 2000)
	c.c.Close()
	g.crash()
	first := time.Duration(0)
	for i := range 5 {
		g = startRig(t, dir, rigOpts{sweep: time.Second, clock: newFakeClock(g.clock.now() + int64(time.Second))})
		grace := time.Duration(g.r.GraceUntil - g.clock.now())
		if i == 0 {
			first = grace
			if first <= 0 {
				t.Fatal("no grace after the crash")
			}
		} else if grace > first {
			t.Fatalf("restart %d: a grace of %v, longer than the first's %v", i+1, grace, first)
		}
		c := g.dial()
		c.send("A w hot 2000 1500") // queued behind the grace
		c.send("A p probe 1000 0")
		c.expect("T p probe")        // read after the one before: it is queued
		g.clock.Advance(time.Second) // a sweep
		g.clock.Advance(time.Second) // the wait ends
		c.expect("T w hot")
		c.c.Close()
		g.crash()
	}
}
