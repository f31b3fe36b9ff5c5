package netloop

import (
	"bytes"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"

	"github.com/ticketd/ticketd/codec"
)

// Conn is ticketd's state of one client connection.
type Conn struct {
	id uint64
	gc gnet.Conn
	s  *Server

	// Loop-only state.
	inflight int    // requests handed to the Backend and not yet answered
	seq      uint64 // requests read so far
	// While paused: how long until the parked loop wakes the connection
	// again (doubling while its unsent output does not shrink), and that
	// output at the last look. Loop only.
	parkWait int64
	parkOut  int
	// unsentTaken: OnClose took output gnet had not written (unsent.go).
	// The flags sit together, woken with them: a connection of 256 bytes
	// is in a smaller allocation class than one a word larger, and idle
	// connections are budgeted at 1 KiB each.
	unsentTaken bool
	paused      bool
	shut        bool        // lingering: the write side is shut (linger)
	told        bool        // the Backend was told the connection is gone (Closed)
	woken       atomic.Bool // Stop's wake not yet handled (lingerAll)
	epfd        int         // the loop's epoll descriptor, for pausing reads
	held        int         // inbound bytes left unparsed by the last OnTraffic
	marks       uint64      // the Backend's (Marks)
	active      int64       // stamp of the last read, write or pending state
	end         *ending     // being closed by the server; nil: open

	// Timeout stamps (see timeout.go): written by the loop, read by the
	// sweep; 0 is none.
	quietFrom   atomic.Int64
	partialFrom atomic.Int64
	parkNext    atomic.Int64 // while parked: not woken by the parked loop before this (Server.now)

	// Mailbox for answers decided on other goroutines. The grants among
	// mail are known by token and key (their keys back to back in keys), to
	// be released if mail is never written.
	mu     sync.Mutex
	mail   []byte
	mailN  int
	grants []grant
	keys   []byte
	closed bool
	failed bool // Fail posted its line: nothing is posted after it
	// eof, once the client has ended its stream with answers still to
	// come: posts wake the goroutine that writes them (writeAfterEOF)
	// instead of the loop, which has let the connection go.
	eof chan struct{}

	late *lateSet // loop only: grants to renew before the next write (LateRenewer)
}

// ending is a connection the server is closing: lingering (linger), or,
// with err, first waiting for the answers to the requests before a bad
// frame (cluster mode: their commits) to write its E line after them.
type ending struct {
	at  int64        // when it is closed, or its E line written, at the latest
	err *codec.Error // the bad frame's, while its E line waits
}

type grant struct {
	token           uint64
	key             int // end of the key in keys; it starts where the previous ends
	since, deadline int64
}

// lateSet holds a connection's grants whose leases the Backend renews right
// before they are written; pooled, as few connections have any at a time.
type lateSet struct {
	gs   []Grant
	ends []int // of each key in keys
	keys []byte
}

// HandOver tells that the answers Handle returns hold a grant whose lease
// counts from since: it is passed to the Backend's RenewLate right before
// they are written. Loop only, from Handle.
func (c *Conn) HandOver(token uint64, key []byte, since, deadline int64) {
	if c.s.renewer == nil {
		return
	}
	if c.late == nil {
		c.late = c.s.latePool.Get().(*lateSet)
	}
	l := c.late
	l.keys = append(l.keys, key...)
	l.ends = append(l.ends, len(l.keys))
	l.gs = append(l.gs, Grant{Token: token, Since: since, Deadline: deadline})
}

// renewLate passes the grants about to be written to the Backend, and tells
// whether they may be written.
func (c *Conn) renewLate() bool {
	l := c.late
	from := 0
	for i := range l.gs {
		l.gs[i].Key = l.keys[from:l.ends[i]:l.ends[i]]
		from = l.ends[i]
	}
	ok := c.s.renewer.RenewLate(c, l.gs)
	c.dropLate()
	return ok
}

// dropLate forgets the grants to renew: written, or the connection gone.
func (c *Conn) dropLate() {
	if l := c.late; l != nil {
		c.late = nil
		if cap(l.keys) > 64<<10 {
			return // one burst must not pin large buffers
		}
		l.gs, l.ends, l.keys = l.gs[:0], l.ends[:0], l.keys[:0]
		c.s.latePool.Put(l)
	}
}

// Marks is a word the Backend may keep on the connection (cluster mode: the
// shards it queued acquires on, mod 64). Loop only, and in Backend.Closed.
func (c *Conn) Marks() *uint64 { return &c.marks }

// ID names the connection for answers decided later; never 0. Safe from any
// goroutine.
func (c *Conn) ID() uint64 { return c.id }

// Pending is how many of the connection's requests are not answered yet
// (queued acquires among them). Loop only, and in Backend.Closed.
func (c *Conn) Pending() int { return c.inflight }

// NextSeq numbers the connection's requests. Loop only.
func (c *Conn) NextSeq() uint64 { c.seq++; return c.seq }

// NextSeqs numbers n requests at once (at least one, as NextSeq does): it
// returns the first number, and the others follow it. Loop only.
func (c *Conn) NextSeqs(n int) uint64 {
	first := c.seq + 1
	c.seq += uint64(max(n, 1))
	return first
}

// Post hands over answers decided away from the connection's loop: b holds
// n encoded answer lines, none of them a grant (grants go through PostGrant
// or PostGrants, so that one never written is released). It copies b, so the
// caller may reuse it at once. Safe from any goroutine; false if the
// connection is gone, in which case nothing was taken.
func (c *Conn) Post(b []byte, n int) bool { return c.PostGrants(b, n, nil) }

// PostGrant is Post for one grant: b holds its encoded answer line, token and
// key say what it grants. If the connection closes before b is written, the
// grant is given back through Backend.Orphaned. It copies b and key.
func (c *Conn) PostGrant(b []byte, token uint64, key []byte) bool {
	g := [1]Grant{{Token: token, Key: key}}
	return c.PostGrants(b, 1, g[:])
}

// PostGrants is Post for n answer lines among which are the grants listed:
// each is given back through Backend.Orphaned if the connection closes
// before b is written. It copies b and the keys. False, taking nothing,
// once the connection has closed or failed (Fail).
func (c *Conn) PostGrants(b []byte, n int, grants []Grant) bool {
	return c.post(b, n, grants, false)
}

// post is PostGrants; last marks Fail's line, after which nothing is taken.
func (c *Conn) post(b []byte, n int, grants []Grant, last bool) bool {
	c.mu.Lock()
	if c.closed || c.failed {
		c.mu.Unlock()
		return false
	}
	c.failed = last
	wake := len(c.mail) == 0
	c.mail = append(c.mail, b...)
	c.mailN += n
	for _, g := range grants {
		c.keys = append(c.keys, g.Key...)
		c.grants = append(c.grants, grant{g.Token, len(c.keys), g.Since, g.Deadline})
	}
	eof := c.eof
	c.mu.Unlock()
	if wake {
		c.wakeBy(eof)
	}
	return true
}

// wake has c looked at again: by its loop, or by its writer after EOF.
func (c *Conn) wake() {
	c.mu.Lock()
	eof := c.eof
	c.mu.Unlock()
	c.wakeBy(eof)
}

// wakeBy is wake with c.eof as read under c.mu.
func (c *Conn) wakeBy(eof chan struct{}) {
	if eof == nil {
		_ = c.gc.Wake(nil)
		return
	}
	select {
	case eof <- struct{}{}:
	default: // a wake is pending already
	}
}

// takeMail appends the mailbox to out and empties it; last tells that
// Fail's line was in it (the connection is to be closed once out is
// written, and nothing more read). Loop only.
func (c *Conn) takeMail(out []byte) (_ []byte, last bool) {
	c.mu.Lock()
	out, last = c.takeMailLocked(out)
	c.mu.Unlock()
	return out, last
}

// takeMailLocked is takeMail under c.mu.
func (c *Conn) takeMailLocked(out []byte) (_ []byte, last bool) {
	last = c.failed
	if len(c.mail) > 0 {
		out = append(out, c.mail...)
		from := 0
		for _, g := range c.grants {
			if g.since != 0 {
				c.HandOver(g.token, c.keys[from:g.key], g.since, g.deadline)
			}
			from = g.key
		}
		c.inflight -= c.mailN
		c.s.late.Add(int64(c.mailN))
		if cap(c.mail) > keepMail || cap(c.grants) > keepGrants || cap(c.keys) > keepMail {
			// A burst must not stay pinned to a connection that goes
			// quiet after it: idle ones cost about 1 KiB each.
			c.mail, c.grants, c.keys = nil, nil, nil
		} else {
			c.mail, c.grants, c.keys = c.mail[:0], c.grants[:0], c.keys[:0]
		}
		c.mailN = 0
	}
	return out, last
}

// keepMail and keepGrants bound the mailbox capacity a connection keeps
// once it is emptied: a few answers' worth, so that steady late answers
// (hand-overs, one or two at a time) reuse it without allocating.
const (
	keepMail   = 512
	keepGrants = 16
)

// seal is takeMail for a connection about to close with an E line of its
// own (a bad frame): what was posted until now goes out before the line,
// and nothing is posted after it: both under one hold of c.mu, or a post
// between them would be taken after the line. Loop only.
func (c *Conn) seal(out []byte) (_ []byte, failed bool) {
	c.mu.Lock()
	out, failed = c.takeMailLocked(out)
	c.failed = true
	c.mu.Unlock()
	return out, failed
}

// sealWith is seal with the bad frame's E line after the mail, unless the
// mail held Fail's line: the client gets one E line, whichever came first.
func (c *Conn) sealWith(out []byte, err *codec.Error) []byte {
	out, failed := c.seal(out)
	if !failed {
		out = codec.AppendError(out, err)
	}
	return out
}

// handler is the gnet event handler.
type handler struct {
	gnet.BuiltinEventEngine
	s *Server
}

func (h *handler) OnOpen(gc gnet.Conn) ([]byte, gnet.Action) {
	c := gc.Context().(*Conn)
	c.gc = gc
	c.epfd = loopPollFD(gc)
	forgetAddrs(gc)
	c.active = h.s.now()
	c.quietFrom.Store(c.active) // a connection that never speaks is idle
	h.s.reg.put(c)
	return nil, gnet.None
}

func (h *handler) OnClose(gc gnet.Conn, err error) gnet.Action {
	c, ok := gc.Context().(*Conn)
	if !ok || c == nil {
		return gnet.None
	}
	s := h.s
	// First, while the connection still counts as open (for Stop and
	// --max-conns): what gnet had not written, and what is still to come
	// for a client that only ended its stream (unsent.go).
	unsent := takeOutbound(gc)
	c.unsentTaken = len(unsent) > 0
	if s.afterEOF(c, gc, unsent, err) {
		return gnet.None // the writer closes it
	}
	if len(unsent) > 0 {
		s.releaseUnsentLater(unsent)
	}
	s.closeConn(c)
	s.conns.Add(-1)
	return gnet.None
}

// closeConn forgets a connection gone: its mailbox refuses posts from now
// on, its queued acquires are withdrawn and the grants posted to it and
// not written are given back. It still counts under --max-conns.
func (s *Server) closeConn(c *Conn) {
	c.mu.Lock()
	c.closed = true
	grants, keys := c.grants, c.keys
	c.mail, c.grants, c.keys = nil, nil, nil
	c.mu.Unlock()
	c.dropLate()
	s.reg.del(c.id)
	s.parked.del(c)
	if !c.told {
		s.cfg.Backend.Closed(c)
	}
	from := 0
	for _, g := range grants {
		s.cfg.Backend.Orphaned(g.token, keys[from:g.key])
		from = g.key
	}
	s.orphans.Add(int64(len(grants)))
}

func (h *handler) OnTraffic(gc gnet.Conn) gnet.Action {
	c := gc.Context().(*Conn)
	s := h.s
	if s.stopping.Load() {
		c.woken.Store(false)
		if c.end == nil {
			return h.linger(c, gc)
		}
	}
	if c.end != nil && c.end.err == nil {
		return h.linger(c, gc)
	}
	var start time.Time
	if s.cfg.Latency != nil {
		start = time.Now()
	}
	outp := s.outPool.Get().(*[]byte)
	out := (*outp)[:0]
	defer func() {
		if cap(out) > 1<<20 { // one flood must not pin a large buffer
			out = make([]byte, 0, 16<<10)
		}
		*outp = out[:0]
		s.outPool.Put(outp)
	}()

	if gc.OutboundBuffered() >= hardOutbound*s.cfg.MaxOutbound {
		// A client that has not read its answers for this long while
		// late ones (its queued acquires' grants and timeouts) kept
		// coming: closed, so that its output does not grow with
		// --max-waiters. Its mailbox's grants are released by OnClose.
		s.unreadClosed.Add(1)
		return gnet.Close
	}
	out, last := c.takeMail(out)

	action := gnet.None
	buf, _ := gc.Peek(-1)
	held, consumed, lineLeft := len(buf), 0, false
	if e := c.end; e != nil {
		// A bad frame's E line waits for the answers before it; nothing
		// after the frame is carried out.
		consumed = held
		if last || c.inflight-s.cfg.Backend.Queued(c) <= 0 || s.now() >= e.at {
			if !last {
				out = c.sealWith(out, e.err)
			}
			c.end = nil // linger's now
			action = gnet.Close
		}
	} else if last {
		action = gnet.Close // Fail's line is the last thing the client reads
	} else if len(buf) > 0 && !c.over(len(out)) {
		out, consumed, action = h.s.parse(c, buf, out, gc.OutboundBuffered())
	}
	// Before Discard, which may give buf back to a pool that every loop
	// takes from.
	if consumed < held {
		lineLeft = bytes.IndexByte(buf[consumed:], '\n') >= 0
	}
	if consumed > 0 { // gnet's Discard(0) drops everything
		_, _ = gc.Discard(consumed)
	}
	buf = nil
	if a, ok := h.send(c, gc, out); !ok {
		return a
	}
	if len(out) > 0 && s.cfg.Latency != nil {
		s.cfg.Latency.Observe(time.Since(start).Seconds())
	}
	if action == gnet.Close {
		return h.linger(c, gc)
	}
	if held-consumed > s.hardInbound() {
		// Requests read past the backpressure: see hardInbound. Closed as
		// one that does not read: what is unsent goes, its grants
		// released by OnClose.
		s.floodClosed.Add(1)
		return gnet.Close
	}
	if c.end != nil {
		// Woken by posts; looked at too for what posts nothing (a commit
		// that only queues an acquire).
		c.lookLater(c.inflight, c.end.at)
		return gnet.None
	}
	if c.over(0) {
		c.pause()
	} else {
		if c.paused {
			c.resume()
		}
		// Parsing stopped at a limit that the write above has cleared:
		// go on now, as the client may send nothing more to wake us.
		if lineLeft {
			_ = gc.Wake(nil)
		}
	}
	if s.timeouts {
		switch c.watch(held, consumed, lineLeft, len(out) > 0) {
		case idleTimedOut:
			return gnet.Close // nothing is pending or unsent
		case frameTimedOut:
			// As after a bad frame: the answers already decided go out
			// first (gnet's own close drops what its buffer holds beyond
			// one write).
			return h.linger(c, gc)
		}
	}
	return gnet.None
}

// lingerFor bounds how long a connection the server closes (after a bad
// frame's E line, Fail's, or at the Backend's word) waits for its client
// to read what it was written.
const lingerFor = 5 * time.Second

// linger closes a connection the server is done with without losing what
// it was written. gnet, told to close, writes what it holds once and drops
// the rest, and a close with input unread makes the kernel reset the
// connection and drop its own send queue too: a client that pipelined past
// a bad frame while reading slowly lost the answers before it, grants
// among them, and the E line. So the connection stays open while its
// client reads: what it sends is discarded, once gnet has written
// everything the write side is shut (the client reads to the end, then
// EOF), and it is closed when the client closes its side or lingerFor has
// passed. (Not once the client's kernel has acknowledged everything: a
// client still sending then meets a reset, and one that gives up on a
// failed write never reads what it was sent.) It is looked at meanwhile as
// lookLater says, and once all is written only at its end. Its queued acquires
// are withdrawn at once (Closed), as nothing more is read from it, and its
// mailbox is sealed: what was posted to it goes out, and a later post is
// refused (a grant's release given back). Loop only.
func (h *handler) linger(c *Conn, gc gnet.Conn) gnet.Action {
	s := h.s
	if c.end == nil {
		c.end = &ending{at: s.now() + int64(lingerFor)}
		c.paused = false // reads go on, to be discarded
		c.park()
		_ = resumeRead(c.epfd, gc.Fd(), gc.OutboundBuffered() > 0)
		c.told = true
		s.cfg.Backend.Closed(c)
		// What was posted until now goes out; nothing is taken after it,
		// so no mailbox is left for Stop to wait on.
		outp := s.outPool.Get().(*[]byte)
		out, _ := c.seal((*outp)[:0])
		a, ok := h.send(c, gc, out)
		*outp = out[:0]
		s.outPool.Put(outp)
		if !ok {
			return a // a closed descriptor may be another's by now: touch it no more
		}
	}
	if n := gc.InboundBuffered(); n > 0 {
		_, _ = gc.Discard(n)
	}
	if !c.shut && gc.OutboundBuffered() == 0 {
		c.shut = true
		if shutWrite(gc.Fd()) != nil {
			return gnet.Close
		}
	}
	if s.now() >= c.end.at {
		return gnet.Close
	}
	if c.shut {
		c.parkNext.Store(c.end.at) // all written: only the clock is left (a close is seen)
	} else {
		c.lookLater(gc.OutboundBuffered(), c.end.at)
	}
	return gnet.None
}

// send writes out to c, the late grants among it renewed first. If not ok,
// the caller returns a at once: the Backend failed (close, the grants given
// back), or the write did (gnet closed the connection, and OnClose has run).
func (h *handler) send(c *Conn, gc gnet.Conn, out []byte) (a gnet.Action, ok bool) {
	if c.late != nil && !c.renewLate() {
		h.unwritten(out)
		return gnet.Close, false
	}
	if len(out) > 0 {
		if _, err := gc.Write(out); err != nil {
			// Failed at once, gnet wrote none of out; failed after writing
			// part (to watch the socket for the rest), it kept the rest,
			// which OnClose took and saw to.
			if !c.unsentTaken {
				h.unwritten(out)
			}
			return gnet.None, false
		}
	}
	return gnet.None, true
}

// unwritten gives back the grants among out, answers that a failed write
// did not send: gnet writes once (level-triggered) and, on an error other
// than EAGAIN, writes nothing of it and closes the connection, whose
// OnClose has run by now and found these grants already taken from the
// mailbox (or never in it: the caller's own answers). Rare: a client that
// reset its connection while its requests were carried out.
func (h *handler) unwritten(out []byte) { h.s.releaseGrants(out) }

// parse reads frames from buf while the connection is within its limits
// (unsent is its output not yet written) and hands them to the Backend in
// batches.
func (s *Server) parse(c *Conn, buf []byte, out []byte, unsent int) ([]byte, int, gnet.Action) {
	rp := s.reqPool.Get().(*[]codec.Request)
	reqs := (*rp)[:0]
	defer func() { *rp = reqs[:0]; s.reqPool.Put(rp) }()

	consumed := 0
	var acq, rel int64
	// Nothing is written to the connection while parsing, so its unsent
	// bytes stay as they are: the limits come down to counts.
	maxIn, recounted := s.cfg.MaxInflight, false
	maxOut := s.cfg.MaxOutbound - unsent
	flush := func() bool {
		if len(reqs) == 0 {
			return false
		}
		var answered int
		var closeNow bool
		out, answered, closeNow = s.cfg.Backend.Handle(c, reqs, out)
		c.inflight -= answered
		reqs = reqs[:0]
		return closeNow
	}
	action := gnet.None
	for {
		if len(reqs) == cap(reqs) {
			if flush() {
				action = gnet.Close
				break
			}
		}
		if c.inflight >= maxIn && !recounted {
			recounted = true
			maxIn += s.cfg.Backend.Queued(c)
		}
		if c.inflight >= maxIn || len(out) >= maxOut {
			break
		}
		reqs = reqs[:len(reqs)+1]
		n, perr := codec.ParseRequest(buf[consumed:], s.cfg.Limits, &reqs[len(reqs)-1])
		if perr != nil {
			reqs = reqs[:len(reqs)-1]
			s.badFrames.Add(1)
			if !flush() {
				if c.inflight-s.cfg.Backend.Queued(c) > 0 {
					// Answers to requests before it are still to come
					// (cluster mode: their commits): the E line waits.
					c.end = &ending{at: s.now() + int64(lingerFor), err: perr}
					c.park()
					break
				}
				out = c.sealWith(out, perr)
			}
			action = gnet.Close
			break
		}
		if n == 0 || s.crowd != nil && !s.crowd.Admit(c) {
			reqs = reqs[:len(reqs)-1]
			break
		}
		if reqs[len(reqs)-1].Kind == codec.Acquire {
			acq++
		} else {
			rel++
		}
		consumed += n
		c.inflight++
	}
	if action == gnet.None && flush() {
		action = gnet.Close
	}
	if acq > 0 {
		s.acquires.Add(acq)
	}
	if rel > 0 {
		s.releases.Add(rel)
	}
	return out, consumed, action
}

// over tells whether the connection is past its limits; pending counts
// answer bytes not yet handed to gnet.
func (c *Conn) over(pending int) bool {
	max := c.s.cfg.MaxInflight
	return c.gc.OutboundBuffered()+pending >= c.s.cfg.MaxOutbound ||
		c.inflight >= max && c.inflight-c.s.cfg.Backend.Queued(c) >= max ||
		c.s.crowd != nil && c.s.crowd.Crowded(c)
}

// pause stops parsing the connection and, where pause_linux.go can, reading
// its socket. It is applied again on every OnTraffic while over the limits,
// since gnet turns reading back on after it drains output.
func (c *Conn) pause() {
	out := c.gc.OutboundBuffered()
	if !c.paused {
		c.paused = true
		c.s.paused.Add(1)
		// Nothing may arrive to wake a connection paused on its own unsent
		// output once it drains (least of all one whose socket is not
		// read), so it is looked at again on a timer.
		c.s.parked.add(c)
		c.parkWait = int64(parkedEvery)
	} else if out < c.parkOut {
		c.parkWait = int64(parkedEvery) // its client reads: look again soon
	} else {
		// A client that reads nothing is looked at less and less often:
		// woken every 10 ms, hundreds of them took a loop's time from
		// every other connection.
		c.parkWait = min(2*c.parkWait, int64(parkedMax))
	}
	c.parkOut = out
	c.parkNext.Store(c.s.now() + c.parkWait)
	_ = pauseRead(c.epfd, c.gc.Fd(), out > 0)
}

// park has the parked loop look at c, which waits for the clock or its
// output to drain (linger, a bad frame's E line): see lookLater.
func (c *Conn) park() {
	c.parkWait, c.parkOut = 0, math.MaxInt
	c.s.parked.add(c)
}

// lookLater sets when the parked loop next wakes c, which waits until end
// and meanwhile for left (its unsent output, or its answers to come) to
// shrink: soon while it does, less and less often while it does not (as
// pause), at end at the latest. Woken every parkedEvery, a few thousand
// lingering connections that did nothing took most of a loop's time.
func (c *Conn) lookLater(left int, end int64) {
	if left < c.parkOut {
		c.parkWait = int64(parkedEvery)
	} else {
		c.parkWait = min(2*c.parkWait, int64(parkedMax))
	}
	c.parkOut = left
	c.parkNext.Store(min(c.s.now()+c.parkWait, end))
}

// resume turns reading back on; if that fails the connection stays parked
// and the next wake tries again.
func (c *Conn) resume() {
	if resumeRead(c.epfd, c.gc.Fd(), c.gc.OutboundBuffered() > 0) == nil {
		c.paused = false
		c.s.parked.del(c)
	}
}

// parkedSet holds paused connections; parkedLoop wakes them every
// parkedEvery so that their loop re-checks their limits, and sleeps
// while the set is empty, so that an idle server is not woken 100 times
// a second for nothing.
type parkedSet struct {
	mu   sync.Mutex
	m    map[*Conn]struct{}
	kick chan struct{} // sent to when the set stops being empty
}

// parkedEvery is how often a parked connection is woken; parkedMax how
// seldom a paused one whose unsent output does not shrink comes to be.
const (
	parkedEvery = 10 * time.Millisecond
	parkedMax   = 320 * time.Millisecond
)

func (p *parkedSet) init() { p.m = make(map[*Conn]struct{}); p.kick = make(chan struct{}, 1) }

func (p *parkedSet) add(c *Conn) {
	c.parkNext.Store(0) // woken on the next round (pause sets a later one)
	p.mu.Lock()
	first := len(p.m) == 0
	p.m[c] = struct{}{}
	p.mu.Unlock()
	if first {
		select {
		case p.kick <- struct{}{}:
		default: // a kick is pending already
		}
	}
}

func (p *parkedSet) del(c *Conn) { p.mu.Lock(); delete(p.m, c); p.mu.Unlock() }

// list appends the parked connections to batch.
func (p *parkedSet) list(batch []*Conn) []*Conn {
	p.mu.Lock()
	for c := range p.m {
		batch = append(batch, c)
	}
	p.mu.Unlock()
	return batch
}

func (s *Server) parkedLoop() {
	defer s.acceptWG.Done()
	t := time.NewTimer(parkedEvery)
	defer t.Stop()
	var batch []*Conn
	for {
		batch = s.parked.list(batch[:0])
		now := s.now()
		for _, c := range batch {
			if c.parkNext.Load() <= now {
				s.parkedWakes.Add(1)
				_ = c.gc.Wake(nil)
			}
		}
		if len(batch) == 0 {
			// A connection parked since the list above has kicked.
			select {
			case <-s.done:
				return
			case <-s.parked.kick:
			}
		}
		clear(batch) // hold no closed connection until the next round
		t.Reset(parkedEvery)
		select {
		case <-s.done:
			return
		case <-t.C:
		}
	}
}
