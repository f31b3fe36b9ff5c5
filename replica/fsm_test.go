package replica

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"slices"
	"testing"
	"time"
	"unsafe"

	sm "github.com/lni/dragonboat/v4/statemachine"

	"github.com/ticketd/ticketd/shard"
)

// recorder is a sink that keeps what a replica decides for its node.
type recorder struct{ got []string }

func (r *recorder) deliver(_ int, ans []shard.Answer) {
	for _, a := range ans {
		r.got = append(r.got, string(a.Result.Letter())+" "+string(a.Owner)+" "+string(a.Key))
	}
}

func (r *recorder) notice(_ int, node uint32, kind uint64, _ int64) {
	r.got = append(r.got, fmt.Sprintf("notice %d from %d", kind, node))
}

func (r *recorder) renew(_ int, cmds []shard.Command) {
	for _, c := range cmds {
		r.got = append(r.got, fmt.Sprintf("renew %d %s %s lease %d allow %d", c.Token, c.Owner, c.Key, c.LeaseMs, c.WaitMs))
	}
}

func (r *recorder) lapsed(_ int, grants []shard.Answer) {
	for _, a := range grants {
		r.got = append(r.got, fmt.Sprintf("lapsed %c %s %s", a.Result.Letter(), a.Owner, a.Key))
	}
}

func (r *recorder) lost(_ int, conns []uint64) {
	r.got = append(r.got, fmt.Sprintf("lost %v", conns))
}

func (r *recorder) behind(_ int, logInc uint64) {
	r.got = append(r.got, fmt.Sprintf("behind %d", logInc))
}

func (r *recorder) applied(int, []uint64) {}

type batch struct {
	h    header
	cmds []shard.Command
}

func (b batch) bytes() []byte {
	b.h.count = uint64(len(b.cmds))
	out := appendHeader(nil, b.h)
	for i := range b.cmds {
		out = appendCommand(out, &b.cmds[i])
	}
	return out
}

func acquire(conn, seq uint64, owner, key string, lease, wait uint64) shard.Command {
	return shard.Command{Op: shard.OpAcquire, From: shard.Requester{Conn: conn, Seq: seq}, Owner: []byte(owner), Key: []byte(key), LeaseMs: lease, WaitMs: wait}
}

// snapshot is f's replica snapshot, as SaveSnapshot writes it.
func snapshot(t *testing.T, f *fsm) []byte {
	t.Helper()
	ctx, err := f.PrepareSnapshot()
	if err != nil {
		t.Fatal(err)
	}
	return ctx.([]byte)
}

// restore recovers f from the snapshot b.
func restore(t *testing.T, f *fsm, b []byte) {
	t.Helper()
	if err := f.RecoverFromSnapshot(bytes.NewReader(b), nil, nil); err != nil {
		t.Fatal(err)
	}
}

// update applies bs as one Update and returns each entry's result.
func update(t *testing.T, f *fsm, bs ...batch) []uint64 {
	t.Helper()
	ents := make([]sm.Entry, len(bs))
	for i, b := range bs {
		ents[i] = sm.Entry{Index: f.applied + uint64(i) + 1, Cmd: b.bytes()}
	}
	if _, err := f.Update(ents); err != nil {
		t.Fatal(err)
	}
	var out []uint64
	for _, e := range ents {
		out = append(out, e.Result.Value)
	}
	return out
}

func TestFSMAppliesARetriedBatchOnce(t *testing.T) {
	rec := &recorder{}
	f := newFSM(0, 1, shard.Config{}, rec)
	c1 := requesterConn(1, 5)
	b := batch{h: header{node: 1, inc: 1, batch: 7, stamp: 1e9}, cmds: []shard.Command{acquire(c1, 1, "o", "k", 1000, 0)}}
	update(t, f, b, b)
	if len(rec.got) != 1 || rec.got[0] != "A o k" {
		t.Fatalf("answers %q", rec.got)
	}
	// Batches may commit out of order while the floor allows them: 9
	// before 8, with 7 still in flight.
	rec.got = nil
	b9 := batch{h: header{node: 1, inc: 1, batch: 9, floor: 7, stamp: 2e9}, cmds: []shard.Command{acquire(c1, 3, "q", "i", 1000, 0)}}
	b8 := batch{h: header{node: 1, inc: 1, batch: 8, floor: 7, stamp: 2e9}, cmds: []shard.Command{acquire(c1, 2, "p", "j", 1000, 0)}}
	update(t, f, b9, b8)
	if len(rec.got) != 2 {
		t.Fatalf("answers %q", rec.got)
	}
	// Once the proposer's floor passes them, copies of settled batches, and
	// batches it gave up, are refused; what the replica remembers shrinks.
	rec.got = nil
	b10 := batch{h: header{node: 1, inc: 1, batch: 10, floor: 10, stamp: 3e9}}
	abandoned := batch{h: header{node: 1, inc: 1, batch: 6, floor: 6, stamp: 3e9}, cmds: []shard.Command{acquire(c1, 4, "r", "h", 1000, 0)}}
	update(t, f, b10, b8, b, abandoned)
	if len(rec.got) != 0 || f.refused != 3 {
		t.Fatalf("answers %q, refused %d", rec.got, f.refused)
	}
	if p := f.props[1]; p.floor != 10 || len(p.seen) != 1 {
		t.Fatalf("remembers floor %d, %d ids", p.floor, len(p.seen))
	}
}

func TestFSMNewIncarnationWithdrawsTheOldOnesWaiters(t *testing.T) {
	rec := &recorder{}
	f := newFSM(0, 2, shard.Config{}, rec)
	holder := batch{h: header{node: 1, inc: 1, batch: 1, stamp: 1e9}, cmds: []shard.Command{acquire(requesterConn(1, 1), 1, "h", "k", 60000, 0)}}
	old := batch{h: header{node: 2, inc: 3, batch: 1, stamp: 1e9}, cmds: []shard.Command{acquire(requesterConn(3, 4), 1, "w", "k", 1000, 60000)}}
	update(t, f, holder, old)
	if st := f.t.Stats(); st.Waiters != 1 {
		t.Fatalf("waiters %d", st.Waiters)
	}
	// Node 2 restarts as incarnation 4: its first batch (even empty) withdraws.
	update(t, f, batch{h: header{node: 2, inc: 4, batch: 1, stamp: 2e9}})
	if st := f.t.Stats(); st.Waiters != 0 || st.Withdrawn != 1 {
		t.Fatalf("after restart: %+v", st)
	}
	// A batch of the old incarnation that commits late is refused.
	late := batch{h: header{node: 2, inc: 3, batch: 2, stamp: 2e9}, cmds: []shard.Command{acquire(requesterConn(3, 4), 2, "w", "j", 1000, 0)}}
	update(t, f, late)
	if st := f.t.Stats(); st.Keys != 1 || f.refused != 1 {
		t.Fatalf("late batch applied: %+v refused %d", st, f.refused)
	}
}

func TestFSMClockNeverGoesBack(t *testing.T) {
	f := newFSM(0, 1, shard.Config{}, nil)
	update(t, f, batch{h: header{node: 1, inc: 1, batch: 1, stamp: 5e9}})
	update(t, f, batch{h: header{node: 2, inc: 1, batch: 1, stamp: 3e9}, cmds: []shard.Command{acquire(requesterConn(1, 1), 1, "o", "k", 1000, 0)}})
	if f.now != 5e9 {
		t.Fatalf("now %d", f.now)
	}
	var out []shard.Command
	if out = f.t.Due(6e9-1, out); len(out) != 0 {
		t.Fatalf("lease measured from the older stamp: %v", out)
	}
	if out = f.t.Due(6e9, out); len(out) != 1 {
		t.Fatalf("due at 6s: %v", out)
	}
}

func TestFSMSnapshotRoundTrip(t *testing.T) {
	f := newFSM(3, 1, shard.Config{}, nil)
	update(t, f,
		batch{h: header{node: 1, inc: 2, batch: 1, stamp: 1e9}, cmds: []shard.Command{acquire(requesterConn(2, 1), 1, "a", "k", 5000, 0), acquire(requesterConn(2, 1), 2, "b", "k", 5000, 9000)}},
		batch{h: header{node: 3, inc: 1, batch: 4, stamp: 2e9}, cmds: []shard.Command{acquire(requesterConn(1, 9), 1, "c", "j", 5000, 0)}},
	)
	ctx, err := f.PrepareSnapshot()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := f.SaveSnapshot(ctx, &buf, nil, nil); err != nil {
		t.Fatal(err)
	}
	g := newFSM(3, 2, shard.Config{}, nil)
	if err := g.RecoverFromSnapshot(bytes.NewReader(buf.Bytes()), nil, nil); err != nil {
		t.Fatal(err)
	}
	g.recovered(f.applied)
	_, a, _ := f.digest()
	_, b, _ := g.digest()
	if a != b {
		t.Fatal("restored replica differs")
	}
	// The restored replica still deduplicates and knows the incarnations.
	update(t, g, batch{h: header{node: 3, inc: 1, batch: 4, stamp: 2e9}, cmds: []shard.Command{acquire(requesterConn(1, 9), 2, "d", "x", 5000, 0)}})
	if g.t.Stats().Keys != 2 {
		t.Fatal("a batch applied before the snapshot was applied again")
	}
	var bad bytes.Buffer
	bad.Write(buf.Bytes()[:buf.Len()-3])
	if err := newFSM(3, 2, shard.Config{}, nil).RecoverFromSnapshot(&bad, nil, nil); err == nil {
		t.Fatal("a truncated snapshot was accepted")
	}
}

// A restored replica reports no applied index until Dragonboat reports the
// snapshot's (SnapshotRecovered, after RecoverFromSnapshot): never the index
// of the state it replaced beside the digest of the new one.
func TestFSMRestoredReportsTheSnapshotsIndex(t *testing.T) {
	at := func(i uint64, stamp int64) batch {
		return batch{h: header{node: 1, inc: 1, batch: i, stamp: stamp}, cmds: []shard.Command{acquire(requesterConn(1, 1), i, "o", fmt.Sprintf("k%d", i), 5000, 0)}}
	}
	f := newFSM(0, 1, shard.Config{}, nil)
	for i := uint64(1); i <= 20; i++ {
		update(t, f, at(i, int64(i)*1e6))
	}
	snap20 := snapshot(t, f)
	update(t, f, at(21, 21e6))
	snap21 := snapshot(t, f)
	applied := func(g *fsm) uint64 { a, _, _ := g.digest(); return a }

	g := newFSM(0, 2, shard.Config{}, nil)
	update(t, g, at(1, 1e6), at(2, 2e6), at(3, 3e6))
	restore(t, g, snap20)
	if a := applied(g); a != 0 {
		t.Fatalf("restored to index 20, reports %d before the snapshot's index is known", a)
	}
	g.recovered(20)
	_, want, _ := newFSMAt(t, snap20).digest()
	if a, sum, _ := g.digest(); a != 20 || sum != want {
		t.Fatalf("applied %d, digest equal %v", a, sum == want)
	}

	// An entry applied before the report: the entry's index stands.
	restore(t, g, snap20)
	if _, err := g.Update([]sm.Entry{{Index: 21, Cmd: at(21, 21e6).bytes()}}); err != nil {
		t.Fatal(err)
	}
	g.recovered(20)
	if a := applied(g); a != 21 {
		t.Fatalf("applied %d after entry 21", a)
	}

	// Two restores before either report: the first report does not speak
	// for the second's state.
	restore(t, g, snap20)
	restore(t, g, snap21)
	g.recovered(20)
	if a := applied(g); a != 0 {
		t.Fatalf("the first restore's report gave %d to the second's state", a)
	}
	g.recovered(21)
	if a, sum, _ := g.digest(); a != 21 {
		t.Fatalf("applied %d", a)
	} else if _, fs, _ := f.digest(); sum != fs {
		t.Fatal("restored replica differs")
	}
	g.recovered(21) // a report with no restore behind it changes nothing
	if a := applied(g); a != 21 {
		t.Fatalf("applied %d", a)
	}
}

// newFSMAt is a replica restored from snap.
func newFSMAt(t *testing.T, snap []byte) *fsm {
	t.Helper()
	g := newFSM(0, 3, shard.Config{}, nil)
	restore(t, g, snap)
	return g
}

func TestFSMRejectsAMalformedEntry(t *testing.T) {
	f := newFSM(0, 1, shard.Config{}, nil)
	b := batch{h: header{node: 1, inc: 1, batch: 1, stamp: 1}, cmds: []shard.Command{acquire(1, 1, "o", "k", 1, 0)}}.bytes()
	for _, cut := range []int{1, 3, len(b) - 1} {
		if _, err := f.Update([]sm.Entry{{Index: 1, Cmd: b[:cut]}}); err == nil {
			t.Fatalf("entry cut at %d applied", cut)
		}
	}
	if _, err := f.Update([]sm.Entry{{Index: 1, Cmd: append([]byte{9}, b[1:]...)}}); err == nil {
		t.Fatal("unknown version applied")
	}
	// Settings: cut, with bytes after them, and with no shards (the
	// limits per shard would divide by zero).
	n := appendHeader(nil, header{node: 1, inc: 1, floor: noticeSettings, stamp: 1})
	good := appendSettings(slices.Clone(n), settings{shards: 2, limits: limits{MaxKeys: 4}, skew: 500e6})
	for _, bad := range [][]byte{good[:len(good)-1], append(slices.Clone(good), 0), appendSettings(slices.Clone(n), settings{limits: limits{MaxKeys: 4}})} {
		if _, err := f.Update([]sm.Entry{{Index: 1, Cmd: bad}}); err == nil {
			t.Fatalf("settings notice %x applied", bad)
		}
	}
	if _, err := f.Update([]sm.Entry{{Index: 1, Cmd: good}}); err != nil {
		t.Fatal(err)
	}
}

// An Update wakes the leader's timer loop only when it sets a timer due
// before the loop planned to look: a first lease, a shorter one, a wait
// that ends before the leases; not a later lease, nor a release.
func TestFSMTellsTimersMovedEarlier(t *testing.T) {
	rec := &recorder{}
	f := newFSM(0, 1, shard.Config{}, rec)
	kicks := 0
	f.skew, f.timersMoved = 500e6, func() { kicks++ }
	c := requesterConn(1, 5)
	step := func(name string, want int, cmds ...shard.Command) {
		t.Helper()
		update(t, f, batch{h: header{node: 1, inc: 1, stamp: 1e9}, cmds: cmds})
		if kicks != want {
			t.Fatalf("%s: %d kicks, want %d", name, kicks, want)
		}
	}
	step("first lease", 1, acquire(c, 1, "o", "a", 2000, 0))                                                      // due at 1s + 2s + skew
	step("later lease", 1, acquire(c, 2, "o", "b", 5000, 0))                                                      // 6.5s
	step("shorter lease", 2, acquire(c, 3, "o", "c", 1000, 0))                                                    // 2.5s
	step("wait before the leases end", 3, acquire(c, 4, "p", "a", 1000, 300))                                     // wait ends at 1.3s
	rel := shard.Command{Op: shard.OpRelease, From: shard.Requester{Conn: c, Seq: 5}, Key: []byte("c"), Token: 3} // tokens count per shard: a 1, b 2, c 3
	step("release", 3, rel)
	if last := rec.got[len(rec.got)-1]; last != "R  c" {
		t.Fatalf("the release was answered %q", last)
	}
	if d, ok := f.t.NextDue(f.skew); !ok || d != 1.3e9 || f.due != d {
		t.Fatalf("next due %d %v, recorded %d; want 1.3s", d, ok, f.due)
	}
}

// A grant applied later than the replicated clock says it was made (an
// entry that committed late) has its lease counted from the apply on this
// node's clock as well: the leader's timer does not end it before the
// lease has run from then, plus the skew. A grant applied on time, and a
// lease released, add nothing.
func TestFSMCoversALeaseGrantedLate(t *testing.T) {
	rec := &recorder{}
	f := newFSM(0, 1, shard.Config{}, rec)
	var local int64
	f.skew, f.clock, f.inc = 500e6, func() int64 { return local }, 1 // the batches are this run's
	c, d := requesterConn(1, 5), requesterConn(1, 6)
	expiresAt := func(now int64) []string {
		t.Helper()
		f.mu.Lock()
		defer f.mu.Unlock()
		var got []string
		cmds, _ := f.dueExpires(now, f.t.Due(now-f.skew, nil), nil)
		for _, c := range cmds {
			got = append(got, fmt.Sprintf("%s %d", c.Key, c.Token))
		}
		return got
	}

	// "late" is stamped 1 s and applied at 1.9 s (token 1, deadline 11 s);
	// "on-time" is stamped and applied at 2 s (token 2, deadline 12 s).
	local = 1.9e9
	update(t, f, batch{h: header{node: 1, inc: 1, batch: 1, stamp: 1e9}, cmds: []shard.Command{acquire(c, 1, "o", "late", 10000, 0)}})
	local = 2e9
	update(t, f, batch{h: header{node: 1, inc: 1, batch: 2, stamp: 2e9}, cmds: []shard.Command{acquire(c, 2, "o", "on-time", 10000, 0)}})
	if got := expiresAt(12.4e9 - 1); len(got) != 0 {
		t.Fatalf("just before 12.4 s: %v expire; want none (late: 11.9 s + skew, on-time: 12 s + skew)", got)
	}
	f.mu.Lock()
	_, held := f.dueExpires(12.4e9-1, f.t.Due(12.4e9-1-f.skew, nil), nil)
	f.mu.Unlock()
	if held != 12.4e9 {
		t.Fatalf("the held-back lease comes due at %d, want 12.4 s", held)
	}
	if got := expiresAt(12.4e9); len(got) != 1 || got[0] != "late 1" {
		t.Fatalf("at 12.4 s: %v expire; want late 1", got)
	}
	if got := expiresAt(12.5e9); len(got) != 2 || got[1] != "on-time 2" {
		t.Fatalf("at 12.5 s: %v expire; want late 1 (its Expire not applied yet) and on-time 2", got)
	}

	// A hand-over decided by a release that committed late: the waiter's
	// lease runs from the apply. The released lease's cover goes.
	local = 20e9
	update(t, f, batch{h: header{node: 1, inc: 1, batch: 3, stamp: 20e9}, cmds: []shard.Command{
		acquire(c, 3, "o", "h", 10000, 0), acquire(d, 1, "p", "h", 10000, 60000)}})
	local = 23e9
	update(t, f, batch{h: header{node: 1, inc: 1, batch: 4, stamp: 21e9}, cmds: []shard.Command{
		{Op: shard.OpRelease, From: shard.Requester{Conn: c, Seq: 4}, Key: []byte("h"), Token: 3}}})
	if last := rec.got[len(rec.got)-1]; last != "renew 4 p h lease 10000 allow 2000" {
		t.Fatalf("the release handed over as %q, want a renewal (applied 2 s late)", last)
	}
	if _, ok := f.covers[3]; ok {
		t.Fatal("the released lease kept its cover")
	}
	if got := f.covers[4]; got != 31e9+2e9 {
		t.Fatalf("the hand-over's lease is covered to %d, want 33 s (deadline 31 s, applied 2 s late)", got)
	}
	if got := expiresAt(33.5e9 - 1); slices.Contains(got, "h 4") {
		t.Fatalf("before 33.5 s: %v expire; want h 4 still held", got)
	}
	if got := expiresAt(33.5e9); !slices.Contains(got, "h 4") {
		t.Fatalf("at 33.5 s: %v expire; want h 4 among them", got)
	}
}

// A grant this replica applies more than half the skew after the time its
// lease counts from is not answered but renewed (fsm.judge); the renewal is
// answered if it comes back within the lateness it allows itself and half
// the skew, else renewed again; a grant later than its lease and the skew,
// or whose token no longer holds, is lapsed. An Expire made for the lease
// end before a renewal is stale once the renewal applied. Grants for other nodes, or for an earlier run of this one, are
// never renewed here.
func TestFSMRenewsAGrantAppliedLate(t *testing.T) {
	rec := &recorder{}
	f := newFSM(0, 1, shard.Config{}, rec)
	var local int64
	f.skew, f.clock, f.inc = 500e6, func() int64 { return local }, 1
	c := requesterConn(1, 5)
	dueAt := func(now int64, key string) bool {
		for _, d := range f.t.Due(now, nil) {
			if string(d.Key) == key {
				return true
			}
		}
		return false
	}
	renewal := func(id uint64, stamp int64, tok uint64, key string, allowMs uint64) batch {
		return batch{h: header{node: 1, inc: 1, batch: id, stamp: stamp}, cmds: []shard.Command{
			{Op: shard.OpRenew, From: shard.Requester{Conn: c, Seq: tok}, Owner: []byte("o"), Key: []byte(key), Token: tok, LeaseMs: 10000, WaitMs: allowMs}}}
	}

	local = 1.25e9 // exactly half the skew late: answered
	update(t, f, batch{h: header{node: 1, inc: 1, batch: 1, stamp: 1e9}, cmds: []shard.Command{acquire(c, 1, "o", "a", 10000, 0)}})
	local = 2.3e9 // 300 ms late: renewed, allowing itself those 300 ms
	update(t, f, batch{h: header{node: 1, inc: 1, batch: 2, stamp: 2e9}, cmds: []shard.Command{acquire(c, 2, "o", "b", 10000, 0)}})
	if want := []string{"A o a", "renew 2 o b lease 10000 allow 300"}; !slices.Equal(rec.got, want) {
		t.Fatalf("got %q, want %q", rec.got, want)
	}

	// Back 550 ms after its stamp (300 allowed + 250): answered, the lease
	// running 10.3 s from the renewal's stamp.
	rec.got = nil
	local = 3.55e9
	update(t, f, renewal(3, 3e9, 2, "b", 300))
	if want := []string{"A o b"}; !slices.Equal(rec.got, want) {
		t.Fatalf("got %q, want %q", rec.got, want)
	}
	if dueAt(13.3e9-1, "b") || !dueAt(13.3e9, "b") {
		t.Fatal("the renewed lease does not end at 13.3 s")
	}
	// The leader's Expire made for the first deadline (12 s), committed
	// after the renewal, is stale.
	update(t, f, batch{h: header{node: 2, inc: 1, stamp: 3.6e9}, cmds: []shard.Command{{Op: shard.OpExpire, Key: []byte("b"), Token: 2, Deadline: 12e9}}})
	if !dueAt(13.3e9, "b") || f.t.Stats().Expiries != 0 {
		t.Fatal("an Expire made before the renewal ended the renewed lease")
	}
	// Back later than that: renewed again, allowing the 700 ms it took.
	rec.got = nil
	local = 4.7e9
	update(t, f, renewal(4, 4e9, 2, "b", 300))
	if want := []string{"renew 2 o b lease 10000 allow 700"}; !slices.Equal(rec.got, want) {
		t.Fatalf("got %q, want %q", rec.got, want)
	}
	// A renewal of a lease that ended before it applied names its
	// connection as lapsed: granted, over, and never answered.
	rec.got = nil
	update(t, f, batch{h: header{node: 2, inc: 1, stamp: 5e9}, cmds: []shard.Command{{Op: shard.OpExpire, Key: []byte("b"), Token: 2}}})
	local = 5.1e9
	update(t, f, renewal(5, 5e9, 2, "b", 700))
	if want := []string{"lapsed T o b"}; !slices.Equal(rec.got, want) {
		t.Fatalf("got %q, want %q", rec.got, want)
	}
	// A grant later than both its lease and the skew is not renewed: the
	// node is too far behind; it is lapsed, to be released.
	rec.got = nil
	local = 10.6e9
	update(t, f, batch{h: header{node: 1, inc: 1, batch: 7, stamp: 10e9}, cmds: []shard.Command{acquire(c, 9, "o", "e", 100, 0)}})
	if want := []string{"lapsed A o e"}; !slices.Equal(rec.got, want) {
		t.Fatalf("got %q, want %q", rec.got, want)
	}

	// Late grants for another node, or for an earlier run of this one, are
	// not this replica's to renew.
	rec.got = nil
	local = 9e9
	update(t, f,
		batch{h: header{node: 2, inc: 1, batch: 1, stamp: 6e9}, cmds: []shard.Command{acquire(requesterConn(1, 1), 1, "o", "c", 10000, 0)}},
		batch{h: header{node: 1, inc: 1, batch: 6, stamp: 6e9}, cmds: []shard.Command{acquire(requesterConn(0, 1), 1, "o", "d", 10000, 0)}})
	if len(rec.got) != 1 || rec.got[0] != "A o d" {
		t.Fatalf("got %q, want only the earlier run's answer (dropped by the node)", rec.got)
	}
}

// A restarted node replays its log before anything of its new run: those
// grants are applied late by the restart, not by their commit, and get no
// cover (else every lease live at a restart would be stretched by the time
// since its grant whenever this node led). From the node's first entry of
// this run on, grants applied late are covered.
func TestFSMReplayAtStartAddsNoCover(t *testing.T) {
	f := newFSM(0, 1, shard.Config{}, nil)
	var local int64 = 600e9 // ten minutes after the stamps below
	f.skew, f.clock, f.inc = 500e6, func() int64 { return local }, 2
	update(t, f,
		batch{h: header{node: 1, inc: 1, batch: 1, stamp: 1e9}, cmds: []shard.Command{acquire(requesterConn(1, 1), 1, "o", "a", 3_600_000, 0)}},
		batch{h: header{node: 2, inc: 1, batch: 1, stamp: 2e9}, cmds: []shard.Command{acquire(requesterConn(1, 2), 1, "o", "b", 3_600_000, 0)}})
	if len(f.covers) != 0 {
		t.Fatalf("covers %v for grants replayed at start, want none", f.covers)
	}
	update(t, f,
		batch{h: header{node: 1, inc: 2, floor: noticeHandOver, stamp: 599e9}},
		batch{h: header{node: 2, inc: 1, batch: 2, stamp: 599e9}, cmds: []shard.Command{acquire(requesterConn(1, 3), 1, "o", "c", 10_000, 0)}})
	if got := f.covers[3]; got != 599e9+10e9+1e9 {
		t.Fatalf("a grant applied 1 s late after this run began is covered to %d, want 610 s", got)
	}
}

// A batch with id 0 and no commands is a notice of the hand-over protocol:
// passed on to the node (its kind in the floor field) and nothing else. The
// table and the dedup state stay as they were (but for a node new to the
// replica, which is remembered as after any batch of its), and a notice of
// an earlier incarnation is refused like its batches.
func TestFSMPassesHandOverNoticesOn(t *testing.T) {
	rec := &recorder{}
	f := newFSM(0, 1, shard.Config{}, rec)
	update(t, f, batch{h: header{node: 2, inc: 3, batch: 1, stamp: 1e9}, cmds: []shard.Command{acquire(requesterConn(3, 1), 1, "o", "k", 60000, 0)}})
	rec.got = nil
	var before bytes.Buffer
	if err := f.t.WriteSnapshot(&before); err != nil {
		t.Fatal(err)
	}
	update(t, f,
		batch{h: header{node: 1, inc: 1, floor: noticeHandOver, stamp: 1e9}},
		batch{h: header{node: 2, inc: 3, floor: noticeDrained, stamp: 1e9}},
		batch{h: header{node: 2, inc: 2, floor: noticeDrained, stamp: 1e9}}, // an earlier run of node 2
	)
	if want := []string{"notice 0 from 1", "notice 1 from 2"}; !slices.Equal(rec.got, want) {
		t.Fatalf("notices passed on: %q, want %q", rec.got, want)
	}
	var after bytes.Buffer
	if err := f.t.WriteSnapshot(&after); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(before.Bytes(), after.Bytes()) {
		t.Error("applying notices changed the table")
	}
	if p := f.props[2]; p.inc != 3 || p.floor != 0 || len(p.seen) != 1 {
		t.Errorf("node 2's dedup state: %+v, want incarnation 3 with batch 1 seen", *p)
	}
	if p := f.props[1]; p == nil || p.inc != 1 || len(p.seen) != 0 {
		t.Errorf("node 1's dedup state: %v, want incarnation 1 with nothing seen", p)
	}
}

// A batch of this run of this node that this replica will not answer says
// so to its proposer, whose connections then hear that the outcome is
// unknown instead of waiting for nothing: a retry of a batch that a
// snapshot received had applied, and a batch refused as an earlier run's.
func TestFSMTellsItsProposerOfBatchesItWillNotAnswer(t *testing.T) {
	acq := func(seq uint64, key string) []shard.Command {
		return []shard.Command{acquire(requesterConn(1, 5), seq, "o", key, 60000, 0)}
	}
	leader := newFSM(0, 2, shard.Config{}, nil)
	update(t, leader, batch{h: header{node: 1, inc: 1, batch: 7, stamp: 1e9}, cmds: acq(1, "k")})
	ctx, err := leader.PrepareSnapshot()
	if err != nil {
		t.Fatal(err)
	}
	var snap bytes.Buffer
	if err := leader.SaveSnapshot(ctx, &snap, nil, nil); err != nil {
		t.Fatal(err)
	}

	rec := &recorder{}
	f := newFSM(0, 1, shard.Config{}, rec)
	f.inc = 1
	if err := f.RecoverFromSnapshot(bytes.NewReader(snap.Bytes()), nil, nil); err != nil {
		t.Fatal(err)
	}
	rec.got = nil
	got := update(t, f,
		batch{h: header{node: 1, inc: 1, batch: 7, floor: 6, stamp: 2e9}, cmds: acq(1, "k")}, // the retry
		batch{h: header{node: 1, inc: 1, batch: 8, floor: 6, stamp: 2e9}, cmds: acq(3, "i")}, // new
	)
	if want := []uint64{resultUnanswered, resultApplied}; !slices.Equal(got, want) {
		t.Errorf("results %v, want %v", got, want)
	}
	if want := []string{"A o i"}; !slices.Equal(rec.got, want) {
		t.Errorf("answers %q, want %q", rec.got, want)
	}
	// Once more, the same: the first copy may have been an attempt its
	// proposer gave up on, and the one it waits for a later one.
	if got := update(t, f, batch{h: header{node: 1, inc: 1, batch: 7, floor: 6, stamp: 2e9}, cmds: acq(1, "k")}); got[0] != resultUnanswered {
		t.Errorf("a second retry: result %d, want %d (unanswered)", got[0], resultUnanswered)
	}
	// Below the floor the batch is settled, and refused.
	update(t, f, batch{h: header{node: 1, inc: 1, batch: 9, floor: 9, stamp: 2e9}, cmds: acq(4, "j")})
	if got := update(t, f, batch{h: header{node: 1, inc: 1, batch: 7, floor: 6, stamp: 2e9}, cmds: acq(1, "k")}); got[0] != resultApplied {
		t.Errorf("a retry below the floor: result %d, want %d (applied, refused)", got[0], resultApplied)
	}
	if len(f.snapOwn) != 0 {
		t.Errorf("marks kept below the floor: %v", f.snapOwn)
	}

	// This run's batches are refused once a later run's were applied (the
	// data dir's incarnation went back).
	update(t, f, batch{h: header{node: 1, inc: 2, batch: 1, stamp: 3e9}, cmds: acq(4, "h")})
	if got := update(t, f, batch{h: header{node: 1, inc: 1, batch: 9, floor: 9, stamp: 3e9}, cmds: acq(5, "g")}); got[0] != resultUnanswered {
		t.Errorf("a batch refused as an earlier run's: result %d, want %d", got[0], resultUnanswered)
	}
}

// The first settings notice of a shard's log decides its limits on every
// replica, whatever each was configured with; later ones change nothing.
// Snapshots carry them, and those of the format before them still load.
func TestFSMAppliesTheFirstSettingsOfItsLog(t *testing.T) {
	notice := func(node uint32, maxKeys int) []byte {
		b := appendHeader(nil, header{node: node, inc: 1, floor: noticeSettings, stamp: 1e9})
		return appendSettings(b, settings{shards: 1, limits: limits{MaxKeys: maxKeys}})
	}
	log := []sm.Entry{{Index: 1, Cmd: notice(2, 2)}, {Index: 2, Cmd: notice(1, 5)}}
	for i, key := range []string{"a", "b", "c"} {
		b := batch{h: header{node: 1, inc: 1, batch: uint64(i + 1), stamp: 2e9}, cmds: []shard.Command{acquire(requesterConn(1, 1), uint64(i+1), "o", key, 5000, 0)}}
		log = append(log, sm.Entry{Index: uint64(i + 3), Cmd: b.bytes()})
	}
	var sums [][32]byte
	for _, cfg := range []shard.Config{{}, {MaxKeys: 1}, {MaxKeys: 9}} {
		rec := &recorder{}
		f := newFSM(0, 1, cfg, rec)
		if _, err := f.Update(slices.Clone(log)); err != nil {
			t.Fatal(err)
		}
		if want := []string{"A o a", "A o b", "B o c"}; !slices.Equal(rec.got, want) {
			t.Fatalf("configured with %+v: answers %q, want %q", cfg, rec.got, want)
		}
		if set, by, ok := f.settings(); !ok || by != 2 || set.MaxKeys != 2 {
			t.Fatalf("settings %+v from %d (%v), want node 2's", set, by, ok)
		}
		_, sum, _ := f.digest()
		sums = append(sums, sum)
	}
	if sums[0] != sums[1] || sums[0] != sums[2] {
		t.Fatal("replicas configured differently differ")
	}

	f := newFSM(0, 1, shard.Config{}, nil)
	if _, err := f.Update(slices.Clone(log)); err != nil {
		t.Fatal(err)
	}
	g := newFSM(0, 2, shard.Config{MaxKeys: 7}, nil)
	restore(t, g, snapshot(t, f))
	if set, by, ok := g.settings(); !ok || by != 2 || set.MaxKeys != 2 {
		t.Fatalf("restored settings %+v from %d (%v)", set, by, ok)
	}
	rec := &recorder{}
	g.out = rec
	update(t, g, batch{h: header{node: 2, inc: 1, batch: 1, stamp: 3e9}, cmds: []shard.Command{acquire(requesterConn(1, 1), 1, "p", "d", 5000, 0)}})
	if want := []string{"B p d"}; !slices.Equal(rec.got, want) {
		t.Fatalf("restored replica answered %q, want %q", rec.got, want)
	}

	// Version 1: no settings line (the byte after now).
	old := newFSM(0, 1, shard.Config{}, nil)
	update(t, old, batch{h: header{node: 1, inc: 1, batch: 1, stamp: 1e9}, cmds: []shard.Command{acquire(requesterConn(1, 1), 1, "o", "a", 5000, 0)}})
	v2 := snapshot(t, old)
	at := len(replMagic) + 1 + len(binary.AppendVarint(nil, old.now))
	if v2[at] != 0 {
		t.Fatal("no settings should be one 0 byte")
	}
	v1 := slices.Concat(v2[:len(replMagic)], []byte{1}, v2[len(replMagic)+1:at], v2[at+1:])
	h := newFSM(0, 2, shard.Config{}, nil)
	restore(t, h, v1)
	h.applied = old.applied
	_, a, _ := old.digest()
	_, b, _ := h.digest()
	if _, _, ok := h.settings(); ok || a != b {
		t.Fatal("a snapshot of version 1 did not load as it was")
	}
}

// The clock skew is one of the settings: announced with them, kept in
// snapshots, and unknown (0, matching any) in a notice or snapshot of a
// ticketd that did not announce it, which still loads; a change of limits
// without it keeps the one known.
func TestFSMSettingsCarryTheClockSkew(t *testing.T) {
	notice := func(kind uint64, stamp int64, s settings, cut bool) sm.Entry {
		b := appendSettings(appendHeader(nil, header{node: 2, inc: 1, floor: kind, stamp: stamp}), s)
		if cut { // as an older ticketd wrote it: no skew
			b = b[:len(b)-len(binary.AppendUvarint(nil, uint64(s.skew)))]
		}
		return sm.Entry{Index: 1, Cmd: b}
	}
	base := settings{shards: 1, limits: limits{MaxKeys: 2}, skew: 500e6}
	f := newFSM(0, 1, shard.Config{}, nil)
	if _, err := f.Update([]sm.Entry{notice(noticeSettings, 1e9, base, false)}); err != nil {
		t.Fatal(err)
	}
	if set, _, _ := f.settings(); set != base {
		t.Fatalf("settings %+v, want %+v", set, base)
	}
	changed := base
	changed.MaxKeys = 3
	if _, err := f.Update([]sm.Entry{notice(noticeLimits, 2e9, changed, true)}); err != nil {
		t.Fatal(err)
	}
	if set, _, _ := f.settings(); set != changed {
		t.Fatalf("after a change of limits without the skew: %+v, want %+v", set, changed)
	}
	v4 := snapshot(t, f)
	g := newFSM(0, 2, shard.Config{}, nil)
	restore(t, g, v4)
	if set, _, _ := g.settings(); set != changed {
		t.Fatalf("restored %+v, want %+v", set, changed)
	}

	// Version 3: the settings without the skew.
	at := len(replMagic) + 1 + len(binary.AppendVarint(nil, f.now)) + 1 // after now and setBy 2
	at += len(appendSettings(nil, settings{shards: changed.shards, limits: changed.limits})) - 1
	skewLen := len(binary.AppendUvarint(nil, uint64(changed.skew)))
	v3 := slices.Concat(v4[:len(replMagic)], []byte{3}, v4[len(replMagic)+1:at], v4[at+skewLen:])
	h := newFSM(0, 2, shard.Config{}, nil)
	restore(t, h, v3)
	want := changed
	want.skew = 0
	if set, _, _ := h.settings(); set != want {
		t.Fatalf("a snapshot of version 3 restored %+v, want %+v", set, want)
	}
	// The first node to announce a skew with the same shards and limits
	// fixes it (a node with other limits does not); later ones are held to it.
	other := changed
	other.MaxKeys, other.skew = 9, 700e6
	fifty := changed
	fifty.skew = 50e6
	for _, s := range []settings{other, changed, fifty} {
		if _, err := h.Update([]sm.Entry{notice(noticeSettings, 3e9, s, false)}); err != nil {
			t.Fatal(err)
		}
	}
	if set, _, _ := h.settings(); set != changed {
		t.Fatalf("after nodes announced %s, %s and %s: %+v, want %+v", other, changed, fifty, set, changed)
	}

	for _, tc := range []struct {
		a, b settings
		same bool
	}{
		{base, base, true},
		{base, settings{shards: 1, limits: limits{MaxKeys: 2}, skew: 50e6}, false},
		{base, settings{shards: 1, limits: limits{MaxKeys: 2}}, true},
		{base, settings{shards: 1, limits: limits{MaxKeys: 3}, skew: 500e6}, false},
	} {
		if tc.a.same(tc.b) != tc.same || tc.b.same(tc.a) != tc.same {
			t.Errorf("%s and %s: same %v, want %v", tc.a, tc.b, !tc.same, tc.same)
		}
	}
}

// A batch of this run that the replica applied itself, and so answered,
// before a snapshot replaced its state is not reported unanswered when a
// retry of it comes; one that only the snapshot applied still is.
func TestFSMAnsweredBatchIsNotUnansweredAfterASnapshot(t *testing.T) {
	acq := func(seq uint64, key string) []shard.Command {
		return []shard.Command{acquire(requesterConn(1, 5), seq, "o", key, 60000, 0)}
	}
	b7 := batch{h: header{node: 1, inc: 1, batch: 7, floor: 7, stamp: 1e9}, cmds: acq(1, "k")}
	b8 := batch{h: header{node: 1, inc: 1, batch: 8, floor: 7, stamp: 1e9}, cmds: acq(2, "j")}
	leader := newFSM(0, 2, shard.Config{}, nil)
	update(t, leader, b7, b8)
	snap := snapshot(t, leader)

	rec := &recorder{}
	f := newFSM(0, 1, shard.Config{}, rec)
	f.inc = 1
	update(t, f, b7)
	if want := []string{"A o k"}; !slices.Equal(rec.got, want) {
		t.Fatalf("answers %q, want %q", rec.got, want)
	}
	restore(t, f, snap)
	if got, want := update(t, f, b7, b8), []uint64{resultApplied, resultUnanswered}; !slices.Equal(got, want) {
		t.Errorf("retries after the snapshot: results %v, want %v", got, want)
	}
}

// A replica that catches up by snapshot never applies the entries the
// snapshot covers, so the answers they decided for this node's queued
// acquires never come out of it: it names their connections (lost), which
// the node then closes with E unavailable. A connection whose acquire is
// still queued in the snapshot is not named, nor is another node's.
func TestFSMSnapshotNamesWaitersItDecided(t *testing.T) {
	holder, x, y := requesterConn(1, 1), requesterConn(1, 2), requesterConn(1, 3)
	queue := batch{h: header{node: 2, inc: 1, batch: 1, stamp: 1e9}, cmds: []shard.Command{
		acquire(holder, 1, "h", "k", 60000, 0), acquire(holder, 2, "h", "j", 60000, 0)}}
	wait := batch{h: header{node: 1, inc: 1, batch: 1, stamp: 1e9}, cmds: []shard.Command{
		acquire(x, 1, "x", "k", 60000, 30000), acquire(y, 1, "y", "j", 60000, 30000)}}
	other := batch{h: header{node: 3, inc: 1, batch: 1, stamp: 1e9}, cmds: []shard.Command{
		acquire(requesterConn(1, 4), 1, "z", "k", 60000, 30000)}}
	release := batch{h: header{node: 2, inc: 1, batch: 2, stamp: 2e9}, cmds: []shard.Command{
		{Op: shard.OpRelease, From: shard.Requester{Conn: holder, Seq: 3}, Key: []byte("k"), Token: 1}}}

	ahead := newFSM(0, 2, shard.Config{}, nil)
	update(t, ahead, queue, wait, other, release) // k goes to x; y still waits for j
	snap := snapshot(t, ahead)

	rec := &recorder{}
	behind := newFSM(0, 1, shard.Config{}, rec)
	behind.inc = 1
	update(t, behind, queue, wait, other)
	rec.got = nil
	restore(t, behind, snap)
	if want := []string{fmt.Sprintf("lost %v", []uint64{x})}; !slices.Equal(rec.got, want) {
		t.Fatalf("after the snapshot: %q, want %q", rec.got, want)
	}
}

// A leader's withdraw of a node's queued acquires (the node was out of its
// reach) decodes as sent, takes out every acquire of that node's
// incarnations below the one named, and no other's; the node itself, cut
// off and applying it later, names its connections whose acquires went.
func TestFSMWithdrawsALostNodesAcquires(t *testing.T) {
	holder := requesterConn(1, 1)
	old, mineA, mineB, later := requesterConn(1, 2), requesterConn(2, 3), requesterConn(2, 4), requesterConn(3, 5)
	hold := batch{h: header{node: 1, inc: 1, batch: 1, stamp: 1e9}, cmds: []shard.Command{acquire(holder, 1, "h", "k", 60000, 0)}}
	queue := func(inc, id uint64, conn uint64, owner string) batch {
		return batch{h: header{node: 2, inc: inc, batch: id, stamp: 1e9}, cmds: []shard.Command{acquire(conn, 1, owner, "k", 60000, 30000)}}
	}
	other := batch{h: header{node: 3, inc: 1, batch: 1, stamp: 1e9}, cmds: []shard.Command{acquire(requesterConn(1, 6), 1, "z", "k", 60000, 30000)}}
	withdraw := shard.Command{Op: shard.OpWithdrawBelow, From: shard.Requester{Node: 2, Conn: requesterConn(3, 0)}}
	var r reader
	r.b = appendCommand(nil, &withdraw)
	var got shard.Command
	r.command(1, &got)
	if r.err != nil || got.Op != withdraw.Op || got.From != withdraw.From || len(r.b) != 0 {
		t.Fatalf("decoded %+v (%v), want %+v", got, r.err, withdraw)
	}
	reap := batch{h: header{node: 1, inc: 1, stamp: 2e9}, cmds: []shard.Command{withdraw}}
	newer := queue(3, 1, later, "l")

	rec := &recorder{}
	f := newFSM(0, 2, shard.Config{}, rec)
	f.inc = 2
	update(t, f, hold, queue(1, 1, old, "o"), queue(2, 1, mineA, "a"), queue(2, 2, mineB, "b"), other)
	rec.got = nil
	update(t, f, reap, newer)
	if want := []string{fmt.Sprintf("lost %v", []uint64{mineA, mineB})}; !slices.Equal(rec.got, want) {
		t.Fatalf("applying the withdraw: %q, want %q", rec.got, want)
	}
	var left []string
	for _, w := range f.t.Waiting(2, nil) {
		left = append(left, fmt.Sprint(w.From.Conn))
	}
	left2 := f.t.Waiting(3, nil)
	if len(left) != 1 || left[0] != fmt.Sprint(later) || len(left2) != 1 {
		t.Fatalf("left queued: node 2 %v, node 3 %d; want only the later incarnation's and node 3's", left, len(left2))
	}
}

// A batch of this run refused because the log holds a later incarnation of
// this node (its data dir was restored from a copy) tells the node so, which
// stops it: every batch it proposes would be refused.
func TestFSMTellsADataDirBehindTheLog(t *testing.T) {
	rec := &recorder{}
	f := newFSM(0, 2, shard.Config{}, rec)
	f.inc = 2
	later := batch{h: header{node: 2, inc: 3, batch: 1, stamp: 1e9}, cmds: []shard.Command{acquire(requesterConn(3, 1), 1, "a", "k", 60000, 0)}}
	mine := batch{h: header{node: 2, inc: 2, batch: 1, stamp: 2e9}, cmds: []shard.Command{acquire(requesterConn(2, 1), 1, "b", "j", 60000, 0)}}
	other := batch{h: header{node: 1, inc: 5, batch: 1, stamp: 2e9}, cmds: []shard.Command{acquire(requesterConn(5, 1), 1, "c", "i", 60000, 0)}}
	if res := update(t, f, later, other); slices.Contains(rec.got, "behind 3") || res[0] != resultApplied {
		t.Fatalf("before this run's batch: %q %v", rec.got, res)
	}
	rec.got = nil
	if res := update(t, f, mine); res[0] != resultUnanswered || !slices.Equal(rec.got, []string{"behind 3"}) {
		t.Fatalf("this run's batch below the log's incarnation: result %v, told %q", res, rec.got)
	}
}

// A change of limits applies from its place in the log on and stays in
// snapshots; one that would change the shard count is ignored.
func TestFSMChangesLimitsWhereTheLogSays(t *testing.T) {
	enc := func(kind uint64, shards, maxKeys int) sm.Entry {
		b := appendHeader(nil, header{node: 2, inc: 1, floor: kind, stamp: 1e9})
		return sm.Entry{Cmd: appendSettings(b, settings{shards: shards, limits: limits{MaxKeys: maxKeys}})}
	}
	acq := func(id uint64, key string) sm.Entry {
		b := batch{h: header{node: 1, inc: 1, batch: id, floor: id, stamp: 2e9}, cmds: []shard.Command{acquire(requesterConn(1, 1), id, "o", key, 60000, 0)}}
		return sm.Entry{Cmd: b.bytes()}
	}
	rec := &recorder{}
	f := newFSM(0, 1, shard.Config{}, rec)
	apply := func(es ...sm.Entry) {
		t.Helper()
		for i := range es {
			es[i].Index = f.applied + uint64(i) + 1
		}
		if _, err := f.Update(es); err != nil {
			t.Fatal(err)
		}
	}
	apply(enc(noticeSettings, 1, 1), acq(1, "a"), acq(2, "b"), enc(noticeLimits, 1, 2), acq(3, "b"), enc(noticeLimits, 2, 9), acq(4, "c"))
	want := []string{"A o a", "B o b", "A o b", "B o c"}
	if !slices.Equal(rec.got, want) {
		t.Fatalf("got %q\nwant %q", rec.got, want)
	}
	g := newFSM(0, 2, shard.Config{}, nil)
	restore(t, g, snapshot(t, f))
	if set, by, ok := g.settings(); !ok || by != 2 || set.MaxKeys != 2 {
		t.Fatalf("restored settings %v from %d (%v)", set, by, ok)
	}
}

// A change of limits carries its sender's skew, but does not change the
// shard's: a node started with another skew may send one before its own
// settings are found to differ.
func TestFSMLimitsChangeKeepsTheSkew(t *testing.T) {
	enc := func(kind uint64, stamp, skew int64) sm.Entry {
		b := appendHeader(nil, header{node: 2, inc: 1, floor: kind, stamp: stamp})
		return sm.Entry{Cmd: appendSettings(b, settings{shards: 1, limits: limits{MaxKeys: 5}, skew: skew})}
	}
	f := newFSM(0, 1, shard.Config{}, nil)
	es := []sm.Entry{enc(noticeSettings, 1e9, 500e6), enc(noticeLimits, 2e9, 100e6)}
	for i := range es {
		es[i].Index = uint64(i) + 1
	}
	if _, err := f.Update(es); err != nil {
		t.Fatal(err)
	}
	if set, _, ok := f.settings(); !ok || set.skew != 500e6 || set.MaxKeys != 5 {
		t.Fatalf("settings %v, want the limits changed and the skew kept at 500ms", set)
	}
}

// A change of limits stamped no later than the one the shard has is a copy
// retried after a later change (or made before it): it does not undo the
// later one, also after a snapshot.
func TestFSMRetriedLimitsChangeDoesNotUndoALaterOne(t *testing.T) {
	enc := func(kind uint64, stamp int64, maxKeys int) sm.Entry {
		b := appendHeader(nil, header{node: 2, inc: 1, floor: kind, stamp: stamp})
		return sm.Entry{Cmd: appendSettings(b, settings{shards: 1, limits: limits{MaxKeys: maxKeys}})}
	}
	update := func(f *fsm, es ...sm.Entry) {
		t.Helper()
		for i := range es {
			es[i].Index = f.applied + uint64(i) + 1
		}
		if _, err := f.Update(es); err != nil {
			t.Fatal(err)
		}
	}
	limit := func(f *fsm) int {
		set, _, ok := f.settings()
		if !ok {
			t.Fatal("no settings")
		}
		return set.MaxKeys
	}
	f := newFSM(0, 1, shard.Config{}, &recorder{})
	update(f, enc(noticeSettings, 1e9, 1), enc(noticeLimits, 3e9, 5), enc(noticeLimits, 2e9, 2), enc(noticeLimits, 3e9, 2))
	if got := limit(f); got != 5 {
		t.Fatalf("max keys %d after a retried earlier change, want 5", got)
	}
	g := newFSM(0, 2, shard.Config{}, nil)
	restore(t, g, snapshot(t, f))
	update(g, enc(noticeLimits, 2.5e9, 2))
	if got := limit(g); got != 5 {
		t.Fatalf("restored from a snapshot: max keys %d after an earlier change, want 5", got)
	}
	update(g, enc(noticeLimits, 4e9, 7))
	if got := limit(g); got != 7 {
		t.Fatalf("max keys %d after a later change, want 7", got)
	}
}

// Every attempt to propose an entry is stamped anew, but for a change of
// limits: its retried copies keep the stamp it was made with.
func TestRestampKeepsAChangeOfLimitsStamp(t *testing.T) {
	for _, tc := range []struct {
		h    header
		want int64
	}{
		{header{floor: noticeLimits, stamp: 5}, 5},
		{header{floor: noticeLimits}, 9},
		{header{floor: noticeSettings, stamp: 5}, 9},
		{header{batch: 3, floor: noticeLimits, count: 1, stamp: 5}, 9},
	} {
		h := tc.h
		h.restamp(9)
		if h.stamp != tc.want {
			t.Errorf("%+v: stamp %d, want %d", tc.h, h.stamp, tc.want)
		}
	}
}

// A replica that lagged while it ran (its raft link cut, a long pause)
// applies the grants it catches up on late; their holders' nodes answered
// them on time. Once it leads the shard again (hand-back), it holds their
// Expire back by no more than the lateness a commit can have (maxLate),
// not by its own lag: a crashed holder's key would stay held that much
// past its lease and the skew.
func TestLaggingReplicaHoldsALeaseBackNoLongerThanACommitCanBeLate(t *testing.T) {
	rec := &recorder{}
	f := newFSM(0, 1, shard.Config{}, rec)
	var local int64
	f.skew, f.clock, f.inc, f.maxLate = 500e6, func() int64 { return local }, 1, 6e9

	// Node 1 runs (its notice of this run applied: live).
	local = 1e9
	update(t, f, batch{h: header{node: 1, inc: 1, floor: noticeHandOver, stamp: 1e9}})
	// Node 1 is cut off from 5 s to 65 s. At 10 s node 2's client is
	// granted "k" for 120 s (deadline 130 s); node 1 applies it at 65 s.
	local = 65e9
	update(t, f, batch{h: header{node: 2, inc: 1, batch: 1, stamp: 10e9},
		cmds: []shard.Command{acquire(requesterConn(1, 7), 1, "o", "k", 120_000, 0)}})

	expires := func(now int64) int {
		f.mu.Lock()
		defer f.mu.Unlock()
		cmds, _ := f.dueExpires(now, f.t.Due(now-f.skew, nil), nil)
		return len(cmds)
	}
	if n := expires(130e9 + f.skew + f.maxLate); n != 1 {
		f.mu.Lock()
		cover := f.covers[1]
		f.mu.Unlock()
		t.Fatalf("at lease end + skew + maxLate the leader proposes %d Expires, want 1: held back by a cover to %.1f s (the replica's 55 s lag)",
			n, float64(cover)/1e9)
	}
}

// A batch a snapshot applied before this replica could answer it, retried
// twice after it: the first copy may be an attempt its proposer gave up on
// (timed out while the node caught up), and the second the one it waits
// for. Both must say the answers never came out here; the mark was spent on
// the first, and the awaited copy read applied: its acquire went unanswered.
func TestFSMSaysEveryRetryOfABatchTheSnapshotAppliedIsUnanswered(t *testing.T) {
	acq := []shard.Command{acquire(requesterConn(1, 5), 1, "o", "k", 60000, 0)}
	attempt := func(stamp int64) batch {
		return batch{h: header{node: 1, inc: 1, batch: 7, floor: 7, stamp: stamp}, cmds: acq}
	}
	leader := newFSM(0, 2, shard.Config{}, nil)
	update(t, leader, attempt(1e9))
	snap := snapshot(t, leader)

	rec := &recorder{}
	f := newFSM(0, 1, shard.Config{}, rec)
	f.inc = 1
	restore(t, f, snap)
	rec.got = nil
	got := update(t, f, attempt(2e9), attempt(3e9))
	if want := []uint64{resultUnanswered, resultUnanswered}; !slices.Equal(got, want) || len(rec.got) != 0 {
		t.Fatalf("results %v with answers %q, want %v and none", got, rec.got, want)
	}
}

// A restore reads and decodes the snapshot before it takes the replica's
// lock, which the event loops take too (Node.Queued): a large snapshot,
// or one read slowly, must not stall them.
func TestFSMRestoreReadsTheSnapshotOutsideTheLock(t *testing.T) {
	f := newFSM(3, 1, shard.Config{}, nil)
	var cmds []shard.Command
	for i := range 500 {
		cmds = append(cmds, acquire(requesterConn(2, 1), uint64(i+1), "o", fmt.Sprintf("key-%d", i), 5000, 0))
	}
	update(t, f, batch{h: header{node: 1, inc: 2, batch: 1, stamp: 1e9}, cmds: cmds})
	b := snapshot(t, f)
	g := newFSM(3, 2, shard.Config{}, nil)
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- g.RecoverFromSnapshot(pr, nil, nil) }()
	// Returns once the restore has read the first half: it then waits,
	// mid-snapshot, for the rest.
	if _, err := pw.Write(b[:len(b)/2]); err != nil {
		t.Fatal(err)
	}
	free := make(chan struct{})
	go func() {
		g.mu.Lock()
		g.mu.Unlock()
		close(free)
	}()
	select {
	case <-free:
	case <-time.After(10 * time.Second):
		t.Fatal("the replica's lock is held while its snapshot is still being read")
	}
	if _, err := pw.Write(b[len(b)/2:]); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	g.recovered(f.applied)
	_, x, _ := f.digest()
	if _, y, _ := g.digest(); x != y {
		t.Fatal("restored replica differs")
	}
}

// A flood answered in a few large batches leaves the replica's per-Update
// buffers (the answers for this node, the bytes they point into) no larger
// than keepAtMost once a small batch follows: 16 shards each keeping its
// largest batch held hundreds of MB after a flood.
func TestFSMLetsGoOfAFloodsBuffers(t *testing.T) {
	f := newFSM(0, 1, shard.Config{}, &recorder{})
	c1 := requesterConn(1, 5)
	cmds := make([]shard.Command, 50_000)
	for i := range cmds {
		cmds[i] = acquire(c1, uint64(i+1), "flooding-owner", fmt.Sprintf("flood-key-%06d", i), 60000, 0)
	}
	update(t, f, batch{h: header{node: 1, inc: 1, batch: 1, stamp: 1e9}, cmds: cmds})
	var a shard.Answer
	if n := uintptr(cap(f.mine)) * unsafe.Sizeof(a); n <= keepAtMost {
		t.Fatalf("the flood's answers took %d bytes, no more than keepAtMost: the test proves nothing", n)
	}
	update(t, f, batch{h: header{node: 1, inc: 1, batch: 2, stamp: 2e9}, cmds: []shard.Command{acquire(c1, 50_001, "o", "k", 1000, 0)}})
	if n := uintptr(cap(f.mine)) * unsafe.Sizeof(a); n > keepAtMost {
		t.Errorf("after a small batch the replica keeps %d bytes of answers", n)
	}
	if n := cap(f.arena); n > keepAtMost {
		t.Errorf("after a small batch the replica keeps %d bytes of answer fields", n)
	}
}
