package netloop

import "golang.org/x/sys/unix"

// unacked is how much of what was written to fd (its end of stream
// included) the peer has not acknowledged yet; -1 if unknown.
func unacked(fd int) int {
	n, err := unix.IoctlGetInt(fd, unix.SIOCOUTQ)
	if err != nil {
		return -1
	}
	return n
}
