package replica

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sync"
	"unsafe"

	sm "github.com/lni/dragonboat/v4/statemachine"

	"github.com/ticketd/ticketd/shard"
)

// Incarnations are numbered in the top bits of a Requester's Conn: every
// connection id a node ever hands out is larger than every id of its earlier
// runs, which is what OpWithdrawBelow relies on.
const (
	connBits = 40
	connMask = 1<<connBits - 1
)

func requesterConn(inc, local uint64) uint64 { return inc<<connBits | local&connMask }

// proposer is what a replica remembers of one node's proposals to its
// shard, to apply each batch once: its latest incarnation, the floor below
// which every batch id is settled (and refused), and the ids at or above it
// already applied. Bounded by what the node has in flight.
type proposer struct {
	inc   uint64
	floor uint64
	seen  map[uint64]struct{}
}

// sink receives what a replica decides for this node: answers for its
// connections (Acquired answers whose connection is gone must be released),
// after each Update. It runs on the shard's apply goroutine and must not block.
type sink interface {
	deliver(shardIdx int, answers []shard.Answer)
	// notice passes on a notice of the hand-over protocol (noticeHandOver
	// or noticeDrained) from node, stamped on its clock.
	notice(shardIdx int, node uint32, kind uint64, stamp int64)
	// renew passes on the renewals of grants this replica applied too
	// late to answer (fsm.judge), for this node to propose.
	renew(shardIdx int, cmds []shard.Command)
	// lapsed passes on this node's grants that came too late even to renew
	// (Acquired: to be released), or whose renewal found the lease ended
	// (TimedOut): their connections must hear that the outcome is unknown.
	lapsed(shardIdx int, grants []shard.Answer)
	// lost names this node's connections that had acquires queued which a
	// snapshot received no longer holds (their answers were decided in
	// entries this replica never applied), or which the leader withdrew
	// having given this node up for lost: their answers will not come.
	lost(shardIdx int, conns []uint64)
	// behind tells that the log holds a later incarnation of this node
	// than this run's: its data dir went back (restored from a copy).
	behind(shardIdx int, logInc uint64)
	// applied names this run's batches that this replica has applied.
	applied(shardIdx int, batches []uint64)
}

// fsm is one replica of one shard: a shard.Table in Replicated mode plus
// the state that makes applying a log deterministic and retries harmless.
// Every field marked (state) is in snapshots.
type fsm struct {
	idx  int // shard index (raft shard id - 1)
	cfg  shard.Config
	node uint32
	out  sink

	mu    sync.Mutex // Update vs the leader's timer, Lookup and stats
	t     *shard.Table
	now   int64                // replicated clock: largest stamp applied (state)
	props map[uint32]*proposer // per node (state)
	// set is the shard's settings, from the first notice of them applied
	// or the last change of limits (nil: none yet; the log of an older
	// ticketd), and setBy the node that sent them (state). setAt is the
	// proposer's stamp on the change of limits they came from (0: none, or
	// one of a ticketd that did not stamp them) (state): a change stamped
	// no later is a copy retried after a later change, or was made before
	// it, and is not applied. SetLimits stamps past every change committed
	// before it (read through the leader), so that one sent through a node
	// whose clock is behind still comes after them.
	set       *settings
	setBy     uint32
	setAt     int64
	applied   uint64          // last applied log index (not state: Dragonboat keeps it); 0: not known
	refused   uint64          // batches refused as stale (not state)
	ans       []shard.Answer  // scratch
	cmd       shard.Command   // scratch
	mine      []shard.Answer  // answers for this node, per Update
	grants    []grantAt       // grants among mine, to judge, per Update
	renews    []shard.Command // renewals of this node's late grants, per Update
	lapsed    []shard.Answer  // this node's grants too late even to renew, per Update
	gone      []uint64        // this node's connections whose queued acquires the leader withdrew, per Update
	behindInc uint64          // a later incarnation of this node found in the log, per Update
	ownDone   []uint64        // this run's batches applied, per Update
	notices   []header        // hand-over notices applied, per Update
	// inc is this run's incarnation, and snapOwn the batch ids of this run
	// that a snapshot received had applied: their answers never came out
	// here (not state).
	inc     uint64
	snapOwn map[uint64]struct{}
	arena   []byte // copies of the keys and owners in mine
	// recovering counts the snapshots restored whose index has not been
	// reported yet (Node.SnapshotRecovered; RecoverFromSnapshot is not
	// told it): until then applied is 0, not the index of the state the
	// snapshot replaced (not state).
	recovering int

	// For the leader's timer loop, set before the first Update: it delays
	// lease ends by skew, and timersMoved wakes it when an Update sets a
	// timer due before due, the time the loop last planned to look at the
	// shard (it sets due; math.MaxInt64: nothing due).
	skew        int64
	timersMoved func()
	due         int64

	// clock is this node's clock (nil: no covers). covers holds, per token
	// of a lease this replica granted (tokens are unique in a shard), the
	// time on that clock before which the lease must not end: its lease_ms
	// counted from the moment the grant was applied here. A deadline counts
	// from the replicated clock, the stamp of an attempt, and an entry that
	// commits late (held up by a leader that failed, or a loss of quorum; an
	// abandoned attempt that commits after its retry) grants a lease that has
	// partly run before anyone hears of it. The leader ends a lease only
	// once its clock is skew past both (not state: each node measures its
	// own, and a new leader uses what it applied as a follower, no earlier
	// than the entries committed).
	clock      func() int64
	covers     map[uint64]int64
	coverPrune int // len(covers) at which setCover next drops what is due
	// maxLate bounds a cover's lateness (0: no bound): no grant whose
	// answer reaches a holder commits later than its proposer waits for it
	// (the unavailable timeout, or one attempt's, and an abandoned attempt
	// that commits after its retry within both), so more is this replica's
	// own lag (cut off or paused while it ran, catching up from the log),
	// which would hold those leases once it leads.
	maxLate int64
	// live: this replica has applied an entry of this run of its node, so
	// what it applies commits while it runs. Entries before that are a
	// replay of the log at start (or what committed while the node was
	// down): applied late by the restart, not by their commit, and covered
	// by the nodes that applied them when they committed.
	live bool
}

func newFSM(idx int, node uint32, cfg shard.Config, out sink) *fsm {
	cfg.Replicated = true
	return &fsm{
		idx: idx, cfg: cfg, node: node, out: out,
		t:     shard.New(cfg),
		props: make(map[uint32]*proposer),
		due:   math.MaxInt64,
	}
}

// Update implements sm.IConcurrentStateMachine.
func (f *fsm) Update(ents []sm.Entry) ([]sm.Entry, error) {
	f.mu.Lock()
	f.mine = emptied(f.mine)
	f.grants = f.grants[:0]
	f.renews = emptied(f.renews)
	f.lapsed = f.lapsed[:0]
	f.gone = f.gone[:0]
	f.behindInc = 0
	f.ownDone = f.ownDone[:0]
	f.arena = emptied(f.arena)
	f.notices = f.notices[:0]
	var err error
	for i := range ents {
		var res uint64
		if res, err = f.applyEntry(ents[i].Cmd); err != nil {
			err = fmt.Errorf("shard %d, log index %d: %w", f.idx, ents[i].Index, err)
			break
		}
		ents[i].Result = sm.Result{Value: res}
		f.applied = ents[i].Index
	}
	f.judge()
	moved := f.timersEarlier()
	f.mu.Unlock()
	if moved {
		f.timersMoved()
	}
	if len(f.ownDone) > 0 && f.out != nil {
		// Before the answers: a connection they free may send more at once.
		f.out.applied(f.idx, f.ownDone)
	}
	if len(f.mine) > 0 && f.out != nil {
		f.out.deliver(f.idx, f.mine)
	}
	if len(f.renews) > 0 && f.out != nil {
		f.out.renew(f.idx, f.renews)
	}
	if len(f.lapsed) > 0 && f.out != nil {
		f.out.lapsed(f.idx, f.lapsed)
	}
	if len(f.gone) > 0 && f.out != nil {
		f.out.lost(f.idx, f.gone)
	}
	if f.behindInc != 0 && f.out != nil {
		f.out.behind(f.idx, f.behindInc)
	}
	for _, h := range f.notices {
		if f.out != nil {
			f.out.notice(f.idx, h.node, h.floor, h.stamp)
		}
	}

	return ents, err
}

// keepAtMost bounds the bytes a buffer emptied for reuse keeps: one burst
// (a flood of pipelined requests, answered in a few large batches) must not
// hold its largest batch's memory for good, in every shard.
const keepAtMost = 1 << 20

// emptied is s emptied for reuse, or nil once a burst grew it past
// keepAtMost bytes. Dropping it is safe where reuse is: what was taken
// from it before keeps the old array alive.
func emptied[T any](s []T) []T {
	var zero T
	if uintptr(cap(s))*unsafe.Sizeof(zero) > keepAtMost {
		return nil
	}
	return s[:0]
}

// timersEarlier tells whether the commands just applied set a timer that
// comes due before the timer loop planned to look at the shard (a new wait,
// a grant), and moves the plan to it. O(1), with every Update: timers that
// end only move the next one later, which the loop finds when it looks.
// Under f.mu.
func (f *fsm) timersEarlier() bool {
	if f.timersMoved == nil {
		return false
	}
	lease, wait := f.t.NewTimers()
	d := wait
	if lease < math.MaxInt64 {
		d = min(d, lease+f.skew)
	}
	if d >= f.due {
		return false
	}
	f.due = d
	return true
}

// Result values of an entry for its proposer.
const (
	resultApplied = 1
	// resultUnanswered: a batch of this run of this node that this replica
	// will never answer: applied before by a snapshot it received (which
	// carries no answers), or refused as an earlier run's (the data dir's
	// incarnation went back). Its connections must hear that the outcome
	// is unknown rather than wait for answers that do not come.
	resultUnanswered = 2
)

// applyEntry applies one batch and returns its result for the proposer.
// Under f.mu.
func (f *fsm) applyEntry(b []byte) (uint64, error) {
	if len(b) == 0 {
		return resultApplied, nil
	}
	r := reader{b: b}
	h := r.header()
	if r.err != nil {
		return 0, r.err
	}
	mine := h.node == f.node && h.inc == f.inc
	if mine {
		f.live = true
	}
	if h.stamp > f.now {
		f.now = h.stamp // never back, whatever a node's clock says
	}
	p := f.props[h.node]
	switch {
	case p != nil && h.inc < p.inc:
		// A batch of a node's earlier run, committed late: its connections are
		// gone and their clients saw them close without an answer.
		f.refused++
		if mine {
			f.behindInc = p.inc // this run is the earlier one
			return resultUnanswered, nil
		}
		return resultApplied, nil
	case p == nil || h.inc > p.inc:
		p = &proposer{inc: h.inc, seen: make(map[uint64]struct{})}
		f.props[h.node] = p
		f.cmd = shard.Command{Op: shard.OpWithdrawBelow, From: shard.Requester{Node: h.node, Conn: requesterConn(h.inc, 0)}}
		f.t.Apply(f.now, &f.cmd, nil)
	}
	if h.notice() {
		if h.floor == noticeSettings || h.floor == noticeLimits {
			s := r.settings()
			if r.err != nil || len(r.b) != 0 {
				return 0, errEntry
			}
			// A change of limits cannot change the shard count, nor the
			// skew: it carries its sender's, which may be one started
			// otherwise that has not yet found so (a skew left unknown by
			// an older ticketd is taken from it, as from settings).
			if f.set == nil || h.floor == noticeLimits && s.shards == f.set.shards && (h.stamp == 0 || h.stamp > f.setAt) {
				if f.set != nil && (s.skew == 0 || f.set.skew != 0) {
					s.skew = f.set.skew
				}
				f.adopt(s, h.node)
				if h.floor == noticeLimits {
					f.setAt = h.stamp
				}
			} else if h.floor == noticeSettings && f.set.skew == 0 && s.skew != 0 && s.shards == f.set.shards && s.limits == f.set.limits {
				// Settings from an older ticketd, which did not announce
				// the skew: the first node to announce one with the same
				// shards and limits fixes it, so later nodes are held to it.
				f.set.skew = s.skew
				f.followSkew()
			}
			return resultApplied, nil
		}
		f.notices = append(f.notices, h)
		return resultApplied, nil
	}
	if h.batch != 0 {
		if h.floor > p.floor {
			p.floor = h.floor
			for id := range p.seen {
				if id < p.floor {
					delete(p.seen, id)
				}
			}
			if mine {
				for id := range f.snapOwn {
					if id < p.floor {
						delete(f.snapOwn, id)
					}
				}
			}
		}
		if h.batch < p.floor {
			f.refused++ // applied before, or given up by its proposer
			return resultApplied, nil
		}
		if _, dup := p.seen[h.batch]; dup {
			// Every copy says so while the batch is in flight, not the
			// first alone: that one may be an attempt its proposer gave
			// up on, and the copy it waits for would read applied.
			if _, lost := f.snapOwn[h.batch]; lost && mine {
				return resultUnanswered, nil
			}
			return resultApplied, nil
		}
		p.seen[h.batch] = struct{}{}
		if mine {
			f.ownDone = append(f.ownDone, h.batch)
		}
	}
	for n := uint64(0); n < h.count; n++ {
		r.command(h.node, &f.cmd)
		if r.err != nil {
			return 0, r.err
		}
		var before []shard.Command
		if f.cmd.Op == shard.OpWithdrawBelow && f.cmd.From.Node == f.node {
			before = f.t.Waiting(f.node, nil)
		}
		f.ans = f.t.Apply(f.now, &f.cmd, f.ans[:0])
		f.cover(f.ans)
		f.keep(f.ans)
		if before != nil {
			// The leader gave this node up for lost (see Node.reap):
			// acquires of its connections are gone without an answer.
			f.gone = append(f.gone, gone(before, f.t.Waiting(f.node, nil))...)
		}
	}
	if len(r.b) != 0 {
		return 0, errEntry
	}
	return resultApplied, nil
}

// adopt makes s the shard's settings. Every node announces its own before
// it proposes anything else (see group.announce), so every replica applies
// every batch of the log after the first notice under the same limits,
// whatever its own flags say: replicas cannot part on a B. Under f.mu.
func (f *fsm) adopt(s settings, by uint32) {
	f.set, f.setBy = &s, by
	f.t.SetLimits(perShard(s.MaxKeys, s.shards), s.MaxWaitersPerKey, perShard(s.MaxWaiters, s.shards))
	f.followSkew()
}

// followSkew makes the shard's skew, once one is announced, the one this
// replica ends leases and judges late grants by: every node is held to it.
// A node started with another stops once its notice is compared, but may
// lead the shard until then, and a lease it ended by a smaller skew than
// the one other nodes answered by would be held twice. Under f.mu.
func (f *fsm) followSkew() {
	if f.set != nil && f.set.skew != 0 {
		f.skew = f.set.skew
	}
}

// settings returns the shard's settings and the node that sent them; false
// if none was applied yet.
func (f *fsm) settings() (settings, uint32, bool) {
	s, by, _, ok := f.settingsAt()
	return s, by, ok
}

// settingsAt is settings with the stamp of the change of limits they came
// from (0: none).
func (f *fsm) settingsAt() (settings, uint32, int64, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.set == nil {
		return settings{}, 0, 0, false
	}
	return *f.set, f.setBy, f.setAt, true
}

// keep copies the answers addressed to this node (their slices point into the
// entry or the table, both of which move on), and notes which of them are
// grants to be judged for lateness once the Update is applied (judge). f.cmd
// is the command that decided them.
func (f *fsm) keep(ans []shard.Answer) {
	for _, a := range ans {
		if a.To.Node != f.node || a.To.Conn == 0 {
			continue
		}
		a.Owner = f.copyBytes(a.Owner)
		a.Key = f.copyBytes(a.Key)
		if f.cmd.Op == shard.OpRenew && a.Result == shard.TimedOut {
			// Not T: the acquire was granted, and whoever came next
			// found the key held. Its outcome can only be unknown.
			f.lapsed = append(f.lapsed, a)
			continue
		}
		if a.Result == shard.Acquired && f.clock != nil && f.skew > 0 && f.live && a.To.Conn>>connBits == f.inc {
			g := grantAt{i: len(f.mine), since: f.now, lease: uint64(a.Deadline-f.now) / 1e6}
			if f.cmd.Op == shard.OpRenew {
				g.lease, g.allow = f.cmd.LeaseMs, int64(f.cmd.WaitMs)*1e6
			}
			f.grants = append(f.grants, g)
		}
		f.mine = append(f.mine, a)
	}
}

// grantAt is a grant among f.mine to judge for lateness: the replicated
// time its lease counts from, its lease, and the lateness its renewal
// allowed for itself (0: not a renewal).
type grantAt struct {
	i            int
	since, allow int64
	lease        uint64
}

// judge takes out of f.mine the grants of this Update that come too late to
// answer, turning them into renewals, or, past what a renewal may allow,
// into lapsed ones. The clock is read once, after the whole Update, just
// before the answers go to the network.
//
// The holder counts its lease from about the answer; the leader ends it
// skew after its deadline on its own clock, and the deadline counts from
// the replicated time the grant was applied at. An answer more than half
// the skew after that would leave the holder believing in its lease past
// the Expire once the clocks differ by the other half. The leader's covers
// cannot help: a follower that answers may apply the grant later than the
// leader did. So the grant is answered only when a renewal has moved its
// lease to count from about then: the renewal, stamped when proposed, runs
// the lease plus the lateness seen now (its allowance, the time it allows
// itself to come back), and is answered if it came back within that and
// half the skew, else renewed again with the longer allowance. Each round
// is later by more than half the skew, and an allowance above both the
// lease and the skew is not given: that grant is lapsed (its connection is
// told E unavailable, and the grant released), as is a renewal that found
// the lease ended. A renewal costs one more commit, only for grants applied
// late; the holder's key stays held up to the allowance past the lease it
// believes in. Under f.mu.
func (f *fsm) judge() {
	if len(f.grants) == 0 {
		return
	}
	local := f.clock()
	taken := false
	for _, g := range f.grants {
		late := local - g.since
		if late <= g.allow+f.skew/2 {
			continue
		}
		a := &f.mine[g.i]
		if late > max(f.skew, int64(min(g.lease, math.MaxInt64/1_000_000))*1e6) {
			f.lapsed = append(f.lapsed, *a)
		} else {
			f.renews = append(f.renews, shard.Command{Op: shard.OpRenew, From: a.To, Owner: a.Owner, Key: a.Key,
				Token: a.Token, LeaseMs: g.lease, WaitMs: uint64((late + 1e6 - 1) / 1e6)})
		}
		a.To.Conn, taken = 0, true // taken out
	}
	if taken {
		f.mine = slices.DeleteFunc(f.mine, func(a shard.Answer) bool { return a.To.Conn == 0 })
	}
}

// cover records how late this replica applied the grants among ans, and
// forgets the leases released. Under f.mu.
func (f *fsm) cover(ans []shard.Answer) {
	if f.clock == nil || !f.live {
		return
	}
	var local int64
	for i := range ans {
		switch a := &ans[i]; a.Result {
		case shard.Acquired:
			if local == 0 {
				local = f.clock()
			}
			late := local - f.now
			if f.maxLate > 0 {
				late = min(late, f.maxLate)
			}
			if late > 0 {
				f.setCover(a.Token, a.Deadline+late, local)
			}
		case shard.Released:
			delete(f.covers, a.Token)
		}
	}
}

// setCover records that the lease of tok ends no earlier than notBefore on
// this node's clock. Entries whose time has come are dropped now and then
// (a follower never proposes their Expire), so that the map holds about
// the leases still running. Under f.mu.
func (f *fsm) setCover(tok uint64, notBefore, local int64) {
	if f.covers == nil {
		f.covers = make(map[uint64]int64)
	}
	if len(f.covers) >= f.coverPrune {
		for t, nb := range f.covers {
			if nb+f.skew <= local {
				delete(f.covers, t)
			}
		}
		f.coverPrune = max(1024, 2*len(f.covers))
	}
	f.covers[tok] = notBefore
}

// dueExpires appends to out the Expire commands among due (from
// Table.Due(now-skew)) whose covers have passed too, and returns the
// earliest time on this node's clock at which one held back comes due
// (math.MaxInt64: none). Under f.mu.
func (f *fsm) dueExpires(now int64, due, out []shard.Command) ([]shard.Command, int64) {
	later := int64(math.MaxInt64)
	for i := range due {
		c := &due[i]
		if c.Op != shard.OpExpire {
			continue
		}
		if nb, ok := f.covers[c.Token]; ok {
			if now-f.skew < nb {
				later = min(later, nb+f.skew)
				continue
			}
			delete(f.covers, c.Token)
		}
		out = append(out, *c)
	}
	return out, later
}

func (f *fsm) copyBytes(b []byte) []byte {
	if b == nil {
		return nil
	}
	// A later append may move the arena; what was copied before stays put in
	// the old array, which the earlier answers keep alive.
	s := len(f.arena)
	f.arena = append(f.arena, b...)
	return f.arena[s:len(f.arena):len(f.arena)]
}

// Lookup implements sm.IConcurrentStateMachine; it is not used for reads of
// lock state (those go through the log) and answers only diagnostic queries.
// limitsQuery asks Lookup for the stamp of the shard's last change of
// limits (fsm.setAt).
type limitsQuery struct{}

func (f *fsm) Lookup(q interface{}) (interface{}, error) {
	if _, ok := q.(limitsQuery); ok {
		_, _, at, _ := f.settingsAt()
		return at, nil
	}
	return nil, errors.New("replica: no lookups but limitsQuery")
}

// PrepareSnapshot captures the state under the mutual exclusion Dragonboat
// gives it against Update; SaveSnapshot then only writes bytes.
func (f *fsm) PrepareSnapshot() (interface{}, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var buf bytes.Buffer
	if err := f.writeState(&buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// SaveSnapshot implements sm.IConcurrentStateMachine.
func (f *fsm) SaveSnapshot(ctx interface{}, w io.Writer, _ sm.ISnapshotFileCollection, _ <-chan struct{}) error {
	_, err := w.Write(ctx.([]byte))
	return err
}

// RecoverFromSnapshot implements sm.IConcurrentStateMachine.
//
// The snapshot is read and decoded before f.mu is taken: a large one takes
// a while, and the event loops ask the table under it (Node.Queued), as do
// the timer loop and the stats. Nothing else changes f meanwhile: Update
// runs on this goroutine.
func (f *fsm) RecoverFromSnapshot(r io.Reader, _ []sm.SnapshotFile, _ <-chan struct{}) error {
	st, err := f.readState(bufio.NewReader(r))
	f.mu.Lock()
	var before map[uint64]struct{} // this run's batches applied here
	if p := f.props[f.node]; p != nil && p.inc == f.inc {
		before = p.seen
	}
	waiting := f.t.Waiting(f.node, nil)
	if err == nil {
		f.install(st)
	}
	var lost []uint64
	if err == nil && len(waiting) > 0 {
		lost = gone(waiting, f.t.Waiting(f.node, nil))
	}
	if p := f.props[f.node]; err == nil && p != nil && p.inc == f.inc {
		// Batches of this run that the snapshot applied, and not this
		// replica before it, were never answered here: a retry of one,
		// refused as a repeat, must say so.
		own := make(map[uint64]struct{})
		for id := range p.seen {
			_, answered := before[id]
			_, lost := f.snapOwn[id]
			if !answered || lost {
				own[id] = struct{}{}
			}
		}
		f.snapOwn = own
	}
	f.t.NewTimers()
	f.due = math.MaxInt64
	if err == nil {
		f.applied = 0
		f.recovering++
	}
	f.mu.Unlock()
	if f.timersMoved != nil {
		f.timersMoved() // the table restored may have any timers
	}
	if len(lost) > 0 && f.out != nil {
		f.out.lost(f.idx, lost)
	}
	return err
}

// recovered takes the index of a snapshot restored, reported after its
// RecoverFromSnapshot in the same order. Entries applied since then set
// applied themselves, and a report that an older restore left behind does
// not speak for the state of a later one.
func (f *fsm) recovered(index uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.recovering == 0 {
		return
	}
	f.recovering--
	if f.recovering == 0 {
		f.applied = max(f.applied, index)
	}
}

// gone returns the connections of the waiters in before that are not in
// after, each once.
func gone(before, after []shard.Command) []uint64 {
	still := make(map[shard.Requester]struct{}, len(after))
	for _, w := range after {
		still[w.From] = struct{}{}
	}
	var conns []uint64
	for _, w := range before {
		if _, ok := still[w.From]; !ok && !slices.Contains(conns, w.From.Conn) {
			conns = append(conns, w.From.Conn)
		}
	}
	return conns
}

// Close implements sm.IConcurrentStateMachine.
func (f *fsm) Close() error { return nil }

// Replica snapshot, version 4, uvarints unless said otherwise:
//
//	"TKRS" version(1 byte) now(varint)
//	setBy (0: no settings), then if not 0: shards maxKeys maxWaiters maxWaitersPerKey skew setAt(varint)
//	nodeCount, per node ascending: node incarnation floor idCount id* (ascending)
//	the table's own snapshot (shard.WriteSnapshot, with its checksum)
//
// Version 3, without skew, version 2, without setAt either, and version 1,
// without the settings line, still load.
const (
	replMagic   = "TKRS"
	replVersion = 4
)

func (f *fsm) writeState(w io.Writer) error {
	b := append([]byte(replMagic), replVersion)
	b = binary.AppendVarint(b, f.now)
	if f.set == nil {
		b = binary.AppendUvarint(b, 0)
	} else {
		b = binary.AppendUvarint(b, uint64(f.setBy))
		b = appendSettings(b, *f.set)
		b = binary.AppendVarint(b, f.setAt)
	}
	nodes := make([]uint32, 0, len(f.props))
	for n := range f.props {
		nodes = append(nodes, n)
	}
	slices.Sort(nodes)
	b = binary.AppendUvarint(b, uint64(len(nodes)))
	for _, n := range nodes {
		p := f.props[n]
		b = binary.AppendUvarint(b, uint64(n))
		b = binary.AppendUvarint(b, p.inc)
		b = binary.AppendUvarint(b, p.floor)
		ids := make([]uint64, 0, len(p.seen))
		for id := range p.seen {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		b = binary.AppendUvarint(b, uint64(len(ids)))
		for _, id := range ids {
			b = binary.AppendUvarint(b, id)
		}
	}
	if _, err := w.Write(b); err != nil {
		return err
	}
	return f.t.WriteSnapshot(w)
}

var errSnapshot = errors.New("replica: bad snapshot")

// replState is a replica snapshot read, for install.
type replState struct {
	t     *shard.Table
	now   int64
	props map[uint32]*proposer
	set   *settings
	setBy uint32
	setAt int64
}

// readState decodes a snapshot that writeState wrote. It reads nothing of
// f but its table's fixed config, so it needs no lock.
func (f *fsm) readState(r *bufio.Reader) (*replState, error) {
	magic := make([]byte, len(replMagic)+1)
	if _, err := io.ReadFull(r, magic); err != nil || string(magic[:4]) != replMagic || magic[4] < 1 || magic[4] > replVersion {
		return nil, errSnapshot
	}
	var err error
	uv := func() uint64 {
		if err != nil {
			return 0
		}
		var v uint64
		v, err = binary.ReadUvarint(r)
		return v
	}
	now, err := binary.ReadVarint(r)
	var set *settings
	var setBy uint32
	var setAt int64
	if magic[4] >= 2 {
		if by := uv(); by != 0 {
			v := [4]uint64{uv(), uv(), uv(), uv()}
			for _, x := range v {
				if x > math.MaxInt64 {
					err = errSnapshot
				}
			}
			if v[0] == 0 && err == nil {
				err = errSnapshot // no node runs without shards
			}
			set = &settings{shards: int(v[0]), limits: limits{MaxKeys: int(v[1]), MaxWaiters: int(v[2]), MaxWaitersPerKey: int(v[3])}}
			if magic[4] >= 4 {
				if k := uv(); k > math.MaxInt64 {
					err = errSnapshot
				} else {
					set.skew = int64(k)
				}
			}
			setBy = uint32(by)
			if magic[4] >= 3 && err == nil {
				setAt, err = binary.ReadVarint(r)
			}
		}
	}
	props := make(map[uint32]*proposer)
	for n := uv(); err == nil && n > 0; n-- {
		node := uint32(uv())
		p := &proposer{inc: uv(), floor: uv(), seen: make(map[uint64]struct{})}
		for k := uv(); err == nil && k > 0; k-- {
			p.seen[uv()] = struct{}{}
		}
		props[node] = p
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errSnapshot, err)
	}
	t := shard.New(f.cfg)
	if err := t.ReadSnapshot(r); err != nil {
		return nil, err
	}
	return &replState{t: t, now: now, props: props, set: set, setBy: setBy, setAt: setAt}, nil
}

// install makes st the replica's state. Under f.mu.
func (f *fsm) install(st *replState) {
	f.t, f.now, f.props, f.set, f.setAt = st.t, st.now, st.props, nil, st.setAt
	if st.set != nil {
		f.adopt(*st.set, st.setBy)
	}
}

// digest is a hash of the replica's state, for checking that replicas agree.
func (f *fsm) digest() (applied uint64, sum [32]byte, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	h := sha256.New()
	if err := f.writeState(h); err != nil {
		return 0, sum, err
	}
	copy(sum[:], h.Sum(nil))
	return f.applied, sum, nil
}
