//go:build unix

package netloop

import "golang.org/x/sys/unix"

// shutWrite sends the client end of stream after what was written.
func shutWrite(fd int) error { return unix.Shutdown(fd, unix.SHUT_WR) }

// dupFD duplicates fd, close-on-exec.
func dupFD(fd int) (int, error) { return unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0) }
