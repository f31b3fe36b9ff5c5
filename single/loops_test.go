package single

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ticketd/ticketd/codec"
	"github.com/ticketd/ticketd/shard"
)

// Every grant, on every path, leaves only under durable ceilings (the rig
// checks each one as it leaves). Each grant here carries a lease longer
// than any before, so the background loop cannot have covered it: the
// synced write must happen before the answer is written or posted.
func TestGrantsLeaveUnderDurableCeilings(t *testing.T) {
	for _, loops := range []int{1, 2} {
		t.Run(fmt.Sprintf("%dloops", loops), func(t *testing.T) { grantsUnderCeilings(t, loops) })
	}
}

func grantsUnderCeilings(t *testing.T, loops int) {
	dir := t.TempDir()
	g := startRig(t, dir, rigOpts{loops: loops})
	h, w1, w2, w3 := g.dial(), g.dial(), g.dial(), g.dial()

	// Hand-over on release.
	tok := h.acquire("h", "k", 1000)
	w1.send("A w1 k 3600000 60000", "A w1 probe 1 0")
	w1.granted("w1", "probe")
	h.send(fmt.Sprintf("R %d k", tok))
	h.expect(fmt.Sprintf("R %d k", tok))
	tok = w1.granted("w1", "k")

	// Hand-over when the lease ends (the timer loop's Tick).
	h.send("A h2 k 7200000 7200000", "A h2 probe2 1 0")
	h.granted("h2", "probe2")
	g.clock.Advance(time.Hour + time.Second)
	h.granted("h2", "k")

	// A grant whose connection has gone is released, and the key goes to
	// the next waiter (the orphan path inside dispatch).
	tok = w2.acquire("w2", "o", 1000)
	w3.send("A w3 o 3600000 600000", "A w3 probe3 1 0")
	w3.granted("w3", "probe3")
	h.send("A h3 o 10800000 600000", "A h3 probe4 1 0")
	h.granted("h3", "probe4")
	w3conn := atomic.Uint64{}
	g.setDeliver(func(a *shard.Answer, b []byte) bool {
		if string(a.Owner) == "w3" && a.Result == shard.Acquired {
			w3conn.Store(a.To.Conn)
			return false // as if w3's connection had just closed
		}
		return true
	})
	w2.send(fmt.Sprintf("R %d o", tok))
	w2.expect(fmt.Sprintf("R %d o", tok))
	h.granted("h3", "o")
	if w3conn.Load() == 0 {
		t.Fatal("the grant to w3 was never delivered")
	}
	g.setDeliver(nil)

	// Grace end after a crash: the queued acquire is granted by Tick.
	g.crash()
	g2 := startRig(t, dir, rigOpts{clock: g.clock})
	if g2.r.GraceUntil == 0 {
		t.Fatal("no grace after a crash with leases held")
	}
	q := g2.dial()
	q.send("A q fresh 36000000 86400000", "A q probe5 1 0")
	line, _ := q.read()
	if line != "T q probe5" {
		t.Fatalf("in grace: %q, want T", line)
	}
	g2.clock.Advance(time.Duration(g2.r.GraceUntil-g2.clock.now()) + time.Millisecond)
	q.granted("q", "fresh")
}

// A lease whose deadline saturates at the largest int64 is covered by a
// ceiling that saturates too, instead of wrapping below it.
func TestLeaseCeilingSaturates(t *testing.T) {
	g := startRig(t, t.TempDir(), rigOpts{limits: codec.Limits{MaxLeaseMs: math.MaxUint64 / 2, MaxWaitMs: 1000}})
	c := g.dial()
	c.acquire("o", "forever", 9_000_000_000_000)
	if st := g.store.state(); st.LeaseCeil != math.MaxInt64 {
		t.Fatalf("lease ceiling %d, want %d", st.LeaseCeil, int64(math.MaxInt64))
	}
	// The background loop neither stalls nor wraps: other grants go on.
	g.clock.Advance(time.Second)
	c.acquire("o", "other", 1000)
}

// The background loop keeps both ceilings ahead of steady traffic: after
// the start, no synced write happens on the request path.
func TestCeilingLoopKeepsAhead(t *testing.T) {
	g := startRig(t, t.TempDir(), rigOpts{tokenBlock: 16})
	c := g.dial()
	c.acquire("o", "warm", 1000)
	base := g.r.SyncReserves() // the first lease ceiling
	for i := range 200 {
		key := fmt.Sprintf("k%d", i%7)
		tok := c.acquire("o", key, 1000)
		c.send(fmt.Sprintf("R %d %s", tok, key))
		c.expect(fmt.Sprintf("R %d %s", tok, key))
		if i%4 == 3 {
			g.clock.Advance(time.Duration(leaseStep / 8))
		}
	}
	if n := g.r.SyncReserves() - base; n != 0 {
		t.Fatalf("%d synced writes on the request path in steady traffic, want 0", n)
	}
	if st := g.store.state(); st.TokenCeil < g.r.Stats().LastToken {
		t.Fatalf("token ceiling %d below the last token %d", st.TokenCeil, g.r.Stats().LastToken)
	}
}

// A wait queued while the timer loop is between its scan of the shards
// and its sleep still gets its T on time.
func TestTimerWakeNotLost(t *testing.T) {
	g := startRig(t, t.TempDir(), rigOpts{})
	h, w, late := g.dial(), g.dial(), g.dial()
	h.acquire("h", "k", 3600000)
	w.send("A w k 1000 1000")
	for g.r.nextWake.Load() != testStart+int64(time.Second) { // the loop has seen w's deadline
		time.Sleep(time.Millisecond)
	}
	var armed atomic.Bool
	armed.Store(true)
	g.setScanned(func(earliest int64) {
		if earliest != math.MaxInt64 || !armed.Swap(false) {
			return
		}
		// w's wait was served; before the loop says what it sleeps for,
		// another connection queues a wait that ends later.
		late.send("A l k 1000 5000", "A l probe 1 0")
		late.granted("l", "probe")
	})
	g.clock.Advance(time.Second)
	w.expect("T w k")
	g.clock.Advance(5 * time.Second)
	late.expect("T l k")
}

// A grant whose answer cannot be written (the client reset its connection
// while the grant's lease ceiling was being synced) is released: the key is
// not left held by a token nobody received.
func TestGrantWhoseWriteFailsIsReleased(t *testing.T) {
	g := startRig(t, t.TempDir(), rigOpts{})
	c := g.dial()
	var armed atomic.Bool
	armed.Store(true)
	reset := make(chan struct{})
	g.store.setSaveErr(func(state) error {
		if armed.CompareAndSwap(true, false) {
			_ = c.c.(*net.TCPConn).SetLinger(0)
			_ = c.c.Close()                   // a reset
			time.Sleep(50 * time.Millisecond) // arrives before the answer is written
			close(reset)
		}
		return nil
	})
	c.send("A o k 600000 0") // a lease longer than the ceiling: a synced write
	select {
	case <-reset:
	case <-time.After(5 * time.Second):
		t.Fatal("the grant did not wait for a synced write: the test did not test that")
	}
	c2 := g.dial()
	c2.send("A p k 1000 3000") // granted, or queued behind o's grant until it is released
	c2.granted("p", "k")
}

// slowTenMinuteCeiling makes the first synced write of a lease ceiling 10
// minutes past the start take 5 s of the rig's time; the flag it returns
// stays true until that write has happened.
func (g *rig) slowTenMinuteCeiling() *atomic.Bool {
	var slow atomic.Bool
	slow.Store(true)
	g.store.setSaveErr(func(s state) error {
		if s.LeaseCeil >= testStart+int64(600*time.Second) && slow.CompareAndSwap(true, false) {
			g.clock.jump(5 * time.Second)
		}
		return nil
	})
	return &slow
}

// waiterBehindHolder has h hold k (a 1 s lease, token tok) and w queue
// for it with a lease of 10 minutes, more than the lease ceiling covers.
func (g *rig) waiterBehindHolder() (h, w *client, tok uint64) {
	g.t.Helper()
	h, w = g.dial(), g.dial()
	tok = h.acquire("h", "k", 1000)
	w.send("A w k 600000 60000")
	time.Sleep(50 * time.Millisecond) // queued
	return h, w, tok
}

// grantedOnlyAfter queues x on key behind its holder and checks that x is
// granted only once lease has passed since answered, the time the holder
// counts its lease from.
func (g *rig) grantedOnlyAfter(x *client, key string, answered int64, lease time.Duration) {
	g.t.Helper()
	x.send("A x " + key + " 1000 7200000")
	time.Sleep(50 * time.Millisecond) // queued
	g.clock.Advance(time.Duration(answered + int64(lease) - int64(time.Millisecond) - g.clock.now()))
	_ = x.c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if line, err := x.r.ReadString('\n'); err == nil {
		g.t.Fatalf("%q %v after the holder's answer, while it (lease %v from its answer) still held %s",
			line, time.Duration(g.clock.now()-answered), lease, key)
	}
	g.clock.Advance(2 * time.Millisecond)
	x.granted("x", key)
}

// A hand-over whose answer leaves late (here its lease ceiling's synced
// write takes 5 s) keeps its whole lease from the answer, which is where
// its holder counts it from: the next waiter is granted only after that.
func TestLateHandOverKeepsItsLeaseFromItsAnswer(t *testing.T) {
	for _, loops := range []int{1, 2} {
		t.Run(fmt.Sprintf("loops=%d", loops), func(t *testing.T) {
			g := startRig(t, t.TempDir(), rigOpts{loops: loops})
			h, w, tok := g.waiterBehindHolder()
			x := g.dial()
			slow := g.slowTenMinuteCeiling()
			h.send(fmt.Sprintf("R %d k", tok))
			h.expect(fmt.Sprintf("R %d k", tok))
			w.granted("w", "k")
			if slow.Load() {
				t.Fatal("the hand-over did not wait for a synced write: the test did not test that")
			}
			answered := g.clock.now() // w counts its lease from here
			g.grantedOnlyAfter(x, "k", answered, 600*time.Second)
			if g.r.LateRenewals() == 0 {
				t.Error("no late renewal counted")
			}
		})
	}
}

// On a disk whose every synced write takes longer than leaseStep, a
// hand-over whose lease needs a higher ceiling is answered after a write or
// two: each write moved its deadline on past the ceiling it had just made
// durable, for another write, and the event loop wrote for as long as the
// disk stayed that slow, answering nobody (a review: 90 s with fsyncs of
// 2.1 s).
func TestHandOverOnADiskSlowerThanTheLeaseStep(t *testing.T) {
	g := startRig(t, t.TempDir(), rigOpts{})
	h, w, tok := g.waiterBehindHolder()
	const most = 50 // slow writes: the test ends either way
	var writes atomic.Int64
	g.store.setSaveErr(func(state) error {
		if writes.Add(1) <= most {
			g.clock.jump(time.Duration(leaseStep + leaseStep/4))
		}
		return nil
	})
	h.send(fmt.Sprintf("R %d k", tok))
	h.expect(fmt.Sprintf("R %d k", tok))
	answered := g.clock.now()
	w.granted("w", "k")
	n := writes.Load()
	g.store.setSaveErr(nil)
	if n > 4 {
		t.Fatalf("%d synced writes of %v each before the hand-over's answer", n, time.Duration(leaseStep+leaseStep/4))
	}
	g.grantedOnlyAfter(g.dial(), "k", answered, 600*time.Second)
}

// A crash right after a slow synced write keeps the promised grace: no
// longer than the longest lease granted, plus leaseStep, from the restart.
// The ceiling written then goes past the deadline by as long again as the
// last write took (coverLeases), and the grace, counted from that write's
// start, took it over: after a crash that followed a slow fsync, every key
// was refused for as much longer (a fault campaign: 1.8 s).
func TestCrashAfterASlowDiskKeepsTheGraceToTheLongestLease(t *testing.T) {
	dir := t.TempDir()
	g := startRig(t, dir, rigOpts{})
	h, w, tok := g.waiterBehindHolder()
	var writes atomic.Int64
	g.store.setSaveErr(func(state) error {
		if writes.Add(1) <= 4 {
			g.clock.jump(time.Duration(leaseStep + leaseStep/4))
		}
		return nil
	})
	h.send(fmt.Sprintf("R %d k", tok))
	h.expect(fmt.Sprintf("R %d k", tok))
	w.granted("w", "k")
	answered := g.clock.now() // w's 10-minute lease counts from here
	g.crash()

	g2 := startRig(t, dir, rigOpts{clock: g.clock})
	restart := g.clock.now()
	if end := answered + int64(600*time.Second); g2.r.GraceUntil < end {
		t.Fatalf("grace until %v after the restart, before the lease granted ends (%v)",
			time.Duration(g2.r.GraceUntil-restart), time.Duration(end-restart))
	}
	if most := restart + int64(600*time.Second) + leaseStep; g2.r.GraceUntil > most {
		t.Fatalf("grace until %v after the restart, more than the longest lease and %v",
			time.Duration(g2.r.GraceUntil-restart), time.Duration(leaseStep))
	}
}

// The first lease longer than any before, which most often passes the
// lease ceiling too, pays one synced write on the request path, not one for
// each (it paid two: 5 s for a grant on a disk whose fsyncs took 2.5 s).
func TestLongerLeaseThanAnyBeforePaysOneWrite(t *testing.T) {
	g := startRig(t, t.TempDir(), rigOpts{})
	c := g.dial()
	c.acquire("o", "a", 1000)
	var writes atomic.Int64
	g.store.setSaveErr(func(state) error { writes.Add(1); return nil })
	c.acquire("o", "b", 600_000)
	if n := writes.Load(); n != 1 {
		t.Fatalf("%d synced writes before the grant of a lease longer than any before, want 1", n)
	}
	if st := g.store.state(); st.MaxLease < int64(600*time.Second) {
		t.Fatalf("longest lease on disk %v after a grant of 10 minutes", time.Duration(st.MaxLease))
	}
}

// A late hand-over whose lease ceiling cannot be written stops trying once
// the write has failed: the runner is failing, and the loop that moves the
// lease on wrote again and again under the shard lock, its event loop
// answering nobody until the process was gone.
func TestLateHandOverWhoseCeilingFailsStopsWriting(t *testing.T) {
	g := startRig(t, t.TempDir(), rigOpts{})
	h, _, tok := g.waiterBehindHolder() // its waiter makes the release a hand-over
	var writes atomic.Int64
	g.store.setSaveErr(func(state) error {
		if writes.Add(1) == 1 {
			g.clock.jump(time.Duration(leaseStep + leaseStep/4)) // late: the lease moves on
			return nil
		}
		g.clock.jump(time.Millisecond) // a failed write takes time too
		return errors.New("injected EIO")
	})
	h.send(fmt.Sprintf("R %d k", tok))
	select {
	case <-g.r.Failed():
	case <-time.After(10 * time.Second):
		t.Fatal("the runner did not fail on a failed write")
	}
	n := writes.Load()
	time.Sleep(200 * time.Millisecond)
	m := writes.Load()
	g.store.setSaveErr(nil) // a loop still writing ends: the test ends either way
	if m != n || n > 4 {
		t.Fatalf("%d writes when the runner failed, %d more 200 ms later", n, m-n)
	}
}

// A grant at once to an acquire that could have waited (wait_ms > 0) is
// dated by its holder from its answer too, as a hand-over is (the client
// cannot tell them apart): one whose answer leaves late (its lease
// ceiling's synced write takes 5 s here) keeps its whole lease from it.
func TestLateDirectGrantThatCouldWaitKeepsItsLease(t *testing.T) {
	g := startRig(t, t.TempDir(), rigOpts{})
	w, x := g.dial(), g.dial()
	slow := g.slowTenMinuteCeiling()
	w.send("A w k 600000 60000") // the key is free: granted at once
	w.granted("w", "k")
	if slow.Load() {
		t.Fatal("the grant did not wait for a synced write: the test did not test that")
	}
	answered := g.clock.now() // w counts its lease from here
	g.grantedOnlyAfter(x, "k", answered, 600*time.Second)
}

// A hand-over's answer that a later frame of the same batch holds back (its
// synced write takes 5 s here) also keeps its whole lease from the answer:
// the batch's answers leave when it ends, its own connection's and, with one
// event loop, the other connections' too.
func TestHandOverHeldBackByALaterFrameKeepsItsLease(t *testing.T) {
	for _, tc := range []struct {
		name  string
		loops int
		same  bool // the waiter queued on the releaser's connection
	}{
		{"same connection, one loop", 1, true},
		{"same connection, two loops", 2, true},
		{"other connection, one loop", 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := startRig(t, t.TempDir(), rigOpts{loops: tc.loops, shards: 1})
			c, w, x := g.dial(), g.dial(), g.dial()
			if tc.same {
				w = c
			}
			tok := c.acquire("h", "k", 1000)
			w.send("A w k 2000 60000")
			time.Sleep(50 * time.Millisecond) // queued
			slow := g.slowTenMinuteCeiling()
			c.send(fmt.Sprintf("R %d k", tok), "A y big 600000 0")
			if tc.same {
				c.expect(fmt.Sprintf("R %d k", tok))
			}
			w.granted("w", "k")
			answered := g.clock.now() // w counts its 2 s lease from here
			if !tc.same {
				c.expect(fmt.Sprintf("R %d k", tok))
			}
			c.granted("y", "big")
			if slow.Load() {
				t.Fatal("no synced write in the batch: the test did not test that")
			}
			g.grantedOnlyAfter(x, "k", answered, 2*time.Second)
		})
	}
}

// A hand-over posted to another connection on the same loop leaves when
// the loop has done every connection of the same poll: here one of them,
// read in the same poll as the release, pays a synced write of 5 s. The
// hand-over keeps its whole lease from its answer all the same.
func TestHandOverBehindAnotherConnsSyncedWriteKeepsItsLease(t *testing.T) {
	g := startRig(t, t.TempDir(), rigOpts{loops: 1, shards: 1})
	h, w, a, z, x := g.dial(), g.dial(), g.dial(), g.dial(), g.dial()
	tok := h.acquire("h", "k", 1000)
	w.send("A w k 2000 60000")
	time.Sleep(50 * time.Millisecond) // queued
	var busy, slow atomic.Bool
	g.store.setSaveErr(func(s state) error {
		switch {
		case s.LeaseCeil >= testStart+int64(1200*time.Second) && slow.CompareAndSwap(false, true):
			g.clock.jump(5 * time.Second) // z's synced write, after h's release in the same poll
		case s.LeaseCeil >= testStart+int64(600*time.Second) && busy.CompareAndSwap(false, true):
			time.Sleep(300 * time.Millisecond) // the loop is busy while h's and z's frames arrive
		}
		return nil
	})
	a.send("A a big1 600000 0")
	time.Sleep(50 * time.Millisecond)
	h.send(fmt.Sprintf("R %d k", tok))
	time.Sleep(10 * time.Millisecond)
	z.send("A z big2 1200000 0")
	a.granted("a", "big1")
	h.expect(fmt.Sprintf("R %d k", tok))
	w.granted("w", "k")
	answered := g.clock.now() // w counts its 2 s lease from here
	z.granted("z", "big2")
	if !slow.Load() {
		t.Fatal("z's synced write did not happen: the test did not test that")
	}
	g.grantedOnlyAfter(x, "k", answered, 2*time.Second)
}

// handOverInSyncedWrite queues w on k (shard 0 of 2) behind h's 1 s lease,
// and has the timer loop hand k to w while the event loop is in a synced
// write for big (shard 1) that takes 5 s of the rig's time; inWrite runs at
// the end of that write. It returns w and an idle client once big's grant,
// which came after the write, is read.
func (g *rig) handOverInSyncedWrite(k, big string, inWrite func()) (w, x *client) {
	g.t.Helper()
	h, a := g.dial(), g.dial()
	w, x = g.dial(), g.dial()
	h.acquire("h", k, 1000)
	w.send("A w " + k + " 1000 60000") // a lease the ceiling covers already: the timer loop writes nothing
	time.Sleep(50 * time.Millisecond)  // queued
	posted := make(chan struct{})
	var once sync.Once
	g.setDeliver(func(an *shard.Answer, _ []byte) bool {
		if an.Result == shard.Acquired && string(an.Owner) == "w" {
			once.Do(func() { close(posted) })
		}
		return true
	})
	var slow atomic.Bool
	g.store.setSaveErr(func(s state) error {
		if s.LeaseCeil >= testStart+int64(600*time.Second) && slow.CompareAndSwap(false, true) {
			// h's lease ends and the timer loop looks (Advance would wait for
			// the ceiling loop, which waits for this write).
			g.clock.jump(time.Second)
			select {
			case g.r.wake <- struct{}{}:
			default:
			}
			select {
			case <-posted:
			case <-time.After(5 * time.Second):
				g.t.Error("the timer loop did not hand k over during the synced write")
			}
			g.clock.jump(5 * time.Second) // and the write takes 5 s
			inWrite()
		}
		return nil
	})
	a.send("A a " + big + " 600000 0")
	a.granted("a", big)
	if !slow.Load() {
		g.t.Fatal("no synced write: the test did not test that")
	}
	return w, x
}

// A hand-over that the timer loop decides (a lease ends) while the event
// loop is in a synced write for another shard waits in the connection's
// mailbox until that write is done: it keeps its whole lease from its
// answer too.
func TestTimerHandOverPostedDuringASyncedWriteKeepsItsLease(t *testing.T) {
	g := startRig(t, t.TempDir(), rigOpts{loops: 1, shards: 2})
	k := keyOf(0, 2) // its shard comes first in the timer loop's round
	w, x := g.handOverInSyncedWrite(k, keyOf(1, 2), func() {})
	w.granted("w", k)
	answered := g.clock.now() // w counts its 1 s lease from here
	g.grantedOnlyAfter(x, k, answered, time.Second)
	if g.r.LateRenewals() == 0 {
		t.Error("no late renewal counted")
	}
}

// A hand-over whose whole lease passes before its answer can leave (it
// waits in the mailbox while the loop is in a synced write of 5 s), and
// whose key is swept meanwhile, is not answered: the key is free, and its
// holder would count a whole lease from the answer while the next acquire
// was granted. Its connection is closed instead.
func TestHandOverLostBeforeItsAnswerLeftClosesItsConnection(t *testing.T) {
	g := startRig(t, t.TempDir(), rigOpts{loops: 1, shards: 2})
	k := keyOf(0, 2)
	w, x := g.handOverInSyncedWrite(k, keyOf(1, 2), func() {
		// w's 1 s lease has passed: the sweep takes its key.
		p := g.r.part([]byte(k))
		p.mu.Lock()
		swept := p.t.Sweep(g.clock.now())
		p.mu.Unlock()
		if swept != 1 {
			t.Errorf("the sweep removed %d keys, want w's grant of %s", swept, k)
		}
	})
	w.expectClosed()
	if g.r.LostLateGrants() != 1 {
		t.Errorf("%d lost hand-overs counted, want 1", g.r.LostLateGrants())
	}
	x.send("A x " + k + " 1000 0")
	x.granted("x", k)
}

// A hand-over's renewal waits for its shard's lock, held elsewhere (a sweep,
// another loop's synced write): the time it waits delays the answer too, so
// the lease moves on from the time the lock was had, not from before.
func TestHandOverRenewedAfterWaitingForItsShardKeepsItsLease(t *testing.T) {
	g := startRig(t, t.TempDir(), rigOpts{loops: 1, shards: 2})
	k := keyOf(0, 2)
	w, x := g.handOverInSyncedWrite(k, keyOf(1, 2), func() {
		// At the end of the other shard's write, before the loop writes
		// w's hand-over: another goroutine holds k's shard for 300 ms of
		// the rig's time, which passes while the loop waits for it.
		p := g.r.part([]byte(k))
		locked := make(chan struct{})
		go func() {
			p.mu.Lock()
			close(locked)
			time.Sleep(300 * time.Millisecond) // the loop gets to RenewLate and waits
			g.clock.jump(300 * time.Millisecond)
			p.mu.Unlock()
		}()
		<-locked
	})
	w.granted("w", k)
	answered := g.clock.now() // w counts its 1 s lease from here
	g.grantedOnlyAfter(x, k, answered, time.Second)
}

// A clean shutdown releases a grant that could not be delivered before it
// writes the snapshot, so the restart holds no key under a token nobody
// received.
func TestOrphanAtShutdownNotInSnapshot(t *testing.T) {
	dir := t.TempDir()
	g := startRig(t, dir, rigOpts{})
	c := g.dial()
	kept := c.acquire("o", "kept", 60000)
	lost := c.acquire("o", "lost", 60000)
	g.srv.StopAccepting()
	g.r.Quiesce()
	// What the network side does when it closes a connection whose mailbox
	// still held a grant.
	g.r.Orphaned(lost, []byte("lost"))
	if err := g.shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	g2 := startRig(t, dir, rigOpts{clock: g.clock})
	if g2.r.Restored != 1 {
		t.Fatalf("restored %d keys, want 1 (kept)", g2.r.Restored)
	}
	c2 := g2.dial()
	c2.send("A x lost 1000 0", fmt.Sprintf("R %d kept", kept))
	if line, _ := c2.read(); !strings.HasPrefix(line, "A ") {
		t.Fatalf("lost: %q, want a grant", line)
	}
	c2.expect(fmt.Sprintf("R %d kept", kept))
}

// Queued acquires get T at shutdown, and requests after it close the
// connection unanswered.
func TestQuiesce(t *testing.T) {
	g := startRig(t, t.TempDir(), rigOpts{})
	h, w := g.dial(), g.dial()
	h.acquire("h", "k", 60000)
	w.send("A w k 1000 60000", "A w probe 1 0")
	w.granted("w", "probe")
	g.r.Quiesce()
	w.expect("T w k")
	h.send("A h other 1000 0")
	h.expectClosed()
}

// A snapshot write that does not finish (a disk that hangs) does not hold
// the shutdown past its deadline.
func TestShutdownSnapshotBounded(t *testing.T) {
	dir := t.TempDir()
	g := startRig(t, dir, rigOpts{})
	c := g.dial()
	c.acquire("o", "k", 60000)
	hang := make(chan struct{})
	defer close(hang)
	// Once let go it fails, so that nothing is written into a dir the
	// test is removing.
	g.store.setSnapErr(func() error { <-hang; return errors.New("let go") })
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- g.shutdown(ctx) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "in time") || !strings.Contains(err.Error(), dir) {
			t.Fatalf("shutdown with a hung snapshot write: %v; want a timeout naming the dir", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("shutdown still waiting for the snapshot write 10s after its deadline")
	}
	c.expectClosed()
}

// A full disk: the write that fails stops every grant (the one it was for
// gets no answer), the log says "no space left on device in <dir>", the
// runner reports the failure, queued acquires still get T, and no snapshot
// is written.
func TestDiskFull(t *testing.T) {
	for _, loops := range []int{1, 2} {
		t.Run(fmt.Sprintf("%dloops", loops), func(t *testing.T) { diskFull(t, loops) })
	}
}

func diskFull(t *testing.T, loops int) {
	dir := t.TempDir()
	g := startRig(t, dir, rigOpts{loops: loops})
	h, w, x := g.dial(), g.dial(), g.dial()
	h.acquire("h", "k", 60000)
	w.send("A w k 1000 60000", "A w probe 1 0")
	w.granted("w", "probe")
	enospc := &fs.PathError{Op: "write", Path: dir + "/" + stateName, Err: syscall.ENOSPC}
	g.store.setSaveErr(func(state) error { return ioErr(dir, enospc) })

	x.send("A x long 36000000 0") // a lease longer than any: needs a synced write
	x.expectClosed()
	select {
	case <-g.r.Failed():
	case <-time.After(5 * time.Second):
		t.Fatal("runner did not report the failed write")
	}
	want := "no space left on device in " + dir
	if err := g.r.Err(); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Err: %v; want %q", err, want)
	}
	logged := false
	for _, e := range g.logs.All() {
		for _, f := range e.Context {
			if f.Interface != nil {
				if err, ok := f.Interface.(error); ok && strings.Contains(err.Error(), want) {
					logged = true
				}
			}
		}
	}
	if !logged {
		t.Errorf("no log entry says %q: %v", want, g.logs.All())
	}
	g.r.Quiesce()
	w.expect("T w k")
	g.srv.StopAccepting()
	if err := g.r.Shutdown(t.Context()); err == nil {
		t.Error("Shutdown after a failed write: nil, want an error (no snapshot)")
	}
	if g.store.snaps != 0 {
		t.Error("a snapshot was written after a failed write")
	}
}

// Tokens restart above every reservation after a crash, whichever shard
// made it and whatever --shards is now.
func TestTokensAfterFewerShards(t *testing.T) {
	dir := t.TempDir()
	g := startRig(t, dir, rigOpts{shards: 16, tokenBlock: 16})
	c := g.dial()
	key := keyOf(9, 16)
	var tok uint64
	for range 42 {
		tok = c.acquire("o", key, 1000)
		c.send(fmt.Sprintf("R %d %s", tok, key))
		c.expect(fmt.Sprintf("R %d %s", tok, key))
	}
	g.crash()
	g2 := startRig(t, dir, rigOpts{shards: 4, clock: g.clock, tokenBlock: 16})
	g2.clock.Advance(time.Duration(g2.r.GraceUntil-g2.clock.now()) + time.Millisecond)
	c2 := g2.dial()
	for i := range 4 {
		k := keyOf(i, 4)
		if got := c2.acquire("p", k, 1000); got <= tok {
			t.Fatalf("%s: token %d after the restart with fewer shards, not above %d", k, got, tok)
		}
	}
}

// The wall clock stepping ahead during a run (an NTP correction) leaves the
// runner's clock behind it by the step, and the next run reads the wall
// clock: the lease ceiling written must count the step, or a crash restart
// would end its grace that much before a lease granted before the crash.
func TestWallClockStepAheadKeepsTheGrace(t *testing.T) {
	dir := t.TempDir()
	g := startRig(t, dir, rigOpts{})
	c := g.dial()
	granted := g.clock.now()
	c.acquire("o", "k", 60_000)
	const step = 30 * time.Second
	g.clock.stepWall(step)
	g.clock.Advance(time.Second) // the ceiling loop looks again
	g.crash()

	// The next run starts on the wall clock.
	next := newFakeClock(g.clock.now() + int64(step))
	g2 := startRig(t, dir, rigOpts{clock: next})
	if end := granted + int64(60*time.Second+step); g2.r.GraceUntil < end {
		t.Fatalf("grace until %v, before the lease's end on the wall clock %v", time.Duration(g2.r.GraceUntil-granted), time.Duration(end-granted))
	}
}

// The same step during the grace of a crash restart, and a second crash
// before the grace ends: the third run must still wait out the first run's
// lease on the wall clock. The grace is a deadline too, and the step must
// reach the ceiling.
func TestWallClockStepDuringAGraceReachesTheCeiling(t *testing.T) {
	dir := t.TempDir()
	g := startRig(t, dir, rigOpts{})
	granted := g.clock.now()
	g.dial().acquire("o", "k", 60_000)
	g.crash()

	g2 := startRig(t, dir, rigOpts{clock: newFakeClock(g.clock.now() + int64(time.Second))})
	if g2.r.GraceUntil < granted+int64(60*time.Second) {
		t.Fatalf("run 2's grace ends %v after the grant, before the lease", time.Duration(g2.r.GraceUntil-granted))
	}
	const step = 30 * time.Second
	g2.clock.stepWall(step)
	g2.clock.Advance(time.Second) // the ceiling loop looks again
	g2.crash()

	g3 := startRig(t, dir, rigOpts{clock: newFakeClock(g2.clock.now() + int64(step))})
	if end := granted + int64(60*time.Second+step); g3.r.GraceUntil < end {
		t.Fatalf("run 3's grace ends %v after the grant, before the lease's end on the wall clock (%v)",
			time.Duration(g3.r.GraceUntil-granted), time.Duration(end-granted))
	}
}

// The same step before a clean stop: the snapshot's deadlines are on the
// stopped run's clock, and the next run's reads the wall clock, the step
// ahead. Each lease must keep the time it had left.
func TestCleanRestartAfterWallClockStepKeepsLeases(t *testing.T) {
	dir := t.TempDir()
	g := startRig(t, dir, rigOpts{})
	c := g.dial()
	granted := g.clock.now()
	tok := c.acquire("o", "k", 60_000)
	const step = 30 * time.Second
	g.clock.stepWall(step)
	g.clock.Advance(time.Second)
	if err := g.shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}

	next := newFakeClock(g.clock.now() + int64(step))
	g2 := startRig(t, dir, rigOpts{clock: next})
	end := granted + int64(step) + int64(60*time.Second) // the lease's end on the wall clock
	next.Advance(time.Duration(end - int64(time.Second) - next.now()))
	c2 := g2.dial()
	c2.send("A p k 1000 0")
	if line, _ := c2.read(); line != "T p k" {
		t.Fatalf("a second before the lease's end on the wall clock: %q, want T p k", line)
	}
	next.Advance(time.Second)
	if got := c2.acquire("p", "k", 1000); got <= tok {
		t.Fatalf("token %d after the lease ended, not above %d", got, tok)
	}
}

// A grant made after such a step leaves under a ceiling that counts it,
// without waiting for the ceiling loop: a crash right after it still waits
// out its lease on the wall clock.
func TestGrantAfterWallClockStepIsCovered(t *testing.T) {
	dir := t.TempDir()
	g := startRig(t, dir, rigOpts{})
	c := g.dial()
	c.acquire("o", "first", 60_000) // the ceiling now covers a minute and a bit
	const step = 30 * time.Second
	g.clock.stepWall(step)
	granted := g.clock.now()
	c.acquire("o", "second", 60_000) // ends within the ceiling, by the runner's clock
	g.crash()

	next := newFakeClock(g.clock.now() + int64(step))
	g2 := startRig(t, dir, rigOpts{clock: next})
	if end := granted + int64(60*time.Second+step); g2.r.GraceUntil < end {
		t.Fatalf("grace until %v after the grant, before its lease's end on the wall clock %v", time.Duration(g2.r.GraceUntil-granted), time.Duration(end-granted))
	}
}

// A run whose wall clock was a day ahead (a host that booted with it fast)
// wrote its lease ceilings a day out; after a crash, the restart on the
// corrected clock must not grant nothing for a day: every lease of the
// earlier run ended within the longest lease granted in the dir (a minute
// here; --max-lease is an hour) of the crash.
func TestCrashGraceAfterAFastClockEndsWithinTheLongestLease(t *testing.T) {
	dir := t.TempDir()
	g := startRig(t, dir, rigOpts{clock: newFakeClock(testStart + int64(24*time.Hour))})
	g.dial().acquire("o", "k", 60_000)
	g.crash()

	g2 := startRig(t, dir, rigOpts{clock: newFakeClock(testStart + int64(time.Minute))})
	now := g2.clock.now()
	if limit := now + int64(time.Minute) + leaseStep; g2.r.GraceUntil > limit {
		t.Fatalf("no grant for %v after a crash restart, although every earlier lease ended within a minute, the longest granted, of the crash",
			time.Duration(g2.r.GraceUntil-now))
	}
	if g2.r.GraceUntil < now+int64(time.Minute) {
		t.Fatalf("grace of %v after the crash, shorter than the lease granted", time.Duration(g2.r.GraceUntil-now))
	}
}

// heldAtCrash is a data dir whose run granted a 10-minute lease and was
// killed (kill -9, or a power cut) right after its answer; the rig, for its
// clock, and when the answer left.
func heldAtCrash(t *testing.T) (dir string, g *rig, answered int64) {
	t.Helper()
	dir = t.TempDir()
	g = startRig(t, dir, rigOpts{shards: 1})
	g.dial().acquire("h", "held", 600_000)
	answered = g.clock.now()
	g.crash()
	return dir, g, answered
}

// A restart whose wall clock reads fast (a host back from a power cut with
// its clock ahead, time not yet synced) reads the lease ceiling as passed:
// the grace must still last what the leases had left at the crash, counted
// on this run's own clock from its start.
func TestCrashGraceOnARestartWhoseClockReadsFast(t *testing.T) {
	dir, _, _ := heldAtCrash(t)

	// Restarted 5 s later in real time, on a wall clock an hour fast.
	now := testStart + int64(5*time.Second) + int64(time.Hour)
	r := restartOn(t, dir, now)
	if !r.Crashed {
		t.Fatal("not a crash restart")
	}
	if left := time.Duration(r.GraceUntil - now); left < 595*time.Second {
		t.Errorf("grace of %v after the restart (GraceUntil %d, now %d); the lease answered before the crash has 595s left",
			max(left, 0), r.GraceUntil, now)
	}
}

// restartOn opens dir, of one shard, as a restart on a wall clock reading
// at; the test's end closes it, or the caller at once, as a crash before
// the run's loops ran.
func restartOn(t *testing.T, dir string, at int64) *Runner {
	t.Helper()
	r, err := open(Options{DataDir: dir, Shards: 1, SweepInterval: time.Hour, MaxLease: time.Hour}, env{clock: newFakeClock(at)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// A restart whose wall clock reads fast waits out a grace past the lease
// ceiling it read (what the ceiling had left, counted from the restart):
// that grace must be durable with the start's own write. It was not until
// the ceiling loop's first round, and a second crash before it left a
// ceiling already passed: the third run granted at once a key whose
// 10-minute lease, answered 6 s before, still ran.
func TestSecondCrashRightAfterAFastClockRestartKeepsTheGrace(t *testing.T) {
	dir, _, answered := heldAtCrash(t)

	now := answered + int64(5*time.Second) + int64(time.Hour) // 5 s later, the clock an hour fast
	_ = restartOn(t, dir, now).Close()                        // crashed before its loops ran

	now3 := now + int64(time.Second)
	r3 := restartOn(t, dir, now3)
	if left := int64(600*time.Second) - int64(6*time.Second); r3.GraceUntil < now3+left {
		t.Fatalf("the third run's grace ends %v after its start; the lease has %v left", time.Duration(max(0, r3.GraceUntil-now3)), time.Duration(left))
	}
}

// The same with the grace carried over by a clean shutdown: the run after
// it, on a clock an hour fast, and a crash before its ceiling loop ran.
func TestCrashAfterACarriedGraceOnAFastClockKeepsTheGrace(t *testing.T) {
	dir, g, answered := heldAtCrash(t)
	g2 := startRig(t, dir, rigOpts{shards: 1, clock: g.clock})
	g2.clock.Advance(time.Second)
	if err := g2.shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}

	real := g.clock.now() + int64(time.Second)
	now3 := real + int64(time.Hour)
	_ = restartOn(t, dir, now3).Close() // crashed before its loops ran
	now4 := now3 + int64(time.Second)
	r4 := restartOn(t, dir, now4)
	if left := answered + int64(600*time.Second) - (real + int64(time.Second)); r4.GraceUntil < now4+left {
		t.Fatalf("the fourth run's grace ends %v after its start; the lease has %v left", time.Duration(max(0, r4.GraceUntil-now4)), time.Duration(left))
	}
}

// A lease too long for its length in ns to fit an int64 is recorded as
// the longest (saturated), not wrapped below the longest before: only an
// embedder with limits wider than cmd/ticketd's (720 h) can grant one.
func TestLeaseLongerThanNanosecondsHoldIsRecorded(t *testing.T) {
	dir := t.TempDir()
	limits := codec.Limits{MaxLeaseMs: 1 << 62, MaxWaitMs: 1000}
	g := startRig(t, dir, rigOpts{limits: limits})
	g.dial().acquire("o", "forever", 10_000_000_000_000)
	g.crash()
	g2 := startRig(t, dir, rigOpts{limits: limits, clock: g.clock})
	if left := time.Duration(g2.r.GraceUntil - g.clock.now()); left < 24*time.Hour {
		t.Fatalf("grace of %v after a crash, while a lease of 317 years runs", left)
	}
}

// A clean restart whose wall clock reads fast: the snapshot's lease ends
// are on the stopped run's clock, so each lease must keep what it had left
// at the stop, counted from the restart.
func TestCleanRestartOnAClockThatReadsFastKeepsLeases(t *testing.T) {
	dir := t.TempDir()
	g := startRig(t, dir, rigOpts{shards: 1})
	c := g.dial()
	tok := c.acquire("o", "k", 60_000)
	c.c.Close()
	if err := g.shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}

	// Restarted 5 s later in real time, on a wall clock an hour fast.
	next := newFakeClock(g.clock.now() + int64(5*time.Second) + int64(time.Hour))
	g2 := startRig(t, dir, rigOpts{shards: 1, clock: next})
	if !g2.r.Clean {
		t.Fatal("not a clean restart")
	}
	c2 := g2.dial()
	c2.send("A p k 1000 0")
	if line, _ := c2.read(); line != "T p k" {
		t.Fatalf("at the restart, the lease with 60s left at the stop: %q, want T p k", line)
	}
	next.Advance(59 * time.Second)
	c2.send("A p k 1000 0")
	if line, _ := c2.read(); line != "T p k" {
		t.Fatalf("59s after the restart: %q, want T p k", line)
	}
	next.Advance(2 * time.Second)
	if got := c2.acquire("p", "k", 1000); got <= tok {
		t.Fatalf("token %d after the lease ended, not above %d", got, tok)
	}
}

// On a right clock the same moves each lease by the downtime only, not by
// the time since the state was last written before it.
func TestCleanRestartMovesLeasesByTheDowntimeOnly(t *testing.T) {
	dir := t.TempDir()
	g := startRig(t, dir, rigOpts{shards: 1})
	c := g.dial()
	granted := g.clock.now()
	tok := c.acquire("o", "k", 60_000)
	c.c.Close()
	g.clock.Advance(30 * time.Second) // nothing written meanwhile
	if err := g.shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}

	const down = 5 * time.Second
	next := newFakeClock(g.clock.now() + int64(down))
	g2 := startRig(t, dir, rigOpts{shards: 1, clock: next})
	if g2.r.Shifted != down {
		t.Errorf("leases moved by %v, want the downtime, %v", g2.r.Shifted, down)
	}
	next.Advance(time.Duration(granted + int64(60*time.Second+down) - next.now()))
	if got := g2.dial().acquire("p", "k", 1000); got <= tok {
		t.Fatalf("token %d after the lease and the downtime ended, not above %d", got, tok)
	}
}

// A run on a wall clock off by WallOffset (the fault campaign's restart on a
// clock ahead) reads that clock from its start, and sees no step in it.
func TestWallOffsetIsTheRunsClock(t *testing.T) {
	c := newWallClock(time.Hour)
	if d := time.Duration(c.now() - time.Now().UnixNano()); d < time.Hour-time.Second || d > time.Hour+time.Second {
		t.Fatalf("the clock reads %v ahead, want an hour", d)
	}
	if a := c.ahead(); a != 0 {
		t.Fatalf("a step of %v seen in a clock off from its start", time.Duration(a))
	}
}
