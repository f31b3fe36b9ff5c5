//go:build !linux || poll_opt

package netloop

import "github.com/panjf2000/gnet/v2"

// Without gnet's default epoll poller there is no safe way to stop polling a
// socket for reading (see pause_linux.go). Pausing then only stops parsing:
// the connection still costs at most its limits in answers and waiters, but
// gnet goes on buffering what the client sends.

func loopPollFD(gnet.Conn) int { return -1 }

func pauseRead(int, int, bool) error { return nil }

func resumeRead(int, int, bool) error { return nil }
