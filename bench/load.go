package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
)

// Dist chooses the key of each acquire.
type Dist struct {
	Keys    int     // uniform over this many keys ...
	Hot     int     // ... except that the first Hot of them ...
	HotFrac float64 // ... get this share of all acquires (hot keys queue and hand over)
}

func (d Dist) String() string {
	if d.Hot > 0 && d.HotFrac > 0 {
		return fmt.Sprintf("%d keys, %.0f%% on %d hot", d.Keys, 100*d.HotFrac, d.Hot)
	}
	return fmt.Sprintf("%d keys uniform", d.Keys)
}

// Load describes one run of the generator.
type Load struct {
	System System
	Addr   string
	// Addrs, when given, spread the connections over several servers (the
	// nodes of a cluster) in turn; Addr is then only a label.
	Addrs []string
	Conns int
	// Depth is the most lock pairs in flight per connection. Closed loop keeps
	// exactly Depth in flight; open loop delays an acquire that finds Depth in
	// flight (and charges the delay to its latency). 0: 1 closed, 256 open.
	Depth int
	// Rate > 0 selects open loop: acquires per second over all connections,
	// evenly spaced per connection. 0: closed loop.
	Rate     float64
	Warmup   time.Duration
	Duration time.Duration // the measured window; 0 with Pairs > 0: until Pairs
	Pairs    int64         // with Duration 0: stop once the window has this many pairs
	Keys     Dist
	// KeyPrefix starts every key, so that runs on one server do not meet.
	KeyPrefix string
	LeaseMs   uint64 // 0: 30000
	WaitMs    uint64 // ticketd: how long an acquire may queue (0: answer T at once)
	// Sources are local addresses to dial from, in turn (e.g. 127.0.0.2 ...):
	// each gives its own range of source ports.
	Sources []string
	// Drain is how long pairs in flight at the end may take to finish, so that
	// the run leaves no key held (0: 2s).
	Drain time.Duration
	Seed  uint64
	// Reconnect (closed loop, ticketd): a connection the server closes, or
	// ends with `E unavailable`, is dialled again to the next address; the
	// pairs it had in flight are counted lost and start afresh. Without it
	// either ends the run with an error.
	Reconnect bool
	// Trace, when set, records every answer by shard and time.
	Trace *Trace
	// Progress gets a line a second while the run goes (nil: quiet), prefixed
	// with Label.
	Progress io.Writer
	Label    string
}

func (l *Load) validate() error {
	if l.Addr == "" && len(l.Addrs) > 0 {
		l.Addr = strings.Join(l.Addrs, ",")
	}
	if l.Addr == "" {
		return errors.New("bench: no address")
	}
	if l.Reconnect && (l.Rate > 0 || l.System != Ticketd) {
		return errors.New("bench: Reconnect is for ticketd in closed loop")
	}
	if l.Conns <= 0 {
		return errors.New("bench: Conns must be > 0")
	}
	if l.Duration <= 0 && l.Pairs <= 0 {
		return errors.New("bench: give Duration or Pairs")
	}
	if l.Keys.Keys <= 0 {
		return errors.New("bench: Keys.Keys must be > 0")
	}
	if l.Keys.Hot > l.Keys.Keys || l.Keys.HotFrac < 0 || l.Keys.HotFrac > 1 {
		return errors.New("bench: hot keys must be a subset and HotFrac within [0,1]")
	}
	if l.Rate < 0 {
		return errors.New("bench: Rate must be >= 0")
	}
	if l.Depth == 0 {
		l.Depth = 1
		if l.Rate > 0 {
			l.Depth = 256
		}
	}
	if l.LeaseMs == 0 {
		l.LeaseMs = 30000
	}
	if l.Drain == 0 {
		l.Drain = 2 * time.Second
	}
	if l.Label == "" {
		l.Label = string(l.System)
	}
	return nil
}

// Result is what one run measured.
type Result struct {
	Load   Load
	Window time.Duration // measured time
	Lines  int64         // answers in the window
	Pairs  int64         // lock pairs completed (release answered) in the window
	// Answers in the window by meaning.
	Acquired, Refused, Released, NotReleased int64
	// Latency of every request line sent (open loop: due) in the window,
	// whenever its answer came, Acquire of acquires alone (a waiter's wait),
	// SendLag (open loop) how late the generator sent against its schedule.
	// Nanoseconds.
	Latency, Acquire, SendLag *hdrhistogram.Histogram
	// LongestAcquire is the longest wait of an acquire answered in the window
	// or the drain, whenever it was sent: a wait that began in the warm-up
	// is not in Acquire, and is still a wait.
	LongestAcquire time.Duration
	// GrantsPerConn counts the grants each connection got in the window.
	GrantsPerConn []int64
	// Overruns counts acquires in open loop that found Depth pairs in flight
	// on their connection and waited.
	Overruns int64
	// With Load.Reconnect: connections dialled again, how many of those ends
	// were `E unavailable`, the requests in flight they took with them
	// (outcome unknown), and the longest a reconnecting connection went from
	// its last answer before the end to its first answer after.
	Reconnects, Unavailable, Lost int64
	Outage                        time.Duration
	// Unanswered counts the requests still without an answer when the drain
	// ended, and (open loop) the acquires due in the window never sent; a
	// run that leaves any fails.
	Unanswered int64
}

// LinesPerSec is answers per second in the window.
func (r *Result) LinesPerSec() float64 { return float64(r.Lines) / r.Window.Seconds() }

// PairsPerSec is completed lock pairs per second in the window.
func (r *Result) PairsPerSec() float64 { return float64(r.Pairs) / r.Window.Seconds() }

// Q returns the latency quantile q (0..100) of h.
func Q(h *hdrhistogram.Histogram, q float64) time.Duration {
	if h == nil || h.TotalCount() == 0 {
		return 0
	}
	return time.Duration(h.ValueAtQuantile(q))
}

func newHist() *hdrhistogram.Histogram {
	return hdrhistogram.New(1000, int64(100*time.Second), 3) // 1µs .. 100s, 3 digits
}

func record(h *hdrhistogram.Histogram, vs []int64) {
	for _, v := range vs {
		if v < 0 {
			v = 0
		}
		if v > h.HighestTrackableValue() {
			v = h.HighestTrackableValue()
		}
		_ = h.RecordValue(v)
	}
}

var clockBase = time.Now()

// nanotime is monotonic nanoseconds since the process started.
func nanotime() int64 { return int64(time.Since(clockBase)) }

// run is the state all connections of one Load share.
type run struct {
	l        *Load
	w        wire
	open     bool
	start    int64        // when sending begins
	winStart int64        // start + warm-up
	endAt    atomic.Int64 // end of the window; the last sends are before it
	stopping atomic.Bool  // no new pairs
	winPairs atomic.Int64 // with Load.Pairs: pairs in the window so far
	dead     atomic.Bool  // drain time is over: give up
	stopCh   chan struct{}

	errOnce sync.Once
	err     error
	failed  atomic.Bool

	shards []*recShard
	addrs  []string
}

// stop ends the window at now (if it has not ended) and starts the drain.
func (r *run) stop(now int64) {
	if r.stopping.CompareAndSwap(false, true) {
		if r.endAt.Load() > now {
			r.endAt.Store(now)
		}
		close(r.stopCh)
	}
}

func (r *run) fail(err error) {
	r.errOnce.Do(func() { r.err = err })
	r.failed.Store(true)
}

// recShard is a set of histograms several connections record into, a
// batch at a time: one per connection would take too much memory at
// thousands of connections.
type recShard struct {
	mu            sync.Mutex
	lat, acq, lag *hdrhistogram.Histogram
}

type slotState uint8

const (
	slotFree slotState = iota
	slotAcquiring
	slotReleasing
)

// slot is one lock pair in flight; key and owner are its own buffers.
type slot struct {
	index int32
	state slotState
	gen   uint64
	token uint64
	stamp int64 // send time (closed) or intended send time (open) of the request in flight
	key   []byte
	owner []byte
}

type conn struct {
	r     *run
	id    int
	nc    net.Conn
	rng   *rand.Rand
	shard *recShard

	leaseMs, waitMs uint64
	leaseText       []byte // Redis PX argument
	ownerPrefix     []byte // "c<id>."
	addr            int    // index into run.addrs of the server dialled

	mu        sync.Mutex // slots, free, fifo, releases, wbuf, counters: reader and sender
	slots     []slot
	free      []int32
	inflight  int
	fifo      []int32 // ordered wires: slots in the order their requests went out
	fifoHead  int
	releases  releaseTable // ticketd: releases in flight
	wbuf      []byte
	fakeToken uint64

	// open loop sender state
	next    int64 // intended time of the next acquire
	every   int64 // spacing of acquires
	blocked bool  // the sender waits for a free slot
	kick    chan struct{}

	rbuf []byte
	rlen int

	// per batch, flushed to the shard: lat and acq by the reader, lag (under
	// mu) by whoever sent acquires
	lat, acq, lag []int64

	// window counters, under mu
	grants, lines, pairs, acquired, refused, released, notReleased, overruns int64

	// reconnection, under mu: counted over the whole run, not the window
	reconnects, unavailable, lost int64
	longestAcq                    int64 // see Result.LongestAcquire
	lastAnswer                    int64 // time of the latest answer
	outageFrom                    int64 // last answer before a reconnect, until the first after
	outage                        int64 // longest such stretch

	progress atomic.Int64 // answers so far, for the progress line
	slowest  atomic.Int64 // longest latency since the last progress line, ns
}

// Run drives one load and returns what it measured. It dials every
// connection first, then sends for Warmup+Duration, then lets the pairs in
// flight finish (at most Drain) and closes the connections.
func Run(ctx context.Context, l Load) (*Result, error) {
	if err := l.validate(); err != nil {
		return nil, err
	}
	w, err := newWire(l.System)
	if err != nil {
		return nil, err
	}
	if l.System == Redis {
		if err := redisSetup(l.Addr); err != nil { // EVALSHA needs the script loaded
			return nil, fmt.Errorf("bench: redis at %s: loading the release script: %w", l.Addr, err)
		}
	}
	addrs := l.Addrs
	if len(addrs) == 0 {
		addrs = []string{l.Addr}
	}
	ncs, err := dialSpread(ctx, addrs, l.Conns, l.Sources)
	if err != nil {
		return nil, err
	}

	r := &run{l: &l, w: w, open: l.Rate > 0, stopCh: make(chan struct{}), addrs: addrs}
	nshards := min(l.Conns, 16)
	for range nshards {
		r.shards = append(r.shards, &recShard{lat: newHist(), acq: newHist(), lag: newHist()})
	}
	conns := make([]*conn, l.Conns)
	rbufSize := max(4096, min(64<<10, l.Depth*2*160))
	for i := range conns {
		c := &conn{
			r: r, id: i, nc: ncs[i], shard: r.shards[i%nshards], addr: i % len(addrs),
			rng:     rand.New(rand.NewPCG(l.Seed, uint64(i))),
			leaseMs: l.LeaseMs, waitMs: l.WaitMs,
			leaseText:   strconv.AppendUint(nil, l.LeaseMs, 10),
			ownerPrefix: fmt.Appendf(nil, "c%d.", i),
			slots:       make([]slot, l.Depth),
			releases:    newReleaseTable(max(l.Depth, 1)),
			rbuf:        make([]byte, rbufSize),
			kick:        make(chan struct{}, 1),
		}
		if w.ordered() {
			c.fifo = make([]int32, 0, 2*l.Depth)
		}
		for j := range c.slots {
			c.slots[j].index = int32(j)
			c.free = append(c.free, int32(l.Depth-1-j))
		}
		conns[i] = c
	}
	defer func() {
		for _, c := range conns {
			c.mu.Lock()
			c.nc.Close()
			c.mu.Unlock()
		}
	}()

	r.start = nanotime() + int64(10*time.Millisecond)
	r.winStart = r.start + int64(l.Warmup)
	if l.Duration > 0 {
		r.endAt.Store(r.winStart + int64(l.Duration))
	} else {
		r.endAt.Store(math.MaxInt64)
	}
	if l.Trace != nil {
		l.Trace.begin(r.start, l.Warmup+l.Duration+l.Drain+time.Second)
	}
	if r.open {
		every := float64(l.Conns) / l.Rate * 1e9
		for _, c := range conns {
			c.every = int64(every)
			c.next = r.start + int64(c.rng.Float64()*every) // spread connections over one interval
		}
	}

	var wg sync.WaitGroup
	for _, c := range conns {
		if r.open {
			wg.Go(c.sender)
		}
		wg.Go(c.reader)
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()

	r.monitor(ctx, conns, done)

	res := &Result{Load: l, Latency: newHist(), Acquire: newHist(), SendLag: newHist()}
	end := r.endAt.Load()
	res.Window = time.Duration(end - r.winStart)
	for _, s := range r.shards {
		res.Latency.Merge(s.lat)
		res.Acquire.Merge(s.acq)
		res.SendLag.Merge(s.lag)
	}
	for _, c := range conns {
		res.GrantsPerConn = append(res.GrantsPerConn, c.grants)
		res.Lines += c.lines
		res.Pairs += c.pairs
		res.Acquired += c.acquired
		res.Refused += c.refused
		res.Released += c.released
		res.NotReleased += c.notReleased
		res.Overruns += c.overruns
		res.Reconnects += c.reconnects
		res.Unavailable += c.unavailable
		res.Lost += c.lost
		res.Outage = max(res.Outage, time.Duration(c.outage))
		res.LongestAcquire = max(res.LongestAcquire, time.Duration(c.longestAcq))
		c.mu.Lock()
		res.Unanswered += int64(c.inflight) + c.unsentLocked(end)
		c.mu.Unlock()
	}
	if l.Trace != nil {
		l.Trace.end(r.winStart, end)
	}
	if r.err != nil {
		return res, r.err
	}
	if err := ctx.Err(); err != nil {
		return res, err
	}
	if res.Unanswered > 0 {
		// Left out, they would leave the tail out of the figures.
		return res, fmt.Errorf("%s: %d requests of the window unanswered %v after it ended", l.System, res.Unanswered, l.Drain)
	}
	return res, nil
}

// unsentLocked (open loop) counts the acquires due before end that were
// never sent (their slots stayed busy through the drain).
func (c *conn) unsentLocked(end int64) int64 {
	if !c.r.open || c.every <= 0 || c.next >= end {
		return 0
	}
	return (end-c.next-1)/c.every + 1
}

// finishedLocked: nothing of c's is in flight, or still to send, in a run
// that is stopping.
func (c *conn) finishedLocked() bool {
	r := c.r
	return r.stopping.Load() && c.inflight == 0 &&
		(!r.open || c.next >= r.endAt.Load() || r.failed.Load() || r.dead.Load())
}

// monitor ends the window (by time, by pair count or by ctx), prints
// progress, and after the window gives the pairs in flight Drain to finish.
func (r *run) monitor(ctx context.Context, conns []*conn, done <-chan struct{}) {
	l := r.l
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	lastPrint, lastLines := nanotime(), int64(0)
	stop := r.stop
	var drainUntil int64
	ctxDone := ctx.Done()
	for {
		select {
		case <-done:
			stop(nanotime())
			return
		case <-ctxDone:
			stop(nanotime())
			ctxDone = nil // closed for good: select on it no more
		case <-tick.C:
		}
		now := nanotime()
		if r.failed.Load() || r.dead.Load() {
			stop(now)
		}
		if !r.stopping.Load() {
			if now >= r.endAt.Load() {
				stop(now)
			}
		}
		if r.stopping.Load() {
			if drainUntil == 0 {
				drainUntil = now + int64(l.Drain)
			}
			if now >= drainUntil && !r.dead.Swap(true) {
				// Pairs still open now stay open; unblock every reader.
				for _, c := range conns {
					c.deadlineNow()
					c.wake()
				}
			}
			continue
		}
		if l.Progress != nil && now-lastPrint >= int64(time.Second) {
			var lines, slowest int64
			for _, c := range conns {
				lines += c.progress.Load()
				slowest = max(slowest, c.slowest.Swap(0))
			}
			el := time.Duration(now - r.start).Truncate(time.Second / 10)
			total := time.Duration(r.endAt.Load() - r.start)
			phase := "run"
			if now < r.winStart {
				phase = "warm-up"
			}
			totalText := total.String()
			if l.Duration == 0 {
				totalText = "?"
			}
			fmt.Fprintf(l.Progress, "  %s: %s/%s %s, %s answers/s, slowest %v\n", l.Label, el, totalText, phase,
				human(float64(lines-lastLines)/(float64(now-lastPrint)/1e9)), time.Duration(slowest).Round(time.Millisecond))
			lastPrint, lastLines = now, lines
		}
	}
}

func (c *conn) wake() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// startPair puts a new acquire in s, stamped at, and encodes it.
func (c *conn) startPair(s *slot, at int64) {
	l := c.r.l
	k := l.Keys
	var idx int
	if k.Hot > 0 && k.HotFrac > 0 && c.rng.Float64() < k.HotFrac {
		idx = c.rng.IntN(k.Hot)
	} else {
		idx = c.rng.IntN(k.Keys)
	}
	s.key = strconv.AppendUint(append(s.key[:0], l.KeyPrefix...), uint64(idx), 10)
	s.gen++
	s.owner = append(s.owner[:0], c.ownerPrefix...)
	s.owner = strconv.AppendUint(s.owner, uint64(s.index), 10)
	s.owner = append(s.owner, '.')
	s.owner = strconv.AppendUint(s.owner, s.gen, 10)
	s.state = slotAcquiring
	s.stamp = at
	c.inflight++
	c.wbuf = c.r.w.appendAcquire(c.wbuf, c, s)
	if c.fifo != nil {
		c.fifo = append(c.fifo, s.index)
	}
}

func (c *conn) popFIFO() (int32, bool) {
	if c.fifoHead >= len(c.fifo) {
		return 0, false
	}
	si := c.fifo[c.fifoHead]
	c.fifoHead++
	if c.fifoHead == len(c.fifo) {
		c.fifo, c.fifoHead = c.fifo[:0], 0
	} else if c.fifoHead >= 1024 && c.fifoHead*2 >= len(c.fifo) {
		n := copy(c.fifo, c.fifo[c.fifoHead:])
		c.fifo, c.fifoHead = c.fifo[:n], 0
	}
	return si, true
}

// slotOfOwner finds the slot of an acquire by the owner it sent:
// "c<id>.<slot>.<gen>".
func (c *conn) slotOfOwner(owner []byte) (int32, bool) {
	if !bytes.HasPrefix(owner, c.ownerPrefix) {
		return 0, false
	}
	var si int
	rest := owner[len(c.ownerPrefix):]
	i := 0
	for ; i < len(rest) && rest[i] != '.'; i++ {
		d := rest[i] - '0'
		if d > 9 {
			return 0, false
		}
		si = si*10 + int(d)
	}
	if i == 0 || si >= len(c.slots) || c.slots[si].state != slotAcquiring ||
		!bytes.Equal(owner, c.slots[si].owner) {
		return 0, false
	}
	return int32(si), true
}

// endPair closes the pair of s; in closed loop it starts the next one at once.
func (c *conn) endPair(s *slot, now int64) {
	c.inflight--
	if !c.r.open && !c.r.stopping.Load() {
		c.startPair(s, now)
		return
	}
	s.state = slotFree
	c.free = append(c.free, s.index)
	if c.blocked || c.inflight == 0 && c.r.stopping.Load() {
		c.blocked = false
		c.wake()
	}
}

// writeLocked sends what was encoded. The caller holds mu, so that for an
// ordered wire the FIFO and the bytes on the wire stay in one order even with
// a sender and a reader both writing; pairs in flight are bounded, so the
// socket buffer never fills and the write does not block for long.
func (c *conn) writeLocked() error {
	if len(c.wbuf) == 0 {
		return nil
	}
	_, err := c.nc.Write(c.wbuf)
	if cap(c.wbuf) > 1<<20 { // a burst's giant buffer is not kept
		c.wbuf = nil
	} else {
		c.wbuf = c.wbuf[:0]
	}
	return err
}

func (c *conn) reader() {
	r := c.r
	if !r.open {
		if d := time.Duration(r.start - nanotime()); d > 0 {
			time.Sleep(d)
		}
		c.mu.Lock()
		now := nanotime()
		c.free = c.free[:0]
		for i := range c.slots {
			c.startPair(&c.slots[i], now)
		}
		err := c.writeLocked()
		c.mu.Unlock()
		if err != nil && !(r.l.Reconnect && c.reconnect(err)) {
			if !r.stopping.Load() {
				r.fail(fmt.Errorf("%s: write: %w", r.l.System, err))
			}
			return
		}
	}
	for {
		if r.stopping.Load() {
			c.mu.Lock()
			idle := c.finishedLocked()
			c.mu.Unlock()
			if idle {
				return
			}
		}
		if c.rlen == len(c.rbuf) {
			c.rbuf = append(c.rbuf, make([]byte, len(c.rbuf))...)
		}
		n, err := c.nc.Read(c.rbuf[c.rlen:])
		if n > 0 {
			c.rlen += n
			if perr := c.onData(nanotime()); perr != nil {
				if r.l.Reconnect && !r.dead.Load() && (errors.Is(perr, errUnavailable) || errors.Is(perr, errWrite)) {
					if c.reconnect(perr) {
						continue
					}
					return
				}
				if !r.dead.Load() {
					r.fail(fmt.Errorf("%s: connection %d: %w", r.l.System, c.id, perr))
				}
				c.nc.Close()
				return
			}
		}
		if err != nil {
			if r.dead.Load() {
				return
			}
			if r.stopping.Load() && errors.Is(err, os.ErrDeadlineExceeded) {
				return
			}
			if r.l.Reconnect && !errors.Is(err, os.ErrDeadlineExceeded) {
				if c.reconnect(err) {
					continue
				}
				return
			}
			r.fail(fmt.Errorf("%s: connection %d: read: %w", r.l.System, c.id, err))
			return
		}
	}
}

// onData handles every complete answer in rbuf, received at now, and sends
// what they call for (releases; in closed loop the next acquires).
func (c *conn) onData(now int64) error {
	r := c.r
	end := r.endAt.Load()
	inWindow := now >= r.winStart && now < end
	c.mu.Lock()
	buf := c.rbuf[:c.rlen]
	off := 0
	var lines, pairs, slowest int64
	var err error
	for {
		n, si, out, tok, perr := r.w.parse(buf[off:], c)
		if perr != nil {
			err = perr
			break
		}
		if n == 0 {
			break
		}
		off += n
		lines++
		s := &c.slots[si]
		if t := r.l.Trace; t != nil {
			t.add(s.key, s.stamp, now)
		}
		// By the request's stamp, not the answer's time: an answer that
		// comes in the drain is the tail of the window, not outside it.
		if s.stamp >= r.winStart && s.stamp < end {
			lat := now - s.stamp
			slowest = max(slowest, lat)
			c.lat = append(c.lat, lat)
			if s.state == slotAcquiring {
				c.acq = append(c.acq, lat)
			}
		}
		if s.state == slotAcquiring && now >= r.winStart {
			c.longestAcq = max(c.longestAcq, now-s.stamp)
		}
		if inWindow {
			c.lines++
		}
		switch {
		case out == outAcquired && s.state == slotAcquiring:
			if inWindow {
				c.grants++
				c.acquired++
			}
			s.token = tok
			s.state = slotReleasing
			s.stamp = now
			c.wbuf = r.w.appendRelease(c.wbuf, c, s)
			if c.fifo != nil {
				c.fifo = append(c.fifo, s.index)
			}
		case out == outRefused && s.state == slotAcquiring:
			if inWindow {
				c.refused++
			}
			c.endPair(s, now)
		case out == outReleased && s.state == slotReleasing:
			if inWindow {
				c.released++
				c.pairs++
				pairs++
			}
			c.endPair(s, now)
		case out == outNotReleased && s.state == slotReleasing:
			// Leases outlast every run: the lock was lost while held.
			if inWindow {
				c.notReleased++
			}
			err = fmt.Errorf("the release of %q (token %d) was answered: not held", s.key, s.token)
		default:
			err = fmt.Errorf("answer of kind %d for a slot in state %d", out, s.state)
		}
		if err != nil {
			break
		}
	}
	c.rlen = copy(c.rbuf, buf[off:])
	if r.open && err == nil {
		c.dueLocked(now, end) // one write for both: the sender's timer is late more often than not
		c.recordLagLocked()
	}
	if lines > 0 {
		c.lastAnswer = now
		if c.outageFrom != 0 {
			c.outage = max(c.outage, now-c.outageFrom)
			c.outageFrom = 0
		}
	}
	if werr := c.writeLocked(); werr != nil && err == nil {
		err = fmt.Errorf("%w: %w", errWrite, werr)
	}
	c.mu.Unlock()
	c.progress.Add(lines)
	if slowest > c.slowest.Load() {
		c.slowest.Store(slowest) // a lost race with the progress line's swap only moves it to the next line
	}
	if pairs > 0 && r.l.Pairs > 0 && r.winPairs.Add(pairs) >= r.l.Pairs {
		r.stop(now)
	}
	if len(c.lat) > 0 {
		s := c.shard
		s.mu.Lock()
		record(s.lat, c.lat)
		record(s.acq, c.acq)
		s.mu.Unlock()
		c.lat, c.acq = c.lat[:0], c.acq[:0]
	}
	return err
}

// recordLagLocked moves the send lags to the shard; mu is held, since both
// the sender and the reader send acquires.
func (c *conn) recordLagLocked() {
	if len(c.lag) == 0 {
		return
	}
	s := c.shard
	s.mu.Lock()
	record(s.lag, c.lag)
	s.mu.Unlock()
	c.lag = c.lag[:0]
}

// dueLocked (open loop) encodes the acquires due by now, each stamped with
// its intended time.
func (c *conn) dueLocked(now, end int64) {
	r := c.r
	// Until end even once stopping: what was due in the window goes out in
	// the drain, stamped when it was due.
	for !r.failed.Load() && !r.dead.Load() && c.next <= now && c.next < end {
		if len(c.free) == 0 {
			if !c.blocked && c.next >= r.winStart {
				c.overruns++
			}
			c.blocked = true
			return
		}
		si := c.free[len(c.free)-1]
		c.free = c.free[:len(c.free)-1]
		c.startPair(&c.slots[si], c.next)
		if c.next >= r.winStart {
			c.lag = append(c.lag, now-c.next)
		}
		c.next += c.every
	}
}

// sender (open loop) sends each acquire at its intended time, unless the
// reader, awake anyway for answers, sent it along with its releases first.
func (c *conn) sender() {
	r := c.r
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now := nanotime()
		end := r.endAt.Load()
		c.mu.Lock()
		c.dueLocked(now, end)
		err := c.writeLocked()
		c.recordLagLocked()
		done := c.finishedLocked()
		blocked := c.blocked
		next := c.next
		c.mu.Unlock()
		if err != nil {
			if !r.dead.Load() {
				r.fail(fmt.Errorf("%s: write: %w", r.l.System, err))
			}
			return
		}
		if done {
			// Nothing will arrive any more: wake the reader from its Read.
			c.deadlineNow()
			return
		}
		if r.dead.Load() {
			return
		}
		wait := time.Duration(next - nanotime())
		if blocked || next >= end {
			wait = time.Hour // until the reader frees a slot, or the last pair ends
		}
		stopCh := r.stopCh
		if r.stopping.Load() {
			stopCh = nil // closed: would wake at once, forever
		}
		if wait > 0 {
			timer.Reset(wait)
			select {
			case <-c.kick:
			case <-timer.C:
			case <-stopCh:
			}
		}
	}
}

// deadlineNow wakes the reader from its Read.
func (c *conn) deadlineNow() {
	c.mu.Lock()
	c.nc.SetReadDeadline(time.Now())
	c.mu.Unlock()
}

var errWrite = errors.New("write")

// reconnect replaces a connection the server ended (cause) with one to the
// next address that accepts, and starts every slot's pair again on it; the
// requests in flight on the old one are lost (their outcome is unknown). It
// reports false once the run is stopping.
func (c *conn) reconnect(cause error) bool {
	r := c.r
	c.mu.Lock()
	c.nc.Close()
	c.reconnects++
	if errors.Is(cause, errUnavailable) {
		c.unavailable++
	}
	c.lost += int64(c.inflight)
	c.inflight = 0
	c.releases.clear()
	c.rlen = 0
	c.wbuf = c.wbuf[:0]
	if c.outageFrom == 0 {
		c.outageFrom = c.lastAnswer
		if c.outageFrom == 0 {
			c.outageFrom = nanotime()
		}
	}
	c.mu.Unlock()
	for tries := 0; !r.stopping.Load(); tries++ {
		c.addr = (c.addr + 1) % len(r.addrs)
		nc, err := net.DialTimeout("tcp", r.addrs[c.addr], time.Second)
		if err != nil {
			if tries%len(r.addrs) == len(r.addrs)-1 {
				time.Sleep(20 * time.Millisecond) // every address refused: a moment before the next round
			}
			continue
		}
		c.mu.Lock()
		c.nc = nc
		c.inflight = 0
		c.releases.clear()
		c.wbuf = c.wbuf[:0]
		now := nanotime()
		for i := range c.slots {
			c.startPair(&c.slots[i], now)
		}
		err = c.writeLocked()
		c.mu.Unlock()
		if err == nil {
			return true
		}
		nc.Close()
	}
	return false
}

// dialSpread dials n connections, connection i to addrs[i%len(addrs)].
func dialSpread(ctx context.Context, addrs []string, n int, sources []string) ([]net.Conn, error) {
	if len(addrs) == 1 {
		return DialMany(ctx, addrs[0], n, sources)
	}
	out := make([]net.Conn, n)
	closeAll := func() {
		for _, nc := range out {
			if nc != nil {
				nc.Close()
			}
		}
	}
	for k, a := range addrs {
		cnt := (n - k + len(addrs) - 1) / len(addrs) // i in [0,n) with i%len == k
		if cnt <= 0 {
			continue
		}
		ncs, err := DialMany(ctx, a, cnt, sources)
		if err != nil {
			closeAll()
			return nil, err
		}
		for j, nc := range ncs {
			out[k+j*len(addrs)] = nc
		}
	}
	return out, nil
}

// DialMany opens n TCP connections to addr, a bounded number at a time (a
// flood of SYNs would overflow the listen backlog and wait out a retransmit),
// taking source addresses from sources in turn.
func DialMany(ctx context.Context, addr string, n int, sources []string) ([]net.Conn, error) {
	conns := make([]net.Conn, n)
	sem := make(chan struct{}, 128)
	var wg sync.WaitGroup
	var once sync.Once
	var failed atomic.Bool
	var firstErr error
	dialers := make([]*net.Dialer, max(1, len(sources)))
	for i := range dialers {
		dialers[i] = &net.Dialer{Timeout: 10 * time.Second}
		if len(sources) > 0 {
			ip := net.ParseIP(sources[i])
			if ip == nil {
				return nil, fmt.Errorf("bench: bad source address %q", sources[i])
			}
			dialers[i].LocalAddr = &net.TCPAddr{IP: ip}
		}
	}
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if failed.Load() {
				return
			}
			nc, err := dialers[i%len(dialers)].DialContext(ctx, "tcp", addr)
			if err != nil {
				once.Do(func() { firstErr = fmt.Errorf("bench: dial %s (connection %d of %d): %w", addr, i+1, n, err) })
				failed.Store(true)
				return
			}
			conns[i] = nc
		})
	}
	wg.Wait()
	if firstErr != nil {
		for _, nc := range conns {
			if nc != nil {
				nc.Close()
			}
		}
		return nil, firstErr
	}
	return conns, nil
}

// human writes a rate with thousands separators.
func human(v float64) string {
	return commas(int64(math.Round(v)))
}

func commas(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := n < 0
	if neg {
		s = s[1:]
	}
	var b []byte
	for i := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b = append(b, ',')
		}
		b = append(b, s[i])
	}
	if neg {
		return "-" + string(b)
	}
	return string(b)
}
