package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ticketd/ticketd/codec"
	"github.com/ticketd/ticketd/internal/redial"
)

// A slot is one of the client's connections, across reconnects. Per live TCP
// connection it runs two goroutines: the reader (the slot's run goroutine,
// which also redials) and a writer.
//
// Callers push requests onto a lock-free stack (head); the writer takes the
// whole stack at once, registers the batch in the pending maps under one
// lock, encodes it and writes it with one Write. The reader parses every
// answer of one Read and matches them under one lock, wakes the callers,
// lets them push their replies, and then writes them itself if the writer
// is idle, or else wakes it. So the hot path takes no lock per request, only
// per batch, batches grow with the load, and under a steady pipeline there
// is one write per read and no goroutine between the read and the write, as
// a hand-written loop would do. The reader's writes never block: it must go
// on draining answers while the socket is full, or a server that stops
// reading until its answers are read would wait on it forever. What does
// not fit goes to the writer, which may block. When
// the connection is down, head holds closedCall and pushes fail, so a caller
// moves on to another slot instead of queueing behind a dead one.
type slot struct {
	cl   *Client
	head atomic.Pointer[call]
	wake chan struct{} // capacity 1: the stack went from empty to not empty

	// readerWakes is set while the reader hands answers to callers and
	// waits for their replies: their pushes need not wake the writer, as
	// the reader does that once for all of them.
	readerWakes atomic.Bool
	pushed      atomic.Uint64 // requests pushed so far: how many of the woken callers replied

	// lastRead is when the connection up last read anything (monoNow);
	// silent is set when watch gave it up for that. answered: it matched
	// an answer (run goroutine only).
	lastRead atomic.Int64
	silent   atomic.Bool
	answered bool

	mu    sync.Mutex         // guards the pending maps and held
	acq   map[uint64]*call   // acquires with generated owners, by sequence
	named map[namedKey]*call // AcquireAs
	rel   map[uint64]*call   // releases by token, chained through next in send order

	// held are releases to send again (see resend) that found no other
	// connection up: the slot's next connection sends them, and heldTimer
	// fails those whose lock's keep passes first.
	held      []*call
	heldTimer *time.Timer

	ncMu sync.Mutex // guards nc against Close
	nc   net.Conn

	// wmu is held by whoever writes to the connection: the writer, or the
	// reader when it finds the writer idle (TryLock). w's rest, bytes a
	// write of the reader's left unsent, goes out before anything else.
	wmu sync.Mutex
	w   batchWriter
	try tryWriter // the reader's writes that never block

	// Owned by the run goroutine. home is the address connection i of a
	// client starts on (i mod the addresses), so that the connections are
	// spread; failed is the address whose connection broke last (-1: none),
	// failedAt when each one's last broke.
	home, failed, cur int // cur: the address of the connection up or last up
	failedAt          []time.Time
	addr              string

	// Going home (see goHome): while moving is set, new requests stay
	// queued, and once nothing is pending on the connection, homeConn (a
	// connection to home, guarded by ncMu) takes its place and sends them.
	moving   atomic.Bool
	homeConn net.Conn
	// homing: a move was decided (homeConn set) and the connection home
	// is not yet in place; guarded by ncMu.
	homing bool
	// ending: the reader met an E line or a bad answer; nothing more is
	// written on the connection.
	ending   atomic.Bool
	homePace redial.Home // run goroutine only, read by goHome while serve runs

	// shutWrite: Close shut the connection's sending side (closeFlush), and
	// nothing more is written on it. late, guarded by lateMu: releases Close
	// sends on a connection of its own once every slot is down (sendLate):
	// grants that came after the shut, and releases that nobody waits for
	// and that found no connection left to carry them.
	shutWrite atomic.Bool
	lateMu    sync.Mutex
	late      []lateRelease
}

// lateRelease is a release left for Close to send (slot.late).
type lateRelease struct {
	token uint64
	key   string
	keep  time.Time // the lock's keep: past it there is nothing to release
}

// namedKey finds an AcquireAs call by its owner and key: a struct of the
// call's own strings, so that registering it copies nothing.
type namedKey struct{ owner, key string }

// closedCall marks the stack of a slot whose connection is down.
var closedCall = &call{}

func newSlot(cl *Client, home int) *slot {
	s := &slot{
		cl:       cl,
		wake:     make(chan struct{}, 1),
		acq:      make(map[uint64]*call),
		named:    make(map[namedKey]*call),
		rel:      make(map[uint64]*call),
		home:     home,
		failed:   -1,
		failedAt: make([]time.Time, len(cl.addrs)),
		homePace: redial.Home{Every: goHomeAfter},
	}
	s.head.Store(closedCall)
	return s
}

// take empties the stack and returns what it held; nil if it was empty or
// holds closedCall (the connection is down: its teardown set the mark, and
// the mark, shared by every slot, is never taken for a call).
func (s *slot) take() *call {
	for {
		h := s.head.Load()
		if h == nil || h == closedCall {
			return nil
		}
		if s.head.CompareAndSwap(h, nil) {
			return h
		}
	}
}

// push queues c for the writer; false if the connection is down.
func (s *slot) push(c *call) bool {
	for {
		h := s.head.Load()
		if h == closedCall {
			return false
		}
		c.next = h
		if s.head.CompareAndSwap(h, c) {
			s.pushed.Add(1)
			if h == nil && !s.readerWakes.Load() {
				s.wakeWriter()
			}
			return true
		}
	}
}

func (s *slot) wakeWriter() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *slot) closeConn() {
	s.ncMu.Lock()
	if s.nc != nil {
		s.nc.Close()
	}
	s.ncMu.Unlock()
}

// dial tries every address once, in redial.Order. Going back to its own
// address after a move is worth a short wait only: a node cut off by the
// network, rather than down, does not refuse but lets the attempt time out.
// So that attempt gets a tenth of the dial timeout, and the address is
// tried again with all of it after the others.
func (s *slot) dial(ctx context.Context) (net.Conn, error) {
	addrs := s.cl.addrs
	order := redial.Order(s.home, s.failed, s.failedAt, time.Now(), recentFailure)
	back := s.failed >= 0 && s.failed != s.home && order[0] == s.home
	if back {
		order = append(order, s.home)
	}
	var errs []error
	for i, j := range order {
		timeout := s.cl.cfg.dialTimeout
		if back && i == 0 {
			timeout /= 10
		}
		var d net.Dialer
		dctx, cancel := context.WithTimeout(ctx, timeout)
		nc, err := d.DialContext(dctx, "tcp", addrs[j])
		cancel()
		if err == nil {
			s.cur, s.addr = j, addrs[j]
			// A failed round of dials before this one is no longer why
			// nothing is up, should that happen again.
			s.cl.lastErr.Store(nil)
			return nc, nil
		}
		errs = append(errs, err)
	}
	err := errs[0]
	if len(errs) > 1 {
		err = errors.Join(errs...)
	}
	s.cl.lastErr.Store(&err)
	return nil, &ConnError{Addr: s.cl.addrList, Err: err}
}

// recentFailure is how long an address whose connection broke goes after
// the others when a slot redials (see redial.Order). A variable for tests.
var recentFailure = redial.RecentFailure

// run serves nc (if not nil), then redials with backoff until Close.
func (s *slot) run(nc net.Conn) {
	defer s.cl.wg.Done()
	attempt := 0
	for {
		if nc != nil {
			// A connection that the server closes at once (over its
			// --max-conns, a node crash-looping at start) must not be
			// redialled at the shortest pause for ever: only one that
			// served resets the backoff.
			up := time.Now()
			s.serve(nc)
			if s.answered || time.Since(up) >= s.cl.cfg.backoffMax {
				attempt = 0
			}
			nc = nil
			s.ncMu.Lock()
			next := s.homeConn
			s.homeConn = nil
			s.ncMu.Unlock()
			// A move home that Close met after it was decided still
			// carries Close's flush: the releases queued for it go out there.
			if next != nil && beforeMoveHome != nil {
				beforeMoveHome()
			}
			if next != nil && !s.cl.shut.Load() {
				nc, s.cur, s.addr, s.failed = next, s.home, s.cl.addrs[s.home], -1
				s.homePace.Arrived(time.Now())
				continue // moved home: nothing failed
			}
			if next != nil {
				s.ncMu.Lock()
				s.homing = false
				s.ncMu.Unlock()
				next.Close()
				s.failUnsent(ErrClosed) // what serve left queued for next
			}
			now := time.Now()
			s.failed = s.cur
			s.failedAt[s.cur] = now
			s.homePace.Broke(now, s.cur == s.home)
		}
		if s.cl.closed.Load() {
			s.failHeld(true)
			return
		}
		// The first redial after a connection that served goes at once
		// (the address that broke is tried last): while the slot is down
		// its calls go to the others, and with every slot on one node (a
		// rolling restart moves them onto the last node up) a release
		// made in a pause before it failed at once, its lock held to the
		// lease's end. Later ones back off.
		if attempt > 0 {
			d := s.cl.cfg.backoffMin << min(attempt-1, 20)
			if d > s.cl.cfg.backoffMax || d <= 0 {
				d = s.cl.cfg.backoffMax
			}
			d = d/2 + rand.N(d/2+1) // jitter, so that many clients do not return at once
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-s.cl.ctx.Done():
				t.Stop()
				s.failHeld(true)
				return
			}
		}
		attempt++
		nc, _ = s.dial(s.cl.ctx)
	}
}

// serve runs one TCP connection until it breaks or the client closes, then
// fails what it leaves unanswered.
func (s *slot) serve(nc net.Conn) {
	s.ncMu.Lock()
	s.nc, s.homing = nc, false
	// Cleared with nc in place, so that Close's flush, which reads both
	// under ncMu, never takes a connection still marked moving for one.
	s.moving.Store(false)
	s.ending.Store(false)
	if s.cl.shut.Load() {
		nc.Close() // Close came first: the read fails at once, and the teardown below runs
	}
	s.ncMu.Unlock()

	// Open the stack before the writer starts: the writer must never take
	// the closed mark for a call.
	s.head.CompareAndSwap(closedCall, nil)
	s.sendHeld()
	s.try.reset(nc)
	stop := make(chan struct{})
	wdone := make(chan struct{})
	go s.writeLoop(nc, stop, wdone)
	if s.head.Load() != nil {
		s.wakeWriter() // requests queued while the last connection drained
	}
	var hdone chan struct{}
	if s.cur != s.home {
		hdone = make(chan struct{})
		go s.goHome(nc, stop, hdone)
	}
	s.answered = false
	s.silent.Store(false)
	s.lastRead.Store(monoNow())
	sdone := make(chan struct{})
	go s.watch(nc, stop, sdone)

	up := time.Now()
	err := s.readLoop(nc)

	close(stop)
	nc.Close()
	<-wdone
	<-sdone
	if hdone != nil {
		<-hdone
	}
	if s.silent.Load() {
		err = fmt.Errorf("no answer for %v with requests in flight: the connection is silent", s.cl.cfg.answerTimeout)
	}
	if !s.answered && time.Since(up) < time.Second && !s.silent.Load() && !s.cl.closed.Load() &&
		(errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)) {
		// Said so, to its calls and to those made while nothing is up,
		// which would only hear "no connection is up", as if no server
		// listened.
		err = fmt.Errorf("%w (%s: %v)", ErrClosedAtOnce, s.addr, err)
		why := err
		s.cl.lastErr.Store(&why)
	}
	s.ncMu.Lock()
	s.nc = nil
	s.ncMu.Unlock()
	if s.cl.closed.Load() {
		err = ErrClosed
	}

	// Requests never written: the connection home takes them when this
	// one made way for it; else another connection may carry them, and if
	// none is up they fail as certainly not carried out.
	s.ncMu.Lock()
	switching := s.homeConn != nil
	s.ncMu.Unlock()
	if !switching || s.cl.shut.Load() {
		s.failUnsent(err)
	}

	// Requests written and unanswered: the server may have acted on them.
	s.mu.Lock()
	var lost []*call
	for k, c := range s.acq {
		lost = append(lost, c)
		delete(s.acq, k)
	}
	for k, c := range s.named {
		lost = append(lost, c)
		delete(s.named, k)
	}
	for k, c := range s.rel {
		for ; c != nil; c = c.next {
			lost = append(lost, c)
		}
		delete(s.rel, k)
	}
	s.mu.Unlock()
	for _, c := range lost {
		c.next = nil
		if s.resend(c) {
			continue
		}
		c.err = &ConnError{Addr: s.addr, Unknown: true, Err: err}
		s.finish(c)
	}
}

// monoNow is a monotonic time in ns, for times kept in atomics.
func monoNow() int64 { return int64(time.Since(monoStart)) }

var monoStart = time.Now()

// watch gives the connection up (closes it) when a request written on it
// has gone unanswered answerTimeout past its wait while nothing at all was
// read for as long (see WithAnswerTimeout): a peer that vanished without a
// reset would otherwise hold its calls, and the releases that another node
// could carry out, for as long as the kernel takes to notice.
func (s *slot) watch(nc net.Conn, stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	limit := s.cl.cfg.answerTimeout
	t := time.NewTicker(max(min(limit/4, time.Second), time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		if monoNow()-s.lastRead.Load() >= int64(limit) && s.overdue(time.Now(), limit) {
			s.silent.Store(true)
			nc.Close()
			return
		}
	}
}

// overdue tells whether a pending request was written more than limit
// past its wait before now.
func (s *slot) overdue(now time.Time, limit time.Duration) bool {
	late := func(c *call) bool { return now.Sub(c.sent) > limit+time.Duration(c.waitMs)*time.Millisecond }
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.acq {
		if late(c) {
			return true
		}
	}
	for _, c := range s.named {
		if late(c) {
			return true
		}
	}
	for _, c := range s.rel {
		for ; c != nil; c = c.next {
			if late(c) {
				return true
			}
		}
	}
	return false
}

// resend hands a release that the broken connection left unanswered to
// another connection, or if none is up to the slot's next one (holding it
// until then), while the lock's lease may still run (its keep). A
// node that fails (or answers E unavailable) between a release and its
// answer would otherwise leave the lock held until its lease ends, and its
// waiters waiting. Sending it again is safe: a token releases its key once,
// and a key's later holders have larger tokens, so the copy that comes
// second is answered N. An N that arrives before the Deadline (which is
// conservative) can only mean that the first copy released the key, or
// that a single-mode restart forgot the holder while its grace period keeps
// the key from others: released reports both answers as released. One
// that arrives later may mean that the lease ended and the key went on
// first: its outcome is unknown.
func (s *slot) resend(c *call) bool {
	if !s.mayResend(c) {
		return false
	}
	c.resent = true
	return s.cl.submit(c, s) || s.hold(c)
}

// mayResend tells whether c is a release whose lock's keep has not passed,
// on a client still open.
func (s *slot) mayResend(c *call) bool {
	return c.kind == 'R' && !c.keep.IsZero() && time.Now().Before(c.keep) && !s.cl.closed.Load()
}

// hold keeps release c for the slot's next connection, while its lock's
// keep has not passed; false if it has, or the client is closed.
func (s *slot) hold(c *call) bool {
	if !s.mayResend(c) {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.held = append(s.held, c)
	s.armHeld()
	return true
}

// armHeld sets heldTimer for the earliest keep among held. Under s.mu.
func (s *slot) armHeld() {
	var first time.Time
	for _, c := range s.held {
		if first.IsZero() || c.keep.Before(first) {
			first = c.keep
		}
	}
	if s.heldTimer != nil {
		s.heldTimer.Stop()
		s.heldTimer = nil
	}
	if len(s.held) > 0 {
		s.heldTimer = time.AfterFunc(time.Until(first), s.heldDue)
	}
}

// failHeld fails the held releases whose keep has passed (all of them
// with all set: the client is closing) with an unknown outcome, as the
// first copy's break left it.
// heldDue fails the held releases whose keep passed, on heldTimer's
// goroutine. Close waits for it (cl.wg) as for the connections' goroutines,
// so that no ReleaseFunc func is called after Close returns: counted under
// s.mu while the client is open, before the slot's run goroutine can end
// (its last failHeld takes s.mu after).
func (s *slot) heldDue() {
	s.mu.Lock()
	if s.cl.closed.Load() {
		s.mu.Unlock()
		return // the teardown fails them all
	}
	s.cl.wg.Add(1)
	s.mu.Unlock()
	defer s.cl.wg.Done()
	s.failHeld(false)
}

// heldFailing, when set, runs as failHeld has taken the releases it fails
// and before it fails them. (A hook for tests.)
var heldFailing func()

func (s *slot) failHeld(all bool) {
	s.mu.Lock()
	var due []*call
	kept := s.held[:0]
	now := time.Now()
	for _, c := range s.held {
		if all || !now.Before(c.keep) {
			due = append(due, c)
		} else {
			kept = append(kept, c)
		}
	}
	clear(s.held[len(kept):])
	s.held = kept
	s.armHeld()
	s.mu.Unlock()
	if len(due) > 0 && heldFailing != nil {
		heldFailing()
	}
	for _, c := range due {
		why := ErrClosed
		if !all {
			why = errors.New("connection broke with the release in flight; no connection came up before the lease's end")
		}
		c.err = &ConnError{Addr: s.cl.addrList, Unknown: true, Err: why}
		s.finish(c)
	}
}

// sendHeld queues the held releases on the connection just up; the ones
// whose keep passed meanwhile fail.
func (s *slot) sendHeld() {
	s.failHeld(false)
	s.mu.Lock()
	held := s.held
	s.held = nil
	s.armHeld()
	s.mu.Unlock()
	for _, c := range held {
		if !s.push(c) && !s.resend(c) { // closed again at once (Close): fail it
			c.err = &ConnError{Addr: s.addr, Unknown: true, Err: ErrClosed}
			s.finish(c)
		}
	}
}

// failUnsent closes the slot's queue and hands what it held to another
// connection, or fails it with err as not sent. A release sent again (see
// resend), whose first copy's outcome is unknown, and one that nobody waits
// for (ReleaseNoWait, or a late grant's) are held for the next connection
// instead, while their lock's keep has not passed.
func (s *slot) failUnsent(err error) {
	c := s.head.Swap(closedCall)
	if c == closedCall {
		return // closed before, and emptied then
	}
	// The queue is newest first: hand it on oldest first, so that the
	// requests for a key go out in the order they were made.
	var old *call
	for c != nil {
		c.next, old, c = old, c, c.next
	}
	c = old
	for c != nil {
		next := c.next
		c.next = nil
		if (c.internal || c.kind == 'R' || c.state.Load() != stAbandoned) && !s.cl.closed.Load() && s.cl.submit(c, s) ||
			c.kind == 'R' && (c.resent || c.internal || c.state.Load() == stAbandoned) && s.hold(c) {
			c = next
			continue
		}
		c.err = &ConnError{Addr: s.addr, Unknown: c.resent, Err: err}
		s.finish(c)
		c = next
	}
}

// finish hands an answered (or failed) call back: to its waiting caller, or
// its func, or, if the caller gave up, recycles it and releases a grant
// nobody wants.
func (s *slot) finish(c *call) {
	if c.internal {
		if c.kind == 'R' && c.err != nil {
			s.releaseLate(c.token, c.key, c.keep) // Close's, if it is closing
		}
		putCall(c)
		return
	}
	if fn := c.onAcquire; fn != nil {
		l, err := s.cl.acquired(c)
		putCall(c)
		fn(l, err)
		return
	}
	if fn := c.onRelease; fn != nil {
		err := released(c)
		putCall(c)
		fn(err)
		return
	}
	if c.state.CompareAndSwap(stWaiting, stDone) {
		c.done <- struct{}{}
		return
	}
	if c.kind == 'A' && c.res == 'A' && c.err == nil {
		if s.shutWrite.Load() {
			s.releaseLate(c.resToken, c.key, c.keep)
			putCall(c)
			return
		}
		r := getCall()
		r.kind, r.internal, r.key, r.token = 'R', true, c.key, c.resToken
		r.until, r.keep = c.start.Add(time.Duration(c.leaseMs)*time.Millisecond), c.keep
		if !s.push(r) && !s.cl.submit(r, s) && !s.hold(r) {
			s.releaseLate(r.token, r.key, r.keep)
			putCall(r) // no connection before the lease's end (or Close sends it)
		}
	}
	putCall(c)
}

// releaseLate leaves the release of token for Close to send, if the client
// is closing and the lock's keep has not passed.
func (s *slot) releaseLate(token uint64, key string, keep time.Time) {
	if !s.cl.closed.Load() || keep.IsZero() || !time.Now().Before(keep) {
		return
	}
	s.lateMu.Lock()
	s.late = append(s.late, lateRelease{token, key, keep})
	s.lateMu.Unlock()
}

// goHome runs while the slot's connection nc is off its own address: every
// homePace.After() it dials home, and once that succeeds it holds new
// requests back (queued, in order), waits until every request sent on nc
// has its answer, and hands the new connection over in nc's place, which
// sends them. So connections that moved during a node's outage spread again
// once it is back, instead of waiting for a break that may never come, and
// no request fails for it. It does not start while an acquire that may
// wait in the server's queue is pending, and if nc does not drain within
// drainLimit (a slow commit), it sends again and tries later.
func (s *slot) goHome(nc net.Conn, stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	every := s.homePace.After()
	d := every/2 + rand.N(every/2+1) // jitter: clients that moved together do not all return at once
	for {
		select {
		case <-stop:
			return
		case <-time.After(d):
		}
		d = every/2 + rand.N(every/2+1)
		if s.queuedAcquires() {
			// They may wait long, and holding new calls behind them would
			// hold those as long: look again soon for a moment without.
			d = queuedRecheck
			continue
		}
		var dl net.Dialer
		ctx, cancel := context.WithTimeout(s.cl.ctx, s.cl.cfg.dialTimeout/10)
		hc, err := dl.DialContext(ctx, "tcp", s.cl.addrs[s.home])
		cancel()
		if err != nil {
			continue
		}
		// Whether to move is decided under ncMu, where Close's flush looks
		// (closeFlush): once Close has begun no move starts or completes,
		// and the releases queued meanwhile go out on nc.
		s.ncMu.Lock()
		if s.cl.closed.Load() {
			s.ncMu.Unlock()
			hc.Close()
			return
		}
		s.moving.Store(true)
		s.ncMu.Unlock()
		if s.drained(stop) {
			s.ncMu.Lock()
			if !s.cl.closed.Load() {
				s.homeConn, s.homing = hc, true
				s.ncMu.Unlock()
				nc.Close()
				return
			}
			s.ncMu.Unlock()
		}
		s.moving.Store(false)
		s.wakeWriter()
		hc.Close()
		if s.cl.closed.Load() {
			return
		}
	}
}

// queuedAcquires tells whether an acquire that may wait in the server's
// queue (wait > 0) is pending on the slot.
func (s *slot) queuedAcquires() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.acq {
		if c.waitMs > 0 {
			return true
		}
	}
	for _, c := range s.named {
		if c.waitMs > 0 {
			return true
		}
	}
	return false
}

// drained waits until no request sent on the slot's connection is
// unanswered (true), or drainLimit passes or stop closes (false).
func (s *slot) drained(stop <-chan struct{}) bool {
	limit := time.Now().Add(drainLimit)
	for {
		// The writer may be writing a batch it took before moving was
		// set: its lock, then the pending maps, see it done.
		s.wmu.Lock()
		s.mu.Lock()
		idle := len(s.acq) == 0 && len(s.named) == 0 && len(s.rel) == 0 && len(s.w.rest) == 0
		s.mu.Unlock()
		s.wmu.Unlock()
		if idle {
			return true
		}
		if time.Now().After(limit) {
			return false
		}
		select {
		case <-stop:
			return false
		case <-time.After(time.Millisecond):
		}
	}
}

// goHomeAfter, drainLimit and queuedRecheck pace goHome. (Variables for
// tests.)
var (
	goHomeAfter   = redial.GoHomeAfter
	drainLimit    = 250 * time.Millisecond
	queuedRecheck = 50 * time.Millisecond
	// beforeMoveHome runs when a move home is decided, before the
	// connection home takes the slot's place.
	beforeMoveHome func()
)

// writeLoop encodes and writes batches of queued requests until stop.
func (s *slot) writeLoop(nc net.Conn, stop <-chan struct{}, wdone chan<- struct{}) {
	defer close(wdone)
	defer func() { s.wmu.Lock(); s.w.rest = nil; s.wmu.Unlock() }() // a later connection starts clean
	for {
		select {
		case <-s.wake:
		case <-stop:
			return
		}
		s.wmu.Lock()
		for len(s.w.rest) > 0 && !s.ending.Load() || s.head.Load() != nil && !s.moving.Load() && !s.ending.Load() && !s.cl.closed.Load() {
			// Callers that were just woken are about to push their next
			// requests: let them run first, and write all of it at once.
			// One write per request would cost a syscall each.
			s.gather(0, math.MaxInt)
			if !s.w.flush(s, nc, nil) {
				s.wmu.Unlock()
				<-stop
				return
			}
		}
		s.wmu.Unlock()
	}
}

// writeOrWake writes the queued requests from the reader if no write is under
// way, without blocking; whatever the socket does not take, and everything
// when a write is under way, is left to the writer.
func (s *slot) writeOrWake(nc net.Conn) {
	if !s.try.ok || !s.wmu.TryLock() {
		s.wakeWriter()
		return
	}
	if !s.w.flush(s, nc, &s.try) || len(s.w.rest) > 0 {
		s.wmu.Unlock()
		s.wakeWriter()
		return
	}
	s.wmu.Unlock()
}

// gather yields until want more requests were pushed since pushed0, or
// until a yield saw none pushed, up to maxYields times.
func (s *slot) gather(pushed0 uint64, want int) {
	for range maxYields {
		p := s.pushed.Load()
		if p-pushed0 >= uint64(want) {
			return
		}
		runtime.Gosched()
		if s.pushed.Load() == p {
			return
		}
	}
}

// batchWriter holds the buffers of the slot's writes; guarded by wmu.
type batchWriter struct {
	out     []byte
	rest    []byte // the tail of out that a write that must not block left unsent
	batch   []*call
	refused []*call
	kept    []*call // not sent at Close, queued again for the teardown to fail
	owner   []byte
	key     []byte
}

// flush writes rest, then takes every queued request, registers them in the
// pending maps, encodes and writes them with one write; false if a write
// failed (the connection is then closed, and the reader fails what is
// pending). With try it writes only what the socket takes at once and leaves
// the remainder in rest.
func (w *batchWriter) flush(s *slot, nc net.Conn, try *tryWriter) bool {
	if s.shutWrite.Load() {
		return true // what is queued fails in the teardown; Close sends the releases
	}
	if len(w.rest) > 0 {
		if try != nil {
			return true // the writer's job: it may have to wait
		}
		_, err := nc.Write(w.rest)
		w.rest = nil
		if err != nil {
			nc.Close()
			return false
		}
	}
	if s.moving.Load() || s.ending.Load() {
		return true // held for the connection home (goHome), or another one
	}
	// Once Close has begun only releases go out (closeFlush); the rest stays
	// queued, and fails unsent in the teardown.
	closing := s.cl.closed.Load()
	h := s.take()
	if h == nil {
		return true
	}
	w.batch = appendStack(w.batch, h)
	now := time.Now()
	out := w.out[:0]
	s.mu.Lock()
	for _, c := range w.batch {
		// An acquire its caller gave up on is not sent; a release is, as
		// its caller wants the lock released whether or not it waits.
		if !c.internal && c.kind != 'R' && c.state.Load() == stAbandoned {
			putCall(c)
			continue
		}
		if closing && c.kind != 'R' {
			w.kept = append(w.kept, c)
			continue
		}
		c.sent = now
		w.key = append(w.key[:0], c.key...)
		switch {
		case c.kind == 'R':
			s.addRel(c)
			out = codec.AppendRelease(out, c.token, w.key)
		case c.owner == "":
			s.acq[c.seq] = c
			w.owner = append(w.owner[:0], s.cl.idPrefix...)
			w.owner = strconv.AppendUint(w.owner, c.seq, 10)
			out = codec.AppendAcquire(out, w.owner, w.key, c.leaseMs, c.waitMs)
		default:
			if s.named[namedKey{c.owner, c.key}] != nil {
				w.refused = append(w.refused, c)
				continue
			}
			s.named[namedKey{c.owner, c.key}] = c
			w.owner = append(w.owner[:0], c.owner...)
			out = codec.AppendAcquire(out, w.owner, w.key, c.leaseMs, c.waitMs)
		}
	}
	s.mu.Unlock()
	clear(w.batch)
	w.batch = w.batch[:0]
	for _, c := range w.refused {
		c.err = fmt.Errorf("%w: owner %q already has an acquire of key %q in flight (one given up stays so until the server answers it)", ErrInvalid, c.owner, c.key)
		s.finish(c)
	}
	clear(w.refused)
	w.refused = w.refused[:0]
	for _, c := range w.kept {
		if !s.push(c) { // the teardown has begun
			c.err = &ConnError{Addr: s.addr, Err: ErrClosed}
			s.finish(c)
		}
	}
	clear(w.kept)
	w.kept = w.kept[:0]
	w.out = out
	if cap(w.out) > 1<<20 {
		w.out = nil // one burst should not pin a large buffer
	}
	if len(out) == 0 {
		return true
	}
	var err error
	if try != nil {
		w.rest, err = try.write(out)
	} else {
		_, err = nc.Write(out)
	}
	if err != nil {
		w.rest = nil
		nc.Close()
		return false
	}
	return true
}

// addRel registers release c, about to be written, for its answer: after
// any release of the same token already in flight. Under s.mu.
func (s *slot) addRel(c *call) {
	first := s.rel[c.token]
	if first == nil {
		s.rel[c.token] = c
		return
	}
	for first.next != nil {
		first = first.next
	}
	first.next = c
}

// closeFlush is Close's last use of the slot's connection, if one is up.
// The callers of acquires sent on it and not yet answered get ErrClosed at
// once (giveUpWaiting). The releases queued on it (ReleaseNoWait's, a late
// grant's, a waiting Release's) go out, and it waits for their answers.
// Then it shuts the connection's sending side: the server answers what it
// has decided, withdraws the acquires still queued, and ends its stream,
// which the reader reads to. A grant that comes meanwhile is released by
// Close on a connection of its own (finish, sendLate). All until deadline.
// Closed at once, the connection dropped the releases, and their locks
// stayed held to the end of their leases, as did a grant on its way; and a
// close with answers unread resets the connection, which can drop what was
// just written. Acquires still queued in the client are not sent: they fail
// with ErrClosed in the teardown.
//
// A move home under way is called off (goHome sees closed under ncMu and
// no longer moves), so the releases it held back go out on nc. One already
// decided goes on: the releases wait for the connection home, and the flush
// waits for it to be in place.
func (s *slot) closeFlush(deadline time.Time) {
	s.ncMu.Lock()
	nc, switching := s.nc, s.homing
	if !switching {
		s.moving.Store(false)
	}
	s.ncMu.Unlock()
	for switching && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
		s.ncMu.Lock()
		nc, switching = s.nc, s.homing
		s.ncMu.Unlock()
	}
	if nc == nil || switching || s.moving.Load() || s.ending.Load() {
		return
	}
	s.giveUpWaiting()
	_ = nc.SetWriteDeadline(deadline)
	for {
		if s.gone(nc) {
			return // the teardown failed what was registered
		}
		s.wmu.Lock()
		ok := s.w.flush(s, nc, nil)
		s.wmu.Unlock()
		if !ok {
			return // the teardown fails what was registered
		}
		// What flush wrote is registered until answered.
		s.mu.Lock()
		pending := len(s.rel) > 0
		s.mu.Unlock()
		if !pending || !time.Now().Before(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	s.wmu.Lock()
	s.shutWrite.Store(true)
	cw, ok := nc.(interface{ CloseWrite() error })
	ok = ok && cw.CloseWrite() == nil
	s.wmu.Unlock()
	for ok && !s.gone(nc) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
}

// gone tells whether nc is no longer the slot's connection: its reader has
// ended, and the teardown has failed what was registered on it.
func (s *slot) gone(nc net.Conn) bool {
	s.ncMu.Lock()
	defer s.ncMu.Unlock()
	return s.nc != nc
}

// giveUpWaiting fails, with ErrClosed, the calls of the acquires sent on the
// slot's connection and not yet answered, as if their callers had given up:
// each stays registered as a copy of its own whose caller gave up, so that
// a grant that still comes is released (finish) rather than reaching a
// caller that could not release it any more, the client being closed.
func (s *slot) giveUpWaiting() {
	var failed []*call
	s.mu.Lock()
	for seq, c := range s.acq {
		if c.state.Load() != stAbandoned {
			s.acq[seq] = abandonedCopy(c)
			failed = append(failed, c)
		}
	}
	for k, c := range s.named {
		if c.state.Load() != stAbandoned {
			s.named[k] = abandonedCopy(c)
			failed = append(failed, c)
		}
	}
	s.mu.Unlock()
	for _, c := range failed {
		c.err = &ConnError{Addr: s.cl.addrList, Unknown: true, Err: ErrClosed}
		s.finish(c)
	}
}

// abandonedCopy is a call for acquire c's answer that nobody waits for.
func abandonedCopy(c *call) *call {
	k := getCall()
	k.kind, k.seq, k.owner, k.key = c.kind, c.seq, c.owner, c.key
	k.leaseMs, k.waitMs, k.sent = c.leaseMs, c.waitMs, c.sent
	k.state.Store(stAbandoned)
	return k
}

// maxYields bounds how often the writer or the reader yields to collect a batch.
const maxYields = 4

// appendStack appends the calls of a taken stack to batch in the order they
// were pushed (the stack holds the latest first).
func appendStack(batch []*call, h *call) []*call {
	n := len(batch)
	for c := h; c != nil; {
		next := c.next
		c.next = nil
		batch = append(batch, c)
		c = next
	}
	slices.Reverse(batch[n:])
	return batch
}

// keepSlack is keepFor's margin beyond the lease: the cluster's default
// --max-clock-skew (500 ms) and an expiry's commit many times over.
const keepSlack = 10 * time.Second

// keepFor is about how long after its A arrived a lease of leaseMs may
// still run on the server: until then a lost release is worth sending
// again; past it a copy would most likely be answered N. The lease runs
// from the grant, and a hand-over's from no earlier than its answer's
// leaving (single mode renews one whose answer leaves late), so from
// before the arrival; a cluster node that applied a grant late renews it
// for up to as long again before it answers, and the leader ends a lease
// only once its clock has passed the end by --max-clock-skew and the
// expiry has committed. Twice the lease covers the renewal and the
// clocks' rates. Not a bound for a clean single-mode restart, which moves
// every lease on by its downtime, nor for a --max-clock-skew far above its
// default: a release not sent then leaves the key held to its lease's end.
// It never makes a release count as done: only R does, or a
// copy's N before Deadline.
func keepFor(leaseMs uint64) time.Duration {
	lease := time.Duration(min(leaseMs, uint64(math.MaxInt64/4/time.Millisecond))) * time.Millisecond
	return 2*lease + keepSlack
}

// readLoop reads and matches answers until the connection breaks, the server
// sends E, or it breaks the protocol; it returns the cause.
func (s *slot) readLoop(nc net.Conn) error {
	buf := make([]byte, 64<<10)
	var (
		start, end int
		a          codec.Answer
		batch      []*call
		// floor is the latest send among the requests answered so far
		// on this connection: see the dating of a waited grant below.
		floor time.Time
	)
	for {
		n, rerr := nc.Read(buf[end:])
		end += n
		if n > 0 {
			now := time.Now()
			s.lastRead.Store(monoNow())
			var perr error
			s.mu.Lock()
			for start < end {
				m, err := codec.ParseAnswer(buf[start:end], &a)
				if err != nil {
					perr = &ProtocolError{Text: err.Error()}
					break
				}
				if m == 0 {
					break
				}
				start += m
				if a.Kind == 'E' {
					perr = &ServerError{Code: string(a.Code), Text: string(a.Text)}
					break
				}
				var c *call
				c = s.match(&a)
				if c == nil {
					perr = &ProtocolError{Text: fmt.Sprintf("answer %q matches no request", bytes.TrimRight(buf[start-m:start], "\r\n"))}
					break
				}
				c.res, c.resToken = a.Kind, a.Token
				s.answered = true
				if a.Kind == 'N' && c.resent && !now.Before(c.until) {
					// A copy carried out after the lease's end: the key
					// may have gone to another holder before the first
					// copy, if it was carried out, released it.
					c.err = &ConnError{Addr: s.addr, Unknown: true, Err: errors.New("the release, sent again after its connection broke, was answered N after the lock's Deadline")}
				}
				if a.Kind == 'T' && c.waitMs > 0 {
					c.early = now.Sub(c.sent) < earlyBefore(c.waitMs)
				}
				// A lease counts from its send at the earliest. A grant
				// that may have waited (a hand-over) counts from later:
				// its answer left the server after every answer read
				// before it here, so after each of their requests was
				// sent, and the server moves a hand-over's lease on to
				// when its answer leaves. Its arrival less a round trip
				// would be later still, but not sound: a stall between
				// the server's last look at the clock and its write, or
				// in this reader before it read, comes in between.
				c.start = c.sent
				if c.kind == 'A' && c.waitMs > 0 && floor.After(c.start) {
					c.start = floor
				}
				if a.Kind == 'A' {
					c.keep = now.Add(keepFor(c.leaseMs))
				}
				if c.sent.After(floor) {
					floor = c.sent
				}
				batch = append(batch, c)
			}
			s.mu.Unlock()
			if perr != nil {
				// The connection ends here: what the callers woken below
				// send next stays queued, for another connection to carry
				// (failUnsent), rather than go out on this one unanswered.
				s.ending.Store(true)
			}
			// Answers before an E line or a bad one are good. The callers
			// woken here mostly reply at once (a release after a grant, the
			// next acquire after a release): let them, then wake the writer
			// once for the lot instead of at the first push.
			replies := perr == nil && len(batch) > 0
			var pushed0 uint64
			if replies {
				s.readerWakes.Store(true)
				pushed0 = s.pushed.Load()
			}
			woken := 0 // callers that will reply; a func replies within finish
			for _, c := range batch {
				if !c.internal && c.onAcquire == nil && c.onRelease == nil {
					woken++
				}
				s.finish(c)
			}
			clear(batch)
			batch = batch[:0]
			if perr != nil {
				return perr
			}
			if replies {
				s.gather(pushed0, woken)
				s.readerWakes.Store(false)
				if s.head.Load() != nil {
					s.writeOrWake(nc)
				}
			}
			if start == end {
				start, end = 0, 0
			} else if len(buf)-end < codec.MaxLine {
				end = copy(buf, buf[start:end])
				start = 0
			}
		}
		if rerr != nil {
			if errors.Is(rerr, net.ErrClosed) && s.cl.closed.Load() {
				return ErrClosed
			}
			return rerr
		}
	}
}

// earlyBefore is how soon after the send a T to an acquire that waits waitMs
// shows that the server ended the wait itself: its wait starts after the
// request arrived, so a T in time cannot come before waitMs has passed here.
// The margin (2% and 5ms) covers clocks that run at slightly different
// rates; a T within it counts as a wait that passed.
func earlyBefore(waitMs uint64) time.Duration {
	w := time.Duration(waitMs) * time.Millisecond
	return w - w/50 - 5*time.Millisecond
}

// match finds and removes the pending call that answer a belongs to; nil if
// none does. Called with s.mu held.
func (s *slot) match(a *codec.Answer) *call {
	switch a.Kind {
	case 'R', 'N':
		var prev *call
		for c := s.rel[a.Token]; c != nil; prev, c = c, c.next {
			if c.key != string(a.Key) {
				continue
			}
			switch {
			case prev != nil:
				prev.next = c.next
			case c.next != nil:
				s.rel[a.Token] = c.next
			default:
				delete(s.rel, a.Token)
			}
			c.next = nil
			return c
		}
		return nil
	}
	// A, T, B: a generated owner is the client id, a dot and the sequence.
	if p := s.cl.idPrefix; len(a.Owner) > len(p) && string(a.Owner[:len(p)]) == p {
		if seq, ok := parseSeq(a.Owner[len(p):]); ok {
			if c := s.acq[seq]; c != nil && c.key == string(a.Key) {
				delete(s.acq, seq)
				return c
			}
		}
	}
	// The conversions in the index make no copies; delete uses c's strings.
	if c := s.named[namedKey{string(a.Owner), string(a.Key)}]; c != nil {
		delete(s.named, namedKey{c.owner, c.key})
		return c
	}
	return nil
}

// parseSeq parses the decimal sequence of a generated owner. A leading zero
// is refused: the client never writes one, so such an owner is not its own.
func parseSeq(b []byte) (uint64, bool) {
	if len(b) == 0 || b[0] == '0' {
		return 0, false
	}
	v, err := strconv.ParseUint(string(b), 10, 64) // no allocation when it parses
	return v, err == nil
}
