// Package single runs ticketd's lock tables in one process: it applies
// requests to shard.Table under a lock per shard, drives the tables' timers
// and sweep from real clocks, and keeps the small durable state that makes
// restarts safe (see store.go and ARCHITECTURE.md).
//
// Runner satisfies netloop.Backend. Requests are applied on the event loop
// that read them; answers for other connections (a hand-over on release, a
// grant or timeout from the timer) are posted to their connection's mailbox.
package single

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
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
}

const (
	// tokenBlock tokens are reserved per synced write; after a crash the
	// counter restarts above the reservation, so tokens skip at most this.
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
	cmd     shard.Command
	out     []shard.Answer
	post    []byte
	orphans []orphan
	next    atomic.Int64 // earliest timer of t, for the timer goroutine
}

type orphan struct {
	token uint64
	key   []byte
}

// Runner is single mode's Backend.
type Runner struct {
	opt   Options
	log   *zap.Logger
	parts []*part
	store *store
	clock clock
	srv   *netloop.Server

	leaseMu   sync.Mutex
	leaseCeil atomic.Int64

	closing  atomic.Bool
	wake     chan struct{}
	nextWake atomic.Int64
	stop     chan struct{}
	wg       sync.WaitGroup

	// Restart facts, for the log.
	Restored   int    // keys loaded from a clean-shutdown snapshot
	Crashed    bool   // the last run did not shut down cleanly
	GraceUntil int64  // crash grace end, unix ns; 0 if none
	TokenFloor uint64 // tokens start above this
}

// Open opens the data dir and loads what the last run left.
func Open(opt Options) (*Runner, error) {
	if opt.Shards <= 0 {
		return nil, errors.New("single: Shards must be positive")
	}
	if opt.Logger == nil {
		opt.Logger = zap.NewNop()
	}
	st, err := openStore(opt.DataDir)
	if err != nil {
		return nil, err
	}
	r := &Runner{
		opt:   opt,
		log:   opt.Logger,
		store: st,
		clock: newClock(),
		wake:  make(chan struct{}, 1),
		stop:  make(chan struct{}),
	}
	if err := r.load(); err != nil {
		_ = st.close()
		return nil, err
	}
	return r, nil
}

func (r *Runner) newTable(i int, keys, waiters *shard.Budget) *shard.Table {
	return shard.New(shard.Config{
		MaxWaitersPerKey: r.opt.MaxWaitersPerKey,
		Keys:             keys,
		Waiters:          waiters,
		ReserveTokens: func(next uint64) uint64 {
			ceil := next + tokenBlock
			if err := r.store.setUint(tokenKey(i), ceil); err != nil {
				// Granting past a ceiling that is not on disk could repeat
				// tokens after a crash; there is no safe way on.
				r.log.Fatal("cannot persist token reservation", zap.Error(err))
			}
			return ceil
		},
	})
}

func (r *Runner) load() error {
	n := r.opt.Shards
	keys, waiters := shard.NewBudget(r.opt.MaxKeys), shard.NewBudget(r.opt.MaxWaiters)
	r.parts = make([]*part, n)
	for i := range r.parts {
		r.parts[i] = &part{t: r.newTable(i, keys, waiters)}
	}

	// Tokens restart above every reservation ever made, on any shard, so
	// they only grow even if --shards changed.
	var floor uint64
	for i := 0; ; i++ {
		v, ok, err := r.store.getUint(tokenKey(i))
		if err != nil {
			return err
		}
		if !ok {
			if i >= n {
				break
			}
			continue
		}
		floor = max(floor, v)
	}
	leaseCeil, _, err := r.store.getUint(keyLease)
	if err != nil {
		return err
	}
	r.leaseCeil.Store(int64(leaseCeil))
	prevShards, hadShards, err := r.store.getUint(keyShards)
	if err != nil {
		return err
	}

	snap, err := r.store.snapshot()
	if err != nil {
		return err
	}
	switch {
	case snap != nil:
		if hadShards && int(prevShards) != n {
			return fmt.Errorf("data dir %q holds a table of %d shards; restart with --shards=%d (or drain it first)", r.opt.DataDir, prevShards, prevShards)
		}
		if err := r.restore(snap); err != nil {
			return fmt.Errorf("data dir %q: corrupt snapshot: %w", r.opt.DataDir, err)
		}
		// From here on a crash must look like one.
		if err := r.store.dropSnapshot(); err != nil {
			return err
		}
	case hadShards:
		r.Crashed = true
		for _, p := range r.parts {
			p.t.SetLastToken(floor)
		}
		r.TokenFloor = floor
		if now := r.clock.now(); int64(leaseCeil) > now {
			r.GraceUntil = int64(leaseCeil)
			for _, p := range r.parts {
				p.t.SetGrace(int64(leaseCeil))
			}
		}
	}
	for _, p := range r.parts {
		p.updateNext()
	}
	return r.store.setUint(keyShards, uint64(n))
}

// The snapshot blob: uvarint shard count, then per shard a uvarint length
// and that shard's table snapshot.
func (r *Runner) restore(b []byte) error {
	cnt, k := binary.Uvarint(b)
	if k <= 0 || int(cnt) != len(r.parts) {
		return errors.New("bad shard count")
	}
	b = b[k:]
	for _, p := range r.parts {
		l, k := binary.Uvarint(b)
		if k <= 0 || uint64(len(b)-k) < l {
			return errors.New("truncated")
		}
		if err := p.t.ReadSnapshot(bytesReader(b[k : k+int(l)])); err != nil {
			return err
		}
		b = b[k+int(l):]
		r.Restored += p.t.Stats().Keys
		r.TokenFloor = max(r.TokenFloor, p.t.LastToken())
	}
	return nil
}

// Attach connects the runner to the network side it answers through and
// starts the timers.
func (r *Runner) Attach(srv *netloop.Server) {
	r.srv = srv
	r.wg.Add(3)
	go r.timerLoop()
	go r.sweepLoop()
	go r.ceilingLoop()
}

// part is the shard that holds key.
func (r *Runner) part(key []byte) *part {
	if len(r.parts) == 1 {
		return r.parts[0] // no hashing when there is nothing to choose
	}
	return r.parts[shard.Index(key, len(r.parts))]
}

// Handle implements netloop.Backend.
func (r *Runner) Handle(c *netloop.Conn, reqs []codec.Request, out []byte) ([]byte, int, bool) {
	now := r.clock.now()
	self := c.ID()
	answered := 0
	for i := range reqs {
		q := &reqs[i]
		p := r.part(q.Key)
		p.mu.Lock()
		if r.closing.Load() {
			p.mu.Unlock()
			return out, answered, true
		}
		cmd := &p.cmd
		*cmd = shard.Command{From: shard.Requester{Conn: self, Seq: c.NextSeq()}, Key: q.Key}
		if q.Kind == codec.Acquire {
			cmd.Op, cmd.Owner, cmd.LeaseMs, cmd.WaitMs = shard.OpAcquire, q.Owner, q.LeaseMs, q.WaitMs
		} else {
			cmd.Op, cmd.Token = shard.OpRelease, q.Token
		}
		p.out = p.t.Apply(now, cmd, p.out[:0])
		var a int
		out, a = r.dispatch(p, now, self, out)
		answered += a
		p.mu.Unlock()
	}
	return out, answered, false
}

// dispatch writes p.out: answers for conn self go to out, the others to
// their connection's mailbox. A grant nobody can receive is released, and
// what that release decides is dispatched in turn. Runs under p.mu.
func (r *Runner) dispatch(p *part, now int64, self uint64, out []byte) ([]byte, int) {
	answered := 0
	for {
		for i := range p.out {
			a := &p.out[i]
			if self != 0 && a.To.Conn == self {
				out = encode(out, a)
				answered++
				continue
			}
			if a.To.Conn == 0 {
				continue // an internal release
			}
			p.post = encode(p.post[:0], a)
			if c := r.srv.Conn(a.To.Conn); c == nil || !c.Post(p.post, 1) {
				if a.Result == shard.Acquired {
					p.orphans = append(p.orphans, orphan{a.Token, append([]byte(nil), a.Key...)})
				}
			}
		}
		if len(p.orphans) == 0 {
			break
		}
		o := p.orphans[len(p.orphans)-1]
		p.orphans = p.orphans[:len(p.orphans)-1]
		p.cmd = shard.Command{Op: shard.OpRelease, Key: o.key, Token: o.token}
		p.out = p.t.Apply(now, &p.cmd, p.out[:0])
	}
	r.afterApply(p)
	return out, answered
}

func encode(dst []byte, a *shard.Answer) []byte {
	switch a.Result {
	case shard.Acquired:
		return codec.AppendAcquired(dst, a.Token, a.Owner, a.Key)
	case shard.TimedOut:
		return codec.AppendTimedOut(dst, a.Owner, a.Key)
	case shard.Busy:
		return codec.AppendBusy(dst, a.Owner, a.Key)
	case shard.Released:
		return codec.AppendReleased(dst, a.Token, a.Key)
	default:
		return codec.AppendNotReleased(dst, a.Token, a.Key)
	}
}

// afterApply makes sure the durable lease ceiling covers every granted
// deadline and tells the timer about an earlier deadline. Under p.mu.
func (r *Runner) afterApply(p *part) {
	if d := p.t.MaxDeadline(); d > r.leaseCeil.Load() {
		// ceilingLoop keeps the ceiling ahead of steady traffic; only a
		// lease longer than any before lands here, and pays a synced
		// write under the shard lock before its answer can be written.
		r.persistLeaseCeil(d + leaseStep)
	}
	if p.updateNext() < r.nextWake.Load() {
		select {
		case r.wake <- struct{}{}:
		default:
		}
	}
}

// persistLeaseCeil writes a lease ceiling of at least ceil, synced, so that
// after a crash no new grant can overlap a lease granted before it.
func (r *Runner) persistLeaseCeil(ceil int64) {
	r.leaseMu.Lock()
	defer r.leaseMu.Unlock()
	if ceil <= r.leaseCeil.Load() {
		return
	}
	if err := r.store.setUint(keyLease, uint64(ceil)); err != nil {
		r.log.Fatal("cannot persist lease ceiling", zap.Error(err))
	}
	r.leaseCeil.Store(ceil)
}

// ceilingLoop moves the lease ceiling ahead of the granted deadlines before
// a grant needs it, so that in steady traffic the synced write happens here
// and not under a shard lock on an event loop. Checked every leaseStep/8 and
// raised to the latest deadline + leaseStep once less than leaseStep/2 is
// left, it stays ahead of deadlines that move with the clock.
func (r *Runner) ceilingLoop() {
	defer r.wg.Done()
	t := time.NewTicker(time.Duration(leaseStep / 8))
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
		}
		var d int64
		for _, p := range r.parts {
			p.mu.Lock()
			d = max(d, p.t.MaxDeadline())
			p.mu.Unlock()
		}
		if d > 0 && r.leaseCeil.Load()-d < leaseStep/2 {
			r.persistLeaseCeil(d + leaseStep)
		}
	}
}

func (p *part) updateNext() int64 {
	n, ok := p.t.NextDeadline()
	if !ok {
		n = math.MaxInt64
	}
	p.next.Store(n)
	return n
}

// Closed implements netloop.Backend: withdraw the connection's waiters from
// every shard (a connection does not know which shards it queued on). A
// connection with no unanswered request has no waiters anywhere.
func (r *Runner) Closed(c *netloop.Conn) {
	if c.Pending() == 0 {
		return
	}
	now := r.clock.now()
	for _, p := range r.parts {
		p.mu.Lock()
		if p.t.Stats().Waiters > 0 {
			r.applyInternal(p, now, shard.Command{Op: shard.OpWithdraw, From: shard.Requester{Conn: c.ID()}})
		}
		p.mu.Unlock()
	}
}

// applyInternal applies a command of the server's own (no connection waits
// for its answer) and dispatches what it decides for others. Under p.mu.
func (r *Runner) applyInternal(p *part, now int64, cmd shard.Command) {
	p.cmd = cmd
	p.out = p.t.Apply(now, &p.cmd, p.out[:0])
	r.dispatch(p, now, 0, nil)
}

// Orphaned implements netloop.Backend.
func (r *Runner) Orphaned(token uint64, key []byte) {
	now := r.clock.now()
	p := r.part(key)
	p.mu.Lock()
	r.applyInternal(p, now, shard.Command{Op: shard.OpRelease, Key: key, Token: token})
	p.mu.Unlock()
}

func (r *Runner) timerLoop() {
	defer r.wg.Done()
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		earliest := int64(math.MaxInt64)
		for _, p := range r.parts {
			earliest = min(earliest, p.next.Load())
		}
		r.nextWake.Store(earliest)
		wait := time.Hour
		if earliest != math.MaxInt64 {
			wait = time.Duration(max(0, earliest-r.clock.now()))
		}
		t.Reset(wait)
		select {
		case <-r.stop:
			return
		case <-r.wake:
			if !t.Stop() {
				select {
				case <-t.C:
				default:
				}
			}
		case <-t.C:
		}
		now := r.clock.now()
		for _, p := range r.parts {
			if p.next.Load() > now {
				continue
			}
			p.mu.Lock()
			if !r.closing.Load() {
				p.out = p.t.Tick(now, p.out[:0])
				r.dispatch(p, now, 0, nil)
			}
			p.mu.Unlock()
		}
	}
}

func (r *Runner) sweepLoop() {
	defer r.wg.Done()
	t := time.NewTicker(r.opt.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
		}
		start := time.Now()
		removed := 0
		for _, p := range r.parts {
			p.mu.Lock()
			if !r.closing.Load() {
				removed += p.t.Sweep(r.clock.now())
			}
			p.mu.Unlock()
		}
		if r.opt.SweepObserver != nil {
			r.opt.SweepObserver.Observe(time.Since(start).Seconds())
		}
		if removed > 0 {
			r.log.Debug("sweep", zap.Int("removed", removed), zap.Duration("took", time.Since(start)))
		}
	}
}

// Shutdown stops applying requests, answers every queued acquire with T,
// writes the table to the data dir and closes it. The caller stops the
// network side afterwards, which flushes those answers.
func (r *Runner) Shutdown(ctx context.Context) error {
	for _, p := range r.parts {
		p.mu.Lock()
	}
	r.closing.Store(true)
	now := r.clock.now()
	for _, p := range r.parts {
		p.out = p.t.TimeoutWaiters(p.out[:0])
		r.dispatch(p, now, 0, nil)
	}
	blob := binary.AppendUvarint(nil, uint64(len(r.parts)))
	var buf bytesWriter
	for _, p := range r.parts {
		buf = buf[:0]
		if err := p.t.WriteSnapshot(&buf); err != nil {
			r.unlockAll()
			return err
		}
		blob = binary.AppendUvarint(blob, uint64(len(buf)))
		blob = append(blob, buf...)
	}
	err := r.store.putSnapshot(blob)
	r.unlockAll()
	close(r.stop)
	r.wg.Wait()
	if cerr := r.store.close(); err == nil {
		err = cerr
	}
	return err
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

// Close releases the data dir without a snapshot (start-up failures).
func (r *Runner) Close() error { return r.store.close() }
