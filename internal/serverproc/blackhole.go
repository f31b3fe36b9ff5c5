package serverproc

import (
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"
)

// BlackHole returns a loopback address whose connection attempts go
// unanswered, as a host that is down or cut off: a listener with a full
// accept queue, which the kernel lets drop each SYN. release closes it and
// the connections that filled it.
func BlackHole() (addr string, release func(), err error) {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return "", nil, err
	}
	var fillers []net.Conn
	release = func() {
		for _, nc := range fillers {
			nc.Close()
		}
		syscall.Close(fd)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		release()
		return "", nil, err
	}
	if err := syscall.Listen(fd, 0); err != nil {
		release()
		return "", nil, err
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		release()
		return "", nil, err
	}
	addr = fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
	for range 16 {
		nc, err := net.DialTimeout("tcp", addr, 300*time.Millisecond)
		if err != nil {
			return addr, release, nil // the queue is full
		}
		fillers = append(fillers, nc)
	}
	release()
	return "", nil, errors.New("serverproc: the accept queue of a listener with backlog 0 does not fill")
}
