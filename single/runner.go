// Package single runs ticketd's lock tables in one process: it applies
// requests to shard.Table under a lock per shard, drives the tables' timers
// and sweep from real clocks, and keeps the small durable state that makes
// restarts safe (see store.go and ARCHITECTURE.md).
//
// Runner satisfies netloop.Backend. Requests are applied on the event loop
// that read them; answers for other connections (a hand-over on release, a
// grant or timeout from the timer) are posted to their connection's mailbox.
//
// The durability rule: a grant's answer leaves the process (written for the
// caller, or posted to another connection's mailbox) only once a durable
// token ceiling at or above its token and a durable lease ceiling at or
// above its deadline are on disk. Background loops keep both ceilings ahead
// of steady traffic; a grant that passes one writes it synchronously first.
package single

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"iter"
	"math"
	mathbits "math/bits"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/ticketd/ticketd/codec"
	"github.com/ticketd/ticketd/netloop"
	"github.com/ticketd/ticketd/shard"
)

// Options configure a Runner.
type Options struct {
	DataDir          string
	Shards           int
	MaxKeys          int // server-wide; 0: unlimited
	MaxWaitersPerKey int
	MaxWaiters       int // server-wide; 0: unlimited
	SweepInterval    time.Duration
	Logger           *zap.Logger
	SweepObserver    netloop.Observer // optional: seconds per sweep

	// MaxLease is the longest lease this or any earlier run on the data dir
	// granted; only RecoverDamaged uses it.
	MaxLease time.Duration
	// RecoverDamaged starts on a data dir whose state cannot be read back
	// whole instead of refusing it: the damaged files are set aside, no key
	// is granted before MaxLease (plus leaseStep) has passed, and tokens
	// restart above the current time in unix nanoseconds (and above any
	// ceiling still readable). See RecoveryFloor.
	RecoverDamaged bool

	// StallTimeout is how long a synced write of the state may take before
	// the runner is not Ready (a stalled disk: grants that wait on it hold
	// their event loop); the state is also written again after half of it
	// without a write, so that a disk that stalls while the server is idle
	// shows too. 0: 5s.
	StallTimeout time.Duration

	// WallOffset is FOR TESTS ONLY: the wall clock reads this much off for
	// the whole run, as on a host whose clock is wrong when it starts (a
	// fault campaign restarts on a clock ahead; Go reads time through the
	// vDSO, so faketime cannot).
	WallOffset time.Duration
}

const (
	// tokenBlock tokens are reserved per synced write; after a crash the
	// counters restart above the reservation, so tokens skip at most this.
	tokenBlock = 1 << 20
	// leaseStep is how far past the latest granted deadline the durable
	// lease ceiling is pushed per synced write: one write per leaseStep of
	// progress, and at most leaseStep of extra grace after a crash.
	leaseStep = int64(2 * time.Second)
)

// part is one shard: its table and the scratch space used under its lock.
type part struct {
	mu      sync.Mutex
	t       *shard.Table
	out     []shard.Answer
	post    []byte
	orphans []orphan
	next    atomic.Int64 // earliest timer of t, for the timer goroutine
}

type orphan struct {
	token uint64
	key   []byte
}

// env is what a Runner takes from its surroundings; tests replace parts.
type env struct {
	clock      clock
	wrapStore  func(durable) durable
	tokenBlock uint64
	// deliver posts b, the encoding of a, to a's connection, a hand-over's
	// lease counted from since (see RenewLate); false if that connection is
	// gone. nil: through the netloop server.
	deliver func(a *shard.Answer, since int64, b []byte) bool
	// granting sees every grant right before its answer leaves the process.
	granting func(a *shard.Answer)
	// scanned runs in the timer loop between reading the shards' next
	// deadlines and publishing the earliest.
	scanned func(earliest int64)
}

// Runner is single mode's Backend.
type Runner struct {
	opt   Options
	env   env
	log   *zap.Logger
	parts []*part
	store durable
	clock clock
	srv   *netloop.Server

	// The durable state; st is what is on disk, under stMu. The atomics
	// mirror its ceilings for the hot path.
	stMu      sync.Mutex
	st        state
	leaseCeil atomic.Int64
	tokenCeil atomic.Uint64
	maxLease  atomic.Int64 // st.MaxLease
	// lastSave is how long the last synced write of the state took, on the
	// runner's clock (see coverLeases).
	lastSave atomic.Int64
	// saving is when the synced write of the state in flight began, and
	// saved when the last one ended, on the runner's clock; 0: none.
	// stallSaid, under stallMu: the runner was logged as stalled and not
	// yet as ready again.
	saving, saved atomic.Int64
	stallMu       sync.Mutex
	stallSaid     bool
	// SyncReserves counts ceilings written on the request path because the
	// background had not kept ahead (a lease longer than any before, a
	// burst of grants).
	syncReserves atomic.Int64
	renewals     atomic.Int64 // rounds that moved hand-overs' leases on before their answer left (renewLate, RenewLate)
	lostLate     atomic.Int64 // hand-overs lost before their answer left (RenewLate)

	failOnce sync.Once
	failErr  error
	failed   chan struct{}
	isFailed atomic.Bool

	scratch sync.Pool // *[]byte, for putting a batch's answers back in order
	inOrder bool      // Handle locks a batch's shards at once: one event loop
	// The budgets all shards share: --max-keys and --max-waiters.
	keys, waiters *shard.Budget

	closing  atomic.Bool
	quiesce  sync.Once
	wake     chan struct{}
	nextWake atomic.Int64
	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup

	// Restart facts, for the log.
	Clean    bool // the last run shut down cleanly: its snapshot was loaded
	Restored int  // keys loaded from a clean-shutdown snapshot
	// Shifted: how much later the restored leases end than the snapshot
	// wrote, the time from its write to this start on this run's clock.
	Shifted    time.Duration
	Crashed    bool     // the last run did not shut down cleanly
	Recovered  []string // recovery: what was damaged; nil otherwise
	SetAside   []string // recovery: where the damaged files went
	GraceUntil int64    // crash grace end, unix ns, also one a clean shutdown carried over; 0 if none
	TokenFloor uint64   // tokens start above this
	// NewDir: the data dir held nothing of an earlier run ("made": it did
	// not exist; "empty": it did); "" otherwise.
	NewDir string
	// StaleSnapshot says why a snapshot found was dropped, older than the
	// state ("": none was; one of another dir is refused as damage); the
	// start is then a crash restart.
	StaleSnapshot string
	// StateWrites and StateWritten are the write count and time (unix ns,
	// 0: unknown) of the state the start found: logged, so that a data
	// dir put back from an older copy, which nothing in it tells, shows
	// against the last run's log as a count gone back.
	StateWrites  uint64
	StateWritten int64
}

// Open opens the data dir and loads what the last run left.
func Open(opt Options) (*Runner, error) {
	return open(opt, env{})
}

func open(opt Options, e env) (*Runner, error) {
	if opt.Shards <= 0 || opt.Shards > maxShards {
		return nil, fmt.Errorf("single: Shards must be between 1 and %d", maxShards)
	}
	if opt.Logger == nil {
		opt.Logger = zap.NewNop()
	}
	if e.clock == nil {
		e.clock = newWallClock(opt.WallOffset)
	}
	if e.tokenBlock == 0 {
		e.tokenBlock = tokenBlock
	}
	if opt.StallTimeout <= 0 {
		opt.StallTimeout = 5 * time.Second
	}
	now := e.clock.now()
	st, ld, err := openStore(opt.DataDir, opt.RecoverDamaged, opt.MaxLease, now)
	if err != nil {
		return nil, err
	}
	var d durable = st
	if e.wrapStore != nil {
		d = e.wrapStore(st)
	}
	r := &Runner{
		opt:    opt,
		env:    e,
		log:    opt.Logger,
		store:  d,
		clock:  e.clock,
		failed: make(chan struct{}),
		wake:   make(chan struct{}, 1),
		stop:   make(chan struct{}),
	}
	r.scratch.New = func() any { b := make([]byte, 0, 16<<10); return &b }
	if err := r.load(ld, now); err != nil {
		_ = d.close()
		return nil, err
	}
	return r, nil
}

func (r *Runner) newTable(keys, waiters *shard.Budget) *shard.Table {
	return shard.New(shard.Config{
		MaxWaitersPerKey: r.opt.MaxWaitersPerKey,
		Keys:             keys,
		Waiters:          waiters,
		ReserveTokens:    r.reserveTokens,
	})
}

// reserveTokens is the tables' hook, called under a shard lock when the
// next token passes the table's ceiling. Normally the background loop has
// reserved ahead and this only reads the durable ceiling.
func (r *Runner) reserveTokens(next uint64) uint64 {
	if c := r.tokenCeil.Load(); c >= next {
		return c
	}
	r.syncReserves.Add(1)
	if err := r.raise(func(s *state) { s.TokenCeil = max(s.TokenCeil, satAddU(next, r.env.tokenBlock-1)) }); err != nil {
		// The grant is applied but must not be answered: dispatch holds
		// back every grant once the runner has failed. The table needs a
		// ceiling of at least next; nothing above the durable one leaves.
		r.fail("cannot persist token reservation", err)
		return next
	}
	return r.tokenCeil.Load()
}

// crashGrace is when the grace of a crash restart at now ends: the lease
// ceiling, which covers every lease granted, but no later than now plus the
// longest lease granted in the dir (MaxLease, durable before its answer
// left; and leaseStep, as a recovery waits): each of those leases was
// answered before the crash, so it ends within that of now, whatever the
// wall clock read when it was counted. A
// run whose wall clock was far ahead (a host that booted a day fast, then
// corrected) wrote its ceilings that far out, and the restart would
// otherwise grant nothing for as long. The grace is waited out on this
// run's monotonic clock, so the cap holds even if the wall clock is wrong
// now.
//
// Nor does it end before now plus what the lease ceiling had left when the
// state was last written, both on the last run's clock: no lease had more
// left at the crash, which came after. A restart whose wall clock reads
// fast (a host back from a power cut with its clock ahead, time not yet
// synced) would otherwise read the ceiling as passed and grant at once
// keys whose leases still run. The price: after a long downtime the grace
// still lasts about the longest lease that was running.
func crashGrace(st state, now int64) int64 {
	if st.MaxLease <= 0 {
		return st.LeaseCeil // a dir of an earlier version: unknown
	}
	g := min(st.LeaseCeil, satAdd(satAdd(now, st.MaxLease), leaseStep))
	if st.Written > 0 && st.LeaseCeil > st.Written {
		left := min(st.LeaseCeil-st.Written, satAdd(st.MaxLease, leaseStep))
		g = max(g, satAdd(now, left))
	}
	return g
}

// maxLeaseEver is the longest --max-lease any version accepts.
const maxLeaseEver = int64(720 * time.Hour)

// untilCeil is how long from now a lease that ends by the lease ceiling
// can still run, to record as the dir's longest lease: at most the longest
// any run could grant, so that a ceiling written far ahead by a run whose
// wall clock was (a host that booted fast) does not lift crashGrace's cap
// for good.
func untilCeil(ceil, now int64) int64 { return min(max(0, ceil-now), maxLeaseEver+leaseStep) }

// RecoveryFloor is where tokens restart when a damaged data dir is
// recovered without a readable ceiling: the wall clock in unix
// nanoseconds. No earlier run can have reached it: tokens start at 1 when a
// dir is first used (after 2020, at more than 1.5e18 ns) and grow by one per
// grant per shard, far below one per nanosecond, plus at most tokenBlock per
// crash restart, and an earlier recovery restarted them at its own time,
// which lies behind this one as long as the wall clock has not been set
// back (the same assumption the lease deadlines make across restarts; a
// recovery is refused while the clock is behind the dir's last use, see
// clockPastUse).
func RecoveryFloor(now int64) uint64 { return uint64(max(now, 0)) }

func (r *Runner) load(ld loaded, now int64) error {
	n := r.opt.Shards
	keys, waiters := shard.NewBudget(r.opt.MaxKeys), shard.NewBudget(r.opt.MaxWaiters)
	defer func() { r.keys, r.waiters = keys, waiters }()
	r.parts = make([]*part, n)
	for i := range r.parts {
		r.parts[i] = &part{t: r.newTable(keys, waiters)}
	}
	r.st = ld.st
	if ld.stOK {
		r.StateWrites, r.StateWritten = ld.st.Seq, ld.st.Written
	}
	r.tokenCeil.Store(ld.st.TokenCeil)
	r.leaseCeil.Store(ld.st.LeaseCeil)
	st := ld.st // what to write before serving

	switch {
	case ld.recovered:
		r.Recovered, r.SetAside = ld.damage, ld.movedTo
		r.Crashed = true
		st.TokenCeil = max(st.TokenCeil, RecoveryFloor(now))
		st.LeaseCeil = max(st.LeaseCeil, satAdd(satAdd(now, int64(r.opt.MaxLease)), leaseStep))
		// A snapshot that decoded whole names its leases' ends: the grace
		// waits them out too, should --max-lease be shorter than they were.
		if f, ok := r.snapshotFacts(ld.untrusted); ok {
			st.LeaseCeil = max(st.LeaseCeil, satAdd(f.leaseEnd, leaseStep), f.grace)
		}
		// The grace waits out the whole ceiling, and so must the grace of
		// a crash that comes before it ends, which MaxLease caps.
		st.MaxLease = max(st.MaxLease, untilCeil(st.LeaseCeil, now))
	case ld.snap != nil:
		if ld.st.Shards != 0 && int(ld.st.Shards) != n {
			f, ok := r.snapshotFacts(ld.snap)
			if !ok {
				return fmt.Errorf("data dir %q holds a clean shutdown's table of %d shards; restart with --shards=%d (its table does not load to tell whether it holds keys)",
					r.opt.DataDir, ld.st.Shards, ld.st.Shards)
			}
			if f.keys > 0 {
				return fmt.Errorf("data dir %q holds a clean shutdown's table of %d shards with %d keys in it; restart with --shards=%d. "+
					"--shards changes on a start after a clean shutdown that held no key (each released, or its lease ended and swept: "+
					"--sweep-interval), or after a crash", r.opt.DataDir, ld.st.Shards, f.keys, ld.st.Shards)
			}
			// No key to carry over: what is left of the table is its
			// tokens, which go on above every reservation made, and a
			// crash grace that was still running (moved later as the
			// leases below are).
			if f.grace > 0 && ld.st.Written > 0 && now > ld.st.Written {
				f.grace = satAdd(f.grace, now-ld.st.Written)
				st.LeaseCeil = max(st.LeaseCeil, f.grace)
			}
			r.TokenFloor = st.TokenCeil
			for _, p := range r.parts {
				p.t.SetLastToken(st.TokenCeil)
				if f.grace > now {
					p.t.SetGrace(f.grace)
				}
			}
			if f.grace > now {
				r.GraceUntil = f.grace
			}
			break
		}
		err := r.restore(ld.snap)
		if err == nil && ld.st.Written > 0 && now > ld.st.Written {
			// The snapshot's lease ends are on the stopped run's clock, and
			// this one may read ahead of it (a host back with its clock
			// fast). Each lease keeps what it had left at the stop, the
			// state written with it, counted from now; on a right clock a
			// lease runs that much longer, the downtime, no harm to the
			// holder, who counts its own.
			var end int64
			for _, p := range r.parts {
				p.t.ShiftLeases(now - ld.st.Written)
				end = max(end, p.t.MaxDeadline())
			}
			st.LeaseCeil = max(st.LeaseCeil, satAdd(end, leaseStep))
			r.Shifted = time.Duration(now - ld.st.Written)
		}
		if err == nil {
			for _, p := range r.parts {
				if g := p.t.Grace(); g > now {
					r.GraceUntil = max(r.GraceUntil, g) // a crash's, still running
				}
			}
		}
		if err != nil {
			damage := fmt.Sprintf("%s holds a table that does not load: %v", snapName, err)
			if !r.opt.RecoverDamaged {
				return fmt.Errorf("%w: %q: %s", ErrDamaged, r.opt.DataDir, damage)
			}
			// Its checksum passed, so the store found nothing to recover.
			// The state file is whole, and its ceilings cover every grant,
			// but a recovery is one whatever was damaged (--help).
			if err := clockPastUse(r.opt.DataDir, now, ld.lastUse, ld.lastUseBy); err != nil {
				return err
			}
			to, err := r.store.setAsideSnapshot(now)
			if err != nil {
				return err
			}
			// Budgets of their own: the shards restore loaded before the
			// one that failed took their keys from the first ones.
			keys, waiters = shard.NewBudget(r.opt.MaxKeys), shard.NewBudget(r.opt.MaxWaiters)
			for i := range r.parts {
				r.parts[i] = &part{t: r.newTable(keys, waiters)}
			}
			r.Recovered, r.SetAside, r.Crashed = []string{damage}, []string{to}, true
			st.TokenCeil = max(st.TokenCeil, RecoveryFloor(now))
			st.LeaseCeil = max(st.LeaseCeil, satAdd(satAdd(now, int64(r.opt.MaxLease)), leaseStep))
			ld.snap = nil
		}
	case !ld.fresh:
		r.Crashed = true
		r.StaleSnapshot = ld.staleSnap
	case ld.made:
		r.NewDir = "made"
	default:
		r.NewDir = "empty"
	}
	if ld.snap != nil && ld.snapV1 {
		// The earlier format names no state write, so nothing tells an
		// upgrade's snapshot from one put back: tokens go on above every
		// reservation, which costs an upgrade nothing and keeps them
		// growing even then.
		r.TokenFloor = st.TokenCeil
		for _, p := range r.parts {
			p.t.SetLastToken(st.TokenCeil)
		}
	}
	if r.Crashed {
		// Tokens restart above every reservation ever made (the ceiling is
		// one for all shards, so --shards may change), and no key is granted
		// while a lease from before could still be live.
		r.TokenFloor = st.TokenCeil
		for _, p := range r.parts {
			p.t.SetLastToken(st.TokenCeil)
		}
		grace := st.LeaseCeil
		if r.Recovered == nil {
			// A recovery waits out the --max-lease given now: the dir's
			// record may be an older copy's.
			grace = crashGrace(st, now)
		}
		if grace > now {
			r.GraceUntil = grace
			for _, p := range r.parts {
				p.t.SetGrace(grace)
			}
		}
	}
	var last uint64
	for _, p := range r.parts {
		p.updateNext()
		last = max(last, p.t.LastToken())
	}
	// The first block is reserved with the start's own write.
	st.TokenCeil = max(st.TokenCeil, satAddU(last, r.env.tokenBlock))
	st.Shards = uint32(n)
	if st.MaxLease == 0 && !ld.fresh {
		// A dir of an earlier version, which kept no --max-lease: the
		// leases it granted end by its lease ceiling, so none has longer
		// than that to run. Recorded as this run's leases alone, shorter
		// ones, the next crash's grace would end before them.
		st.MaxLease = untilCeil(ld.st.LeaseCeil, now)
	}
	// Raised by the first grant longer than it (coverLeases), not to
	// --max-lease here: a crash's grace ends within it of the restart. At
	// least 1 ns, as 0 stands for an earlier version's dir.
	st.MaxLease = max(st.MaxLease, 1)
	st.SeqSnaps = true
	// A grace past the ceiling read (a restart whose wall clock reads fast
	// counts what the ceiling had left from now) covers leases that still
	// run: the next crash must find it in the ceiling. Left to the ceiling
	// loop's first round, a crash before it found a ceiling already passed
	// and granted at once.
	st.LeaseCeil = max(st.LeaseCeil, r.GraceUntil)
	r.Clean = ld.snap != nil
	if err := r.write(func(s *state) { *s = st }, ld.snap != nil); err != nil {
		return fmt.Errorf("data dir %q: %w", r.opt.DataDir, err)
	}
	if ld.snap != nil || ld.staleSnap != "" {
		// From here on a crash must look like one.
		if err := r.store.dropSnapshot(); err != nil {
			return err
		}
	}
	return nil
}

// snapFacts is what a snapshot blob holds beyond its tables' entries.
type snapFacts struct {
	keys     int   // keys held (expired leases not yet swept included)
	leaseEnd int64 // the latest lease end granted, unix ns
	grace    int64 // the latest crash grace end still running at its write
}

// snapshotFacts reads the snapshot blob b into tables of its own; false if
// it does not load whole.
func (r *Runner) snapshotFacts(b []byte) (snapFacts, bool) {
	var f snapFacts
	tables, rest, err := splitSnapshot(b)
	if err != nil || len(rest) > 0 {
		return f, false
	}
	for _, tb := range tables {
		t := shard.New(shard.Config{Keys: shard.NewBudget(0), Waiters: shard.NewBudget(0)})
		if err := t.ReadSnapshot(bytesReader(tb)); err != nil {
			return f, false
		}
		f.keys += t.Stats().Keys
		f.leaseEnd = max(f.leaseEnd, t.MaxDeadline())
		f.grace = max(f.grace, t.Grace())
	}
	return f, true
}

// splitSnapshot cuts the snapshot blob into its shards' tables, and what
// follows them. The blob: uvarint shard count, then per shard a uvarint
// length and that shard's table snapshot.
func splitSnapshot(b []byte) (tables [][]byte, rest []byte, err error) {
	cnt, k := binary.Uvarint(b)
	if k <= 0 || cnt > maxShards {
		return nil, nil, errors.New("bad shard count")
	}
	b = b[k:]
	for range cnt {
		l, k := binary.Uvarint(b)
		if k <= 0 || uint64(len(b)-k) < l {
			return nil, nil, errors.New("truncated")
		}
		tables = append(tables, b[k:k+int(l)])
		b = b[k+int(l):]
	}
	return tables, b, nil
}

func (r *Runner) restore(b []byte) error {
	tables, _, err := splitSnapshot(b)
	if err == nil && len(tables) != len(r.parts) {
		err = errors.New("bad shard count")
	}
	if err != nil {
		return err
	}
	for i, p := range r.parts {
		if err := p.t.ReadSnapshot(bytesReader(tables[i])); err != nil {
			return err
		}
		r.Restored += p.t.Stats().Keys
		r.TokenFloor = max(r.TokenFloor, p.t.LastToken())
	}
	return nil
}

// raise applies change to the durable state and writes it, synced. The
// ceilings it mirrors move only once the write is done, and never back
// (but for lowerLease's).
func (r *Runner) raise(change func(*state)) error { return r.write(change, false) }

// write is raise that, with always, writes even an unchanged state (a new
// Seq: a snapshot loaded no longer matches it).
func (r *Runner) write(change func(*state), always bool) error {
	return r.writeState(change, always, false)
}

// writeState is write that, with lower, lets the lease ceiling come down.
func (r *Runner) writeState(change func(*state), always, lower bool) error {
	r.stMu.Lock()
	defer r.stMu.Unlock()
	return r.writeStateLocked(change, always, lower)
}

// writeStateLocked is writeState with stMu held.
func (r *Runner) writeStateLocked(change func(*state), always, lower bool) error {
	next := r.st
	change(&next)
	next.TokenCeil = max(next.TokenCeil, r.st.TokenCeil)
	next.MaxLease = max(next.MaxLease, r.st.MaxLease)
	if !lower {
		next.LeaseCeil = max(next.LeaseCeil, r.st.LeaseCeil)
	}
	if next == r.st && next.Seq != 0 && !always {
		return nil
	}
	next.Seq = r.st.Seq + 1
	start := r.clock.now()
	next.Written = satAdd(start, r.clock.ahead()) // on the next run's clock, as LeaseCeil
	r.saving.Store(max(start, 1))
	err := r.store.save(next)
	end := r.clock.now()
	if err == nil {
		// Before saving is cleared: Ready, which reads them the other way
		// round, never sees neither a write in flight nor a slow last one.
		r.lastSave.Store(max(0, end-start))
	}
	r.stallMu.Lock()
	r.saving.Store(0)
	back := r.stallSaid && err == nil && !r.slowLast() // a failed write fails the runner
	if back {
		r.stallSaid = false
	}
	r.stallMu.Unlock()
	r.saved.Store(end)
	if back {
		r.log.Info("a synced write of the state took less than --unavailable-timeout again: ready", zap.Duration("took", time.Duration(end-start)))
	}
	if err != nil {
		return err
	}
	r.st = next
	r.tokenCeil.Store(next.TokenCeil)
	r.leaseCeil.Store(next.LeaseCeil)
	r.maxLease.Store(next.MaxLease)
	return nil
}

// raiseLease makes the durable lease ceiling at least ceil, plus how far
// the wall clock has stepped ahead of the runner's since the start: the
// next run reads the wall clock, and a lease granted here ends that much
// later on it than its deadline says (without it, a crash restart after an
// NTP step forward would end its grace that much before a live lease).
func (r *Runner) raiseLease(ceil int64) error {
	if ceil = satAdd(ceil, r.clock.ahead()); ceil <= r.leaseCeil.Load() {
		return nil
	}
	return r.raise(func(s *state) { s.LeaseCeil = max(s.LeaseCeil, ceil) })
}

// lowerAfter is how far above the latest lease end still held (plus
// leaseStep) the durable lease ceiling may stand before lowerLease brings
// it down: leases that move with the clock keep it within leaseStep, so
// only a long lease ended early (released, or expired and swept) lowers it.
const lowerAfter = int64(10 * time.Second)

// lowerLease brings the durable lease ceiling down to the latest lease end
// still held, plus leaseStep, once it stands lowerAfter above that: it is
// a high-water mark, and one long lease released early would otherwise
// set the grace of a crash restart (every key not restored refused) until
// that lease's end. Sweep has just lowered the tables' marks.
//
// Every shard is held while the marks are read and the ceiling the hot
// path compares with comes down, and stMu from then until the lower
// ceiling is on disk; the synced write itself holds no shard. A grant that
// leaves meanwhile under the lower ceiling is covered by the old one and
// the new one alike; one above it raises the ceiling (coverLeases), which
// waits on stMu for this write and then writes its own over it.
func (r *Runner) lowerLease() {
	for _, p := range r.parts {
		p.mu.Lock()
	}
	held := true
	defer func() {
		if held {
			r.unlockAll()
		}
	}()
	if r.closing.Load() || r.isFailed.Load() {
		return
	}
	end := r.clock.now()
	for _, p := range r.parts {
		end = max(end, p.t.MaxDeadline(), p.t.Grace())
	}
	ceil := satAdd(satAdd(end, leaseStep), r.clock.ahead())
	if r.leaseCeil.Load()-ceil < lowerAfter {
		return
	}
	// Another write under way (the ceiling loop's raise): the next sweep
	// lowers, rather than every shard waiting for that fsync here.
	if !r.stMu.TryLock() {
		return
	}
	defer r.stMu.Unlock()
	r.leaseCeil.Store(ceil)
	r.unlockAll()
	held = false
	if err := r.writeStateLocked(func(s *state) { s.LeaseCeil = ceil }, false, true); err != nil {
		// Under stMu still: a grant above the lowered ceiling that waits
		// for it finds the runner failed, and is not answered, whatever
		// the failed write left on disk.
		r.fail("cannot persist lease ceiling", err)
	}
}

// fail records that a durable write failed. No grant is answered from now
// on (its ceiling may not be on disk); the owner of the runner shuts down
// without a snapshot, and the next start recovers as after a crash.
func (r *Runner) fail(what string, err error) {
	r.failOnce.Do(func() {
		r.failErr = fmt.Errorf("%s: %w", what, err)
		r.isFailed.Store(true)
		r.log.Error("cannot write the data dir; no lock is granted any more, shutting down",
			zap.String("data_dir", r.store.path()), zap.String("what", what), zap.Error(err))
		close(r.failed)
	})
}

// Failed is closed when a durable write failed; Err then says why.
func (r *Runner) Failed() <-chan struct{} { return r.failed }

// Err is why the runner failed, or nil.
func (r *Runner) Err() error {
	select {
	case <-r.failed:
		return r.failErr
	default:
		return nil
	}
}

// Ready is false while a synced write of the state has taken StallTimeout
// or more (its disk stalls: the grants that wait on it hold their event
// loop, and every connection on it), or the last one took that long (a
// disk that slow on every write would make it flap), and once the runner
// has failed.
func (r *Runner) Ready() bool { return r.NotReady() == "" }

// NotReady says why Ready is false, for /readyz's answer; "" when it is
// true. The stamp in flight is read before the last write's time, as the
// writer stores them in the other order: a stall that ends is seen in one
// or the other.
func (r *Runner) NotReady() string {
	if err := r.Err(); err != nil {
		return "a synced write failed: " + err.Error()
	}
	if d := r.stalled(r.clock.now()); d > 0 {
		return fmt.Sprintf("a synced write of the state has taken %v, --unavailable-timeout (%v) or more: the disk stalls?", d.Round(time.Millisecond), r.opt.StallTimeout)
	}
	if last := time.Duration(r.lastSave.Load()); last >= r.opt.StallTimeout { // slowLast, read once for the text too
		return fmt.Sprintf("the last synced write of the state took %v, --unavailable-timeout (%v) or more", last.Round(time.Millisecond), r.opt.StallTimeout)
	}
	return ""
}

// slowLast: the last synced write of the state took StallTimeout or more.
func (r *Runner) slowLast() bool { return r.lastSave.Load() >= int64(r.opt.StallTimeout) }

// stalled is how long the synced write in flight has taken at now, if
// StallTimeout or more; 0 otherwise.
func (r *Runner) stalled(now int64) time.Duration {
	if at := r.saving.Load(); at != 0 && now-at >= int64(r.opt.StallTimeout) {
		return time.Duration(now - at)
	}
	return 0
}

// GraceLeft is how much is left of a crash grace, in which every acquire
// of a key not restored answers T (0: none, or over).
func (r *Runner) GraceLeft() time.Duration {
	return time.Duration(max(r.GraceUntil-r.clock.now(), 0))
}

// SyncReserves is how many ceilings were written on the request path.
func (r *Runner) SyncReserves() int64 { return r.syncReserves.Load() }

// LateRenewals counts the rounds of renewLate and RenewLate that moved
// hand-overs' leases.
func (r *Runner) LateRenewals() int64 { return r.renewals.Load() }

// LostLateGrants counts hand-overs not answered because their lease passed,
// and the key was swept or taken over, before their answer could leave
// (RenewLate): their connections were closed instead.
func (r *Runner) LostLateGrants() int64 { return r.lostLate.Load() }

// Attach connects the runner to the network side it answers through and
// starts the timers.
func (r *Runner) Attach(srv *netloop.Server) {
	r.srv = srv
	r.inOrder = srv.Loops() == 1
	r.start()
}

func (r *Runner) start() {
	r.wg.Add(4)
	go r.timerLoop()
	go r.sweepLoop()
	go r.ceilingLoop()
	go r.stallLoop()
}

// every runs fn every d on the runner's clock until the stop; the next
// period starts when fn returns.
func (r *Runner) every(d time.Duration, fn func()) {
	defer r.wg.Done()
	t := r.clock.newTimer(d)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C():
		}
		fn()
		t.Reset(d)
	}
}

// stallLoop says in the log when a synced write of the state has stalled
// (the writer cannot: it waits on the disk).
func (r *Runner) stallLoop() {
	r.every(r.opt.StallTimeout/4, func() {
		r.stallMu.Lock()
		d := r.stalled(r.clock.now())
		say := (d > 0 || r.slowLast()) && !r.stallSaid
		r.stallSaid = r.stallSaid || say
		r.stallMu.Unlock()
		if say {
			r.log.Warn("a synced write of the state has taken --unavailable-timeout or more: not ready until one takes less; grants that wait on one hold their event loop and its connections (the disk stalls?)",
				zap.Duration("in_flight_for", d), zap.Duration("unavailable_timeout", r.opt.StallTimeout), zap.String("data_dir", r.store.path()))
		}
	})
}

// part is the shard that holds key.
func (r *Runner) part(key []byte) *part {
	if len(r.parts) == 1 {
		return r.parts[0] // no hashing when there is nothing to choose
	}
	return r.parts[shard.Index(key, len(r.parts))]
}

// Handle implements netloop.Backend. Each shard's lock is taken once per
// batch. With one event loop (the default) the batch locks every shard it
// touches up front, in shard order, and applies its frames in the order
// they were read; with more, it takes the shards one at a time, so that
// loops work on different shards at once, and puts the answers decided at
// once back in request order.
func (r *Runner) Handle(c *netloop.Conn, reqs []codec.Request, out []byte) ([]byte, int, bool) {
	now := r.clock.now()
	seq := c.NextSeqs(len(reqs)) // sequences follow the frames' order, whatever the shard
	if r.inOrder || r.nearLimit(len(reqs)) {
		return r.handleInOrder(c, reqs, out, now, seq)
	}
	return r.handleGrouped(c, reqs, out, now, seq)
}

// handleInOrder applies reqs in order under the locks of all their shards.
// With no other loop to use the shards meanwhile, holding them all for the
// batch costs less than grouping the frames by shard and putting the
// answers back in order did (7% of the server's CPU at pipeline depth 64).
func (r *Runner) handleInOrder(c *netloop.Conn, reqs []codec.Request, out []byte, now int64, seq uint64) ([]byte, int, bool) {
	self := c.ID()
	var sh [netloop.MaxBatch]uint16
	var touched [maxShards / 64]uint64
	words := (len(r.parts) + 63) / 64
	shardsOf(reqs, len(r.parts), &sh, &touched)
	for p := range r.touchedParts(touched[:words]) {
		p.mu.Lock()
	}
	defer r.unlockTouched(touched[:words])
	if r.closing.Load() {
		return out, 0, true
	}
	answered := 0
	var cmd shard.Command // on the stack: Apply keeps no pointer to it
	for j := range reqs {
		p := r.parts[sh[j]]
		command(&cmd, &reqs[j], self, seq+uint64(j))
		p.out = p.t.Apply(now, &cmd, p.out[:0])
		if len(p.out) == 1 && r.ownAnswer(&p.out[0], self) {
			// route's work for this one answer, without its call.
			r.coverLeases(p)
			if p.out[0].Result != shard.Acquired || !r.isFailed.Load() {
				out = netloop.AppendAnswer(out, &p.out[0])
				answered++
			}
		} else {
			var a int
			out, a = r.route(p, now, c, out)
			answered += a
		}
		if r.isFailed.Load() {
			return out, answered, true
		}
	}
	return out, answered, false
}

// ownAnswer tells whether a, a command's only answer, is one that route
// would only write to out (after coverLeases, and for a grant unless the
// runner failed): an answer to conn self that is no hand-over (renewLate,
// HandOver) and no grant seen by env.granting.
func (r *Runner) ownAnswer(a *shard.Answer, self uint64) bool {
	return self != 0 && a.To.Conn == self && !(a.Result == shard.Acquired && (a.Waited || r.env.granting != nil))
}

// shardsOf sets sh[i] to the shard of reqs[i] (shard.Index over n shards)
// and the bit of each shard it names in touched. A function of its own, not
// inlined, so that the hash loop keeps its values in registers rather than
// on handleInOrder's stack, and with n a power of two (the default 16) the
// remainder is a mask rather than a division: the same shard.
//
//go:noinline
func shardsOf(reqs []codec.Request, n int, sh *[netloop.MaxBatch]uint16, touched *[maxShards / 64]uint64) {
	if n <= 1 || n&(n-1) != 0 {
		for i := range reqs {
			s := uint(shard.Index(reqs[i].Key, n))
			sh[i] = uint16(s)
			touched[s/64] |= 1 << (s % 64)
		}
		return
	}
	mask := uint64(n - 1)
	for i := range reqs {
		s := uint(shard.Hash(reqs[i].Key) & mask)
		sh[i] = uint16(s)
		touched[s/64] |= 1 << (s % 64)
	}
}

// nearLimit tells whether a batch of n frames may meet the end of the
// budget of keys or queued acquires that all shards share: then whether a
// frame gets B depends on the frames before it on other shards (a release
// that frees the room an acquire after it takes), and the batch is applied
// in request order, under all its shards' locks (taken in shard order, so
// loops that do so at once cannot deadlock), instead of shard by shard.
func (r *Runner) nearLimit(n int) bool {
	near := func(b *shard.Budget) bool { return b.Max() > 0 && b.Used()+n >= b.Max() }
	return near(r.keys) || near(r.waiters)
}

// maxShards bounds Options.Shards, so that a batch's set of shards fits
// on the stack.
const maxShards = 4096

// touchedParts yields the shards whose bits are set in words, in order.
func (r *Runner) touchedParts(words []uint64) iter.Seq[*part] {
	return func(yield func(*part) bool) {
		for w, bits := range words {
			for bits != 0 {
				b := mathbits.TrailingZeros64(bits)
				bits &= bits - 1
				if !yield(r.parts[w*64+b]) {
					return
				}
			}
		}
	}
}

// unlockTouched publishes each shard's next timer and unlocks it.
func (r *Runner) unlockTouched(words []uint64) {
	for p := range r.touchedParts(words) {
		r.publishNext(p)
		p.mu.Unlock()
	}
}

// command fills cmd with q, the frame numbered seq on connection self.
func command(cmd *shard.Command, q *codec.Request, self, seq uint64) {
	// Field by field, for the reason shard's push gives: a literal is built
	// in a temporary and copied, and the copy stalls on store forwarding.
	cmd.From.Node, cmd.From.Conn, cmd.From.Seq = 0, self, seq
	cmd.Key, cmd.Deadline = q.Key, 0
	if q.Kind == codec.Acquire {
		cmd.Op, cmd.Owner, cmd.LeaseMs, cmd.WaitMs, cmd.Token = shard.OpAcquire, q.Owner, q.LeaseMs, q.WaitMs, 0
	} else {
		cmd.Op, cmd.Owner, cmd.LeaseMs, cmd.WaitMs, cmd.Token = shard.OpRelease, nil, 0, 0, q.Token
	}
}

// handleGrouped applies reqs shard by shard, each shard's lock taken once,
// then puts the answers decided at once back in request order.
func (r *Runner) handleGrouped(c *netloop.Conn, reqs []codec.Request, out []byte, now int64, seq uint64) ([]byte, int, bool) {
	self := c.ID()
	var g netloop.ShardGroups
	g.Group(reqs, len(r.parts))
	var spans [netloop.MaxBatch]struct{ from, to int32 }
	start := len(out)
	answered := 0
	stop := false
	var cmd shard.Command
	for i := 0; i < g.Len() && !stop; {
		sh, run := g.Run(i)
		i += len(run)
		p := r.parts[sh]
		p.mu.Lock()
		if r.closing.Load() {
			p.mu.Unlock()
			stop = true
			break
		}
		for _, j := range run {
			command(&cmd, &reqs[j], self, seq+uint64(j))
			p.out = p.t.Apply(now, &cmd, p.out[:0])
			from := len(out)
			var a int
			out, a = r.dispatch(p, now, c, out)
			answered += a
			spans[j] = struct{ from, to int32 }{int32(from - start), int32(len(out) - start)}
		}
		p.mu.Unlock()
		if r.isFailed.Load() {
			stop = true
		}
	}
	if g.Len() > 0 { // also when stopping: what was answered keeps request order
		if _, first := g.Run(0); len(first) < g.Len() {
			out = r.inRequestOrder(out, start, spans[:len(reqs)])
		}
	}
	return out, answered, stop
}

// inRequestOrder rearranges out[start:], written shard by shard, so that
// each request's answers come in the order the requests were read.
func (r *Runner) inRequestOrder(out []byte, start int, spans []struct{ from, to int32 }) []byte {
	bp := r.scratch.Get().(*[]byte)
	tmp := append((*bp)[:0], out[start:]...)
	out = out[:start]
	for _, s := range spans {
		out = append(out, tmp[s.from:s.to]...)
	}
	if cap(tmp) > 1<<20 {
		tmp = nil // one flood must not pin a large buffer
	}
	*bp = tmp[:0]
	r.scratch.Put(bp)
	return out
}

// dispatch writes p.out: answers for conn self go to out, the others to
// their connection's mailbox. A grant nobody can receive is released, and
// what that release decides is dispatched in turn. Before any answer goes,
// the durable lease ceiling is made to cover every deadline granted (the
// token ceiling already is: the table reserved it before granting). Runs
// under p.mu.
func (r *Runner) dispatch(p *part, now int64, c *netloop.Conn, out []byte) ([]byte, int) {
	out, answered := r.route(p, now, c, out)
	r.publishNext(p)
	return out, answered
}

// route is dispatch but for publishing p's next timer, which its caller
// does once for many commands, before it unlocks p.
func (r *Runner) route(p *part, now int64, c *netloop.Conn, out []byte) ([]byte, int) {
	var self uint64
	if c != nil {
		self = c.ID()
	}
	answered := 0
	for {
		r.coverLeases(p)
		if handsOver(p.out) && !r.isFailed.Load() {
			now = r.renewLate(p, now)
		}
		held := r.isFailed.Load()
		for i := range p.out {
			a := &p.out[i]
			if a.Result == shard.Acquired {
				if held {
					continue // its ceilings may not be durable; the process is going down
				}
				if r.env.granting != nil {
					r.env.granting(a)
				}
			}
			if self != 0 && a.To.Conn == self {
				out = netloop.AppendAnswer(out, a)
				answered++
				if a.Result == shard.Acquired && a.Waited {
					c.HandOver(a.Token, a.Key, now, a.Deadline)
				}
				continue
			}
			if a.To.Conn == 0 {
				continue // an internal release
			}
			p.post = netloop.AppendAnswer(p.post[:0], a)
			if !r.deliver(a, now, p.post) && a.Result == shard.Acquired {
				p.orphans = append(p.orphans, orphan{a.Token, append([]byte(nil), a.Key...)})
			}
		}
		if len(p.orphans) == 0 {
			break
		}
		o := p.orphans[len(p.orphans)-1]
		p.orphans = p.orphans[:len(p.orphans)-1]
		cmd := shard.Command{Op: shard.OpRelease, Key: o.key, Token: o.token}
		p.out = p.t.Apply(now, &cmd, p.out[:0])
	}
	return out, answered
}

// lateSlack is how late a hand-over's answer may leave after the time its
// lease was counted from: about what a request takes from a client's send
// to the server, so that a lease runs from no earlier than about the send
// of every request answered before it, which the client may date it from
// (a client keeps a margin for clock rates anyway).
const lateSlack = int64(10 * time.Microsecond)

// renewLate keeps the hand-overs in p.out from leaving with less lease than
// their holders count: the table counted them from now, read before the
// shard lock was taken (another loop may have held it through a synced
// write), a synced write of coverLeases or reserveTokens, or a long batch.
// Their holders may count from about when the answer leaves, so the
// leases move on by the time that passed, and the ceiling covers them
// again. Returns the time the leases now count from; what delays the
// answers after the shard is unlocked, RenewLate covers. Under p.mu, and
// only when p.out holds a hand-over (handsOver).
func (r *Runner) renewLate(p *part, now int64) int64 {
	for {
		late := r.clock.now() - now
		if late <= lateSlack {
			return now
		}
		for i := range p.out {
			if a := &p.out[i]; a.Result == shard.Acquired && a.Waited {
				a.Deadline = satAdd(a.Deadline, late)
				p.t.Extend(a.Key, a.Token, a.Deadline)
			}
		}
		r.renewals.Add(1)
		now += late
		// Again only after a synced write: the round's own microseconds
		// are what any answer takes to leave. Not after a write that
		// failed: the ceiling will not rise, and the loop would write
		// under the shard lock until the process is gone (a review:
		// 16 million failed writes in 3 s); route holds the grants back.
		wrote := r.syncReserves.Load()
		if r.coverLeases(p); r.syncReserves.Load() == wrote || r.isFailed.Load() {
			return now
		}
	}
}

// handsOver tells whether out holds a hand-over: a grant to an acquire
// that waited (route checks before it calls renewLate, most batches have
// none).
func handsOver(out []shard.Answer) bool {
	for i := range out {
		if out[i].Result == shard.Acquired && out[i].Waited {
			return true
		}
	}
	return false
}

// RenewLate implements netloop.LateRenewer: the hand-overs among the
// answers about to be written to a connection were counted from since, and
// what came between (the rest of the Handle call, the loop's other
// connections in the same poll, a synced write on the loop, the time a
// posted answer waited in the mailbox) delays them. Their leases move on
// by the time that passed, and the ceiling covers them again, before they
// leave. False once the runner has failed (the ceilings may not be
// durable, and no grant leaves), and for a hand-over whose whole lease
// passed first and that was swept or taken over meanwhile (lostLate):
// the key may be another's by now, and neither A nor T would be true, so
// the connection closes instead of answering, its grants given back, as
// cluster mode answers such a grant E unavailable. A client treats what
// a closed connection had not answered as failed.
func (r *Runner) RenewLate(_ *netloop.Conn, gs []netloop.Grant) bool {
	now := r.clock.now()
	late := false
	for i := range gs {
		late = late || now-gs[i].Since > lateSlack
	}
	if !late {
		return !r.isFailed.Load() // they leave now, none late
	}
	var touched [maxShards / 64]uint64
	words := (len(r.parts) + 63) / 64
	for i := range gs {
		s := uint(shard.Index(gs[i].Key, len(r.parts)))
		touched[s/64] |= 1 << (s % 64)
	}
	for {
		if r.isFailed.Load() {
			return false
		}
		// The clock is read under every lock the grants need (taken in
		// shard order, as handleInOrder does): a lock held elsewhere (a
		// sweep, another loop's synced write) delays the answers too.
		for p := range r.touchedParts(touched[:words]) {
			p.mu.Lock()
		}
		now = r.clock.now()
		wrote := r.syncReserves.Load()
		moved, lost := false, false
		for i := range gs {
			g := &gs[i]
			late := now - g.Since
			if late <= lateSlack {
				continue
			}
			g.Since, g.Deadline = now, satAdd(g.Deadline, late)
			if r.part(g.Key).t.Extend(g.Key, g.Token, g.Deadline) {
				moved = true
			} else {
				r.lostLate.Add(1)
				lost = true
			}
		}
		for p := range r.touchedParts(touched[:words]) {
			if moved && !lost {
				r.coverLeases(p)
			}
			p.mu.Unlock()
		}
		if lost {
			return false
		}
		if !moved {
			return !r.isFailed.Load()
		}
		r.renewals.Add(1)
		if r.syncReserves.Load() == wrote {
			// Again only after a synced write: the round's own
			// microseconds are what any answer takes to leave.
			return !r.isFailed.Load()
		}
	}
}

// publishNext tells the timer loop p's earliest timer, and wakes it if that
// comes before its sleep ends. Under p.mu.
func (r *Runner) publishNext(p *part) {
	if p.updateNext() < r.nextWake.Load() {
		select {
		case r.wake <- struct{}{}:
		default:
		}
	}
}

func (r *Runner) deliver(a *shard.Answer, since int64, b []byte) bool {
	if r.env.deliver != nil {
		return r.env.deliver(a, since, b)
	}
	return postAnswer(r.srv.Conn(a.To.Conn), a, since, b)
}

// postAnswer posts b, the encoding of a, to c: a grant typed beside the
// mailbox, released if the connection closes first, and a hand-over's
// renewed when it leaves (RenewLate).
func postAnswer(c *netloop.Conn, a *shard.Answer, since int64, b []byte) bool {
	if c == nil {
		return false
	}
	if a.Result != shard.Acquired {
		return c.Post(b, 1)
	}
	g := [1]netloop.Grant{{Token: a.Token, Key: a.Key}}
	if a.Waited {
		g[0].Since, g[0].Deadline = since, a.Deadline
	}
	return c.PostGrants(b, 1, g[:])
}

// coverLeases makes the durable lease ceiling cover every deadline p's
// table granted, plus any step of the wall clock ahead (see raiseLease).
// ceilingLoop keeps the ceiling ahead of steady traffic; only a lease
// longer than any before, or a step, lands here and pays a synced write
// under the shard lock, before any answer can leave. Under p.mu.
//
// The ceiling goes leaseStep past the deadline and as far again as the
// last synced write took: renewLate moves hand-overs' deadlines on by the
// write's time, and on a disk whose fsyncs took longer than leaseStep each
// write left them past the ceiling it had just made durable, for another
// write; the event loop wrote for as long as the disk stayed that slow,
// answering nobody (a review: 90 s with fsyncs of 2.1 s). A crash restart's
// grace is not that much longer (a fault campaign found it so): it ends
// within the longest lease granted of the restart (crashGrace), and a lease
// longer than any before is made durable here as well, before its answer.
func (r *Runner) coverLeases(p *part) {
	d := p.t.MaxDeadline()
	var ahead int64
	if w, ok := r.clock.(*wallClock); ok {
		ahead = w.most.Load() // r.clock.ahead() without an interface call: once per command
	} else {
		ahead = r.clock.ahead()
	}
	l := p.t.LongestLease()
	if satAdd(d, ahead) <= r.leaseCeil.Load() && l <= r.maxLease.Load() {
		return
	}
	// One synced write for both: the first lease longer than any before
	// most often passes the ceiling too.
	r.syncReserves.Add(1)
	ceil := satAdd(satAdd(d, satAdd(leaseStep, r.lastSave.Load())), ahead)
	if err := r.raise(func(s *state) { s.LeaseCeil, s.MaxLease = max(s.LeaseCeil, ceil), max(s.MaxLease, l) }); err != nil {
		r.fail("cannot persist the lease ceiling and the longest lease", err)
	}
}

// ceilingLoop keeps both durable ceilings ahead of what the tables grant,
// so that in steady traffic their synced writes happen here and not under a
// shard lock on an event loop. Checked every leaseStep/8: the lease ceiling
// is raised to the latest deadline + leaseStep once less than leaseStep/2 is
// left, which keeps it ahead of deadlines that move with the clock; the
// token ceiling is raised a block above the highest token once less than
// half a block is left.
func (r *Runner) ceilingLoop() {
	var aheadLogged int64
	r.every(time.Duration(leaseStep/8), func() {
		var d, grace int64
		var last uint64
		for _, p := range r.parts {
			p.mu.Lock()
			d = max(d, p.t.MaxDeadline())
			grace = max(grace, p.t.Grace())
			last = max(last, p.t.LastToken())
			p.mu.Unlock()
		}
		block := r.env.tokenBlock
		r.clock.now() // reads the wall clock: a step with no traffic is seen too
		ahead := r.clock.ahead()
		if ahead > aheadLogged+int64(time.Second) {
			aheadLogged = ahead
			r.log.Warn("the wall clock stepped ahead of the server's since it started; lease ceilings are written that much later, so that a crash restart still waits out every lease",
				zap.Duration("ahead", time.Duration(ahead)))
		}
		// A grace (after a crash, or restored from a snapshot) stands for
		// leases of an earlier run: a step ahead during it must reach the
		// ceiling too, or the start after a crash would end it that much
		// early.
		if err := r.raiseLease(grace); err != nil {
			r.fail("cannot persist lease ceiling", err)
		}
		if d > 0 && satAdd(satAdd(d, ahead), leaseStep/2) > r.leaseCeil.Load() {
			if err := r.raiseLease(satAdd(d, leaseStep)); err != nil {
				r.fail("cannot persist lease ceiling", err)
			}
		}
		if satAddU(last, block/2) > r.tokenCeil.Load() {
			if err := r.raise(func(s *state) { s.TokenCeil = max(s.TokenCeil, satAddU(last, block)) }); err != nil {
				r.fail("cannot persist token reservation", err)
			}
		}
		// Idle, nothing is written: a disk that stalls meanwhile would
		// show only when a grant waits on it. The same state again,
		// synced, shows it in Ready first.
		if r.clock.now()-r.saved.Load() >= int64(r.opt.StallTimeout/2) && !r.closing.Load() && !r.isFailed.Load() {
			if err := r.write(func(*state) {}, true); err != nil {
				r.fail("cannot persist the state", err)
			}
		}
	})
}

// satAdd is a+b for b >= 0, saturating at the largest int64.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

func satAddU(a, b uint64) uint64 {
	if a > math.MaxUint64-b {
		return math.MaxUint64
	}
	return a + b
}

func (p *part) updateNext() int64 {
	n, ok := p.t.NextDeadline()
	if !ok {
		n = math.MaxInt64
	}
	// Only p's lock holders store it: unchanged (most batches), the store,
	// a locked instruction, is skipped.
	if p.next.Load() != n {
		p.next.Store(n)
	}
	return n
}

// Closed implements netloop.Backend: withdraw the connection's waiters from
// every shard (a connection does not know which shards it queued on). A
// connection with no unanswered request has no waiters anywhere.
func (r *Runner) Closed(c *netloop.Conn) {
	if c.Pending() == 0 {
		return
	}
	r.withdraw(c.ID())
}

// Queued implements netloop.Backend.
func (r *Runner) Queued(c *netloop.Conn) int {
	n := 0
	for _, p := range r.parts {
		p.mu.Lock()
		n += p.t.QueuedOf(0, c.ID())
		p.mu.Unlock()
	}
	return n
}

func (r *Runner) withdraw(conn uint64) {
	now := r.clock.now()
	for _, p := range r.parts {
		p.mu.Lock()
		if p.t.Stats().Waiters > 0 {
			r.applyInternal(p, now, shard.Command{Op: shard.OpWithdraw, From: shard.Requester{Conn: conn}})
		}
		p.mu.Unlock()
	}
}

// applyInternal applies a command of the server's own (no connection waits
// for its answer) and dispatches what it decides for others. Under p.mu.
func (r *Runner) applyInternal(p *part, now int64, cmd shard.Command) {
	p.out = p.t.Apply(now, &cmd, p.out[:0])
	r.dispatch(p, now, nil, nil)
}

// Orphaned implements netloop.Backend. It applies during shutdown too, up
// to the snapshot, so that the snapshot holds no grant nobody received.
func (r *Runner) Orphaned(token uint64, key []byte) {
	now := r.clock.now()
	p := r.part(key)
	p.mu.Lock()
	r.applyInternal(p, now, shard.Command{Op: shard.OpRelease, Key: key, Token: token})
	p.mu.Unlock()
}

// timerLoop runs Tick on every shard whose earliest timer is due and
// sleeps until the next one. dispatch wakes it when a shard's next
// deadline comes before nextWake.
func (r *Runner) timerLoop() {
	defer r.wg.Done()
	t := r.clock.newTimer(time.Hour)
	defer t.Stop()
	for {
		earliest := r.earliest()
		if r.env.scanned != nil {
			r.env.scanned(earliest)
		}
		// Publish, then look again: a deadline set after the scan read its
		// shard, by a dispatch that read nextWake before this store, is seen
		// here; one set later sees the new nextWake and wakes the loop.
		for {
			r.nextWake.Store(earliest)
			e := r.earliest()
			if e >= earliest {
				break
			}
			earliest = e
		}
		wait := time.Hour
		if earliest != math.MaxInt64 {
			wait = time.Duration(max(0, earliest-r.clock.now()))
		}
		t.Reset(wait)
		select {
		case <-r.stop:
			return
		case <-r.wake:
			t.Stop()
		case <-t.C():
		}
		now := r.clock.now()
		for _, p := range r.parts {
			if p.next.Load() > now {
				continue
			}
			p.mu.Lock()
			if !r.closing.Load() {
				p.out = p.t.Tick(now, p.out[:0])
				r.dispatch(p, now, nil, nil)
			}
			p.mu.Unlock()
		}
	}
}

func (r *Runner) earliest() int64 {
	e := int64(math.MaxInt64)
	for _, p := range r.parts {
		e = min(e, p.next.Load())
	}
	return e
}

func (r *Runner) sweepLoop() {
	r.every(r.opt.SweepInterval, func() {
		start := time.Now()
		removed := 0
		for _, p := range r.parts {
			p.mu.Lock()
			if !r.closing.Load() {
				removed += p.t.Sweep(r.clock.now())
			}
			p.mu.Unlock()
		}
		r.lowerLease()
		if r.opt.SweepObserver != nil {
			r.opt.SweepObserver.Observe(time.Since(start).Seconds())
		}
		if removed > 0 {
			r.log.Debug("sweep", zap.Int("removed", removed), zap.Duration("took", time.Since(start)))
		}
	})
}

// Quiesce stops applying requests and answers every queued acquire with T
// (posted to its connection). From here on a request closes its connection
// unanswered, and timers no longer hand keys over; only Orphaned still
// applies. The network side is stopped next, which writes those answers and
// releases grants that could not be delivered; then Shutdown writes the
// snapshot, so what it holds is final.
func (r *Runner) Quiesce() {
	r.quiesce.Do(func() {
		for _, p := range r.parts {
			p.mu.Lock()
		}
		r.closing.Store(true)
		now := r.clock.now()
		for _, p := range r.parts {
			p.out = p.t.TimeoutWaiters(p.out[:0])
			r.dispatch(p, now, nil, nil)
		}
		r.unlockAll()
	})
}

// Shutdown writes the table to the data dir and closes it. It quiesces
// first if Quiesce was not called; call it after the network side stopped.
// If ctx ends first, or the write fails (a full disk), it returns an error
// and the data dir is left as after a crash, which the next start handles
// safely.
func (r *Runner) Shutdown(ctx context.Context) error {
	r.Quiesce()
	// A loop can wait on a stalled disk (the ceiling loop's writes): ctx
	// bounds that too. The store is left open, a write may still be in
	// it; the caller exits, and the next start recovers as after a crash.
	stopped := make(chan struct{})
	go func() { r.stopLoops(); close(stopped) }()
	select {
	case <-stopped:
	case <-ctx.Done():
		return fmt.Errorf("the runner's loops did not stop in time, waiting on a synced write to data dir %q: %w", r.store.path(), ctx.Err())
	}
	if err := r.Err(); err != nil {
		_ = r.store.close()
		return fmt.Errorf("not writing a snapshot after a failed write: %w", err)
	}
	for _, p := range r.parts {
		p.mu.Lock()
	}
	// The next run's clock starts on the wall clock, which a step forward
	// during this run left ahead of this run's: written as they are, the
	// leases would end that much early.
	shift := r.clock.ahead()
	blob := binary.AppendUvarint(nil, uint64(len(r.parts)))
	var buf bytesWriter
	for _, p := range r.parts {
		buf = buf[:0]
		if err := p.t.WriteSnapshotShifted(&buf, shift); err != nil {
			r.unlockAll()
			_ = r.store.close()
			return err
		}
		blob = binary.AppendUvarint(blob, uint64(len(buf)))
		blob = append(blob, buf...)
	}
	r.unlockAll()

	// The write runs on its own so that a disk that hangs cannot hold the
	// process past ctx; the caller exits then, and the next start sees a
	// crash (a snapshot is renamed into place whole, or not at all).
	done := make(chan error, 1)
	go func() {
		// The state is written again first: its Written is then the
		// snapshot's time, from which the next run counts its leases.
		if err := r.write(func(*state) {}, true); err != nil {
			done <- err
			return
		}
		r.stMu.Lock()
		seq, created := r.st.Seq, r.st.Created
		r.stMu.Unlock()
		done <- r.store.putSnapshot(seq, created, blob)
	}()
	select {
	case err := <-done:
		if cerr := r.store.close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("cannot write the snapshot to data dir %q: %w", r.store.path(), err)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("the snapshot (%d bytes) was not written to data dir %q in time: %w", len(blob), r.store.path(), ctx.Err())
	}
}

func (r *Runner) stopLoops() {
	r.stopOnce.Do(func() { close(r.stop) })
	r.wg.Wait()
}

func (r *Runner) unlockAll() {
	for _, p := range r.parts {
		p.mu.Unlock()
	}
}

// Stats sums the tables' figures; it takes each shard's lock in turn.
func (r *Runner) Stats() shard.Stats {
	var sum shard.Stats
	for _, p := range r.parts {
		p.mu.Lock()
		s := p.t.Stats()
		p.mu.Unlock()
		sum.Add(s)
	}
	return sum
}

// Close releases the data dir without a snapshot (start-up failures, and a
// runner that failed): the next start recovers as after a crash.
func (r *Runner) Close() error {
	r.closing.Store(true)
	r.stopLoops()
	return r.store.close()
}
