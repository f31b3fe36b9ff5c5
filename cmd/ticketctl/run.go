package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/ticketd/ticketd/client"
)

func cmdRun(args []string, addr string, stdout, stderr io.Writer) int {
	c := newCommand("run",
		"ticketctl run KEY [--lease 30s] [--wait 10s] [--owner NAME] [--kill-on-expiry [--kill-grace 5s]] [--addr HOST:PORT] -- COMMAND [ARGS...]",
		`Holds the lock on KEY while COMMAND runs, then releases it, and exits with
the command's status. The command gets the lock in its environment, so that
it can pass the fencing token along with its writes:

  TICKETD_KEY       the key
  TICKETD_TOKEN     the fencing token
  TICKETD_DEADLINE  when the lease ends (RFC 3339, UTC; already counted
                    conservatively from before the grant)
  TICKETD_ADDR      the ticketd address

There is no renewal: pick a --lease longer than the command takes. If the
lease ends first, ticketctl says so on stderr (someone else may hold the key
from then on), and still exits with the command's status; with
--kill-on-expiry it also stops the command and every process it started
(on Linux): SIGTERM, then SIGKILL after --kill-grace. When the command ends,
ticketctl names the processes it left running: they no longer hold the
lock. If ticketctl itself is killed with SIGKILL, nothing watches the lease.

SIGTERM sent to ticketctl is passed on to the command (its pid only: a
command that starts others should pass it on, e.g. with exec in sh -c), and
so are SIGHUP, SIGINT and SIGQUIT, except while
ticketctl is in the foreground of a terminal: the command is in ticketctl's
process group, so the terminal's Ctrl-C (SIGINT), Ctrl-\ (SIGQUIT) and
hangup (SIGHUP) reach it directly, and passing them on would deliver them
twice. (Then 'kill -INT' to ticketctl's pid alone does not reach the command;
SIGTERM does.) ticketctl stays until the command ends and then releases the
lock; a signal during that release ends it (exit 128+N: the lock ends
with its lease). Before the command started these signals end the wait for
the lock (exit 128+N); signals ignored when ticketctl started (nohup) stay
ignored for the command. If the lock cannot be had, the command does not
run.
`, addr)
	lease := c.fs.Duration("lease", 30*time.Second, "how long the lock lasts unless released (1ms resolution)")
	wait := c.fs.Duration("wait", 10*time.Second, "how long to queue for the key if it is held; 0 gives up at once")
	owner := c.fs.String("owner", "", "the owner `NAME` the server shows (default: a generated one)")
	kill := c.fs.Bool("kill-on-expiry", false, "stop the command when the lease ends")
	grace := c.fs.Duration("kill-grace", 5*time.Second, "with --kill-on-expiry, time between SIGTERM and SIGKILL")
	pos, argv, code, ok := c.parse(args, 1, "one KEY", true, stdout, stderr)
	if !ok {
		return code
	}
	if len(argv) == 0 {
		return usageError(stderr, c.name, "no COMMAND given: ticketctl run KEY [FLAGS] -- COMMAND [ARGS...]")
	}
	if *grace < 0 {
		return usageError(stderr, c.name, fmt.Sprintf("--kill-grace %v: must not be negative", *grace))
	}
	graceGiven := false
	c.fs.Visit(func(f *flag.Flag) { graceGiven = graceGiven || f.Name == "kill-grace" })
	if graceGiven && !*kill {
		// Accepted, it would do nothing: the command would not be stopped
		// at the lease's end, whatever its grace.
		return usageError(stderr, c.name, "--kill-grace: only with --kill-on-expiry (without it the command is not stopped when the lease ends)")
	}
	key := pos[0]
	if code, ok := c.checkLeaseWait(*lease, *wait, stderr); !ok {
		return code
	}
	if code, ok := c.checkKeyOwner(key, *owner, stderr); !ok {
		return code
	}

	// From here on stopSignals are ours: while waiting for the lock they
	// cancel the acquire, once the command runs they are passed on. Never
	// given back: one between that and the exit would make the exit status
	// 128+N, not the command's.
	sigc, _ := notifyStop()
	// A closed stderr (a log pipe gone with the terminal) must not kill
	// ticketctl while the command runs: with SIGPIPE caught, writes to it
	// fail instead. The command gets the default disposition back at exec.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)

	cl, code := dial(*c.addr, stderr)
	if cl == nil {
		return code
	}
	defer cl.Close()

	t0 := time.Now()
	l, sig, err := acquireInterruptible(cl, sigc, *owner, key, *lease, *wait)
	if sig != nil {
		if err == nil {
			releaseAfter(cl, l, *c.addr, false, stderr)
		}
		fmt.Fprintf(stderr, "ticketctl: interrupted (%v) before the command started\n", sig)
		return exitSignal + signum(sig)
	}
	if err != nil {
		return reportAcquire(stderr, cl, err, *c.addr, key, *wait, time.Since(t0))
	}

	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, stdout, stderr
	cmd.Env = append(os.Environ(),
		"TICKETD_KEY="+key,
		"TICKETD_TOKEN="+strconv.FormatUint(l.Token, 10),
		"TICKETD_DEADLINE="+l.Deadline.UTC().Format(time.RFC3339Nano),
		"TICKETD_ADDR="+*c.addr,
	)
	tty := openTTY()
	defer tty.close()
	becomeSubreaper()
	if err := cmd.Start(); err != nil {
		releaseAfter(cl, l, *c.addr, false, stderr)
		fmt.Fprintf(stderr, "ticketctl: cannot run %s: %v\n", argv[0], err)
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
			return exitNotFound
		}
		return exitCannotExec
	}
	waitc := make(chan error, 1)
	go func() { waitc <- cmd.Wait() }()

	expiry := time.NewTimer(time.Until(l.Deadline))
	defer expiry.Stop()
	reap := time.NewTicker(time.Second)
	defer reap.Stop()
	var killc <-chan time.Time
	var killAt time.Time
	expired := false
	pid := cmd.Process.Pid
	for done := false; !done; {
		select {
		case <-waitc:
			done = true
		case s := <-sigc:
			if passOn(s, tty) {
				cmd.Process.Signal(s)
			}
		case <-expiry.C:
			expired = true
			fmt.Fprintf(stderr, "ticketctl: the lease on %s (token %d) ended while the command was still running; someone else may hold the key now (use a longer --lease)\n",
				key, l.Token)
			if *kill {
				fmt.Fprintf(stderr, "ticketctl: stopping the command and the processes it started (--kill-on-expiry): SIGTERM, then SIGKILL after %v\n", *grace)
				cmd.Process.Signal(syscall.SIGTERM)
				signalTree(syscall.SIGTERM, pid)
				killAt = time.Now().Add(*grace)
				killc = time.After(*grace)
			}
		case <-killc:
			fmt.Fprintf(stderr, "ticketctl: the command outlived --kill-grace %v: SIGKILL\n", *grace)
			cmd.Process.Kill()
			signalTree(syscall.SIGKILL, pid)
			killc = nil
		case <-reap.C:
			reapOrphans(pid)
		}
	}
	if killc != nil {
		// The command ended on SIGTERM; what it started gets the rest of
		// the grace, and then SIGKILL.
		for len(descendants()) > 0 && time.Now().Before(killAt) {
			time.Sleep(20 * time.Millisecond)
			reapOrphans(pid)
		}
		if len(descendants()) > 0 {
			fmt.Fprintf(stderr, "ticketctl: processes the command started outlived --kill-grace %v: SIGKILL\n", *grace)
			signalTree(syscall.SIGKILL, pid)
		}
	}
	reapOrphans(pid)
	if left := descendants(); len(left) > 0 {
		if len(left) == 1 {
			fmt.Fprintf(stderr, "ticketctl: the command left a process running (pid %d); it does not hold the lock on %s any more\n", left[0], key)
		} else {
			fmt.Fprintf(stderr, "ticketctl: the command left %d processes running (pids %v); they do not hold the lock on %s any more\n",
				len(left), left, key)
		}
	}
	// A signal now (an impatient Ctrl-C, a supervisor's SIGTERM while
	// ticketd does not answer) ends the release: the lock then ends with
	// its lease.
	ctx, stop := withSignals(context.Background(), sigc)
	released := releaseAfterCtx(ctx, cl, l, *c.addr, expired, stderr)
	if s := stop(); s != nil && !released {
		fmt.Fprintf(stderr, "ticketctl: interrupted (%v) while releasing %s (token %d); it is freed when its lease ends, or with 'ticketctl release %s %d'\n",
			s, key, l.Token, key, l.Token)
		return exitSignal + signum(s)
	}
	return exitStatus(cmd.ProcessState)
}

// acquireInterruptible acquires while watching sigc. A signal cancels the
// acquire and is returned; if the grant won the race, the lock is returned
// too, for the caller to give back.
func acquireInterruptible(cl *client.Client, sigc <-chan os.Signal, owner, key string, lease, wait time.Duration) (client.Lock, os.Signal, error) {
	limit := wait + 10*time.Second
	if limit < wait {
		limit = wait // overflowed: the server's --max-wait refuses such a wait anyway
	}
	tctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	ctx, stop := withSignals(tctx, sigc)
	l, err := acquire(ctx, cl, owner, key, lease, wait)
	return l, stop(), err
}

// passOn tells whether run passes signal s, sent to ticketctl, on to its
// command. The command is in ticketctl's process group. The terminal sends
// SIGINT (Ctrl-C), SIGQUIT (Ctrl-\) and, when it hangs up, SIGHUP to its
// foreground process group, and a shell that hangs up passes SIGHUP on to
// the process group of each of its jobs: while ticketctl's group is in the
// foreground, the command got these already. So they are passed on only when
// ticketctl has no terminal or is not in its foreground (a background job, a
// service, cron): then a signal reached ticketctl alone, from kill. SIGTERM
// comes from kill (or a supervisor) and is always passed on. The price: in
// the foreground, 'kill -INT' to ticketctl's pid alone is not passed on.
func passOn(s os.Signal, tty *ctty) bool {
	return s == syscall.SIGTERM || !tty.foreground()
}

// releaseAfter gives l back after use (see release), and says on stderr if
// that failed. expired: the lease ended during use, as the user was told.
func releaseAfter(cl *client.Client, l client.Lock, addr string, expired bool, stderr io.Writer) {
	_ = releaseAfterCtx(context.Background(), cl, l, addr, expired, stderr)
}

// releaseAfterCtx is releaseAfter within parent; it says nothing if parent
// ends first (the caller does). It tells whether l was released.
func releaseAfterCtx(parent context.Context, cl *client.Client, l client.Lock, addr string, expired bool, stderr io.Writer) bool {
	ctx, cancel := context.WithTimeout(parent, releaseTimeout(addr))
	defer cancel()
	lost, err := release(ctx, cl, l)
	switch {
	case err == nil:
		return true
	case parent.Err() != nil:
	case err == client.ErrNotHeld:
		if !expired {
			why := "its lease had ended, or ticketd restarted after a crash"
			if lost {
				why = "an earlier try, whose answer was lost with its connection, may have released it; or " + why
			}
			fmt.Fprintf(stderr, "ticketctl: %s was no longer held with token %d at release: %s\n", l.Key, l.Token, why)
		}
	default:
		msg, _ := explain(err, "release", addr, l.Key)
		fmt.Fprintf(stderr, "ticketctl: could not release %s (token %d): %s; it is freed when its lease ends, or with 'ticketctl release %s %d'\n",
			l.Key, l.Token, msg, l.Key, l.Token)
	}
	return false
}

// exitStatus turns the command's end into ticketctl's exit code, as a shell does.
func exitStatus(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return exitSignal + int(ws.Signal())
	}
	return ps.ExitCode()
}

func signum(s os.Signal) int {
	if n, ok := s.(syscall.Signal); ok {
		return int(n)
	}
	return int(syscall.SIGINT)
}
