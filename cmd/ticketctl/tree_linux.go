package main

import (
	"bytes"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// run's command may start processes of its own (a script's commands, a
// worker it forks), and some outlive it. --kill-on-expiry must stop them
// all, or the work goes on after the lease has passed to another holder.
// ticketctl makes itself the subreaper of its descendants, so that those
// whose parent ends come to it rather than to init and stay findable, and
// signals every descendant it finds in /proc. (A process group would not
// do: the command shares ticketctl's, which a terminal signals, and may
// make groups of its own.)

// becomeSubreaper makes ticketctl the reaper of its orphaned descendants.
func becomeSubreaper() { _ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) }

// procEntry is a process's parent and state, from /proc/PID/stat.
type procEntry struct {
	pid, ppid int
	state     byte
}

// processes lists /proc's processes.
func processes() []procEntry {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []procEntry
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 || i+2 >= len(b) {
			continue
		}
		f := bytes.Fields(b[i+2:])
		if len(f) < 2 || len(f[0]) != 1 {
			continue
		}
		ppid, err := strconv.Atoi(string(f[1]))
		if err != nil {
			continue
		}
		out = append(out, procEntry{pid, ppid, f[0][0]})
	}
	return out
}

// descendants are the live processes under ticketctl (zombies left out).
func descendants() []int {
	procs := processes()
	kids := map[int][]procEntry{}
	for _, p := range procs {
		kids[p.ppid] = append(kids[p.ppid], p)
	}
	var out []int
	for q := []int{os.Getpid()}; len(q) > 0; q = q[1:] {
		for _, k := range kids[q[0]] {
			if k.state != 'Z' {
				out = append(out, k.pid)
			}
			q = append(q, k.pid)
		}
	}
	return out
}

// signalTree sends sig to every descendant of ticketctl but except.
func signalTree(sig syscall.Signal, except int) {
	for _, pid := range descendants() {
		if pid != except {
			_ = syscall.Kill(pid, sig)
		}
	}
}

// reapOrphans waits for the children that ended, but the command's own
// process (os/exec waits for that one): those that came to ticketctl as
// their reaper, which would otherwise stay zombies until it exits.
func reapOrphans(command int) {
	self := os.Getpid()
	for _, p := range processes() {
		if p.ppid == self && p.state == 'Z' && p.pid != command {
			var ws syscall.WaitStatus
			_, _ = syscall.Wait4(p.pid, &ws, syscall.WNOHANG, nil)
		}
	}
}
