package chaos

import (
	"testing"
	"time"
)

// waited adds a grant to an acquire that waited (wait 2000 ms), dated by
// the client's rule rtt ms before its answer at comp: a later request on
// its connection, sent then, was answered before it.
func (b *hist) waited(worker int, key string, lease uint64, inv, comp, rtt int64, tok uint64) *Op {
	return b.add(&Op{Worker: worker, Kind: 'A', Owner: "w", Key: key, LeaseMs: lease, WaitMs: 2000,
		Invoke: ms(inv), Complete: ms(comp), Result: ResGranted, Token: tok, Start: max(ms(inv), ms(comp-rtt))})
}

// handOver: H holds k (token 1, lease 1000 ms) from 0; X queues at 100 ms
// (lease 500 ms) and gets k when H releases it at 800 ms, but X's answer
// leaves at answered ms (a synced write held it up), 1 ms round trip. Y
// takes k over (wait 0) in [next, next+1] ms, after X let it run out.
func handOver(answered, next int64) (*hist, *Op) {
	b := newHist()
	b.acq(1, "k", 1000, 0, 1, ResGranted, 1)
	x := b.waited(2, "k", 500, 100, answered, 1, 2)
	b.rel(1, "k", 1, 800, 801, ResReleased)
	b.acq(3, "k", 500, next, next+1, ResGranted, 3)
	return b, x
}

func checkBoth(t *testing.T, b *hist, cfg CheckConfig) map[string]bool {
	t.Helper()
	cfg.MaxLease, cfg.LinTimeout = ms(5000), 10*time.Second
	got := map[string]bool{}
	for _, v := range Check(b.h, cfg).Violations {
		got[v.Check] = true
	}
	return got
}

// A correct server: a hand-over answered at once, and one answered 400 ms
// late whose lease the server moved on by that much (renewed), each taken
// over only after the client's rule ends it.
func TestClientRuleRenewedHandOverPasses(t *testing.T) {
	for _, c := range []struct{ answered, next int64 }{{810, 1310}, {1200, 1700}} {
		b, _ := handOver(c.answered, c.next)
		checkModes(t, b, "")
	}
}

// The server did not renew the late hand-over: X's lease ran from 800 ms
// and Y took k at 1310 ms, while X, answered at 1200 ms, counts its lease
// to 1699 ms. The send-dated checks pass it; the client's rule does not.
func TestClientRuleFlagsUnrenewedHandOver(t *testing.T) {
	b, x := handOver(1200, 1310)
	checkModes(t, b, CheckExclusion)
	checkModes(t, b, CheckLinearLock)

	// Without the client's dating, nothing is wrong to see.
	x.Start = 0
	checkModes(t, b, "")
	x.Start = ms(1199)

	// The fenced register sees it too: Y writes, then X, still within
	// its lease by the client's rule, is refused.
	y := b.h.Ops[len(b.h.Ops)-1]
	b.write(2, "k", x, 1250, ResAccepted)
	b.write(3, "k", y, 1320, ResAccepted)
	b.write(2, "k", x, 1400, ResRefused)
	checkModes(t, b, CheckRegister)
}

// A later holder's accepted write while a lower token is certainly held is
// flagged even when the lower holder never writes again.
func TestClientRuleFlagsHigherWriteWithinHold(t *testing.T) {
	b, _ := handOver(1200, 1310)
	y := b.h.Ops[len(b.h.Ops)-1]
	b.write(3, "k", y, 1320, ResAccepted)
	for _, mode := range []string{"single", "cluster"} {
		if got := checkBoth(t, b, CheckConfig{Mode: mode, Skew: ms(500)}); !got[CheckRegister] {
			t.Errorf("%s: want a %q violation, got %v", mode, CheckRegister, got)
		}
	}
}

// The margin: a takeover within clientMargin of the client's deadline is
// measurement error, not a broken promise; one just past it is flagged.
func TestClientRuleMargin(t *testing.T) {
	m := clientMargin / int64(time.Millisecond)
	b, _ := handOver(1200, 1699-m)
	checkModes(t, b, "")
	b, _ = handOver(1200, 1699-m-2)
	checkModes(t, b, CheckExclusion)
}

// A pause across the answer excuses nothing: a server stopped between its
// renewal and its write read nothing meanwhile, so the request answered
// before the grant was sent before the renewal, and a correct server's
// lease runs past the client's rule. A clock fault (cluster) costs the
// rule half the skew.
func TestClientRuleExceptions(t *testing.T) {
	b, _ := handOver(1200, 1310)
	b.h.Events = []*Event{{Start: ms(900), End: ms(1150), Kind: EvPause}}
	checkModes(t, b, CheckExclusion)

	b, _ = handOver(1200, 1500)
	b.h.Events = []*Event{{Start: ms(1100), End: ms(1400), Kind: EvClock}}
	if got := checkBoth(t, b, CheckConfig{Mode: "cluster", Skew: ms(500)}); len(got) != 0 {
		t.Errorf("cluster, clock fault, takeover within half the skew: want no violation, got %v", got)
	}
	if got := checkBoth(t, b, CheckConfig{Mode: "cluster"}); len(got) != 0 {
		t.Errorf("cluster, clock fault, skew unknown: want no violation, got %v", got)
	}
	b, _ = handOver(1200, 1300)
	b.h.Events = []*Event{{Start: ms(1100), End: ms(1400), Kind: EvClock}}
	if got := checkBoth(t, b, CheckConfig{Mode: "cluster", Skew: ms(500)}); !got[CheckExclusion] {
		t.Errorf("cluster, clock fault, takeover past half the skew: want a %q violation, got %v", CheckExclusion, got)
	}
}

// The recorder dates a waited grant as the Go client does: from its send,
// or from the latest send of a request answered before it on its
// connection if that is later; never from its arrival, which a stalled
// reader or server makes late.
func TestRecorderDatesWaitedGrants(t *testing.T) {
	h := &History{}
	var floor int64 // a new connection: nothing answered
	first := &Op{Kind: 'A', WaitMs: 500, Invoke: ms(1)}
	h.complete(first, ms(8), ResGranted, 6, &floor)
	if first.Start != ms(1) || floor != ms(1) {
		t.Errorf("first waited grant: start %v, floor %v, want its send, 1ms, both", time.Duration(first.Start), time.Duration(floor))
	}
	// Pipelined: a waited acquire sent at 20 ms, then a release at 30 ms
	// answered first; the grant, answered at 300 ms, counts from 30 ms.
	wait := &Op{Kind: 'A', WaitMs: 500, Invoke: ms(20)}
	rel := &Op{Kind: 'R', Invoke: ms(30)}
	h.complete(rel, ms(32), ResReleased, 0, &floor)
	h.complete(wait, ms(300), ResGranted, 7, &floor)
	if wait.Start != ms(30) || floor != ms(30) {
		t.Errorf("waited grant after a later request's answer: start %v, floor %v, want 30ms both", time.Duration(wait.Start), time.Duration(floor))
	}
	late := &Op{Kind: 'A', WaitMs: 500, Invoke: ms(400)}
	h.complete(late, ms(900), ResGranted, 8, &floor)
	if late.Start != ms(400) {
		t.Errorf("waited grant answered 500ms after its send: start %v, want the send, 400ms, not its arrival", time.Duration(late.Start))
	}
	now := &Op{Kind: 'A', Invoke: ms(1000)}
	h.complete(now, ms(1005), ResGranted, 9, &floor)
	if now.Start != 0 || floor != ms(1000) {
		t.Errorf("wait-0 acquire: start %v, floor %v, want 0 (its send dates it), 1000ms", time.Duration(now.Start), time.Duration(floor))
	}
}
