//go:build unix

package client

import (
	"net"
	"syscall"
)

// tryWriter writes to a connection without ever waiting for room in its
// socket. Its write method is bound once, so a write allocates nothing.
type tryWriter struct {
	ok  bool // the connection has a descriptor to write to
	rc  syscall.RawConn
	fn  func(fd uintptr) bool
	buf []byte
	err error
}

func (t *tryWriter) reset(nc net.Conn) {
	t.ok, t.rc = false, nil
	if sc, isSC := nc.(syscall.Conn); isSC {
		if rc, err := sc.SyscallConn(); err == nil {
			t.ok, t.rc = true, rc
		}
	}
	if t.fn == nil {
		t.fn = t.attempt
	}
}

// write writes what the socket takes of b now and returns the rest.
func (t *tryWriter) write(b []byte) ([]byte, error) {
	t.buf, t.err = b, nil
	if err := t.rc.Write(t.fn); err != nil {
		return nil, err
	}
	rest, err := t.buf, t.err
	t.buf = nil
	return rest, err
}

// attempt runs with the descriptor's write lock held (the slot's wmu keeps
// the writer out). It always returns true: never wait for the socket.
func (t *tryWriter) attempt(fd uintptr) bool {
	for len(t.buf) > 0 {
		n, err := syscall.Write(int(fd), t.buf)
		if n > 0 {
			t.buf = t.buf[n:]
		}
		switch {
		case err == nil && n > 0:
		case err == syscall.EINTR:
		case err == syscall.EAGAIN:
			return true
		case err != nil:
			t.err = err
			return true
		default: // 0 bytes and no error: leave it to a write that waits
			return true
		}
	}
	return true
}
