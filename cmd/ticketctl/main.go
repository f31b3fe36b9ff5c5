// Command ticketctl takes and gives back locks on a ticketd server, for people
// at a shell and for scripts: it prints fencing tokens, and its exit codes
// tell a held key from a busy server from an error.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ticketd/ticketd/client"
)

// Exit codes. run exits with its command's status once the command started.
const (
	exitOK      = 0
	exitError   = 1
	exitUsage   = 2
	exitHeld    = 3
	exitBusy    = 4
	exitNotHeld = 5
	exitEnded   = 6 // the server ended the wait early: shutting down or restarting

	exitCannotExec = 126 // the command exists but could not be started
	exitNotFound   = 127 // no such command
	exitSignal     = 128 // + the signal number, for a command killed by a signal
)

const defaultAddr = "127.0.0.1:7411"

const exitCodesHelp = `Exit codes:
  0  ok
  1  error: ticketd unreachable, connection lost, no answer in time
  2  usage: a bad command, flag or argument
  3  held: the key is held by someone else (after --wait), or ticketd is in
     its grace period after a crash, when it answers every key as held until
     the leases granted before the crash could have ended. The message says
     which: ticketctl asks for a key nobody holds (ticketctl-probe.<random>,
     1ms lease, given back at once), which only a server in grace refuses
  4  busy: ticketd is at capacity (keys or waiters); nothing was queued
  5  not held: the token does not hold the key (release)
  6  wait ended: ticketd ended the wait before --wait passed, without
     granting the key: it is shutting down or restarting. Nothing is left
     queued; try again once it is back
  128+N  interrupted by signal N (SIGHUP 129, SIGINT 130, SIGQUIT 131,
       SIGTERM 143) while waiting for ticketd; run: the command not started
  run: once the command has started, its own exit status (128+N if a
  signal N ended it); 126 if it could not be started, 127 if not found.
`

const mainHelp = `Usage: ticketctl [--addr HOST:PORT] COMMAND [ARGS] [FLAGS]

ticketctl takes and gives back locks on a ticketd server.

Commands:
  acquire KEY                   take the lock on KEY and print its token
  release KEY TOKEN             give back the lock on KEY held with TOKEN
  run KEY -- COMMAND [ARGS...]  hold the lock on KEY while COMMAND runs
  help [COMMAND]                show this help, or a command's

Flags (after any command, too):
  --addr HOST:PORT  the ticketd to use; several, comma-separated, for a
                    cluster (default: $TICKETD_ADDR, else 127.0.0.1:7411)

` + exitCodesHelp + `
Run 'ticketctl COMMAND --help' for a command's flags.
`

func main() {
	os.Exit(ctl(os.Args[1:], os.Stdout, os.Stderr))
}

// ctl runs one command line and returns the exit code.
func ctl(args []string, stdout, stderr io.Writer) int {
	top := flag.NewFlagSet("ticketctl", flag.ContinueOnError)
	top.SetOutput(io.Discard)
	addr := top.String("addr", envAddr(), "")
	if err := top.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, mainHelp)
			return exitOK
		}
		return usageError(stderr, "", err.Error())
	}
	args = top.Args()
	if len(args) == 0 {
		fmt.Fprint(stderr, mainHelp)
		return exitUsage
	}
	cmd, args := args[0], args[1:]
	switch cmd {
	case "acquire":
		return cmdAcquire(args, *addr, stdout, stderr)
	case "release":
		return cmdRelease(args, *addr, stdout, stderr)
	case "run":
		return cmdRun(args, *addr, stdout, stderr)
	case "help":
		if len(args) == 0 {
			fmt.Fprint(stdout, mainHelp)
			return exitOK
		}
		if len(args) == 1 && (args[0] == "acquire" || args[0] == "release" || args[0] == "run") {
			return ctl([]string{args[0], "--help"}, stdout, stderr)
		}
		return usageError(stderr, "", fmt.Sprintf("no help for %q: the commands are acquire, release and run", strings.Join(args, " ")))
	}
	return usageError(stderr, "", fmt.Sprintf("unknown command %q: the commands are acquire, release and run", cmd))
}

func envAddr() string {
	if a := os.Getenv("TICKETD_ADDR"); a != "" {
		return a
	}
	return defaultAddr
}

func usageError(stderr io.Writer, cmd, msg string) int {
	name := "ticketctl"
	if cmd != "" {
		name += " " + cmd
	}
	fmt.Fprintf(stderr, "%s: %s\nRun '%s --help' for usage.\n", name, msg, name)
	return exitUsage
}

// command is the flag set of one command with its help text.
type command struct {
	name  string
	usage string // first line(s), before the flags
	about string // after the flags
	fs    *flag.FlagSet
	addr  *string
}

func newCommand(name, usage, about, addr string) *command {
	c := &command{name: name, usage: usage, about: about, fs: flag.NewFlagSet(name, flag.ContinueOnError)}
	c.fs.SetOutput(io.Discard)
	c.addr = c.fs.String("addr", addr, "the ticketd `HOST:PORT`; several, comma-separated, for a cluster (default: $TICKETD_ADDR, else "+defaultAddr+")")
	return c
}

func (c *command) help(w io.Writer) {
	fmt.Fprintf(w, "Usage: %s\n\n%s\nFlags:\n", c.usage, c.about)
	c.fs.VisitAll(func(f *flag.Flag) {
		name, usage := flag.UnquoteUsage(f)
		if name != "" {
			name = " " + name
		}
		fmt.Fprintf(w, "  --%s%s\n        %s", f.Name, name, usage)
		if f.Name != "addr" && f.DefValue != "" && f.DefValue != "false" {
			fmt.Fprintf(w, " (default %s)", f.DefValue)
		}
		fmt.Fprintln(w)
	})
	fmt.Fprintf(w, "\n%s", exitCodesHelp)
}

// parse reads flags anywhere among the arguments, as people type them
// ("acquire KEY --wait 5s"), and wants exactly npos positional ones (want
// names them for the usage error). With tail, the arguments after npos
// positional ones (or after "--") are returned apart: the command of run,
// whose own flags are not ticketctl's. ok false: the exit code is in code.
func (c *command) parse(args []string, npos int, want string, tail bool, stdout, stderr io.Writer) (pos, rest []string, code int, ok bool) {
	pos, rest, code, ok = c.parseArgs(args, npos, tail, stdout, stderr)
	if ok && len(pos) != npos {
		return nil, nil, usageError(stderr, c.name, fmt.Sprintf("want %s, got %d arguments", want, len(pos))), false
	}
	return pos, rest, code, ok
}

func (c *command) parseArgs(args []string, npos int, tail bool, stdout, stderr io.Writer) (pos, rest []string, code int, ok bool) {
	for {
		if err := c.fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				c.help(stdout)
				return nil, nil, exitOK, false
			}
			return nil, nil, usageError(stderr, c.name, err.Error()), false
		}
		left := c.fs.Args()
		if used := len(args) - len(left); used > 0 && args[used-1] == "--" {
			if !tail {
				return append(pos, left...), nil, 0, true
			}
			for len(pos) < npos && len(left) > 0 {
				pos, left = append(pos, left[0]), left[1:]
			}
			return pos, left, 0, true
		}
		if len(left) == 0 {
			return pos, nil, 0, true
		}
		if tail && len(pos) == npos {
			return pos, left, 0, true
		}
		pos, args = append(pos, left[0]), left[1:]
	}
}

// dial connects with one connection. The server, not the client, judges
// leases and waits: one request per connection has nobody else to fail.
func dial(addr string, stderr io.Writer) (*client.Client, int) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cl, err := client.Dial(ctx, addr, client.WithConns(1),
		client.WithLimits(math.MaxInt64, math.MaxInt64),
		client.WithBackoff(50*time.Millisecond, time.Second))
	if err != nil {
		return nil, report(stderr, err, addr, "")
	}
	return cl, exitOK
}

// report explains err to the user (what happened and what to do) and returns
// the exit code for it. key names the key for held and busy answers.
func report(stderr io.Writer, err error, addr, key string) int {
	msg, code := explain(err, addr, key)
	fmt.Fprintf(stderr, "ticketctl: %s\n", msg)
	return code
}

func explain(err error, addr, key string) (string, int) {
	var (
		ce *client.ConnError
		se *client.ServerError
	)
	switch {
	case errors.Is(err, client.ErrHeld):
		return fmt.Sprintf("%s is held by someone else; use --wait DURATION to queue for it", key), exitHeld
	case err == client.ErrBusy:
		return "ticketd is at capacity (its --max-keys, --max-waiters or --max-waiters-per-key limit); nothing was queued, try again later", exitBusy
	case err == client.ErrNotHeld:
		return "", exitNotHeld // the caller words it
	case errors.Is(err, client.ErrInvalid):
		return strings.TrimPrefix(err.Error(), "ticketd: "), exitUsage
	case errors.As(err, &se):
		return fmt.Sprintf("ticketd at %s refused the request (%s: %s); check --lease and --wait against the server's --max-lease and --max-wait",
			addr, se.Code, se.Text), exitError
	case errors.As(err, &ce) && ce.Unknown:
		return fmt.Sprintf("the connection to ticketd at %s broke before it answered (%s); the request may have been carried out",
			ce.Addr, cause(ce.Err)), exitError
	case errors.As(err, &ce):
		return fmt.Sprintf("cannot reach ticketd at %s: %s; is it running? start it with `ticketd`, or point --addr or $TICKETD_ADDR at it",
			ce.Addr, cause(ce.Err)), exitError
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Sprintf("no answer from ticketd at %s in time", addr), exitError
	case errors.Is(err, context.Canceled):
		return "interrupted", exitSignal + int(syscall.SIGINT)
	}
	return err.Error(), exitError
}

// cause shortens a network error to what a user can act on ("connection
// refused" rather than "dial tcp 127.0.0.1:7411: connect: connection refused").
func cause(err error) string {
	var errno syscall.Errno
	var dnsErr *net.DNSError
	switch {
	case errors.As(err, &errno):
		return errno.Error()
	case errors.As(err, &dnsErr):
		return dnsErr.Error()
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded):
		return "timed out"
	case err != nil:
		return err.Error()
	}
	return "unknown cause"
}

func cmdAcquire(args []string, addr string, stdout, stderr io.Writer) int {
	c := newCommand("acquire",
		"ticketctl acquire KEY [--lease 30s] [--wait 0] [--owner NAME] [--addr HOST:PORT]",
		`Takes the lock on KEY and prints its fencing token on stdout. The lock is
held until 'ticketctl release KEY TOKEN' gives it back or the lease ends,
whichever comes first; it does not end with ticketctl. Pass the token along
with each write to the resource the lock guards, so that the resource can
refuse writes from a holder whose lease has ended (a lower token).

  token=$(ticketctl acquire invoices --lease 5m) || exit
  ...
  ticketctl release invoices "$token"
`, addr)
	lease := c.fs.Duration("lease", 30*time.Second, "how long the lock lasts unless released (1ms resolution)")
	wait := c.fs.Duration("wait", 0, "how long to queue for the key if it is held; 0 answers at once")
	owner := c.fs.String("owner", "", "the owner `NAME` the server shows (default: a generated one)")
	pos, _, code, ok := c.parse(args, 1, "one KEY", false, stdout, stderr)
	if !ok {
		return code
	}
	key := pos[0]
	cl, code := dial(*c.addr, stderr)
	if cl == nil {
		return code
	}
	defer cl.Close()
	sigc, unnotify := notifyStop()
	defer unnotify()
	t0 := time.Now()
	l, sig, err := acquireInterruptible(cl, sigc, *owner, key, *lease, *wait)
	if sig != nil {
		if err == nil {
			releaseAfter(cl, l, false, stderr)
		}
		fmt.Fprintf(stderr, "ticketctl: interrupted (%v) before %s was acquired\n", sig, key)
		return exitSignal + signum(sig)
	}
	if err != nil {
		return reportAcquire(stderr, cl, err, *c.addr, key, *wait, time.Since(t0))
	}
	fmt.Fprintln(stdout, l.Token)
	return exitOK
}

// reportAcquire is report for an acquire of key that waited up to wait and
// failed after took. A T is not always a holder: a server that shuts down
// ends every wait with one, and one in its crash grace answers every key so.
func reportAcquire(stderr io.Writer, cl *client.Client, err error, addr, key string, wait, took time.Duration) int {
	switch {
	case err == client.ErrWaitEnded:
		fmt.Fprintf(stderr, "ticketctl: ticketd at %s ended the wait for %s after %v of %v without granting it: it is shutting down or restarting. %s was not acquired and nothing is left queued; try again once ticketd is back\n",
			addr, key, took.Round(10*time.Millisecond), wait, key)
		return exitEnded
	case !errors.Is(err, client.ErrHeld):
		return report(stderr, err, addr, key)
	}
	waited, hint := "", "; use --wait DURATION to queue for it"
	if wait > 0 {
		waited, hint = fmt.Sprintf(" (waited %v)", wait), ""
	}
	var msg string
	switch probeGrace(cl) {
	case graceYes:
		msg = fmt.Sprintf("%s was not granted%s: ticketd at %s is in its grace period after a crash, when it answers every key as held until the leases granted before the crash could have ended; whether anyone holds %s is unknown until then. Try again later",
			key, waited, addr, key)
	case graceNo:
		msg = key + " is held by someone else" + waited + hint
	default:
		msg = key + " is held by someone else, or ticketd is in its grace period after a crash (it then answers every key as held)" + waited + hint
	}
	fmt.Fprintf(stderr, "ticketctl: %s\n", msg)
	return exitHeld
}

type grace int

const (
	graceUnknown grace = iota
	graceNo
	graceYes
)

// probeGrace tells a server in its crash grace from a holder, which T alone
// cannot: it asks, without waiting, for a key with a random name, which
// nobody holds, so only a server in grace answers T. A grant is given back at
// once, and its lease of 1ms ends it should the release be lost.
func probeGrace(cl *client.Client) grace {
	var b [8]byte
	rand.Read(b[:])
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	l, err := cl.Acquire(ctx, "ticketctl-probe."+hex.EncodeToString(b[:]), time.Millisecond, 0)
	switch {
	case err == nil:
		cl.Release(ctx, l) // R, or N if the lease ended first: the key is gone either way
		return graceNo
	case err == client.ErrHeld:
		return graceYes
	}
	return graceUnknown
}

func acquire(ctx context.Context, cl *client.Client, owner, key string, lease, wait time.Duration) (client.Lock, error) {
	if owner != "" {
		return cl.AcquireAs(ctx, owner, key, lease, wait)
	}
	return cl.Acquire(ctx, key, lease, wait)
}

// stopSignals end a wait for ticketd, and are passed on to run's command.
// Each would otherwise kill ticketctl on the spot: a queued acquire is then
// withdrawn only by the server noticing, and run's command goes on with
// nobody watching its lease or releasing the lock.
var stopSignals = []os.Signal{syscall.SIGHUP, os.Interrupt, syscall.SIGQUIT, syscall.SIGTERM}

// notifyStop diverts stopSignals to the channel returned, until stop.
func notifyStop() (sigc <-chan os.Signal, stop func()) {
	c := make(chan os.Signal, 4)
	signal.Notify(c, stopSignals...)
	return c, func() { signal.Stop(c) }
}

// withSignals is parent, cancelled by the first signal from sigc. stop ends
// the watch and returns that signal, if one came.
func withSignals(parent context.Context, sigc <-chan os.Signal) (ctx context.Context, stop func() os.Signal) {
	ctx, cancel := context.WithCancel(parent)
	var sig os.Signal
	done := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case sig = <-sigc:
			cancel()
		case <-done:
		}
	}()
	return ctx, func() os.Signal {
		close(done)
		<-watched
		cancel()
		return sig
	}
}

func cmdRelease(args []string, addr string, stdout, stderr io.Writer) int {
	c := newCommand("release",
		"ticketctl release KEY TOKEN [--addr HOST:PORT]",
		`Gives back the lock on KEY held with TOKEN (as printed by 'ticketctl
acquire'). Any process may release with the token: it alone proves
holdership. Exits 5 if TOKEN does not hold KEY: it was released before, or its
lease ended and the key may have gone to someone else since.
`, addr)
	pos, _, code, ok := c.parse(args, 2, "KEY and TOKEN", false, stdout, stderr)
	if !ok {
		return code
	}
	key := pos[0]
	token, err := strconv.ParseUint(pos[1], 10, 64)
	if err != nil || token == 0 {
		return usageError(stderr, c.name, fmt.Sprintf("TOKEN %q: want a whole number from 1 up, as printed by 'ticketctl acquire'", pos[1]))
	}
	cl, code := dial(*c.addr, stderr)
	if cl == nil {
		return code
	}
	defer cl.Close()
	sigc, unnotify := notifyStop()
	defer unnotify()
	tctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx, stop := withSignals(tctx, sigc)
	err = cl.Release(ctx, client.Lock{Key: key, Token: token})
	if sig := stop(); sig != nil && errors.Is(err, context.Canceled) {
		fmt.Fprintf(stderr, "ticketctl: interrupted (%v) before ticketd answered; %s may or may not have been released\n", sig, key)
		return exitSignal + signum(sig)
	}
	if err == client.ErrNotHeld {
		fmt.Fprintf(stderr, "ticketctl: token %d does not hold %s: it was released before, or its lease ended\n", token, key)
		return exitNotHeld
	}
	if err != nil {
		return report(stderr, err, *c.addr, key)
	}
	return exitOK
}
