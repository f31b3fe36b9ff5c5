package netloop

import (
	"time"
)

// Timeouts cost no timer per connection and nothing per request. Each
// connection's loop keeps two stamps, taken once per read batch: since when
// the connection has been quiet and since when its unfinished frame has
// waited. A sweep every period reads them over the registry and wakes the
// connections that look due; their own loop then decides from its exact
// state and closes them (gnet's Conn is not safe to inspect from here, and
// closing from here could race with an answer being written). The stamps
// read the clock rather than a coarse time kept by the sweep, since that
// would lag whenever the sweep is scheduled late, and close early.

// sweepPeriod is a quarter of the shorter timeout, within [5ms, 1s]: a
// connection is closed between its timeout and its timeout plus about one
// period.
func (s *Server) sweepPeriod() time.Duration {
	d := time.Duration(0)
	for _, t := range []time.Duration{s.cfg.IdleTimeout, s.cfg.FrameTimeout} {
		if t > 0 && (d == 0 || t < d) {
			d = t
		}
	}
	return min(max(d/4, 5*time.Millisecond), time.Second)
}

// now is the stamps' clock: monotonic nanoseconds since the server was
// made, never 0 (which means "none").
func (s *Server) now() int64 { return max(int64(time.Since(s.epoch)), 1) }

func (s *Server) timeoutLoop() {
	defer s.acceptWG.Done()
	t := time.NewTicker(s.sweepPeriod())
	defer t.Stop()
	var due []*Conn
	for {
		select {
		case <-s.done:
			return
		case <-t.C:
		}
		now := s.now()
		s.reg.each(func(c *Conn) {
			if s.expired(c.quietFrom.Load(), c.partialFrom.Load(), now) {
				due = append(due, c)
			}
		})
		for _, c := range due {
			_ = c.gc.Wake(nil)
		}
		clear(due)
		due = due[:0]
	}
}

// timedOut is what watch found.
type timedOut int

const (
	notTimedOut timedOut = iota
	idleTimedOut
	frameTimedOut
)

// watch updates c's stamps at the end of an OnTraffic in which buf was the
// inbound data, consumed bytes of it were parsed and answers were written if
// wrote, and says whether one of its timeouts has passed. Loop only.
func (c *Conn) watch(held, consumed int, lineLeft, wrote bool) timedOut {
	s := c.s
	now := s.now()
	got := held > c.held // new bytes came in this time
	c.held = held - consumed

	// Quiet: nothing read, written or pending. A connection waiting for
	// answers (inflight) or paused is left to the wake-up that ends that
	// state, and is quiet only from then on. Unsent output drains without
	// telling us, so it counts as activity now and is looked at again a
	// timeout later.
	waiting := c.inflight > 0 || c.paused
	wasWaiting := c.quietFrom.Load() == 0
	if got || wrote || waiting || wasWaiting || c.gc.OutboundBuffered() > 0 {
		c.active = now
	}
	quiet := c.active
	if waiting {
		quiet = 0
	}
	if c.quietFrom.Load() != quiet {
		c.quietFrom.Store(quiet)
	}

	// Unfinished frame: a line end missing from what is left. A paused
	// connection's rest waits on us, not on the client.
	partial := c.partialFrom.Load()
	switch {
	case c.held == 0 || c.paused || lineLeft:
		partial = 0
	case consumed > 0 || partial == 0: // a frame begun in this read
		partial = now
	}
	if c.partialFrom.Load() != partial {
		c.partialFrom.Store(partial)
	}

	// Same test as the sweep's; the loop's now is no earlier than the
	// sweep's that woke it.
	if s.expired(quiet, 0, now) {
		s.idleClosed.Add(1)
		return idleTimedOut
	}
	if s.expired(0, partial, now) {
		s.frameClosed.Add(1)
		return frameTimedOut
	}
	return notTimedOut
}

// expired tells whether stamps quiet or partial (0: none) are past their
// timeouts at now.
func (s *Server) expired(quiet, partial, now int64) bool {
	idle, frame := int64(s.cfg.IdleTimeout), int64(s.cfg.FrameTimeout)
	return idle > 0 && quiet != 0 && now-quiet >= idle ||
		frame > 0 && partial != 0 && now-partial >= frame
}
