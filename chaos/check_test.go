package chaos

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ticketd/ticketd/shard"
)

// hist builds histories by hand, times in milliseconds.
type hist struct {
	h  *History
	id int64
}

func newHist() *hist { return &hist{h: &History{}} }

func ms(v int64) int64 { return v * int64(time.Millisecond) }

func (b *hist) add(o *Op) *Op {
	b.id++
	o.ID = b.id
	if o.Result == ResUnknown {
		o.Complete = -1
	}
	b.h.Ops = append(b.h.Ops, o)
	return o
}

func (b *hist) acq(worker int, key string, lease uint64, inv, comp int64, res string, tok uint64) *Op {
	return b.add(&Op{Worker: worker, Kind: 'A', Owner: "o", Key: key, LeaseMs: lease, Invoke: ms(inv), Complete: ms(comp), Result: res, Token: tok})
}

func (b *hist) rel(worker int, key string, tok uint64, inv, comp int64, res string) *Op {
	return b.add(&Op{Worker: worker, Kind: 'R', Key: key, Token: tok, Invoke: ms(inv), Complete: ms(comp), Result: res})
}

func (b *hist) write(worker int, key string, g *Op, at int64, res string) *Op {
	return b.add(&Op{Worker: worker, Kind: 'W', Key: key, Token: g.Token, Grant: g.ID, Invoke: ms(at), Complete: ms(at), Result: res})
}

func checkModes(t *testing.T, b *hist, want string) {
	t.Helper()
	for _, mode := range []string{"single", "cluster"} {
		r := Check(b.h, CheckConfig{Mode: mode, MaxLease: ms(5000), LinTimeout: 10 * time.Second})
		got := map[string]bool{}
		for _, v := range r.Violations {
			got[v.Check] = true
		}
		if want == "" {
			if r.Failed() {
				t.Errorf("%s: want no violation, got %v %v", mode, r.Violations, r.Undecided)
			}
			continue
		}
		if !got[want] {
			t.Errorf("%s: want a %q violation, got %v", mode, want, r.Violations)
		}
	}
}

// A legal history: grants one after another, a wait, a lease that expires
// and is taken over, releases, a T while held, a late release answered N.
func TestCheckLegalHistory(t *testing.T) {
	b := newHist()
	g1 := b.acq(1, "k", 1000, 0, 1, ResGranted, 1)
	b.write(1, "k", g1, 2, ResAccepted)
	b.acq(2, "k", 1000, 5, 6, ResTimedOut, 0)
	b.rel(1, "k", 1, 10, 11, ResReleased)
	g2 := b.acq(2, "k", 300, 20, 21, ResGranted, 2)
	b.write(2, "k", g2, 22, ResAccepted)
	// g2 lets its lease run out; cluster mode ends it 500ms late.
	g3 := b.acq(3, "k", 1000, 900, 901, ResGranted, 5)
	b.write(3, "k", g3, 902, ResAccepted)
	b.write(2, "k", g2, 903, ResRefused) // stale holder fenced off
	b.rel(2, "k", 2, 950, 951, ResNotReleased)
	b.rel(3, "k", 5, 1000, 1001, ResReleased)
	b.rel(3, "k", 5, 1002, 1003, ResNotReleased)
	// An acquire whose connection broke: maybe granted, never seen.
	b.acq(4, "k", 200, 1100, 0, ResUnknown, 0)
	b.acq(5, "k", 1000, 1400, 1401, ResGranted, 7)
	checkModes(t, b, "")
}

func TestCheckFlagsDoubleGrant(t *testing.T) {
	b := newHist()
	b.acq(1, "k", 1000, 0, 1, ResGranted, 1)
	b.acq(2, "k", 1000, 100, 101, ResGranted, 2) // token 1's lease runs to 1000 at least
	checkModes(t, b, CheckExclusion)
	checkModes(t, b, CheckLinearLock)
}

func TestCheckFlagsDoubleGrantAtTheRegister(t *testing.T) {
	b := newHist()
	g1 := b.acq(1, "k", 1000, 0, 1, ResGranted, 1)
	g2 := b.acq(2, "k", 1000, 100, 101, ResGranted, 2)
	b.write(2, "k", g2, 102, ResAccepted)
	b.write(1, "k", g1, 103, ResRefused)
	checkModes(t, b, CheckRegister)
}

func TestCheckFlagsTokenGoingBack(t *testing.T) {
	b := newHist()
	b.acq(1, "k", 100, 0, 1, ResGranted, 7)
	b.rel(1, "k", 7, 2, 3, ResReleased)
	b.acq(2, "k", 100, 10, 11, ResGranted, 5)
	checkModes(t, b, CheckTokens)
	checkModes(t, b, CheckLinearLock)
}

func TestCheckFlagsRepeatedToken(t *testing.T) {
	b := newHist()
	b.acq(1, "k", 100, 0, 1, ResGranted, 3)
	b.acq(2, "k", 100, 0, 500, ResGranted, 3)
	checkModes(t, b, CheckTokens)
}

// A release acknowledged but lost: the token still releases, or the key
// still reads as held.
func TestCheckFlagsLostRelease(t *testing.T) {
	b := newHist()
	b.acq(1, "k", 10000, 0, 1, ResGranted, 1)
	b.rel(1, "k", 1, 10, 11, ResReleased)
	b.rel(1, "k", 1, 20, 21, ResReleased)
	checkModes(t, b, CheckDurability)

	b = newHist()
	b.acq(1, "k", 10000, 0, 1, ResGranted, 1)
	b.rel(1, "k", 1, 10, 11, ResReleased)
	b.acq(2, "k", 10000, 20, 21, ResTimedOut, 0) // nobody holds it
	checkModes(t, b, CheckLinearLock)
}

// A release sent again after an unknown outcome (as the Go client does):
// its N is explained by the first copy, which then took effect, so the key
// is free after it, and a T that says otherwise is caught.
func TestCheckReleaseSentAgain(t *testing.T) {
	for _, res := range []string{ResReleased, ResNotReleased} {
		b := newHist()
		b.acq(1, "k", 10000, 0, 1, ResGranted, 1)
		b.rel(1, "k", 1, 10, 0, ResUnknown)
		b.rel(1, "k", 1, 20, 21, res).Again = true
		b.acq(2, "k", 10000, 30, 31, ResGranted, 2)
		checkModes(t, b, "")
	}
	b := newHist()
	b.acq(1, "k", 10000, 0, 1, ResGranted, 1)
	b.rel(1, "k", 1, 10, 0, ResUnknown)
	b.rel(1, "k", 1, 20, 21, ResNotReleased).Again = true
	b.acq(2, "k", 10000, 30, 31, ResTimedOut, 0)
	checkModes(t, b, CheckLinearLock)
}

// An acknowledged grant that the server forgot.
func TestCheckFlagsForgottenGrant(t *testing.T) {
	b := newHist()
	b.acq(1, "k", 10000, 0, 1, ResGranted, 1)
	b.rel(1, "k", 1, 100, 101, ResNotReleased)
	checkModes(t, b, CheckDurability)
}

// Single mode may forget holders in a crash, but no key may be granted
// while a lease from before it could run.
func TestCheckCrashInSingleMode(t *testing.T) {
	b := newHist()
	b.acq(1, "k", 3000, 0, 1, ResGranted, 1)
	b.h.Events = append(b.h.Events, &Event{Start: ms(100), End: ms(600), Kind: EvCrash})
	b.rel(1, "k", 1, 700, 701, ResNotReleased)    // forgotten: allowed
	b.acq(2, "k", 1000, 800, 801, ResTimedOut, 0) // grace
	r := Check(b.h, CheckConfig{Mode: "single", MaxLease: ms(5000)})
	if len(r.Violations) > 0 {
		t.Fatalf("legal crash history flagged: %v", r.Violations)
	}
	b.acq(3, "k", 1000, 900, 901, ResGranted, 1000) // before token 1's lease ended
	r = Check(b.h, CheckConfig{Mode: "single", MaxLease: ms(5000)})
	var got []string
	for _, v := range r.Violations {
		got = append(got, v.Check)
	}
	if !strings.Contains(strings.Join(got, ","), CheckExclusion) {
		t.Fatalf("grant during grace not flagged: %v", r.Violations)
	}
}

// A kill sent just before an acquire may land after the server answered
// it (seen in a campaign: the grant sent 18µs after the kill, answered
// 1.7ms later): the crash may still forget that holder.
func TestCheckCrashLandingAfterAGrant(t *testing.T) {
	b := newHist()
	b.h.Events = append(b.h.Events, &Event{Start: ms(100), End: ms(600), Kind: EvCrash})
	b.acq(1, "k", 3000, 101, 102, ResGranted, 1)
	b.rel(1, "k", 1, 700, 701, ResNotReleased)
	if r := Check(b.h, CheckConfig{Mode: "single", MaxLease: ms(5000)}); len(r.Violations) > 0 {
		t.Fatalf("legal crash history flagged: %v", r.Violations)
	}
	b = newHist() // a crash over before the grant explains nothing
	b.h.Events = append(b.h.Events, &Event{Start: ms(100), End: ms(600), Kind: EvCrash})
	b.acq(1, "k", 3000, 650, 651, ResGranted, 1)
	b.rel(1, "k", 1, 700, 701, ResNotReleased)
	if r := Check(b.h, CheckConfig{Mode: "single", MaxLease: ms(5000)}); len(r.Violations) == 0 {
		t.Fatal("a grant forgotten without a crash after it not flagged")
	}
}

func TestCheckFlagsDuplicateAnswer(t *testing.T) {
	b := newHist()
	b.h.Anomalies = append(b.h.Anomalies, &Anomaly{At: ms(5), What: "answer matches no request in flight", Line: "A 3 o k\n"})
	checkModes(t, b, CheckOnce)
}

// A T in single mode when the holder's lease had certainly ended: the
// server should have taken the key over.
func TestCheckFlagsStaleHeldInSingleMode(t *testing.T) {
	b := newHist()
	b.acq(1, "k", 100, 0, 1, ResGranted, 1)
	b.acq(2, "k", 100, 500, 501, ResTimedOut, 0)
	r := Check(b.h, CheckConfig{Mode: "single", MaxLease: ms(5000)})
	if len(r.Violations) == 0 {
		t.Fatal("T long after the only lease ended not flagged in single mode")
	}
	if r := Check(b.h, CheckConfig{Mode: "cluster"}); len(r.Violations) > 0 {
		t.Fatalf("cluster mode holds a key until Expire commits, flagged: %v", r.Violations)
	}
}

// A search porcupine cannot finish in time is neither a pass nor a
// violation: the run fails, and the report says "not decided".
func TestCheckUndecidedFails(t *testing.T) {
	b := newHist()
	b.acq(1, "k", 100, 0, 1, ResGranted, 1)
	// Unknown outcomes that all overlap: the search tries their subsets
	// before it can rule out the release at the end, which matches nothing.
	for i := range 40 {
		b.acq(10+i, "k", 100, 2, 0, ResUnknown, 0)
	}
	b.rel(2, "k", 99, 10, 11, ResReleased)
	r := Check(b.h, CheckConfig{Mode: "cluster", LinTimeout: 50 * time.Millisecond})
	if len(r.Undecided) != 1 || r.Undecided[0].Check != CheckLinearLock || r.Undecided[0].Key != "k" {
		t.Fatalf("want key k undecided, got %v (violations %v)", r.Undecided, r.Violations)
	}
	o := &Outcome{Config: Config{Name: "undecided", Mode: "cluster", Workers: DefaultWorkers()}, History: b.h, Check: r, Shards: campaignShards}
	if !o.Failed() {
		t.Fatal("an undecided key passes the run")
	}
	path, err := writeReport(t.TempDir(), o)
	if err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(md), "| "+CheckLinearLock+" | **not decided** (1 key(s)) |") || !strings.Contains(string(md), "**FAILED**") {
		t.Fatalf("report does not show the undecided check:\n%s", md)
	}
}

// A queued grant took effect after the operations placed before it: here
// after H's release, so W's lease (300 ms) runs to 1200 ms at least, and X's
// grant at 1100 ms is a second holder. Anchored at W's own send (2 ms) its
// lease would seem over by then.
func TestCheckQueuedGrantLeaseRunsFromItsPlace(t *testing.T) {
	b := newHist()
	b.acq(1, "k", 5000, 0, 1, ResGranted, 1)
	b.add(&Op{Worker: 2, Kind: 'A', Owner: "w", Key: "k", LeaseMs: 300, WaitMs: 1500, Invoke: ms(2), Complete: ms(1001), Result: ResGranted, Token: 2})
	b.rel(1, "k", 1, 900, 901, ResReleased)
	b.acq(3, "k", 1000, 1100, 1101, ResGranted, 3)
	checkModes(t, b, CheckLinearLock)
}

// A grant that took the key over from a holder whose lease had to run out
// took effect no earlier than that lease's end, and its own lease counts
// from there. H holds k for 600 ms from 0 and never releases it. In each
// history a second grant comes from the end of H's lease (at 600 ms at the
// earliest) and holds 300 ms more, to 900 ms at least:
//   - W, queued (sent at 5 ms), answered at 602 ms; X granted at 700 ms;
//   - W with wait 0, sent at 550 ms and answered at 650 ms; X at 860 ms;
//   - W queued as in the first, and its release at 700 ms answered N: a
//     grant forgotten while its lease ran.
//
// Counted from W's own send, W's lease would seem over in time for each.
func TestCheckTakeOverLeaseRunsFromTheEndBefore(t *testing.T) {
	queued := func() *hist {
		b := newHist()
		b.acq(1, "k", 600, 0, 1, ResGranted, 1)
		b.add(&Op{Worker: 2, Kind: 'A', Owner: "w", Key: "k", LeaseMs: 300, WaitMs: 1000, Invoke: ms(5), Complete: ms(602), Result: ResGranted, Token: 2})
		return b
	}
	b := queued()
	b.acq(3, "k", 1000, 700, 701, ResGranted, 3)
	checkModes(t, b, CheckLinearLock)

	b = newHist()
	b.acq(1, "k", 600, 0, 1, ResGranted, 1)
	b.acq(2, "k", 300, 550, 650, ResGranted, 2)
	b.acq(3, "k", 1000, 860, 861, ResGranted, 3)
	checkModes(t, b, CheckLinearLock)

	b = queued()
	b.rel(2, "k", 2, 700, 701, ResNotReleased)
	checkModes(t, b, CheckLinearLock)

	// And the same grants after W's lease from there are legal.
	b = queued()
	b.acq(3, "k", 1000, 905, 906, ResGranted, 3)
	checkModes(t, b, "")
	b = queued()
	b.rel(2, "k", 2, 905, 906, ResNotReleased)
	checkModes(t, b, "")
}

// A grant answered after its own lease could have ended holds for certain
// at no instant we can name, but it was made between its send and its
// answer: inside another grant's certain interval, that is a double grant.
func TestCheckFlagsLateGrantInsideAnothersLease(t *testing.T) {
	b := newHist()
	b.acq(1, "k", 5000, 0, 1, ResGranted, 1)
	b.add(&Op{Worker: 2, Kind: 'A', Owner: "w", Key: "k", LeaseMs: 300, WaitMs: 1500, Invoke: ms(100), Complete: ms(500), Result: ResGranted, Token: 2})
	checkModes(t, b, CheckExclusion)

	// Handed over on the holder's release: the window reaches past it.
	b = newHist()
	b.acq(1, "k", 5000, 0, 1, ResGranted, 1)
	b.add(&Op{Worker: 2, Kind: 'A', Owner: "w", Key: "k", LeaseMs: 300, WaitMs: 1500, Invoke: ms(100), Complete: ms(500), Result: ResGranted, Token: 2})
	b.rel(1, "k", 1, 400, 401, ResReleased)
	checkModes(t, b, "")
}

// An acquire with an unknown outcome that explains a T holds the key until
// its lease ends, unless the server released it as undeliverable, which it
// can do only once the connection is gone (LostAt).
func TestCheckGhostHoldsUntilLost(t *testing.T) {
	build := func(lostAt, grantAt int64) *hist {
		b := newHist()
		b.acq(1, "k", 100, 0, 1, ResGranted, 1)
		b.rel(1, "k", 1, 10, 11, ResReleased)
		b.acq(2, "k", 5000, 20, 0, ResUnknown, 0).LostAt = ms(lostAt)
		b.acq(3, "k", 1000, 30, 31, ResTimedOut, 0) // only the unknown grant explains it
		b.acq(4, "k", 1000, grantAt, grantAt+1, ResGranted, 3)
		return b
	}
	checkModes(t, build(3000, 100), CheckLinearLock) // the T's holder vanished
	checkModes(t, build(3000, 3000), "")             // released once its connection was gone
	checkModes(t, build(0, 100), "")                 // a history without LostAt: any time
}

// A crash ends when the killed process has died (Killed), not when the
// restarted one listens (End): a grant sent in between was made by the
// restarted process, which must not forget it.
func TestCheckCrashEndsWhenTheProcessDied(t *testing.T) {
	build := func(killed int64) *hist {
		b := newHist()
		b.h.Events = append(b.h.Events, &Event{Start: ms(100), Killed: ms(killed), End: ms(600), Kind: EvCrash})
		b.acq(1, "k", 5000, 580, 590, ResGranted, 1)
		b.rel(1, "k", 1, 700, 701, ResNotReleased)
		return b
	}
	got := map[string]bool{}
	for _, v := range Check(build(110).h, CheckConfig{Mode: "single", MaxLease: ms(5000)}).Violations {
		got[v.Check] = true
	}
	if !got[CheckDurability] || !got[CheckLinearLock] {
		t.Fatalf("grant of the restarted process forgotten: want %q and %q violations, got %v", CheckDurability, CheckLinearLock, got)
	}
	// A history without Killed: the crash may have lasted until End.
	if r := Check(build(0).h, CheckConfig{Mode: "single", MaxLease: ms(5000)}); r.Failed() {
		t.Fatalf("old history without Killed flagged: %v", r.Violations)
	}
}

// Single mode's crash grace is counted from the restart (End), which does
// not trust its wall clock: T answers to a free key are allowed until the
// restart plus the longest lease and the lease step, and flagged after.
func TestCheckCrashGraceFromTheRestart(t *testing.T) {
	build := func(tAt int64) *hist {
		b := newHist()
		b.acq(1, "k", 100, 0, 1, ResGranted, 1)
		b.rel(1, "k", 1, 10, 11, ResReleased)
		b.h.Events = append(b.h.Events, &Event{Start: ms(100), Killed: ms(400), End: ms(900), Kind: EvCrash})
		b.acq(2, "k", 1000, tAt, tAt+1, ResTimedOut, 0)
		return b
	}
	cfg := CheckConfig{Mode: "single", MaxLease: ms(5000)}
	// 900 + 5000 + 2000 ms of lease ceiling step, and a few ms.
	if r := Check(build(7850).h, cfg); r.Failed() {
		t.Fatalf("T within the grace flagged: %v", r.Violations)
	}
	if r := Check(build(8000).h, cfg); len(r.Violations) == 0 {
		t.Fatal("T after the grace not flagged")
	}
}

// A shard that answers every request (T, here) but grants nothing once a
// fault has ended is stuck; the same stretch under the fault is not.
func TestCheckProgressAfterAFault(t *testing.T) {
	build := func(faultEnd int64) *hist {
		b := newHist()
		b.h.Events = []*Event{{Start: ms(1000), End: ms(faultEnd), Kind: EvPause}}
		g := b.acq(1, "k", 1000, 0, 1, ResGranted, 1)
		b.rel(1, "k", g.Token, 10, 11, ResReleased)
		for at := int64(500); at < 14_000; at += 500 {
			b.acq(2, "k", 1000, at, at+400, ResTimedOut, 0) // wait 400 ms for a free key: stuck
		}
		b.acq(1, "k", 1000, 14_000, 14_001, ResGranted, 2)
		return b
	}
	// Stuck from 0.5 s to 14 s: 13.5 s, of which the fault took 12.5 s.
	if r := Check(build(13_500).h, CheckConfig{Mode: "cluster"}); hasCheck(r, CheckProgress) {
		t.Errorf("1 s outside the fault flagged: %v", r.Violations)
	}
	// The fault ends at 2 s: 12 s outside it with nothing granted.
	r := Check(build(2000).h, CheckConfig{Mode: "cluster"})
	if !hasCheck(r, CheckProgress) {
		t.Fatalf("12 s with requests and no grant outside a fault: want a %q violation, got %v", CheckProgress, r.Violations)
	}
	// So is a shard stuck to the end of the run.
	b := build(2000)
	b.h.Ops = b.h.Ops[:len(b.h.Ops)-1]
	if r := Check(b.h, CheckConfig{Mode: "cluster"}); !hasCheck(r, CheckProgress) {
		t.Errorf("stuck to the end: want a %q violation, got %v", CheckProgress, r.Violations)
	}
	// A shard nobody asks anything for a long while is not stuck.
	q := newHist()
	q.acq(1, "k", 1000, 0, 1, ResGranted, 1)
	q.rel(1, "k", 1, 10, 11, ResReleased)
	q.acq(1, "k", 1000, 30_000, 30_001, ResGranted, 2)
	if r := Check(q.h, CheckConfig{Mode: "cluster"}); hasCheck(r, CheckProgress) {
		t.Errorf("a quiet shard flagged: %v", r.Violations)
	}
}

func hasCheck(r *CheckResult, check string) bool {
	for _, v := range r.Violations {
		if v.Check == check {
			return true
		}
	}
	return false
}

// The fault table's "grants again" is the shard that granted last after the
// fault's end; a shard asked and granting nothing before the next fault
// reads none, and a shard asked nothing is left out.
func TestGapsGrantsAgain(t *testing.T) {
	const shards = 8
	var keys [shards]string // a key on each shard
	for i := 0; ; i++ {
		k := fmt.Sprintf("k%d", i)
		if s := shard.Index(k, shards); keys[s] == "" {
			keys[s] = k
		}
		if !slices.Contains(keys[:], "") {
			break
		}
	}
	b := newHist()
	b.h.Events = []*Event{{Start: ms(100), End: ms(200), Kind: EvPause}, {Start: ms(1000), End: ms(1100), Kind: EvPause}}
	b.acq(1, keys[0], 1000, 210, 250, ResGranted, 1)
	b.acq(2, keys[1], 1000, 205, 600, ResGranted, 1)
	b.acq(3, keys[2], 1000, 300, 310, ResTimedOut, 0) // asked, granted only after the next fault
	b.acq(3, keys[2], 1000, 1200, 1210, ResGranted, 1)
	gaps := Gaps(b.h, shards)
	if g := gaps[0]; g.GrantsBack != -1 || g.GrantsBackShard != shard.Index(keys[2], shards) {
		t.Errorf("first fault: grants again %v on shard %d, want none on shard %d", g.GrantsBack, g.GrantsBackShard, shard.Index(keys[2], shards))
	}
	if g := gaps[1]; g.GrantsBack != 110*time.Millisecond || g.GrantsBackShard != shard.Index(keys[2], shards) {
		t.Errorf("second fault: grants again %v on shard %d, want 110ms on shard %d", g.GrantsBack, g.GrantsBackShard, shard.Index(keys[2], shards))
	}
}

func TestGapsGrantsAgainWithNothingAsked(t *testing.T) {
	b := newHist()
	b.h.Events = []*Event{{Start: ms(100), End: ms(200), Kind: EvPause}}
	b.acq(1, "k", 1000, 0, 1, ResGranted, 1)
	if g := Gaps(b.h, 8)[0]; g.GrantsBack != -2 {
		t.Errorf("nothing asked after the fault: grants again %v, want -2 (not measured)", g.GrantsBack)
	}
}

// A clean restart in single mode moves the leases it restores by up to its
// own length: T answers to the held key are allowed that much past the
// lease's end, and a grant there is not a violation either.
func TestCheckCleanRestartMovesLeases(t *testing.T) {
	build := func(tAt int64, res string) *hist {
		b := newHist()
		b.acq(1, "k", 2000, 0, 1, ResGranted, 1) // lease to 2 s
		b.h.Events = append(b.h.Events, &Event{Start: ms(500), End: ms(1500), Kind: EvRestart})
		if res == ResGranted {
			b.acq(2, "k", 1000, tAt, tAt+1, ResGranted, 2)
		} else {
			b.acq(2, "k", 1000, tAt, tAt+1, ResTimedOut, 0)
		}
		return b
	}
	cfg := CheckConfig{Mode: "single", MaxLease: ms(5000)}
	if r := Check(build(2800, ResTimedOut).h, cfg); r.Failed() {
		t.Fatalf("T within the lease moved by the restart flagged: %v", r.Violations)
	}
	if r := Check(build(2100, ResGranted).h, cfg); r.Failed() {
		t.Fatalf("a grant after the lease, within what the restart may add, flagged: %v", r.Violations)
	}
	if r := Check(build(3100, ResTimedOut).h, cfg); len(r.Violations) == 0 {
		t.Fatal("T after the lease and all the restart may add not flagged")
	}
}

// A key that answers T long after its only holder's lease ended is stuck:
// a cluster ends a lease when its Expire commits, some time after its end,
// but not never. Flagged once the lease, the skew, MaxLate and the slack
// have passed with no fault within afterFault before; not earlier, and not
// while a fault may still hold the Expire up.
func TestCheckFlagsKeyLeftLockedInCluster(t *testing.T) {
	build := func(tAt int64, faults ...*Event) *hist {
		b := newHist()
		b.h.Events = faults
		b.acq(1, "k", 1000, 0, 1, ResGranted, 1)
		b.acq(2, "k", 1000, tAt, tAt+1, ResTimedOut, 0)
		return b
	}
	cfg := CheckConfig{Mode: "cluster", Skew: ms(500), MaxLate: ms(6100)}
	// 1 + 1000 + 500 + 6100 + 1000 ms.
	if r := Check(build(8500).h, cfg); r.Failed() {
		t.Errorf("T within the lease, the skew, MaxLate and the slack flagged: %v", r.Violations)
	}
	if r := Check(build(8700).h, cfg); !hasCheck(r, CheckLinearLock) {
		t.Errorf("T after the lease, the skew, MaxLate and the slack with no fault: want a %q violation, got %v", CheckLinearLock, r.Violations)
	}
	partition := func() *Event { return &Event{Start: ms(5000), End: ms(25_000), Kind: EvPartition} }
	if r := Check(build(29_900, partition()).h, cfg); hasCheck(r, CheckLinearLock) {
		t.Errorf("T 4.9 s after a partition ended flagged: %v", r.Violations)
	}
	if r := Check(build(30_100, partition()).h, cfg); !hasCheck(r, CheckLinearLock) {
		t.Errorf("T 5.1 s after the last fault ended: want a %q violation, got %v", CheckLinearLock, r.Violations)
	}
}

// An acquire whose answer never came may have been granted, but only
// before its wait ran out (and, in single mode, before its connection was
// found gone): the T answers it explains end with its lease after that.
func TestCheckGhostExplainsTOnlyWhileItsLeaseCouldRun(t *testing.T) {
	build := func(tAt int64) *hist {
		b := newHist()
		b.add(&Op{Worker: 2, Kind: 'A', Owner: "o", Key: "k", LeaseMs: 1000, WaitMs: 500, Invoke: ms(0), Result: ResUnknown}).LostAt = ms(100)
		b.acq(3, "k", 1000, tAt, tAt+1, ResTimedOut, 0)
		return b
	}
	single := CheckConfig{Mode: "single", MaxLease: ms(5000)}
	// Granted by 100 ms (lost) + 1 s, held 1 s more.
	if r := Check(build(2000).h, single); hasCheck(r, CheckLinearLock) {
		t.Errorf("single: T while the unknown grant's lease could run flagged: %v", r.Violations)
	}
	if r := Check(build(2200).h, single); !hasCheck(r, CheckLinearLock) {
		t.Errorf("single: T after the unknown grant's lease: want a %q violation, got %v", CheckLinearLock, r.Violations)
	}
	// A cluster: committed within MaxLate and granted within its wait, plus
	// the slack; held its lease, MaxLate and the slack more:
	// 500 + 6100 + 1000 + 1000 + 6100 + 1000 ms.
	cluster := CheckConfig{Mode: "cluster", MaxLate: ms(6100)}
	if r := Check(build(15_600).h, cluster); hasCheck(r, CheckLinearLock) {
		t.Errorf("cluster: T while the unknown grant may be held flagged: %v", r.Violations)
	}
	if r := Check(build(15_800).h, cluster); !hasCheck(r, CheckLinearLock) {
		t.Errorf("cluster: T after the unknown grant's latest end: want a %q violation, got %v", CheckLinearLock, r.Violations)
	}
}

// A key asked for once is judged too: T for a key nobody ever held,
// outside any crash grace, is a key the server lost track of.
func TestCheckFlagsLoneRefusalOfAFreeKey(t *testing.T) {
	b := newHist()
	b.acq(1, "k", 1000, 0, 1, ResGranted, 1)
	b.rel(1, "k", 1, 2, 3, ResReleased)
	b.acq(2, "lone", 1000, 10, 11, ResTimedOut, 0)
	checkModes(t, b, CheckLinearLock)
}

// A request the client gave up on is excused by a fault that began before
// it gave up, not by one that began after.
func TestCheckHangExcusedOnlyByAFaultBeforeTheClientGaveUp(t *testing.T) {
	build := func(faultAt int64) *hist {
		b := newHist()
		b.h.Events = []*Event{{Start: ms(faultAt), End: ms(faultAt + 1000), Kind: EvPause}}
		o := b.acq(1, "k", 1000, 0, 0, ResUnknown, 0)
		o.Why, o.LostAt = "no answer within 10s; client gave up", ms(10_000)
		return b
	}
	if r := Check(build(5000).h, CheckConfig{Mode: "single", MaxLease: ms(5000)}); hasCheck(r, CheckLiveness) {
		t.Errorf("a hang with a fault under way flagged: %v", r.Violations)
	}
	if r := Check(build(12_000).h, CheckConfig{Mode: "single", MaxLease: ms(5000)}); !hasCheck(r, CheckLiveness) {
		t.Errorf("a hang whose only fault began after the client gave up: want a %q violation, got %v", CheckLiveness, r.Violations)
	}
}

// An unknown acquire never returned, so the search may place it after any
// later operation; it must not be taken as granted there when its wait
// ended (and its connection was gone) long before: here it would hide a
// lost release, a T after the holder's R.
func TestCheckGhostIsNotGrantedPastItsBound(t *testing.T) {
	build := func(lease uint64, relAt, tAt int64, withGhost bool) *hist {
		b := newHist()
		b.acq(1, "k", lease, 0, 1, ResGranted, 1)
		if withGhost {
			g := b.add(&Op{Worker: 2, Kind: 'A', Owner: "g", Key: "k", LeaseMs: 2000, WaitMs: 500, Invoke: ms(20), Result: ResUnknown})
			g.Why, g.LostAt = "connection lost: EOF", ms(100)
		}
		b.rel(1, "k", 1, relAt, relAt+1, ResReleased)
		b.acq(3, "k", 1000, tAt, tAt+1, ResTimedOut, 0)
		return b
	}
	for _, c := range []struct {
		cfg        CheckConfig
		lease      uint64
		relAt, tAt int64
	}{
		{CheckConfig{Mode: "single", MaxLease: ms(30_000)}, 30_000, 19_000, 20_000},
		{CheckConfig{Mode: "cluster", MaxLease: ms(60_000), Skew: ms(500), MaxLate: ms(6100)}, 60_000, 40_000, 41_000},
	} {
		if r := Check(build(c.lease, c.relAt, c.tAt, false).h, c.cfg); !hasCheck(r, CheckLinearLock) {
			t.Fatalf("%s: a T after the holder's R, no unknown acquire: want a %q violation, got %v", c.cfg.Mode, CheckLinearLock, r.Violations)
		}
		if r := Check(build(c.lease, c.relAt, c.tAt, true).h, c.cfg); !hasCheck(r, CheckLinearLock) {
			t.Errorf("%s: a T %d ms after the holder's R, explained by an unknown acquire whose wait ended at 520 ms: want a %q violation, got %v",
				c.cfg.Mode, c.tAt-c.relAt, CheckLinearLock, r.Violations)
		}
	}
}

// everyFourSeconds is a fault schedule as the campaign makes them: 1 s
// faults with 3 s between them, from 5 s to 60 s.
func everyFourSeconds(kind string) []*Event {
	var evs []*Event
	for at := int64(5000); at < 60_000; at += 4000 {
		evs = append(evs, &Event{Start: ms(at), End: ms(at + 1000), Kind: kind, Nodes: []int{1 + int(at/4000)%3}})
	}
	return evs
}

// A fault excuses only what it can have held up: what was due before it
// began, until 5 s after its end. Faults one after another do not excuse
// a key left locked (cluster) or an unknown grant (single mode) for the
// whole run.
func TestCheckFaultsOnlyDelayWhatWasDueBeforeThem(t *testing.T) {
	single := func(faults []*Event) *hist {
		b := newHist()
		b.h.Events = faults
		b.acq(1, "k", 300, 0, 1, ResGranted, 1)
		b.rel(1, "k", 1, 10, 11, ResReleased)
		g := b.add(&Op{Worker: 2, Kind: 'A', Owner: "g", Key: "k", LeaseMs: 1000, WaitMs: 500, Invoke: ms(20), Result: ResUnknown})
		g.Why, g.LostAt = "connection lost: EOF", ms(100)
		b.acq(3, "k", 1000, 40_000, 40_001, ResTimedOut, 0)
		return b
	}
	scfg := CheckConfig{Mode: "single", MaxLease: ms(2000)}
	for _, faults := range [][]*Event{nil, everyFourSeconds(EvPause)} {
		if r := Check(single(faults).h, scfg); !hasCheck(r, CheckLinearLock) {
			t.Errorf("single, %d faults: a T at 40 s explained by an unknown acquire lost at 100 ms (wait 500 ms, lease 1 s): want a %q violation, got %v",
				len(faults), CheckLinearLock, r.Violations)
		}
	}
	cluster := func(faults []*Event) *hist {
		b := newHist()
		b.h.Events = faults
		b.acq(1, "k", 1000, 0, 1, ResGranted, 1) // its Expire never commits
		for at := int64(20_000); at < 60_000; at += 500 {
			b.acq(2, "k", 1000, at, at+1, ResTimedOut, 0)
		}
		return b
	}
	ccfg := CheckConfig{Mode: "cluster", Skew: ms(500), MaxLate: ms(6100)}
	for _, faults := range [][]*Event{nil, everyFourSeconds(EvPause)} {
		if r := Check(cluster(faults).h, ccfg); !hasCheck(r, CheckLinearLock) {
			t.Errorf("cluster, %d faults: a key left locked from 1 s, answering T from 20 s to 60 s: want a %q violation, got %v",
				len(faults), CheckLinearLock, r.Violations)
		}
	}
}

// In single mode a crash grants nothing until its grace is over (up to the
// longest lease and the ceiling's step after the restart): the progress
// check counts the grace as the crash's. Crashes every 4 s, whose graces
// run back to back, are no stall; 12 s after the last grace is.
func TestCheckProgressCountsACrashGraceAsTheCrash(t *testing.T) {
	build := func(until int64) *hist {
		b := newHist()
		for at := int64(1000); at < 21_000; at += 4000 {
			b.h.Events = append(b.h.Events, &Event{Start: ms(at), Killed: ms(at + 100), End: ms(at + 1000), Kind: EvCrash})
		}
		g := b.acq(1, "k", 1000, 0, 1, ResGranted, 1)
		b.rel(1, "k", g.Token, 10, 11, ResReleased)
		for at := int64(1500); at < until; at += 500 {
			b.acq(2, "k", 1000, at, at+1, ResTimedOut, 0) // refused: a grace
		}
		return b
	}
	cfg := CheckConfig{Mode: "single", MaxLease: ms(2000)}
	// Graces end by 22 s + 2 s + 2 s: T answers to 30 s are within 10 s of it.
	if r := Check(build(30_000).h, cfg); hasCheck(r, CheckProgress) {
		t.Errorf("back-to-back crash graces counted as a stall: %v", r.Violations)
	}
	if r := Check(build(40_000).h, cfg); !hasCheck(r, CheckProgress) {
		t.Errorf("nothing granted for 14 s after the last grace: want a %q violation, got %v", CheckProgress, r.Violations)
	}
}
