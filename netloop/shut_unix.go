//go:build unix

package netloop

import "golang.org/x/sys/unix"

// shutWrite sends the client end of stream after what was written.
func shutWrite(fd int) error { return unix.Shutdown(fd, unix.SHUT_WR) }
