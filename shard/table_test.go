package shard

import (
	"bytes"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
)

func acq(tb *Table, now int64, conn, seq uint64, key string, leaseMs, waitMs uint64) []Answer {
	c := Command{Op: OpAcquire, From: Requester{Conn: conn, Seq: seq}, Owner: []byte("o"), Key: []byte(key), LeaseMs: leaseMs, WaitMs: waitMs}
	return tb.Apply(now, &c, nil)
}

func rel(tb *Table, now int64, key string, tok uint64) []Answer {
	c := Command{Op: OpRelease, From: Requester{Conn: 1}, Key: []byte(key), Token: tok}
	return tb.Apply(now, &c, nil)
}

// TestIndexStable pins the hash: these values must never change (cluster data placement
// depends on them).
func TestIndexStable(t *testing.T) {
	for _, c := range []struct {
		key  string
		n    int
		want int
	}{
		{"", 16, 5},                           // 0xcbf29ce484222325, the offset basis
		{"a", 16, 12},                         // 0xaf63dc4c8601ec8c
		{"invoices", 7, 0},                    // 0x624f59ba098b0299
		{"invoices", 1, 0},                    // one shard
		{"invoices", 0, 0},                    // n < 1 counts as 1
		{"tenant-042/job-0012345", 1024, 764}, // 0xd7cc8c4310f5b6fc
	} {
		if got := Index([]byte(c.key), c.n); got != c.want {
			t.Errorf("Index(%q, %d) = %d, want %d", c.key, c.n, got, c.want)
		}
	}
	for i := range 1000 { // and it is the standard FNV-1a
		k := fmt.Appendf(nil, "k%d", i)
		h := fnv.New64a()
		h.Write(k)
		if got, want := Index(k, 1000003), int(h.Sum64()%1000003); got != want {
			t.Fatalf("Index(%q) = %d, FNV-1a gives %d", k, got, want)
		}
	}
	var counts [8]int
	for i := range 80000 {
		counts[Index(fmt.Appendf(nil, "key-%d", i), 8)]++
	}
	for s, n := range counts {
		if n < 9000 || n > 11000 {
			t.Errorf("shard %d got %d of 80000 keys", s, n)
		}
	}
}

func TestBudgetShared(t *testing.T) {
	b := NewBudget(50)
	tables := []*Table{New(Config{Keys: b}), New(Config{Keys: b}), New(Config{Keys: b})}
	var wg sync.WaitGroup
	for i, tb := range tables {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for round := range 20 {
				held := map[string]uint64{}
				for k := range 40 {
					key := fmt.Sprintf("t%d-%d", i, k)
					a := acq(tb, int64(round), 1, 1, key, 1000, 0)
					if a[0].Result == Acquired {
						held[key] = a[0].Token
					} else if a[0].Result != Busy {
						t.Errorf("unexpected %v", a)
					}
				}
				if tb.Stats().Keys > 50 {
					t.Errorf("table holds %d keys", tb.Stats().Keys)
				}
				for key, tok := range held {
					if a := rel(tb, int64(round), key, tok); a[0].Result != Released {
						t.Errorf("unexpected %v", a)
					}
				}
			}
		}()
	}
	wg.Wait()
	if b.Used() != 0 {
		t.Errorf("budget used %d after every key was released", b.Used())
	}
	// The limit holds across tables.
	for i := range 60 {
		acq(tables[i%3], 0, 1, 1, fmt.Sprintf("x%d", i), 1000, 0)
	}
	if b.Used() != 50 {
		t.Errorf("budget used %d, want 50", b.Used())
	}
	// Sweep gives room back.
	for _, tb := range tables {
		tb.Sweep(2e9)
	}
	if b.Used() != 0 {
		t.Errorf("budget used %d after sweep", b.Used())
	}
}

// A snapshot shifted by d reads back as the table with every time d later:
// the lease still held at the old deadline, free from the new one, the
// waiter's wait ending d later too; a grace of 0 (none) stays none.
func TestSnapshotShifted(t *testing.T) {
	src := New(Config{})
	acq(src, 0, 1, 1, "k", 1000, 0)    // lease until 1 s
	acq(src, 0, 2, 1, "k", 1000, 3000) // waits until 3 s
	const d = int64(10e9)
	var buf bytes.Buffer
	if err := src.WriteSnapshotShifted(&buf, d); err != nil {
		t.Fatal(err)
	}
	tb := New(Config{})
	if err := tb.ReadSnapshot(&buf); err != nil {
		t.Fatal(err)
	}
	if got := tb.MaxDeadline(); got != 1e9+d {
		t.Fatalf("MaxDeadline %d, want %d", got, int64(1e9)+d)
	}
	if tb.Grace() != 0 {
		t.Fatalf("grace %d, want none", tb.Grace())
	}
	if first, ok := tb.NextDeadline(); !ok || first != 1e9+d {
		t.Fatalf("next deadline %d %v, want %d", first, ok, int64(1e9)+d)
	}
	if due := tb.Due(3e9+d-1, nil); len(due) != 1 || due[0].Op != OpExpire {
		t.Fatalf("due just before the wait's end: %+v, want the lease's end only", due)
	}
	if due := tb.Due(3e9+d, nil); len(due) != 2 {
		t.Fatalf("due at the wait's end: %+v, want the lease's end and the wait's", due)
	}
}

func TestSnapshotErrors(t *testing.T) {
	src := New(Config{})
	acq(src, 0, 1, 1, "k", 1000, 0)
	acq(src, 0, 2, 1, "k", 1000, 5000)
	acq(src, 0, 3, 1, "j", 1000, 0)
	var buf bytes.Buffer
	if err := src.WriteSnapshot(&buf); err != nil {
		t.Fatal(err)
	}
	good := buf.Bytes()

	budget := NewBudget(10)
	for cut := range len(good) {
		tb := New(Config{Keys: budget})
		if err := tb.ReadSnapshot(bytes.NewReader(good[:cut])); err == nil {
			t.Fatalf("a snapshot cut at %d of %d bytes was accepted", cut, len(good))
		}
		if err := checkTable(tb); err != nil || tb.Stats().Keys != 0 || budget.Used() != 0 {
			t.Fatalf("after a failed read: %v, %+v, budget %d", err, tb.Stats(), budget.Used())
		}
	}
	for i := range good {
		bad := bytes.Clone(good)
		bad[i] ^= 0x40
		if err := New(Config{}).ReadSnapshot(bytes.NewReader(bad)); err == nil {
			t.Fatalf("a snapshot with byte %d changed was accepted", i)
		}
	}

	tb := New(Config{Keys: budget})
	acq(tb, 0, 1, 1, "other", 1000, 0)
	if err := tb.ReadSnapshot(bytes.NewReader(good)); err == nil {
		t.Fatal("a snapshot was read into a table with keys")
	}
	rel(tb, 0, "other", 1) // empty again, after a history
	if err := tb.ReadSnapshot(bytes.NewReader(good)); err != nil {
		t.Fatal(err)
	}
	if err := checkTable(tb); err != nil {
		t.Fatal(err)
	}
	if st := tb.Stats(); st.Keys != 2 || st.Waiters != 1 || st.LastToken != 2 || budget.Used() != 2 {
		t.Fatalf("restored %+v, budget %d", st, budget.Used())
	}
}

// A snapshot is a function of the state: histories that end in the same state (here with
// other free lists and key index layouts) give the same bytes.
func TestSnapshotDeterministic(t *testing.T) {
	a, b := New(Config{}), New(Config{})
	a.SetLastToken(100)
	for i := range 100 {
		k := fmt.Sprintf("gone-%d", i)
		rel(b, 0, k, acq(b, 0, 1, 1, k, 1000, 0)[0].Token)
	}
	for _, tb := range []*Table{a, b} {
		for i := range 20 {
			acq(tb, 5, 1, uint64(i), fmt.Sprintf("k%d", i%7), 1000, uint64(i%3)*1000)
		}
	}
	var sa, sb bytes.Buffer
	if err := a.WriteSnapshot(&sa); err != nil {
		t.Fatal(err)
	}
	if err := b.WriteSnapshot(&sb); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(sa.Bytes(), sb.Bytes()) {
		t.Fatal("same state, different snapshot bytes")
	}
}

// A released key without waiters leaves the key index at once: the index
// holds registered keys only, so it stays small under churn.
func TestReleasedKeysLeaveIndex(t *testing.T) {
	tb := New(Config{})
	for i := range 10 {
		k := fmt.Sprintf("k%d", i)
		rel(tb, 0, k, acq(tb, 0, 1, 1, k, 1000, 0)[0].Token)
	}
	if tb.keys.len() != 0 {
		t.Fatalf("index holds %d entries after every key was released, want 0", tb.keys.len())
	}
	if n := tb.Sweep(0); n != 0 {
		t.Fatalf("sweep removed %d, want 0", n)
	}
}

// Granted waiters take their timers with them: a high hand-over rate with hour-long waits
// does not pile up heap entries.
func TestHeapHoldsOnlyLiveTimers(t *testing.T) {
	tb := New(Config{})
	tok := acq(tb, 0, 1, 1, "k", 1000, 0)[0].Token
	for i := range 8 {
		acq(tb, 0, uint64(2+i), 1, "k", 1000, 3600000)
	}
	for i := range 10000 {
		now := int64(i) * 1e3
		out := rel(tb, now, "k", tok)
		tok = out[1].Token
		acq(tb, now, uint64(2+i%8), uint64(2+i), "k", 1000, 3600000)
		if len(tb.heap) != 9 {
			t.Fatalf("after %d hand-overs the heap holds %d timers, want 9", i+1, len(tb.heap))
		}
	}
}

func TestEdges(t *testing.T) {
	t.Run("replicated with budget panics", func(t *testing.T) {
		defer func() {
			if recover() == nil {
				t.Error("no panic")
			}
		}()
		New(Config{Replicated: true, Keys: NewBudget(1)})
	})
	t.Run("unknown op panics", func(t *testing.T) {
		defer func() {
			if recover() == nil {
				t.Error("no panic")
			}
		}()
		New(Config{}).Apply(0, &Command{Op: 99}, nil)
	})
	t.Run("bad ceiling panics before granting", func(t *testing.T) {
		tb := New(Config{ReserveTokens: func(next uint64) uint64 { return next - 1 }})
		defer func() {
			if recover() == nil {
				t.Error("no panic")
			}
			if tb.LastToken() != 0 {
				t.Error("token advanced")
			}
		}()
		acq(tb, 0, 1, 1, "k", 1000, 0)
	})
	t.Run("SetLastToken never lowers", func(t *testing.T) {
		tb := New(Config{})
		tb.SetLastToken(10)
		tb.SetLastToken(5)
		if a := acq(tb, 0, 1, 1, "k", 1000, 0); a[0].Token != 11 {
			t.Errorf("token %d, want 11", a[0].Token)
		}
	})
	t.Run("deadlines saturate", func(t *testing.T) {
		tb := New(Config{})
		a := acq(tb, 1e18, 1, 1, "k", math.MaxUint64, 0)
		if a[0].Deadline != math.MaxInt64 || tb.MaxDeadline() != math.MaxInt64 {
			t.Errorf("deadline %d", a[0].Deadline)
		}
		if addMs(0, 1) != 1e6 || addMs(5, 0) != 5 {
			t.Error("addMs")
		}
	})
}

// A snapshot larger than the writer's chunk round-trips.
func TestSnapshotLarge(t *testing.T) {
	a := New(Config{})
	for i := range 20000 {
		k := fmt.Sprintf("tenant-%03d/job-%07d", i%1000, i)
		acq(a, int64(i), 1, uint64(i), k, 30000, 0)
		if i%3 == 0 {
			acq(a, int64(i), 2, uint64(i), k, 30000, 60000)
		}
	}
	var s1, s2 bytes.Buffer
	if err := a.WriteSnapshot(&s1); err != nil {
		t.Fatal(err)
	}
	b := New(Config{})
	if err := b.ReadSnapshot(bytes.NewReader(s1.Bytes())); err != nil {
		t.Fatal(err)
	}
	if err := checkTable(b); err != nil {
		t.Fatal(err)
	}
	if err := b.WriteSnapshot(&s2); err != nil {
		t.Fatal(err)
	}
	if s1.Len() < 200<<10 || !bytes.Equal(s1.Bytes(), s2.Bytes()) {
		t.Fatalf("%d bytes, equal %v", s1.Len(), bytes.Equal(s1.Bytes(), s2.Bytes()))
	}
	if sa, sb := a.Stats(), b.Stats(); sa.Keys != sb.Keys || sa.Waiters != sb.Waiters || sa.LastToken != sb.LastToken {
		t.Fatalf("%+v vs %+v", sa, sb)
	}
}

func TestTimeoutWaitersKeepsHolders(t *testing.T) {
	tb := New(Config{})
	a := Requester{Conn: 1, Seq: 1}
	out := tb.Apply(0, &Command{Op: OpAcquire, From: a, Owner: []byte("h"), Key: []byte("k"), LeaseMs: 1000}, nil)
	tok := out[0].Token
	for i := uint64(2); i <= 4; i++ {
		tb.Apply(0, &Command{Op: OpAcquire, From: Requester{Conn: i, Seq: 1}, Owner: []byte("w"), Key: []byte("k"), LeaseMs: 1000, WaitMs: 5000}, nil)
	}
	tb.SetGrace(1e9)
	tb.Apply(0, &Command{Op: OpAcquire, From: Requester{Conn: 9, Seq: 1}, Owner: []byte("g"), Key: []byte("phantom"), LeaseMs: 1000, WaitMs: 5000}, nil)
	out = tb.TimeoutWaiters(nil)
	if len(out) != 4 {
		t.Fatalf("%d answers, want 4", len(out))
	}
	for _, a := range out {
		if a.Result != TimedOut {
			t.Fatalf("answer %+v, want T", a)
		}
	}
	if st := tb.Stats(); st.Waiters != 0 || st.Keys != 1 {
		t.Fatalf("after: %d waiters, %d keys; want 0 and 1 (the holder's)", st.Waiters, st.Keys)
	}
	out = tb.Apply(1, &Command{Op: OpRelease, Key: []byte("k"), Token: tok}, nil)
	if len(out) != 1 || out[0].Result != Released {
		t.Fatalf("holder's release: %+v", out)
	}
}

func TestKeyIndexAgainstMap(t *testing.T) {
	x := newKeyIndex()
	ref := map[string]*entry{}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 200000; i++ {
		k := fmt.Sprintf("k%d", rng.IntN(3000))
		if e := ref[k]; e != nil {
			if got := x.get([]byte(k)); got != e {
				t.Fatalf("step %d: get %q = %p, want %p", i, k, got, e)
			}
			if rng.IntN(2) == 0 {
				x.del(e)
				delete(ref, k)
			}
			continue
		}
		if got := x.get([]byte(k)); got != nil {
			t.Fatalf("step %d: get of absent %q found %p", i, k, got)
		}
		e := &entry{key: []byte(k)}
		x.put(e)
		ref[k] = e
	}
	if x.len() != len(ref) {
		t.Fatalf("len %d, want %d", x.len(), len(ref))
	}
	seen := 0
	x.each(func(e *entry) {
		seen++
		if ref[string(e.key)] != e {
			t.Fatalf("each yields %q that the reference does not hold", e.key)
		}
	})
	if seen != len(ref) {
		t.Fatalf("each saw %d, want %d", seen, len(ref))
	}
}

func TestWaitingListsOneNodesWaitersInArrivalOrder(t *testing.T) {
	tb := New(Config{Replicated: true})
	acq := func(node uint32, conn uint64, key string, wait uint64) {
		c := Command{Op: OpAcquire, From: Requester{Node: node, Conn: conn, Seq: 1}, Owner: []byte("o"), Key: []byte(key), LeaseMs: 1000, WaitMs: wait}
		tb.Apply(0, &c, nil)
	}
	acq(1, 1, "a", 0)
	acq(1, 1, "b", 0)
	acq(2, 7, "a", 5000)
	acq(1, 9, "b", 5000)
	acq(1, 3, "a", 5000)
	got := tb.Waiting(1, nil)
	if len(got) != 2 || got[0].From.Conn != 9 || string(got[0].Key) != "b" || got[1].From.Conn != 3 || string(got[1].Key) != "a" {
		t.Fatalf("Waiting(1) = %+v", got)
	}
	for _, c := range got {
		if c.Op != OpWaitTimeout {
			t.Fatalf("op %v", c.Op)
		}
	}
	if got := tb.Waiting(3, nil); len(got) != 0 {
		t.Fatalf("Waiting(3) = %+v", got)
	}
	// WaitingConns: each connection once, however many it queued; none
	// once their waits are gone.
	acq(1, 9, "a", 5000)
	conns := tb.WaitingConns(1, nil)
	slices.Sort(conns)
	if !slices.Equal(conns, []uint64{3, 9}) {
		t.Fatalf("WaitingConns(1) = %v, want [3 9]", conns)
	}
	tb.Apply(0, &Command{Op: OpWithdraw, From: Requester{Node: 1, Conn: 9}}, nil)
	tb.Apply(0, &Command{Op: OpWithdraw, From: Requester{Node: 1, Conn: 3}}, nil)
	if conns := tb.WaitingConns(1, nil); len(conns) != 0 {
		t.Fatalf("WaitingConns(1) after the withdrawals = %v", conns)
	}
}

// TestRenew: a renewal answers the same grant again, moves the lease later
// (never earlier) and its timer with it, and answers T once the token no
// longer holds the key; single mode has no renewals.
func TestRenew(t *testing.T) {
	tb := New(Config{Replicated: true})
	renew := func(now int64, tok, leaseMs, allowMs uint64) []Answer {
		c := Command{Op: OpRenew, From: Requester{Node: 2, Conn: 7, Seq: 3}, Owner: []byte("w"), Key: []byte("k"), Token: tok, LeaseMs: leaseMs, WaitMs: allowMs}
		return tb.Apply(now, &c, nil)
	}
	tok := acq(tb, 0, 1, 1, "k", 1000, 0)[0].Token
	stale := tb.Due(1000e6, nil) // the leader's Expire, formed before the renewal applies
	if len(stale) != 1 || stale[0].Deadline != 1000e6 {
		t.Fatalf("Due %+v, want one Expire for the deadline 1 s", stale)
	}
	stale[0].Key = append([]byte(nil), stale[0].Key...)
	a := renew(600e6, tok, 1000, 100)
	if len(a) != 1 || a[0].Result != Acquired || a[0].Token != tok || string(a[0].Owner) != "w" || string(a[0].Key) != "k" ||
		a[0].To != (Requester{Node: 2, Conn: 7, Seq: 3}) || a[0].Deadline != 1700e6 {
		t.Fatalf("renewal answered %+v", a)
	}
	if a := tb.Apply(1100e6, &stale[0], nil); len(a) != 0 || tb.Stats().Keys != 1 || tb.Stats().Expiries != 0 {
		t.Fatalf("an Expire made for the lease end before the renewal ended the renewed lease: %+v", a)
	}
	if d := tb.Due(1699e6, nil); len(d) != 0 {
		t.Fatalf("lease due before its renewed end: %+v", d)
	}
	if d := tb.Due(1700e6, nil); len(d) != 1 || d[0].Op != OpExpire || d[0].Token != tok {
		t.Fatalf("renewed lease not due at its end: %+v", d)
	}
	if a := renew(100e6, tok, 1000, 0); a[0].Deadline != 1700e6 || tb.MaxDeadline() != 1700e6 {
		t.Fatalf("a renewal moved the lease earlier: %+v", a)
	}
	if a := renew(0, tok+1, 1000, 0); len(a) != 1 || a[0].Result != TimedOut || string(a[0].Owner) != "w" {
		t.Fatalf("renewal of a token that does not hold: %+v", a)
	}
	rel(tb, 0, "k", tok)
	if a := renew(0, tok, 1000, 0); len(a) != 1 || a[0].Result != TimedOut {
		t.Fatalf("renewal after the release: %+v", a)
	}
	if s := tb.Stats(); s.Renewals != 4 || s.Grants != 1 || s.Keys != 0 || s.TimedOut != 0 {
		t.Fatalf("stats %+v", s)
	}
	defer func() {
		if recover() == nil {
			t.Error("single mode applied a renewal")
		}
	}()
	New(Config{}).Apply(0, &Command{Op: OpRenew, Key: []byte("k")}, nil)
}

// TestExtend: a hand-over is marked Waited, and so is a direct grant to an
// acquire that could have waited (its holder cannot tell the two apart),
// not one with wait_ms 0; Extend moves its lease later, never earlier, with
// the timer that hands the key on; a token that no longer holds the key is
// not extended.
func TestExtend(t *testing.T) {
	tb := New(Config{})
	if a := acq(tb, 0, 9, 1, "w", 1000, 10_000); !a[0].Waited {
		t.Fatalf("a direct grant to an acquire that could wait is not marked Waited: %+v", a)
	}
	a := acq(tb, 0, 1, 1, "k", 1000, 0)
	if a[0].Waited {
		t.Fatalf("a direct grant with wait_ms 0 is marked Waited: %+v", a)
	}
	acq(tb, 0, 2, 1, "k", 500, 10_000)
	h := rel(tb, 100e6, "k", a[0].Token)
	if len(h) != 2 || h[1].Result != Acquired || !h[1].Waited || h[1].Deadline != 600e6 {
		t.Fatalf("hand-over %+v", h)
	}
	tok := h[1].Token
	acq(tb, 0, 3, 1, "k", 500, 10_000)
	if !tb.Extend([]byte("k"), tok, 1900e6) || tb.MaxDeadline() != 1900e6 {
		t.Fatalf("Extend: max deadline %d", tb.MaxDeadline())
	}
	if !tb.Extend([]byte("k"), tok, 1200e6) {
		t.Fatal("Extend to an earlier end refused")
	}
	if d := tb.Tick(1899e6, nil); len(d) != 0 {
		t.Fatalf("lease ended before its extended end: %+v", d)
	}
	if d := tb.Tick(1900e6, nil); len(d) != 1 || d[0].Result != Acquired || d[0].To.Conn != 3 {
		t.Fatalf("key not handed on at the extended end: %+v", d)
	}
	if tb.Extend([]byte("k"), tok, 3000e6) || tb.Extend([]byte("nokey"), 1, 3000e6) {
		t.Fatal("extended a token that does not hold the key")
	}
}

// TestReleaseFindsItsGrantWhateverTheTokenRingHolds: a release is found by
// its token among the latest grants, and by the key index otherwise; either
// way only the grant it names is released.
func TestReleaseFindsItsGrantWhateverTheTokenRingHolds(t *testing.T) {
	tb := New(Config{})
	first := acq(tb, 0, 1, 1, "old", 60_000, 0)[0].Token
	// Enough later grants that the ring's slot of first holds another entry.
	tokens := map[string]uint64{}
	for i := range 3 * grantRing {
		k := fmt.Sprintf("k%d", i)
		tokens[k] = acq(tb, 0, 1, 1, k, 60_000, 0)[0].Token
	}
	if got := rel(tb, 0, "k0", first); got[0].Result != NotReleased {
		t.Fatalf("release of k0 with the token of another key: %v", got)
	}
	last, prev := fmt.Sprintf("k%d", 3*grantRing-1), fmt.Sprintf("k%d", 3*grantRing-2)
	if got := rel(tb, 0, prev, tokens[last]); got[0].Result != NotReleased {
		t.Fatalf("release of %s with the token of %s, granted just after: %v", prev, last, got)
	}
	if got := rel(tb, 0, "old", first+grantRing); got[0].Result != NotReleased {
		t.Fatalf("release of old with the token in the same ring slot: %v", got)
	}
	if got := rel(tb, 0, "old", first); got[0].Result != Released {
		t.Fatalf("release of old, granted %d grants ago: %v", 3*grantRing, got)
	}
	// Freed entries are reused: a stale slot's entry may now hold another
	// key under another token.
	for k, tok := range tokens {
		if got := rel(tb, 0, k, tok); got[0].Result != Released {
			t.Fatalf("release of %s %d: %v", k, tok, got)
		}
	}
	a := acq(tb, 0, 1, 1, "new", 60_000, 0)[0]
	for k, tok := range tokens {
		if got := rel(tb, 0, k, tok); got[0].Result != NotReleased {
			t.Fatalf("second release of %s %d: %v", k, tok, got)
		}
	}
	if got := rel(tb, 0, "new", a.Token); got[0].Result != Released {
		t.Fatalf("release of new: %v", got)
	}
	// A snapshot loaded over the table: its grants are found by the index.
	b := acq(tb, 0, 1, 1, "kept", 60_000, 0)[0]
	var snap bytes.Buffer
	if err := tb.WriteSnapshot(&snap); err != nil {
		t.Fatal(err)
	}
	if got := rel(tb, 0, "kept", b.Token); got[0].Result != Released {
		t.Fatalf("release of kept before the load: %v", got)
	}
	if err := tb.ReadSnapshot(&snap); err != nil {
		t.Fatal(err)
	}
	if got := rel(tb, 0, "kept", b.Token); got[0].Result != Released {
		t.Fatalf("release of kept after the load: %v", got)
	}
	if got := rel(tb, 0, "kept", b.Token); got[0].Result != NotReleased {
		t.Fatalf("second release of kept after the load: %v", got)
	}
}

// ShiftLeases moves lease ends and the grace later, and nothing else.
func TestShiftLeases(t *testing.T) {
	tb := New(Config{})
	const ms = int64(1e6)
	tok := acq(tb, 0, 1, 1, "k", 1000, 0)[0].Token
	tb.SetGrace(100 * ms)
	tb.ShiftLeases(5000 * ms)
	if g := tb.Grace(); g != 5100*ms {
		t.Errorf("grace %d, want %d", g, 5100*ms)
	}
	if d := tb.MaxDeadline(); d != 6000*ms {
		t.Errorf("max deadline %d, want %d", d, 6000*ms)
	}
	if got := acq(tb, 5999*ms, 2, 1, "k", 1000, 0); got[0].Result != TimedOut {
		t.Fatalf("before the moved lease end: %v", got)
	}
	if got := acq(tb, 6000*ms, 2, 2, "k", 1000, 0); got[0].Result != Acquired || got[0].Token <= tok {
		t.Fatalf("at the moved lease end: %v", got)
	}
	defer func() {
		if recover() == nil {
			t.Error("ShiftLeases on a Replicated table did not panic")
		}
	}()
	New(Config{Replicated: true}).ShiftLeases(1)
}

// Sweep lowers the lease high-water mark to the latest lease end still
// held (single mode's durable ceiling follows it down); a replicated table,
// whose mark is in its state, keeps it.
func TestSweepLowersMaxDeadlineToTheLeasesHeld(t *testing.T) {
	tb := New(Config{})
	long := acq(tb, 0, 1, 1, "long", 3_600_000, 0)[0].Token
	acq(tb, 0, 1, 2, "held", 20_000, 0)
	acq(tb, 0, 1, 3, "ended", 1_000, 0)
	rel(tb, 1e9, "long", long)
	if got := tb.MaxDeadline(); got != 3600e9 {
		t.Fatalf("MaxDeadline %d before the sweep, want the hour's lease end", got)
	}
	tb.Sweep(2e9)
	if got := tb.MaxDeadline(); got != 20e9 {
		t.Fatalf("MaxDeadline %d after the sweep, want 20e9, the lease still held", got)
	}

	rt := New(Config{Replicated: true})
	rel(rt, 1e9, "long", acq(rt, 0, 1, 1, "long", 3_600_000, 0)[0].Token)
	rt.Sweep(2e9)
	if got := rt.MaxDeadline(); got != 3600e9 {
		t.Fatalf("replicated MaxDeadline %d after a sweep, want it kept", got)
	}
}
