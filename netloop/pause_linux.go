//go:build linux && !poll_opt

package netloop

import (
	"reflect"

	"github.com/panjf2000/gnet/v2"
	"golang.org/x/sys/unix"
)

// gnet v2.9.7 reads every readable socket into an unbounded per-connection
// buffer and offers no way to stop (gnet issues #712 and #722), so a client
// that floods without reading would cost unbounded memory. We pause a
// connection by changing its interest in the loop's epoll set ourselves:
// reads off, writes on while gnet still has output for it. gnet's own
// epoll_ctl calls on that descriptor (after it drains output) turn reading
// back on; the next OnTraffic then re-applies the limits, so the worst case
// is one extra read buffer per drained write.
//
// The epoll descriptor is not exported; it is read once per connection by
// reflection from gnet's event loop (conn.loop.poller.fd). loopPollFD returns
// -1 if gnet's layout changes, and pausing then becomes a no-op: parsing
// still stops at the limits, only the kernel-level push-back is lost. A test
// guards the layout and the pause itself.
//
// Only gnet's default epoll poller stores the bare descriptor as the event
// data; under its poll_opt tag the data is a pointer to gnet's attachment,
// which EPOLL_CTL_MOD would overwrite. Hence this file's build constraint,
// and pause_other.go everywhere else.
func loopPollFD(gc gnet.Conn) int {
	v := reflect.ValueOf(gc)
	if v.Kind() != reflect.Pointer || v.IsNil() {
		return -1
	}
	loop := v.Elem().FieldByName("loop")
	if !loop.IsValid() || loop.Kind() != reflect.Pointer || loop.IsNil() {
		return -1
	}
	poller := loop.Elem().FieldByName("poller")
	if !poller.IsValid() || poller.Kind() != reflect.Pointer || poller.IsNil() {
		return -1
	}
	fd := poller.Elem().FieldByName("fd")
	if !fd.IsValid() || fd.Kind() != reflect.Int {
		return -1
	}
	return int(fd.Int())
}

// The event data is the descriptor itself, as gnet's default poller
// registers it. With no epoll descriptor both calls do nothing.
func pauseRead(epfd, fd int, writing bool) error {
	if epfd < 0 {
		return nil
	}
	// Without output unsent, EPOLLRDHUP without EPOLLIN: gnet closes a
	// connection whose client has closed its side, as it does when reading
	// finds the end, so that a paused connection that goes away is not
	// kept (its queued acquires withdrawn, grants for it released) until
	// it is resumed. With output unsent, EPOLLOUT alone: gnet, woken by an
	// end of stream alone, throws its output away before it closes, and a
	// client that half-closed before reading (`nc -N`) lost its answers.
	// Its end is read once the output drains. A client that goes away with
	// output unread resets the connection, which EPOLLOUT reports.
	ev := uint32(unix.EPOLLRDHUP)
	if writing {
		ev = unix.EPOLLOUT
	}
	return unix.EpollCtl(epfd, unix.EPOLL_CTL_MOD, fd, &unix.EpollEvent{Fd: int32(fd), Events: ev})
}

func resumeRead(epfd, fd int, writing bool) error {
	if epfd < 0 {
		return nil
	}
	ev := uint32(unix.EPOLLIN | unix.EPOLLPRI)
	if writing {
		ev |= unix.EPOLLOUT
	}
	return unix.EpollCtl(epfd, unix.EPOLL_CTL_MOD, fd, &unix.EpollEvent{Fd: int32(fd), Events: ev})
}
