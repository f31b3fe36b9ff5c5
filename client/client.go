package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ticketd/ticketd/codec"
	"github.com/ticketd/ticketd/shard"
)

// Client is a connection pool to ticketd. All its methods are safe for
// concurrent use by any number of goroutines.
type Client struct {
	cfg      config
	addrs    []string
	addrList string // addrs joined, for errors
	idPrefix string // client id + "."
	slots    []*slot
	seq      atomic.Uint64 // sequence of generated owners
	closed   atomic.Bool
	shut     atomic.Bool     // Close's flush is over: a connection served from now on is closed at once
	ctx      context.Context // ends at Close: stops dialling and backoff
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	lastErr  atomic.Pointer[error] // why nothing is up (the last dial's error, or ErrClosedAtOnce), for calls made meanwhile
}

// Lock is a granted acquire. It is a plain value: copy it, store it, or hand
// it to another process; the token alone proves holdership.
type Lock struct {
	Key   string
	Token uint64 // fencing token: larger than every token granted for Key before

	// Deadline is a local, conservative end of the lease: the lease runs on
	// the server from the grant, and Deadline counts from the moment the
	// request was sent, which is not later than the grant. For a grant that
	// may have waited in the queue (wait > 0) it counts from the latest
	// send of a request answered before it on the same connection, if that
	// is later: the server renews a hand-over whose answer leaves late
	// (single mode: more than 10µs after its lease started; a cluster node
	// that applied it late), so its lease runs from no earlier than its
	// answer's leaving, which came after those answers. Time the grant
	// spent queued while the connection carried nothing else is not in
	// Deadline: the lease runs that much longer on the server than Deadline
	// says. In cluster mode this holds while the nodes' clocks differ by
	// less than half --max-clock-skew. It carries a monotonic clock
	// reading, so time.Until(Deadline) is immune to wall clock changes.
	// The server's clock rate can still differ a little from the local
	// one: keep a margin.
	Deadline time.Time

	// keep is the other bound: about the latest the lease can still run on
	// the server (keepFor from its A's arrival). Until then a release whose
	// connection broke is worth sending again; Deadline, which leaves out
	// the time a grant waited queued, may have passed long before.
	keep time.Time

	// The owner the acquire was sent with: the AcquireAs name, or the
	// client id prefix and the sequence of a generated owner. Kept in parts
	// so that an Acquire costs no allocation; Owner joins them on request.
	owner string
	seq   uint64
}

// Owner returns the owner name the acquire was sent with ("" for a Lock
// made by hand from a key and a token).
func (l Lock) Owner() string {
	if l.seq == 0 {
		return l.owner
	}
	var b [codec.MaxOwner]byte
	return string(strconv.AppendUint(append(b[:0], l.owner...), l.seq, 10))
}

// Dial connects to the ticketd at addr, a host:port or a comma-separated
// list of them (a cluster: any node serves any key). Each connection makes
// its first attempt at once, on its own address and then the others; Dial
// returns when all have, with at least one up. The others, and any that
// breaks later, are (re)connected in the background with backoff, trying
// the addresses in turn. ctx bounds only the first connection attempts.
//
// Dial fails with a *ConnError (errors.Is(err, ErrConnBroken)) when no
// address could be reached, and with ErrInvalid for a bad option or an
// address that is not host:port.
func Dial(ctx context.Context, addr string, opts ...Option) (*Client, error) {
	cfg := defaultConfig()
	for _, o := range opts {
		o(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	var addrs []string
	for a := range strings.SplitSeq(addr, ",") {
		if a = strings.TrimSpace(a); a == "" {
			continue
		}
		// A typo is the caller's, not a server out of reach.
		if _, port, err := net.SplitHostPort(a); err != nil || port == "" {
			return nil, fmt.Errorf("%w: address %q: want HOST:PORT, several comma-separated", ErrInvalid, a)
		}
		addrs = append(addrs, a)
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("%w: no server address given", ErrInvalid)
	}
	cl := &Client{
		cfg:      cfg,
		addrs:    addrs,
		addrList: strings.Join(addrs, ","),
		idPrefix: cfg.clientID + ".",
	}
	cl.ctx, cl.cancel = context.WithCancel(context.Background())
	for i := range cfg.conns {
		cl.slots = append(cl.slots, newSlot(cl, i%len(addrs)))
	}
	// Every connection makes its first attempt at once: one after another,
	// an address that drops packets held Dial a dial timeout for each
	// connection homed on it.
	conns := make([]net.Conn, cfg.conns)
	errs := make([]error, cfg.conns)
	var dialing sync.WaitGroup
	for i, s := range cl.slots {
		dialing.Go(func() { conns[i], errs[i] = s.dial(ctx) })
	}
	dialing.Wait()
	up := 0
	for i, s := range cl.slots {
		if errs[i] == nil {
			s.head.Store(nil) // take calls at once; the writer drains them when it starts
			up++
		}
	}
	if up == 0 {
		cl.cancel()
		return nil, errs[0]
	}
	for i, s := range cl.slots {
		cl.wg.Add(1)
		go s.run(conns[i]) // nil: redials in the background
	}
	return cl, nil
}

// Close closes every connection and stops reconnecting. Acquires sent and
// not yet answered fail at once with a *ConnError that wraps ErrClosed;
// those not yet written are not sent, and fail so as the connections close,
// as do other calls in flight. Releases already queued (by ReleaseNoWait,
// by a Release still waiting, or by the client for a grant that came after
// its caller gave up) are written first, and their answers awaited; then
// each connection is shut for sending, so that the server withdraws the
// acquires still queued there and ends it, and a grant decided before that,
// which no caller will have, is released on a connection of Close's own.
// Each step takes up to the dial timeout. Later calls return ErrClosed.
// Locks held stay held until released (by another client, with their
// tokens) or until their leases end.
func (cl *Client) Close() error {
	if !cl.closed.CompareAndSwap(false, true) {
		return nil
	}
	deadline := time.Now().Add(cl.cfg.dialTimeout)
	var flushing sync.WaitGroup
	for _, s := range cl.slots {
		flushing.Go(func() { s.closeFlush(deadline) })
	}
	flushing.Wait()
	cl.shut.Store(true)
	cl.cancel()
	for _, s := range cl.slots {
		s.closeConn()
	}
	cl.wg.Wait()
	cl.sendLate()
	return nil
}

// sendLate sends the releases that Close's connections left to it
// (slot.late) on a connection of its own, to the first address that takes
// them, within the dial timeout; what does not get through stays held to
// its lease's end, as it would have.
func (cl *Client) sendLate() {
	var out []byte
	now := time.Now()
	for _, s := range cl.slots {
		s.lateMu.Lock()
		for _, r := range s.late {
			if now.Before(r.keep) {
				out = codec.AppendRelease(out, r.token, []byte(r.key))
			}
		}
		s.late = nil
		s.lateMu.Unlock()
	}
	if len(out) == 0 {
		return
	}
	deadline := now.Add(cl.cfg.dialTimeout)
	for _, addr := range cl.addrs {
		if releasedOn(addr, out, deadline) || !time.Now().Before(deadline) {
			return
		}
	}
}

// releasedOn writes the release lines out to addr, shuts the sending side
// and reads the answers to the end of the server's stream, so that closing
// resets nothing still on its way. False if that failed, or a node of a
// cluster could not carry them out (E unavailable): another address may.
func releasedOn(addr string, out []byte, deadline time.Time) bool {
	d := net.Dialer{Deadline: deadline}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		return false
	}
	defer nc.Close()
	_ = nc.SetDeadline(deadline)
	if _, err := nc.Write(out); err != nil {
		return false
	}
	if cw, ok := nc.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	in, err := io.ReadAll(nc)
	return err == nil && !bytes.HasPrefix(in, []byte("E ")) && !bytes.Contains(in, []byte("\nE "))
}

// Acquire asks for key with a lease of lease, waiting up to wait in the
// server's queue if the key is held (wait 0: answer at once). Both are sent
// in whole milliseconds, truncated; lease must be at least 1ms.
//
// It returns the Lock, or:
//   - ErrHeld: held by someone else until the wait passed;
//   - ErrWaitEnded: the server ended the wait before it passed (it is
//     shutting down); errors.Is(err, ErrHeld) holds for it too;
//   - ErrBusy: the server is at capacity;
//   - a *ConnError: the connection broke, or none is up (check
//     errors.Is(err, ErrOutcomeUnknown));
//   - ErrInvalid (wrapped): a bad key, lease or wait; nothing was sent;
//   - ctx.Err(): ctx ended first.
//
// ctx bounds the call. If it has a deadline, the wait sent is cut to the
// time left, so that the server gives up too. If ctx ends while the acquire
// is still queued, Acquire returns at once; should the grant arrive later,
// the client releases it by itself, so no lock is left behind.
//
// A grant that waited in the queue may come with its Deadline near, or
// even past: Deadline leaves out the time the acquire waited while its
// connection carried nothing else (see Lock.Deadline), since the client
// cannot tell it from a delay of the answer. A holder that acts on
// Deadline needs a lease longer than the wait and the work together: then
// the Deadline of a grant at any moment of the wait leaves time for the
// work.
func (cl *Client) Acquire(ctx context.Context, key string, lease, wait time.Duration) (Lock, error) {
	return cl.acquire(ctx, "", key, lease, wait)
}

// AcquireAs is Acquire with an owner name of the caller's choice instead of a
// generated one, for owners that people read (logs, admin views). The owner
// must be unique among the acquires of key this client has in flight on one
// connection (answers are matched by owner and key); an acquire that would
// clash fails with ErrInvalid. One whose caller gave up (its ctx ended) while
// the server queued it stays in flight until the server answers it, at the
// latest when its wait passes: a new AcquireAs under the same owner and key
// clashes with it until then. Names that start with the client id and a dot
// are reserved for generated owners.
func (cl *Client) AcquireAs(ctx context.Context, owner, key string, lease, wait time.Duration) (Lock, error) {
	if !validField(owner, codec.MaxOwner) {
		return Lock{}, fmt.Errorf("%w: owner %q: want 1 to %d bytes without spaces or control bytes",
			ErrInvalid, owner, codec.MaxOwner)
	}
	if strings.HasPrefix(owner, cl.idPrefix) {
		return Lock{}, fmt.Errorf("%w: owner %q: the prefix %q is reserved for generated owners",
			ErrInvalid, owner, cl.idPrefix)
	}
	return cl.acquire(ctx, owner, key, lease, wait)
}

func (cl *Client) acquire(ctx context.Context, owner, key string, lease, wait time.Duration) (Lock, error) {
	if err := cl.checkAcquire(key, lease, wait); err != nil {
		return Lock{}, err
	}
	if err := ctx.Err(); err != nil {
		return Lock{}, err
	}
	if dl, ok := ctx.Deadline(); ok {
		left := time.Until(dl)
		if left <= 0 {
			return Lock{}, context.DeadlineExceeded
		}
		wait = min(wait, left)
	}
	c, err := cl.queueAcquire(owner, key, lease, wait, nil)
	if err != nil {
		return Lock{}, err
	}
	if !c.wait(ctx) {
		return Lock{}, ctx.Err()
	}
	l, err := cl.acquired(c)
	putCall(c)
	return l, err
}

// checkAcquire refuses what no acquire may carry.
func (cl *Client) checkAcquire(key string, lease, wait time.Duration) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if lease < time.Millisecond || lease > cl.cfg.maxLease {
		return fmt.Errorf("%w: lease %v: want 1ms to %v", ErrInvalid, lease, cl.cfg.maxLease)
	}
	if wait < 0 || wait > cl.cfg.maxWait {
		return fmt.Errorf("%w: wait %v: want 0 to %v", ErrInvalid, wait, cl.cfg.maxWait)
	}
	return nil
}

// queueAcquire hands a checked acquire to a connection and returns its call
// to wait on, or with fn, nil: fn gets the outcome.
func (cl *Client) queueAcquire(owner, key string, lease, wait time.Duration, fn func(Lock, error)) (*call, error) {
	if cl.closed.Load() {
		return nil, ErrClosed
	}
	c := getCall()
	c.kind = 'A'
	c.key = key
	c.leaseMs = uint64(lease / time.Millisecond)
	c.waitMs = uint64(wait / time.Millisecond)
	c.onAcquire = fn
	if owner == "" {
		c.seq = cl.seq.Add(1)
	} else {
		c.owner = owner
	}
	if err := cl.submitOrFail(c); err != nil {
		putCall(c)
		return nil, err
	}
	if fn != nil {
		return nil, nil // answered and recycled maybe already: not ours to touch
	}
	return c, nil
}

// acquired is the outcome of an answered (or failed) acquire.
func (cl *Client) acquired(c *call) (Lock, error) {
	switch {
	case c.err != nil:
		return Lock{}, c.err
	case c.res == 'A':
		l := Lock{Key: c.key, Token: c.resToken, owner: c.owner,
			Deadline: c.start.Add(time.Duration(c.leaseMs) * time.Millisecond), keep: c.keep}
		if c.owner == "" {
			l.owner, l.seq = cl.idPrefix, c.seq
		}
		return l, nil
	case c.res == 'T' && c.early:
		return Lock{}, ErrWaitEnded
	case c.res == 'T':
		return Lock{}, ErrHeld
	default: // 'B'
		return Lock{}, ErrBusy
	}
}

// Release gives up l (by its Key and Token). It returns nil when the server
// released it, ErrNotHeld when the token does not hold the key (released
// before, or expired and taken over), a *ConnError, or ctx.Err() if ctx ended
// first; in the last two cases the release may still have been carried out
// (with ctx ended before the call, it is sent all the same, unawaited).
//
// If the connection breaks before the answer (a cluster node failed, or
// answered E unavailable), the release is sent again on another connection,
// or if none is up when its own connection is back, while the lease may
// still run on the server (for a Lock from this client, up to twice the
// lease and 10 s after its A arrived; for one made by hand, to l.Deadline),
// so that a node's failure does not leave the lock held to the end of its
// lease. A copy's N that arrives before l.Deadline means that the first one
// released the key (or, in single mode, that a restart forgot the holder,
// whose lease the server's grace period still keeps), and Release returns
// nil for it as for R. A *ConnError with an unknown outcome comes only when
// no connection came up in time, the copy's N came after l.Deadline (the
// lease may have ended, and the key gone on, first), or the client was
// closed (a Lock made by hand without a Deadline is never sent again).
func (cl *Client) Release(ctx context.Context, l Lock) error {
	if err := checkLock(l); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		// Sent all the same, as when ctx ends while the release is queued:
		// its caller wants the lock released whether or not it waits.
		if _, qerr := cl.queueRelease(l, true, nil); qerr != nil {
			return qerr
		}
		return err
	}
	c, err := cl.queueRelease(l, false, nil)
	if err != nil {
		return err
	}
	if !c.wait(ctx) {
		return ctx.Err()
	}
	err = released(c)
	putCall(c)
	return err
}

// released is the outcome of an answered (or failed) release.
func released(c *call) error {
	switch {
	case c.err != nil:
		return c.err
	case c.res == 'N' && !c.resent:
		return ErrNotHeld
	}
	// R, or N to a release sent again (see slot.resend) that arrived before
	// the lock's Deadline (a later one fails with an unknown outcome): the
	// token held the key until one of the two copies released it.
	return nil
}

// ReleaseNoWait gives up l like Release, but returns as soon as the release
// is queued, without waiting for the server's answer: the caller saves a
// round trip, and the release goes out with the next write on its
// connection, beside the requests of other callers. It returns an error only
// if the release cannot be queued (ErrInvalid, ErrClosed, or a *ConnError
// when no connection is up); what the server answers is not reported. A
// release queued when its connection breaks goes out on another one; if
// none is up, when its own connection is back, unless the lease has ended
// by then (as Release judges it). A later Acquire of
// the same key by this client goes out after it on the same connection, so
// it is not refused by the lock it just gave up (unless that connection
// breaks in between, or, in cluster mode, the key's shard changes leader
// while both are in flight: the node proposes both again, in any order, and
// an acquire that does not wait may then get ErrHeld; one that waits is
// granted once the release lands). One sent and left unanswered by a broken
// connection is sent again, as Release does.
func (cl *Client) ReleaseNoWait(l Lock) error {
	if err := checkLock(l); err != nil {
		return err
	}
	_, err := cl.queueRelease(l, true, nil)
	return err
}

// AcquireFunc is Acquire for code that keeps many acquires in flight
// without a goroutine for each: it queues the acquire and returns at once,
// and fn gets the outcome Acquire would return (never ctx.Err(): the wait
// alone bounds the call). The grant then reaches fn with no goroutine
// hand-off in between.
//
// If AcquireFunc returns an error (ErrInvalid, ErrClosed, or a *ConnError
// when no connection is up), nothing was queued and fn is not called.
// Otherwise fn is called exactly once, on the goroutine of the connection
// that reads the answer (or fails the call), so it must not block: every
// other answer on that connection waits for it. It may call AcquireFunc,
// ReleaseFunc and ReleaseNoWait, whose requests go out with the replies of
// other callers to the same read; never Acquire or Release, whose answers
// that goroutine would have to read, nor Close, which waits for it.
func (cl *Client) AcquireFunc(key string, lease, wait time.Duration, fn func(Lock, error)) error {
	if fn == nil {
		return fmt.Errorf("%w: nil func", ErrInvalid)
	}
	if err := cl.checkAcquire(key, lease, wait); err != nil {
		return err
	}
	_, err := cl.queueAcquire("", key, lease, wait, fn)
	return err
}

// ReleaseFunc is Release in the manner of AcquireFunc: it queues the release
// of l and returns at once, and fn gets the outcome Release would return,
// under the same rules, but one: a release held for the next connection
// after a break that fails when the lease has ended (as Release judges it),
// with no connection up by then, reaches fn on a timer's goroutine (at
// Close, on the connection's, before Close returns).
func (cl *Client) ReleaseFunc(l Lock, fn func(error)) error {
	if fn == nil {
		return fmt.Errorf("%w: nil func", ErrInvalid)
	}
	if err := checkLock(l); err != nil {
		return err
	}
	_, err := cl.queueRelease(l, false, fn)
	return err
}

// checkLock refuses a Lock that no grant can have made.
func checkLock(l Lock) error {
	if err := checkKey(l.Key); err != nil {
		return err
	}
	if l.Token == 0 {
		return fmt.Errorf("%w: token 0 (not a granted lock)", ErrInvalid)
	}
	return nil
}

// queueRelease hands a release of l to a connection and returns its call to
// wait on. With noWait nobody waits for the answer, the connection recycles
// the call, and nil is returned; so too with fn, which gets the outcome.
func (cl *Client) queueRelease(l Lock, noWait bool, fn func(error)) (*call, error) {
	if cl.closed.Load() {
		return nil, ErrClosed
	}
	c := getCall()
	c.kind, c.internal, c.key, c.token, c.onRelease = 'R', noWait, l.Key, l.Token, fn
	c.until, c.keep = l.Deadline, l.keep
	if c.keep.IsZero() { // a Lock made by hand: its Deadline is all there is
		c.keep = l.Deadline
	}
	if err := cl.submitOrFail(c); err != nil {
		putCall(c)
		return nil, err
	}
	if noWait || fn != nil {
		return nil, nil // answered and recycled maybe already: not ours to touch
	}
	return c, nil
}

func checkKey(key string) error {
	if !validField(key, codec.MaxKey) {
		return fmt.Errorf("%w: key %q: want 1 to %d bytes without spaces or control bytes",
			ErrInvalid, key, codec.MaxKey)
	}
	return nil
}

// submitOrFail hands c to a connection, or says why none takes it.
func (cl *Client) submitOrFail(c *call) error {
	if cl.submit(c, nil) {
		return nil
	}
	if cl.closed.Load() {
		return ErrClosed
	}
	cause := errors.New("no connection is up")
	if p := cl.lastErr.Load(); p != nil {
		cause = *p
	}
	return &ConnError{Addr: cl.addrList, Err: cause}
}

// submit pushes c onto the queue of an open connection other than except:
// the one its key hashes to, or if that one is down the next one up. Every
// request for a key goes out on one connection, so the release a reader
// hands to a caller comes back to that reader, which writes it with the
// other replies to the same read (see readLoop), and a release and the next
// acquire of the key stay in order.
func (cl *Client) submit(c *call, except *slot) bool {
	n := uint32(len(cl.slots))
	i0 := uint32(shard.Index(c.key, int(n)))
	for i := range n {
		s := cl.slots[(i0+i)%n]
		if s != except && s.push(c) {
			return true
		}
	}
	return false
}

// Call states. A caller that gives up moves waiting to abandoned and so
// hands the call to the connection, which recycles it (and releases a late
// grant); otherwise the connection moves it to done and signals the caller,
// which recycles it.
const (
	stWaiting uint32 = iota
	stAbandoned
	stDone
)

// call is the state of one request, from a sync.Pool.
type call struct {
	next     *call // in a connection's submission stack, or a release chain in pending
	state    atomic.Uint32
	kind     byte // 'A' or 'R'
	internal bool // a release nobody waits for (a late grant's, or ReleaseNoWait)
	seq      uint64
	owner    string // AcquireAs only
	key      string
	leaseMs  uint64
	waitMs   uint64
	token    uint64
	sent     time.Time // when the batch holding the request was written
	until    time.Time // release: the lock's Deadline, before which a copy's N means released
	keep     time.Time // release: the lock's keep, before which a lost copy is sent again; acquire: set with an A
	resent   bool      // release: sent again after its connection broke unanswered

	// AcquireFunc and ReleaseFunc: called with the outcome instead of
	// waking a waiting caller.
	onAcquire func(Lock, error)
	onRelease func(error)

	// Set by the connection before done is signalled.
	res      byte // answer kind
	resToken uint64
	early    bool      // a T that came before the wait could have passed
	start    time.Time // grant time estimate (acquire)
	err      error
	done     chan struct{} // capacity 1, one signal per use
}

var callPool = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1)} }}

func getCall() *call { return callPool.Get().(*call) }

func putCall(c *call) {
	*c = call{done: c.done} // stWaiting, and nothing of this use left behind
	callPool.Put(c)
}

// wait blocks until the call is answered (true) or ctx ends and the call is
// handed to the connection (false; the caller must not touch c again).
func (c *call) wait(ctx context.Context) bool {
	done := ctx.Done()
	if done == nil { // a context that never ends: a plain receive is cheaper than a select
		<-c.done
		return true
	}
	select {
	case <-c.done:
		return true
	case <-done:
		if c.state.CompareAndSwap(stWaiting, stAbandoned) {
			return false
		}
		<-c.done // answered just now
		return true
	}
}
