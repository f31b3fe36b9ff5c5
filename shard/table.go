package shard

import (
	"bytes"
	"cmp"
	"math"
	"slices"
)

// Requester names who asked, so the owner of that connection can deliver a late answer.
type Requester struct {
	Node uint32 // cluster node id; 0 in single mode
	Conn uint64 // connection id, unique per node, never 0
	Seq  uint64 // request sequence on that connection
}

// Op is the kind of a Command.
type Op uint8

const (
	OpAcquire       Op = iota + 1 // From, Owner, Key, LeaseMs, WaitMs
	OpRelease                     // From, Key, Token
	OpExpire                      // Key, Token, Deadline: the lease of Token ends (cluster leader); stale token or deadline: no-op
	OpWaitTimeout                 // From (the waiter), Key: its wait ends with T; already answered: no-op
	OpWithdraw                    // From.Node+From.Conn: drop every queued acquire of that connection, no answers
	OpWithdrawBelow               // From.Node+From.Conn: drop every queued acquire of node From.Node whose Conn < From.Conn (an earlier incarnation of that node), no answers
	// OpRenew is From, Owner, Key, Token, LeaseMs, WaitMs (Replicated only): the grant of Token
	// to From is answered anew, its lease running LeaseMs+WaitMs from now if that ends later
	// (cluster: a node that applied the grant too late to answer it counts the lease again from
	// about its answer, WaitMs being the time it allows for the renewal to come back). A to
	// From, or T if Token no longer holds Key (its lease ended before anyone heard of it; the
	// replica turns that into E unavailable, as the acquire was granted).
	OpRenew
)

var opNames = [...]string{"", "acquire", "release", "expire", "wait-timeout", "withdraw", "withdraw-below", "renew"}

func (o Op) String() string {
	if int(o) < len(opNames) && o != 0 {
		return opNames[o]
	}
	return "op?"
}

// Command is one input to Apply. The table copies what it keeps (owner and key of a queued
// acquire), so the slices need only live for the call.
type Command struct {
	Op      Op
	From    Requester
	Owner   []byte
	Key     []byte
	LeaseMs uint64
	WaitMs  uint64
	Token   uint64
	// Deadline of an OpExpire is the lease end it was made for (Due sets it): a lease
	// renewed since (OpRenew) does not end by it. 0: whatever the lease end is.
	Deadline int64
}

// Result is the kind of an Answer.
type Result uint8

const (
	Acquired    Result = iota + 1 // A <Token> <Owner> <Key>
	TimedOut                      // T <Owner> <Key>
	Busy                          // B <Owner> <Key>
	Released                      // R <Token> <Key>
	NotReleased                   // N <Token> <Key>
)

// Letter is the answer's first field on the wire: 'A', 'T', 'B', 'R' or 'N'.
func (r Result) Letter() byte {
	if r >= Acquired && r <= NotReleased {
		return "ATBRN"[r-1]
	}
	return '?'
}

// Answer is addressed to a requester. Owner and Key point into the command or into table
// memory: valid until the next call on the table; copy them to keep them.
type Answer struct {
	To       Requester
	Result   Result
	Token    uint64
	Owner    []byte
	Key      []byte
	Deadline int64 // Acquired: when the lease ends
	// Waited: Acquired to an acquire that could wait (wait_ms > 0), by a
	// hand-over or at once: its holder cannot tell which, and dates its
	// lease from the answer, not from its send (client.Lock.Deadline), so
	// an answer that leaves late needs its lease moved on (single.Runner).
	Waited bool
}

// maxFree bounds each free list: enough to absorb churn, small enough that a burst does not
// pin its memory for good.
const maxFree = 1024

// Config sets a table's limits and mode; the zero value is an unlimited single-mode table.
type Config struct {
	MaxKeys          int     // registered keys in this table; 0: unlimited
	MaxWaitersPerKey int     // 0: unlimited
	MaxWaiters       int     // queued acquires in this table; 0: unlimited
	Keys             *Budget // optional key budget shared by several tables (single mode: server-wide --max-keys); must be nil when Replicated
	Waiters          *Budget // optional waiter budget shared likewise (single mode: server-wide --max-waiters); must be nil when Replicated
	Replicated       bool    // cluster mode: leases end only by OpExpire, waits only by OpWaitTimeout; never compare now with deadlines in Apply
	// ReserveTokens is called when the next token would pass the current ceiling; it returns a
	// new ceiling (single mode persists a block first). nil: no ceiling.
	ReserveTokens func(next uint64) uint64
}

// Stats is a point-in-time view; the counters are cumulative since New (not in snapshots).
type Stats struct {
	Keys      int    // registered keys (held, grace-held, or with waiters)
	Waiters   int    // queued acquires
	LastToken uint64 // the last token granted (or set by SetLastToken / a snapshot)

	Grants      uint64 // Acquired answers, at once or by hand-over
	HandOvers   uint64 // grants to a queued acquire (release, lease end, grace end)
	Expiries    uint64 // leases that ended without a release and were acted on: take-over, hand-over, OpExpire, sweep
	TimedOut    uint64 // T answers, at once or at the end of a wait
	Busy        uint64 // B answers
	Released    uint64 // R answers
	NotReleased uint64 // N answers
	Swept       uint64 // expired keys deleted by Sweep
	Withdrawn   uint64 // queued acquires dropped by OpWithdraw
	Renewals    uint64 // grants answered anew by OpRenew (T ones included)
}

// Add sums o into s (the tables of one server); LastToken takes the maximum.
func (s *Stats) Add(o Stats) {
	s.Keys += o.Keys
	s.Waiters += o.Waiters
	s.LastToken = max(s.LastToken, o.LastToken)
	s.Grants += o.Grants
	s.HandOvers += o.HandOvers
	s.Expiries += o.Expiries
	s.TimedOut += o.TimedOut
	s.Busy += o.Busy
	s.Released += o.Released
	s.NotReleased += o.NotReleased
	s.Swept += o.Swept
	s.Withdrawn += o.Withdrawn
	s.Renewals += o.Renewals
}

// entry is a registered key (held or grace-held, maybe with waiters). live is false only
// for an entry on its way out of the key index or on the free list.
type entry struct {
	key      []byte // owned: inl[:n] or ext
	inl      [inlineKey]byte
	token    uint64 // holder's token; 0 on a live entry: the grace phantom
	deadline int64  // holder's lease end (phantom: grace end)
	head     *waiter
	tail     *waiter
	nwait    int
	hidx     int    // lease timer's heap position, -1: none
	hash     uint64 // of key, while in the key index
	ext      []byte // buffer for keys longer than inl, kept for reuse
	live     bool
}

// waiter is a queued acquire. It is on two lists: its key's FIFO queue and its connection's
// list (for OpWithdraw).
type waiter struct {
	from         Requester
	owner        []byte // owned copy
	leaseMs      uint64
	wait         int64  // wait deadline
	id           uint64 // arrival number in the table: breaks timer ties the same way after a snapshot
	e            *entry
	prev, next   *waiter // key queue
	cprev, cnext *waiter // connection list
	hidx         int     // wait timer's heap position, -1: none
	cn           int     // on the head of a connection's list: the list's length
}

type connID struct {
	node uint32
	conn uint64
}

// Table is the lock table of one shard. It is not safe for concurrent use: one goroutine
// (a shard's event loop, or a replica's state machine) calls all its methods.
type Table struct {
	cfg Config

	// State, all in snapshots: the live entries of keys with their queues, and the
	// fields marked so.
	keys        keyIndex
	last        uint64 // last token granted (snapshot)
	maxDeadline int64  // (snapshot)
	grace       int64  // no unregistered key is granted before this (snapshot)
	nextID      uint64 // next waiter id (snapshot)

	// Derived from the state, rebuilt by ReadSnapshot.
	conns map[connID]*waiter // head of each connection's waiter list
	heap  timerHeap
	nwait int

	// Not state.
	ceiling uint64            // tokens up to here are reserved (with ReserveTokens)
	longest uint64            // the longest lease granted, ms (see LongestLease)
	granted [grantRing]*entry // see holder
	freeE   []*entry
	freeW   []*waiter
	st      Stats
	due     []int    // scratch for Due
	gone    []*entry // scratch for Sweep
	// The earliest lease end and wait end set since NewTimers last ran
	// (math.MaxInt64: none).
	newLease, newWait int64
}

// New returns an empty table. It panics on a Config that cannot work: a shared key Budget
// in Replicated mode (another table's state would make replicas answer differently).
func New(cfg Config) *Table {
	if cfg.Replicated && (cfg.Keys != nil || cfg.Waiters != nil) {
		panic("shard: Config.Keys and Config.Waiters must be nil in Replicated mode")
	}
	t := &Table{cfg: cfg, keys: newKeyIndex(), conns: make(map[connID]*waiter),
		newLease: math.MaxInt64, newWait: math.MaxInt64}
	return t
}

// Apply carries out one command at time now and appends the answers it decides to out.
// An OpAcquire that queues appends nothing: its answer comes later from a release, Tick, or a command.
// A release that hands the key over appends the R for the releaser, then the A for the new
// holder (in single mode, T answers for queued acquires whose wait had passed come between).
// Apply panics on an unknown Op: a log entry this version does not understand must stop the
// replica rather than be skipped on some replicas and not on others.
func (t *Table) Apply(now int64, c *Command, out []Answer) []Answer {
	switch c.Op {
	case OpAcquire:
		return t.acquire(now, c, out)
	case OpRelease:
		return t.release(now, c, out)
	case OpExpire:
		return t.expire(now, c, out)
	case OpWaitTimeout:
		return t.waitTimeout(c, out)
	case OpWithdraw:
		t.withdraw(c.From)
		return out
	case OpWithdrawBelow:
		t.withdrawBelow(c.From)
		return out
	case OpRenew:
		if t.cfg.Replicated {
			return t.renew(now, c, out)
		}
	}
	panic("shard: unknown Op " + c.Op.String())
}

func (t *Table) acquire(now int64, c *Command, out []Answer) []Answer {
	e, h := t.keys.find(c.Key)
	if e == nil {
		if now < t.grace {
			// Grace: the key counts as held by a phantom (token 0) until t.grace.
			if c.WaitMs == 0 {
				return t.refuse(out, c, TimedOut)
			}
			if !t.waiterRoom(nil) {
				return t.refuse(out, c, Busy)
			}
			if !t.takeKey() {
				t.putWaiter()
				return t.refuse(out, c, Busy)
			}
			e = t.register(c.Key, h)
			e.token, e.deadline = 0, t.grace
			t.enqueue(e, now, c)
			t.syncLease(e)
			return out
		}
		if !t.takeKey() {
			return t.refuse(out, c, Busy)
		}
		e = t.register(c.Key, h)
		out = t.grant(out, e, now, c.From, c.Owner, c.LeaseMs)
		out[len(out)-1].Waited = c.WaitMs > 0
		return out
	}
	if !t.cfg.Replicated && e.deadline <= now {
		// Lazy take-over in place; the queue stays as it is (the expiry path is not FIFO).
		if e.token != 0 {
			t.st.Expiries++
		}
		out = t.grant(out, e, now, c.From, c.Owner, c.LeaseMs)
		out[len(out)-1].Waited = c.WaitMs > 0
		return out
	}
	if c.WaitMs == 0 {
		return t.refuse(out, c, TimedOut)
	}
	if !t.waiterRoom(e) {
		return t.refuse(out, c, Busy)
	}
	t.enqueue(e, now, c)
	t.syncLease(e)
	return out
}

func (t *Table) release(now int64, c *Command, out []Answer) []Answer {
	e := t.holder(c.Key, c.Token)
	if e == nil {
		t.st.NotReleased++
		out, a := push(out)
		a.To, a.Result, a.Token, a.Key = c.From, NotReleased, c.Token, c.Key
		return out
	}
	t.st.Released++
	out, a := push(out)
	a.To, a.Result, a.Token, a.Key = c.From, Released, c.Token, c.Key
	var ok bool
	if out, ok = t.handOver(e, now, out); !ok {
		t.unregister(e)
	}
	return out
}

func (t *Table) expire(now int64, c *Command, out []Answer) []Answer {
	e := t.keys.get(c.Key)
	if e == nil || e.token != c.Token || c.Deadline != 0 && e.deadline != c.Deadline {
		return out // stale: the lease already ended, the key changed hands, or the lease was renewed
	}
	if e.token != 0 {
		t.st.Expiries++
	}
	var ok bool
	if out, ok = t.handOver(e, now, out); !ok {
		t.unregister(e)
	}
	return out
}

// renew answers a grant again, with its lease moved later if that is what
// LeaseMs+WaitMs from now gives. Neither the queue nor the token changes:
// the holder is the same, only told later.
func (t *Table) renew(now int64, c *Command, out []Answer) []Answer {
	t.st.Renewals++
	e := t.holder(c.Key, c.Token)
	if e == nil {
		out, a := push(out) // not counted as a T: the acquire was granted
		a.To, a.Result, a.Owner, a.Key = c.From, TimedOut, c.Owner, c.Key
		return out
	}
	if d := addMs(now, c.LeaseMs+c.WaitMs); d > e.deadline {
		e.deadline = d
		t.maxDeadline = max(t.maxDeadline, d)
		t.syncLease(e)
	}
	out, a := push(out)
	a.To, a.Result, a.Token, a.Owner, a.Key, a.Deadline = c.From, Acquired, e.token, c.Owner, e.key, e.deadline
	return out
}

// waitTimeout ends the wait of c.From on c.Key. Were the same requester queued twice on
// the key, the earliest goes: the connection list's order differs after a snapshot, the
// arrival order does not.
func (t *Table) waitTimeout(c *Command, out []Answer) []Answer {
	var found *waiter
	for w := t.conns[connID{c.From.Node, c.From.Conn}]; w != nil; w = w.cnext {
		if w.from.Seq == c.From.Seq && bytes.Equal(w.e.key, c.Key) && (found == nil || w.id < found.id) {
			found = w
		}
	}
	if found != nil {
		e := found.e
		out = t.timeOut(found, out)
		t.settle(e)
	}
	return out
}

func (t *Table) withdraw(from Requester) {
	id := connID{from.Node, from.Conn}
	for w := t.conns[id]; w != nil; w = t.conns[id] {
		e := w.e
		t.removeWaiter(w)
		t.st.Withdrawn++
		t.settle(e)
	}
}

// withdrawBelow drops the waiters of every connection of node from.Node with a smaller
// connection id, in arrival order so that every replica frees them alike.
func (t *Table) withdrawBelow(from Requester) {
	var ws []*waiter
	for id, w := range t.conns {
		if id.node != from.Node || id.conn >= from.Conn {
			continue
		}
		for ; w != nil; w = w.cnext {
			ws = append(ws, w)
		}
	}
	slices.SortFunc(ws, func(a, b *waiter) int { return cmp.Compare(a.id, b.id) })
	for _, w := range ws {
		e := w.e
		t.removeWaiter(w)
		t.st.Withdrawn++
		t.settle(e)
	}
}

// Waiting appends an OpWaitTimeout for every acquire queued by node, in arrival order
// (a cluster node ends its own waits so before it shuts down). Key slices point into
// table memory: valid until the next call on the table.
func (t *Table) Waiting(node uint32, out []Command) []Command {
	var ws []*waiter
	for id, w := range t.conns {
		if id.node != node {
			continue
		}
		for ; w != nil; w = w.cnext {
			ws = append(ws, w)
		}
	}
	slices.SortFunc(ws, func(a, b *waiter) int { return cmp.Compare(a.id, b.id) })
	for _, w := range ws {
		out = append(out, Command{Op: OpWaitTimeout, From: w.from, Key: w.e.key})
	}
	return out
}

// QueuedOf is how many acquires of connection conn of node wait in this
// table, in O(1).
func (t *Table) QueuedOf(node uint32, conn uint64) int {
	if w := t.conns[connID{node, conn}]; w != nil {
		return w.cn
	}
	return 0
}

// WaitingConns appends the connections of node that have acquires queued, in no order: one
// entry per connection, without looking at its waiters.
func (t *Table) WaitingConns(node uint32, out []uint64) []uint64 {
	for id := range t.conns {
		if id.node == node {
			out = append(out, id.conn)
		}
	}
	return out
}

// WaitingAbove keeps, per node other than self with acquires queued, the
// largest of their connection ids in most (a cluster leader looks there for
// the acquires of nodes it gives up for lost).
func (t *Table) WaitingAbove(self uint32, most map[uint32]uint64) {
	for id := range t.conns {
		if id.node != self {
			most[id.node] = max(most[id.node], id.conn)
		}
	}
}

// Tick (single mode) applies everything due at now: hand-over at lease end to the queue head for
// keys with waiters, and wait timeouts. Timers run in deadline order; at equal deadlines wait
// timeouts come before lease ends, then lower tokens and earlier arrivals first. A key whose
// lease ended and whose queue emptied stays registered (expired) until Sweep or an acquire.
// In Replicated mode Tick does nothing: time reaches the table only through commands.
func (t *Table) Tick(now int64, out []Answer) []Answer {
	if t.cfg.Replicated {
		return out
	}
	for len(t.heap) > 0 && t.heap[0].at <= now {
		if w := t.heap[0].w; w != nil {
			e := w.e
			out = t.timeOut(w, out)
			t.settle(e)
			continue
		}
		e := t.heap[0].e
		if e.token != 0 {
			t.st.Expiries++
		}
		var ok bool
		if out, ok = t.handOver(e, now, out); !ok {
			t.settle(e) // drops the lease timer (no waiters left), or the phantom key
		}
	}
	return out
}

// NextDeadline: the earliest timer Tick would act on (false: none). In Replicated mode: the
// earliest timer Due would report. Any Apply can move it earlier (a new wait, a grant to a
// key with waiters), so a runner looks again after each batch of commands.
func (t *Table) NextDeadline() (int64, bool) {
	if len(t.heap) == 0 {
		return 0, false
	}
	return t.heap[0].at, true
}

// NextDue (cluster leader) is the earliest time at which Due would report a command when
// lease ends are asked for leaseDelay after wait ends, as the leader does (its clock skew);
// false: no timer. It reads only the part of the heap that could be earlier, so a leader
// can sleep until then instead of polling.
func (t *Table) NextDue(leaseDelay int64) (int64, bool) {
	if len(t.heap) == 0 {
		return 0, false
	}
	best := int64(math.MaxInt64)
	stack := append(t.due[:0], 0)
	for len(stack) > 0 {
		i := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		tm := &t.heap[i]
		if tm.at >= best {
			continue // nothing below it is earlier
		}
		d := tm.at
		if tm.w == nil {
			d += leaseDelay
		}
		best = min(best, d)
		for c := 2*i + 1; c <= 2*i+2 && c < len(t.heap); c++ {
			stack = append(stack, c)
		}
	}
	t.due = stack[:0]
	return best, true
}

// NewTimers (cluster leader) returns the earliest lease end and the earliest wait end set
// since its last call (math.MaxInt64: none), and forgets them: the only way NextDue moves
// earlier, found without walking the heap after every batch of commands.
func (t *Table) NewTimers() (lease, wait int64) {
	lease, wait = t.newLease, t.newWait
	t.newLease, t.newWait = math.MaxInt64, math.MaxInt64
	return lease, wait
}

// Due (cluster leader) appends the OpExpire/OpWaitTimeout commands due at now without applying them.
// It reports the same commands again on every call until they are applied (a stale one is a
// no-op then), in the order Tick would act on them. Key slices point into table memory:
// valid until the next call on the table. In single mode it sees only the timers Tick uses
// (lease ends of keys with waiters, wait deadlines).
func (t *Table) Due(now int64, out []Command) []Command {
	idx := t.due[:0]
	if len(t.heap) > 0 && t.heap[0].at <= now {
		idx = append(idx, 0)
	}
	for i := 0; i < len(idx); i++ { // breadth-first over the part of the heap that is due
		for c := 2*idx[i] + 1; c <= 2*idx[i]+2 && c < len(t.heap); c++ {
			if t.heap[c].at <= now {
				idx = append(idx, c)
			}
		}
	}
	h := t.heap
	slices.SortFunc(idx, func(a, b int) int {
		switch {
		case h.less(a, b):
			return -1
		case h.less(b, a):
			return 1
		}
		return 0
	})
	for _, i := range idx {
		tm := &t.heap[i]
		if tm.w != nil {
			out = append(out, Command{Op: OpWaitTimeout, From: tm.w.from, Key: tm.w.e.key})
		} else {
			out = append(out, Command{Op: OpExpire, Key: tm.e.key, Token: tm.e.token, Deadline: tm.at})
		}
	}
	t.due = idx[:0]
	return out
}

// Sweep deletes expired keys that have no waiters (single mode, every --sweep-interval),
// and lowers MaxDeadline to the latest lease end still held.
// In Replicated mode it does nothing and returns 0: keys there end by OpExpire.
func (t *Table) Sweep(now int64) (removed int) {
	gone := t.gone[:0]
	var held int64
	t.keys.each(func(e *entry) {
		if !t.cfg.Replicated && e.nwait == 0 && e.deadline <= now {
			gone = append(gone, e)
		} else if e.token != 0 {
			// Not the grace phantom's: its deadline is the grace, which
			// the runner covers as it is (Grace), and counted as a lease
			// it would raise the ceiling a leaseStep over the grace, and
			// so each crash's grace over the one before.
			held = max(held, e.deadline)
		}
	})
	if !t.cfg.Replicated {
		// Lease ends past the latest still held are gone: released early,
		// or swept here. Replicas never lower it, as it is in their state.
		t.maxDeadline = held
	}
	for i, e := range gone {
		gone[i] = nil
		t.keys.del(e)
		if e.token != 0 {
			t.st.Expiries++
		}
		t.drop(e)
		t.freeEntry(e)
		removed++
	}
	if cap(gone) > 4096 {
		gone = nil // a large sweep must not pin its scratch
	}
	t.gone = gone[:0]
	t.st.Swept += uint64(removed)
	return removed
}

// SetGrace: after a crash, no key is granted before until; acquires meanwhile see the key as held.
// It applies to keys not registered: such a key is held by a phantom (token 0, lease end
// until) that no release matches. An acquire with a wait queues behind it and registers the
// key (it needs room for a key and a waiter); at until, Tick hands the key to the queue head.
func (t *Table) SetGrace(until int64) { t.grace = until }

// Grace returns the time set by SetGrace (or read from a snapshot).
func (t *Table) Grace() int64 { return t.grace }

// Stats returns the current sizes and the counters.
func (t *Table) Stats() Stats {
	s := t.st
	s.Keys, s.Waiters, s.LastToken = t.keys.len(), t.nwait, t.last
	return s
}

// LastToken is the last token granted: the value to persist as the high-water mark.
func (t *Table) LastToken() uint64 { return t.last }

// SetLastToken raises the token counter (restart: continue above a persisted high-water
// mark); a value at or below the current one changes nothing, so tokens never go back.
func (t *Table) SetLastToken(tok uint64) {
	if tok > t.last {
		t.last = tok
	}
}

// SetLimits replaces the table's MaxKeys, MaxWaitersPerKey and MaxWaiters (cluster mode:
// the limits recorded in the shard's log replace the node's own). Keys and waiters already
// above a lowered limit stay; only new ones meet it.
func (t *Table) SetLimits(maxKeys, maxWaitersPerKey, maxWaiters int) {
	t.cfg.MaxKeys, t.cfg.MaxWaitersPerKey, t.cfg.MaxWaiters = maxKeys, maxWaitersPerKey, maxWaiters
}

// ShiftLeases moves every lease end and the grace by (> 0) later; waits
// keep their ends. Single mode's answer to a clean restart whose wall clock
// may read ahead of the stopped run's (single.Runner). Not for a Replicated
// table, whose deadlines move only by the log: it panics.
func (t *Table) ShiftLeases(by int64) {
	if t.cfg.Replicated {
		panic("shard: ShiftLeases on a Replicated table")
	}
	if by <= 0 {
		return
	}
	later := func(d int64) int64 {
		if d > math.MaxInt64-by {
			return math.MaxInt64
		}
		return d + by
	}
	// syncLease moves heap timers only, not the index that each walks.
	t.keys.each(func(e *entry) {
		e.deadline = later(e.deadline)
		t.syncLease(e)
	})
	t.maxDeadline = later(t.maxDeadline)
	if t.grace > 0 {
		t.grace = later(t.grace)
	}
}

// MaxDeadline is the latest lease deadline granted (lease high-water mark):
// ever in Replicated mode, else since the last Sweep, which lowers it to
// the latest one still held.
func (t *Table) MaxDeadline() int64 { return t.maxDeadline }

// LongestLease is the longest lease, in ns (saturated), this table has
// granted since it was made: single mode keeps a durable bound on it, so
// that a crash's grace need not outlast it. Not state: no answer depends
// on it.
func (t *Table) LongestLease() int64 { return addMs(0, t.longest) }

// Extend moves the lease of key's grant token to end no earlier than
// deadline: single mode's answer to a hand-over that leaves late (see
// single.Runner). false if token no longer holds key. Not for a Replicated
// table, whose deadlines move only by the log (OpRenew).
func (t *Table) Extend(key []byte, token uint64, deadline int64) bool {
	e := t.holder(key, token)
	if e == nil {
		return false
	}
	if deadline > e.deadline {
		e.deadline = deadline
		t.maxDeadline = max(t.maxDeadline, deadline)
		t.syncLease(e)
	}
	return true
}

// push appends a zero Answer to out for the caller to fill field by field.
// An Answer literal in append is built in a temporary and copied with
// 16-byte loads of its 8-byte stores, which stall on store forwarding
// (pprof put the copies at about 3% of the server's CPU at depth 64).
func push(out []Answer) ([]Answer, *Answer) {
	out = append(out, Answer{})
	return out, &out[len(out)-1]
}

// refuse answers an acquire at once with T or B.
func (t *Table) refuse(out []Answer, c *Command, r Result) []Answer {
	if r == Busy {
		t.st.Busy++
	} else {
		t.st.TimedOut++
	}
	out, a := push(out)
	a.To, a.Result, a.Owner, a.Key = c.From, r, c.Owner, c.Key
	return out
}

// grant makes `to` the holder of the live entry e, with a new token and a lease from now.
func (t *Table) grant(out []Answer, e *entry, now int64, to Requester, owner []byte, leaseMs uint64) []Answer {
	tok := t.nextToken()
	e.token, e.deadline = tok, addMs(now, leaseMs)
	t.granted[tok%grantRing] = e
	t.longest = max(t.longest, leaseMs)
	if e.deadline > t.maxDeadline {
		t.maxDeadline = e.deadline
	}
	t.st.Grants++
	t.syncLease(e)
	out, a := push(out)
	a.To, a.Result, a.Token, a.Owner, a.Key, a.Deadline = to, Acquired, tok, owner, e.key, e.deadline
	return out
}

// grantRing is how many of the latest grants holder finds without the key
// index: more than a shard's grants in flight at pipeline depth 64.
const grantRing = 1024

// holder returns key's entry if token holds it, else nil. A release names
// its grant's token, and the grant is most often one of the latest: its
// entry is then found by the token in granted, without hashing the key and
// probing the index, whose slot for a key granted a while ago has left the
// cache (a third of the table's time at depth 64 went to releases'
// lookups). Tokens are unique in a table and an entry that stops holding
// one has its token set to another or to 0, so a match is the entry the
// index holds for key.
func (t *Table) holder(key []byte, token uint64) *entry {
	if token == 0 {
		return nil // the grace phantom's, never a grant's
	}
	if e := t.granted[token%grantRing]; e != nil && e.token == token && bytes.Equal(e.key, key) {
		return e
	}
	if e := t.keys.get(key); e != nil && e.token == token {
		return e
	}
	return nil
}

func (t *Table) nextToken() uint64 {
	n := t.last + 1
	if t.cfg.ReserveTokens != nil && n > t.ceiling {
		c := t.cfg.ReserveTokens(n)
		if c < n {
			panic("shard: ReserveTokens returned a ceiling below the next token")
		}
		t.ceiling = c
	}
	t.last = n
	return n
}

// handOver gives the key to the head of its queue after its lease ended or was released.
// A waiter whose wait has passed by now is never granted, even if Tick (or, replicated, its
// OpWaitTimeout) has not come yet: it gets its T and the next one is tried. In Replicated
// mode now is the command's time, so every replica decides alike. false: nobody was left to take it
// (the caller decides what becomes of the key).
func (t *Table) handOver(e *entry, now int64, out []Answer) ([]Answer, bool) {
	for e.head != nil {
		w := e.head
		if w.wait <= now {
			out = t.timeOut(w, out)
			continue
		}
		// w's owner bytes stay intact in the free list until a later call reuses w.
		t.removeWaiter(w)
		t.st.HandOvers++
		out = t.grant(out, e, now, w.from, w.owner, w.leaseMs)
		out[len(out)-1].Waited = true
		return out, true
	}
	return out, false
}

// timeOut answers T to a queued acquire and removes it (the caller settles its key).
func (t *Table) timeOut(w *waiter, out []Answer) []Answer {
	t.st.TimedOut++
	out, a := push(out)
	a.To, a.Result, a.Owner, a.Key = w.from, TimedOut, w.owner, w.e.key
	t.removeWaiter(w)
	return out
}

// settle brings a live entry back in line after waiters left it: a phantom with an empty
// queue goes (it exists only for its queue), others get their lease timer adjusted.
func (t *Table) settle(e *entry) {
	if e.token == 0 && e.nwait == 0 {
		t.unregister(e)
		return
	}
	t.syncLease(e)
}

// syncLease keeps the lease timer of e in the heap exactly when a timer would act on it:
// in Replicated mode for every holder, in single mode only with waiters (without them, the
// lease ends lazily).
func (t *Table) syncLease(e *entry) {
	if !e.live || (!t.cfg.Replicated && e.nwait == 0) {
		if e.hidx >= 0 {
			t.heap.remove(e.hidx)
		}
		return
	}
	if e.hidx < 0 {
		t.heap.push(timer{at: e.deadline, tie: e.token, e: e})
		t.newLease = min(t.newLease, e.deadline)
		return
	}
	if tm := &t.heap[e.hidx]; tm.at != e.deadline || tm.tie != e.token {
		tm.at, tm.tie = e.deadline, e.token
		t.heap.fix(e.hidx)
		t.newLease = min(t.newLease, e.deadline)
	}
}

func (t *Table) takeKey() bool {
	if t.cfg.MaxKeys > 0 && t.keys.len() >= t.cfg.MaxKeys {
		return false
	}
	return t.cfg.Keys == nil || t.cfg.Keys.take()
}

// waiterRoom reports whether one more acquire may queue on e (nil: a key not yet registered),
// and if so takes its unit of the shared waiter budget; removeWaiter gives it back.
func (t *Table) waiterRoom(e *entry) bool {
	if t.cfg.MaxWaiters > 0 && t.nwait >= t.cfg.MaxWaiters {
		return false
	}
	if t.cfg.MaxWaitersPerKey > 0 && e != nil && e.nwait >= t.cfg.MaxWaitersPerKey {
		return false
	}
	return t.cfg.Waiters == nil || t.cfg.Waiters.take()
}

func (t *Table) putWaiter() {
	if t.cfg.Waiters != nil {
		t.cfg.Waiters.put()
	}
}

// register makes a live entry for key, which hashes to h, in the key index.
// The caller has taken the key's room.
func (t *Table) register(key []byte, h uint64) *entry {
	e := t.newEntry(key)
	t.keys.putHashed(e, h)
	e.live = true
	return e
}

// unregister ends a live entry without waiters; it leaves the key index.
func (t *Table) unregister(e *entry) {
	t.drop(e)
	t.keys.del(e)
	t.freeEntry(e)
}

// drop makes e not live and gives back its room; the key index is the caller's.
func (t *Table) drop(e *entry) {
	e.live = false
	e.token, e.deadline = 0, 0
	if e.hidx >= 0 {
		t.heap.remove(e.hidx)
	}
	if t.cfg.Keys != nil {
		t.cfg.Keys.put()
	}
}

func (t *Table) newEntry(key []byte) *entry {
	var e *entry
	if n := len(t.freeE); n > 0 {
		e = t.freeE[n-1]
		t.freeE[n-1] = nil
		t.freeE = t.freeE[:n-1]
	} else {
		e = &entry{hidx: -1}
	}
	if len(key) <= len(e.inl) {
		e.key = e.inl[:len(key)]
		copy(e.key, key)
	} else {
		e.ext = append(e.ext[:0], key...)
		e.key = e.ext
	}
	return e
}

// inlineKey bytes of a key live inside its entry, right after the slice
// that points at them, so that comparing a key after a lookup reads the
// entry's first cache line (two for keys that cross it) and no other
// memory; longer keys get a buffer.
const inlineKey = 48

func (t *Table) freeEntry(e *entry) {
	if len(t.freeE) < maxFree {
		t.freeE = append(t.freeE, e)
	}
}

// enqueue puts the acquire c at the tail of e's queue with its wait deadline.
func (t *Table) enqueue(e *entry, now int64, c *Command) {
	w := t.newWaiter()
	w.from = c.From
	w.owner = append(w.owner[:0], c.Owner...)
	w.leaseMs = c.LeaseMs
	w.wait = addMs(now, c.WaitMs)
	w.id = t.nextID
	t.nextID++
	t.link(e, w)
}

// newWaiter takes a waiter from the free list (its owner buffer kept for reuse) or makes one.
func (t *Table) newWaiter() *waiter {
	if n := len(t.freeW); n > 0 {
		w := t.freeW[n-1]
		t.freeW[n-1] = nil
		t.freeW = t.freeW[:n-1]
		return w
	}
	return &waiter{}
}

// link appends w to e's queue and its connection's list and starts its wait timer.
func (t *Table) link(e *entry, w *waiter) {
	w.e = e
	w.prev, w.next = e.tail, nil
	if e.tail != nil {
		e.tail.next = w
	} else {
		e.head = w
	}
	e.tail = w
	e.nwait++
	t.nwait++

	id := connID{w.from.Node, w.from.Conn}
	w.cprev, w.cnext = nil, t.conns[id]
	w.cn = 1
	if w.cnext != nil {
		w.cnext.cprev = w
		w.cn += w.cnext.cn
	}
	t.conns[id] = w

	w.hidx = -1
	t.heap.push(timer{at: w.wait, tie: w.id, w: w})
	t.newWait = min(t.newWait, w.wait)
}

// removeWaiter takes w off its queue, its connection's list and the heap, and frees it.
// The caller settles w's key.
func (t *Table) removeWaiter(w *waiter) {
	e := w.e
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		e.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		e.tail = w.prev
	}
	e.nwait--
	t.nwait--
	t.putWaiter()

	id := connID{w.from.Node, w.from.Conn}
	if w.cprev != nil {
		w.cprev.cnext = w.cnext
		t.conns[id].cn--
	} else if w.cnext != nil {
		w.cnext.cn = w.cn - 1
		t.conns[id] = w.cnext
	} else {
		delete(t.conns, id)
	}
	if w.cnext != nil {
		w.cnext.cprev = w.cprev
	}

	if w.hidx >= 0 {
		t.heap.remove(w.hidx)
	}
	w.e, w.prev, w.next, w.cprev, w.cnext = nil, nil, nil, nil, nil
	if len(t.freeW) < maxFree {
		t.freeW = append(t.freeW, w)
	}
}

// addMs is now + ms milliseconds, saturating instead of wrapping.
func addMs(now int64, ms uint64) int64 {
	if ms > uint64(math.MaxInt64-now)/1e6 {
		return math.MaxInt64
	}
	return now + int64(ms)*1e6
}
