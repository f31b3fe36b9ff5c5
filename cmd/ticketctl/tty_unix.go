//go:build unix

package main

import (
	"errors"
	"syscall"

	"golang.org/x/sys/unix"
)

// ctty is ticketctl's controlling terminal, open for asking which process
// group is in its foreground; nil if it has none.
type ctty struct{ fd int }

func openTTY() *ctty {
	fd, err := unix.Open("/dev/tty", unix.O_RDONLY|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil // no controlling terminal (ENXIO): a service, cron, setsid
	}
	return &ctty{fd}
}

func (t *ctty) close() {
	if t != nil {
		unix.Close(t.fd)
	}
}

// foreground tells whether ticketctl's process group is the terminal's
// foreground group, or the terminal hung up (EIO), whose SIGHUP went to that
// group, as the shell's did to the group of each job.
func (t *ctty) foreground() bool {
	if t == nil {
		return false
	}
	pgrp, err := unix.IoctlGetInt(t.fd, unix.TIOCGPGRP)
	if err != nil {
		return errors.Is(err, syscall.EIO)
	}
	own, err := unix.Getpgid(0)
	return err == nil && pgrp == own
}

// stdoutClosedAtStart tells whether ticketctl was started with its standard
// output closed (`>&-`): the Go runtime then opens /dev/null in its place,
// read-write, where a shell's `>/dev/null` opens it write-only. A token
// printed there is lost without an error.
func stdoutClosedAtStart() bool {
	fl, err := unix.FcntlInt(1, unix.F_GETFL, 0)
	if err != nil || fl&unix.O_ACCMODE != unix.O_RDWR {
		return false
	}
	var out, null unix.Stat_t
	if unix.Fstat(1, &out) != nil || unix.Stat("/dev/null", &null) != nil {
		return false
	}
	return out.Mode&unix.S_IFMT == unix.S_IFCHR && out.Rdev == null.Rdev
}
