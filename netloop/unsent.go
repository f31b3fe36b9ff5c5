package netloop

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"reflect"
	"slices"
	"time"
	"unsafe"

	"github.com/panjf2000/gnet/v2"
	"github.com/panjf2000/gnet/v2/pkg/buffer/elastic"

	"github.com/ticketd/ticketd/codec"
)

// What gnet had not written when a connection closes. gnet v2.9.7, closing
// a connection (after OnClose), writes its buffered output once, as far as
// the socket takes it without blocking, and drops the rest: answers the
// server decided, among them grants that then reach nobody and hold their
// keys to the end of their leases. That happens when a client half-closes
// (shutdown(SHUT_WR), `nc -N`) before it has read what it asked for, and
// when a client that reads nothing is closed for its unsent output. So
// OnClose takes the output out of gnet's buffer first (gnet then has
// nothing left to write), and:
//   - after the client's end of stream, writes it on a duplicate of the
//     descriptor from a goroutine of its own, while answers come (up to
//     lingerFor without one), as linger does for a connection closed with
//     an E line, followed by the answers
//     still to come for requests read before the end (cluster mode: their
//     commits), which the closed connection would have refused;
//   - otherwise, or for what that write did not get out, releases the
//     grants whose lines were not written at all, as their connection is
//     gone. A grant is never released that its client may have read.
//
// gnet's output buffer is not exported: it is reached by reflection and its
// type checked, as loopPollFD reaches the epoll descriptor. If gnet's
// layout changes, takeOutbound returns nil and gnet drops the output as
// before; a test guards the layout.

var elasticBufferType = reflect.TypeOf(elastic.Buffer{})

// takeOutbound moves gc's unsent output out of gnet's buffer (nil if there
// is none, or gnet's layout is not the one known). Loop only, in OnClose.
func takeOutbound(gc gnet.Conn) []byte {
	if gc.OutboundBuffered() == 0 {
		return nil
	}
	v := reflect.ValueOf(gc)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return nil
	}
	f := v.Elem().FieldByName("outboundBuffer")
	if !f.IsValid() || f.Type() != elasticBufferType || !f.CanAddr() {
		return nil
	}
	buf := (*elastic.Buffer)(unsafe.Pointer(f.UnsafeAddr()))
	parts, err := buf.Peek(-1)
	if err != nil {
		return nil
	}
	var out []byte
	for _, p := range parts {
		out = append(out, p...)
	}
	_, _ = buf.Discard(len(out))
	return out
}

// releaseUnsentLater gives back, off the event loop, the grants in output
// gnet had not written at a close that no writer takes over: releasing
// tens of thousands of grants on the loop held every other connection for
// a quarter of a second. Stop waits for it (lingerAll).
func (s *Server) releaseUnsentLater(unsent []byte) {
	s.unsentBusy.Add(1)
	go func() {
		defer s.unsentBusy.Add(-1)
		s.releaseUnsent(unsent, 0, true)
	}()
}

// afterEOF hands a connection whose client has ended its stream to a
// writer of its own (writeAfterEOF) if it is still owed answers: output
// gnet had not written, answers posted and not yet taken, answers to
// requests still being decided (cluster mode: requests read before the
// end and not yet committed), or requests read and not yet parsed (left
// at the connection's limits). The client reads until the server's
// end, so closing at its end lost them, and the grants among them
// reached nobody. It tells whether the writer took the connection over;
// it then closes it, and counts it under --max-conns until done. Loop
// only, in OnClose.
func (s *Server) afterEOF(c *Conn, gc gnet.Conn, unsent []byte, err error) bool {
	if !errors.Is(err, io.EOF) {
		return false
	}
	in := unparsed(c, gc)
	// A paused connection's socket was not read: what the client sent
	// before its end may wait there still.
	reading := c.paused && c.end == nil && !c.told
	if len(unsent) == 0 && bytes.IndexByte(in, '\n') < 0 && !reading && !s.owes(c) {
		return false
	}
	fd, derr := dupFD(gc.Fd())
	if derr != nil {
		return false
	}
	// The timeout sweep and the parked loop leave it alone from now on.
	c.quietFrom.Store(0)
	c.partialFrom.Store(0)
	s.parked.del(c)
	c.mu.Lock()
	c.eof = make(chan struct{}, 1)
	c.mu.Unlock()
	s.unsentBusy.Add(1)
	go s.writeAfterEOF(c, fd, unsent, in, reading)
	return true
}

// unparsed copies what was read from gc and not parsed, if it is still to
// be carried out. Loop only, in OnClose.
func unparsed(c *Conn, gc gnet.Conn) []byte {
	if c.end != nil || c.told || gc.InboundBuffered() == 0 {
		return nil // a bad frame or the server's close: nothing more is carried out
	}
	in, _ := gc.Peek(-1)
	return bytes.Clone(in) // a last line in part may go on in the socket
}

// owes tells whether anything is still to be written to c: what awaits
// tells, or a bad frame's E line that waits for those answers. Loop only,
// or c's writer after EOF.
func (s *Server) owes(c *Conn) bool {
	return c.end != nil && c.end.err != nil || s.awaits(c)
}

// awaits tells whether answers are still to come for c: posted and not
// taken, or for requests handed to the Backend, other than queued
// acquires (the close withdraws those).
func (s *Server) awaits(c *Conn) bool {
	c.mu.Lock()
	mail := len(c.mail) > 0
	c.mu.Unlock()
	switch {
	case mail:
		return true
	case c.told: // lingering: its mailbox is sealed
		return false
	}
	return c.inflight > 0 && c.inflight-s.cfg.Backend.Queued(c) > 0
}

// writeAfterEOF writes, on fd, a duplicate of the descriptor of c, whose
// client has ended its stream, what c is owed (see afterEOF), starting with
// out, gnet's unsent output, and carrying out the requests in in, then,
// if reading, those still in the socket, as c's limits allow; then closes
// c's mailbox, ends the server's stream and waits for the client to
// close, each within lingerFor of the last answer or request taken (cut
// short by Stop). The grants it did not start to write are given back.
func (s *Server) writeAfterEOF(c *Conn, fd int, out, in []byte, reading bool) {
	defer s.unsentBusy.Add(-1)
	defer s.conns.Add(-1)
	// Waiting and parsing end at deadline; the socket's own deadline
	// comes lastWrite later, for what is decided then (a bad frame's E
	// line) to be written.
	deadline := time.Now().Add(lingerFor)
	f := os.NewFile(uintptr(fd), "")
	nc, err := net.FileConn(f) // a descriptor of its own, on Go's poller
	_ = f.Close()
	if err == nil {
		_ = nc.SetDeadline(deadline.Add(lastWrite))
		defer s.onCut(nc)()
	}
	// As the parked loop does on the event loop: a commit that leaves an
	// acquire queued posts nothing, and only a look again sees it; less
	// and less often while nothing comes (thousands of writers at once
	// waiting on slow commits took more than a core, looking every 10 ms).
	wait := time.Duration(parkedEvery)
	look := time.NewTimer(wait)
	defer look.Stop()
	begun, written := len(out) > 0, 0 // gnet may have begun its output's first line
	for err == nil {
		var last bool
		had := len(out)
		if s.stopping.Load() && !c.told {
			// As linger does at Stop: what was posted goes out, nothing
			// more is read or taken, queued acquires are withdrawn.
			c.told = true
			s.cfg.Backend.Closed(c)
			in, reading = nil, false
			if e := c.end; e != nil && e.err != nil {
				out = c.sealWith(out, e.err)
			} else {
				out, _ = c.seal(out)
			}
			c.end, last = nil, true
		} else {
			out, last = c.takeMail(out)
		}
		live := time.Now().Before(deadline) && !s.isCut()
		parsed := 0
		if !last && c.end == nil && live {
			if reading && bytes.IndexByte(in, '\n') < 0 {
				in, reading = readMore(nc, in)
			}
			// Parsing blocks on nothing: the write below is what holds
			// back a client that does not read.
			var a gnet.Action
			out, parsed, a = s.parse(c, in, out, 0)
			in = in[parsed:]
			if a == gnet.Close {
				in, reading = nil, false // nothing after a bad frame is carried out
				last = c.end == nil
			}
			if c.end != nil {
				s.parked.del(c) // a bad frame's wait is this loop's
			}
		}
		came := len(out) > had || parsed > 0 // else look again later and later
		if e := c.end; e != nil && e.err != nil && (last || !live || !s.awaits(c)) {
			// The answers before the bad frame are in: its E line ends
			// the stream, as on the loop.
			if !last {
				out = c.sealWith(out, e.err)
			}
			c.end, last = nil, true
		}
		if c.late != nil && !c.renewLate() {
			err = errBackendFailed
			break
		}
		if len(out) > 0 {
			if written, err = nc.Write(out); err != nil {
				break
			}
			out, begun, written = out[:0], false, 0
		}
		if came && live {
			// While answers come, the client gets them: the bound is
			// lingerFor without one. A fixed one from the end cut off a
			// cluster node's answers to a long pipeline still committing,
			// and released their grants.
			deadline = time.Now().Add(lingerFor)
			if !s.isCut() {
				_ = nc.SetDeadline(deadline.Add(lastWrite))
				if s.isCut() { // Stop's cut came in between: keep it
					_ = nc.SetDeadline(time.Now())
				}
			}
		}
		more := !last && c.end == nil && (reading || bytes.IndexByte(in, '\n') >= 0)
		if last || !live || !more && !s.owes(c) {
			break
		}
		if parsed > 0 {
			continue // stopped at the output's limit, now written
		}
		if came {
			wait = parkedEvery
		} else {
			wait = min(2*wait, parkedMax)
		}
		look.Reset(wait)
		select { // for answers to come, and with them room to parse
		case <-c.eof:
		case <-look.C:
		case <-s.cut:
		}
	}
	if len(out) > 0 {
		s.releaseUnsent(out, written, begun)
	}
	s.closeConn(c) // later posts are refused, their grants given back
	if nc == nil {
		return
	}
	if tc, ok := nc.(*net.TCPConn); ok && err == nil {
		// The client sends no more; read what it sent before its end
		// (unread, it would reset the connection at close).
		_ = tc.CloseWrite()
		_, _ = io.Copy(io.Discard, tc)
	}
	_ = nc.Close()
}

var errBackendFailed = errors.New("the Backend failed")

// lastWrite is how long a writer after EOF has for its last write once it
// stops waiting for answers.
const lastWrite = 250 * time.Millisecond

// readMore appends to in what the client sent before its end and the
// server had not read (a paused connection's socket is not read); false
// once the end is read.
func readMore(nc net.Conn, in []byte) ([]byte, bool) {
	in = slices.Grow(in, 64<<10)
	n, err := nc.Read(in[len(in):cap(in)])
	return in[:len(in)+n], err == nil
}

// onCut makes nc's reads and writes fail at once when Stop cuts the
// writers after EOF short; call what it returns when done with nc.
func (s *Server) onCut(nc net.Conn) (done func()) {
	end := make(chan struct{})
	go func() {
		select {
		case <-s.cut:
			_ = nc.SetDeadline(time.Now())
		case <-end:
		}
	}()
	return func() { close(end) }
}

// isCut tells whether Stop has cut the writers after EOF short.
func (s *Server) isCut() bool {
	select {
	case <-s.cut:
		return true
	default:
		return false
	}
}

// releaseUnsent releases the grants among buf, output of which the first
// sent bytes were written, whose lines were not written at all. One
// written in part is kept: a client that takes a last line without its
// line end could take it for a grant. With begun, buf's first line is kept
// too: gnet may have written its start before.
func (s *Server) releaseUnsent(buf []byte, sent int, begun bool) {
	at := 0
	if begun {
		at = bytes.IndexByte(buf, '\n') + 1
		if at == 0 {
			return
		}
	}
	for at < sent { // lines begun: kept
		n := bytes.IndexByte(buf[at:], '\n')
		if n < 0 {
			return
		}
		at += n + 1
	}
	s.releaseGrants(buf[at:])
}

// releaseGrants releases every grant among buf, whole answer lines.
func (s *Server) releaseGrants(buf []byte) {
	var a codec.Answer
	for len(buf) > 0 {
		n, err := codec.ParseAnswer(buf, &a)
		if err != nil || n == 0 {
			return
		}
		if a.Kind == 'A' {
			s.cfg.Backend.Orphaned(a.Token, a.Key)
			s.orphans.Add(1)
		}
		buf = buf[n:]
	}
}
