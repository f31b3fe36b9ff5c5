package netloop

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"reflect"
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
//     descriptor from a goroutine of its own, within lingerFor, as linger
//     does for a connection closed with an E line;
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

// closedWithUnsent handles a connection's output that gnet had not written
// at its close (see above), off the event loop: releasing tens of thousands
// of grants took it from every other connection for a quarter of a second.
// err is the close's cause, as OnClose got it. It tells whether a writer
// took the connection over, which then counts under --max-conns until it is
// done. Stop waits for both (lingerAll).
func (s *Server) closedWithUnsent(gc gnet.Conn, unsent []byte, err error) bool {
	s.unsentBusy.Add(1)
	if errors.Is(err, io.EOF) {
		if fd, derr := dupFD(gc.Fd()); derr == nil {
			go s.writeAfterEOF(fd, unsent)
			return true
		}
	}
	go func() {
		defer s.unsentBusy.Add(-1)
		s.releaseUnsent(unsent, 0)
	}()
	return false
}

// writeAfterEOF writes unsent on fd, a duplicate of a connection's
// descriptor whose client has ended its stream, then ends the server's
// stream and waits for the client to close, all within lingerFor; then
// releases the grants it did not start to write.
func (s *Server) writeAfterEOF(fd int, unsent []byte) {
	defer s.unsentBusy.Add(-1)
	defer s.conns.Add(-1)
	written := 0
	f := os.NewFile(uintptr(fd), "")
	nc, err := net.FileConn(f) // a descriptor of its own, on Go's poller
	_ = f.Close()
	if err == nil {
		_ = nc.SetDeadline(time.Now().Add(lingerFor))
		written, err = nc.Write(unsent)
		if tc, ok := nc.(*net.TCPConn); ok && err == nil {
			// The client sends no more; read what it sent before its
			// end (unread, it would reset the connection at close).
			_ = tc.CloseWrite()
			_, _ = io.Copy(io.Discard, tc)
		}
		_ = nc.Close()
	}
	s.releaseUnsent(unsent, written)
}

// releaseUnsent releases the grants among buf, a connection's unsent
// output of which the first sent bytes were written, whose lines were not
// written at all. One written in part is kept: a client that takes a last
// line without its line end could take it for a grant. And buf's first
// line is never released: gnet may have written its start before.
func (s *Server) releaseUnsent(buf []byte, sent int) {
	at := bytes.IndexByte(buf, '\n') + 1
	if at == 0 {
		return
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
