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
	"github.com/ticketd/ticketd/codec"
	"github.com/ticketd/ticketd/internal/cliflag"
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
  2  usage: a bad command, flag or argument, or a --lease or --wait beyond
     the server's --max-lease/--max-wait
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
			return nil, nil, usageError(stderr, c.name, cliflag.Explain(c.fs, err).Error()), false
		}
		left := c.fs.Args()
		if msg := boolValueApart(c.fs, args, left); msg != "" {
			return nil, nil, usageError(stderr, c.name, msg), false
		}
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

// boolValueApart tells (a usage message) when a boolean flag was given its
// value as the next argument, `--kill-on-expiry false`: Go's flags take
// that value as the first argument that is not a flag, here the command
// to run. left is what fs.Parse(args) left.
func boolValueApart(fs *flag.FlagSet, args, left []string) string {
	used := len(args) - len(left)
	if used == 0 || len(left) == 0 {
		return ""
	}
	if _, err := strconv.ParseBool(left[0]); err != nil {
		return ""
	}
	prev := args[used-1]
	name := strings.TrimLeft(prev, "-")
	if name == prev || name == "" || strings.Contains(name, "=") {
		return ""
	}
	if f := fs.Lookup(name); f != nil {
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			return fmt.Sprintf("%s takes no separate value: write %s=%s", prev, prev, left[0])
		}
	}
	return ""
}

// Timeouts. A node that is gone without a reset (its host down, a link cut)
// lets a connection attempt run to its timeout, and a request on an open
// connection go unanswered. With several addresses each attempt gets
// dialPerAddr, so that the next address is tried in time (one alone gets
// dialOnly), and the dial as a whole that for each address and a second
// more. A connection that leaves a request unanswered answerTimeout past its
// wait, with nothing else arriving, is given up as silent: that is above a
// cluster node's --unavailable-timeout (5s by default), after which a node
// without quorum answers E unavailable, and below the timeouts of the
// commands, so that a hung node is noticed and (for a release) another
// address tried.
const (
	dialOnly      = 5 * time.Second
	dialPerAddr   = 2 * time.Second
	answerTimeout = 7 * time.Second
)

// addrCount is how many addresses addr lists, as client.Dial splits it.
func addrCount(addr string) int {
	n := 0
	for a := range strings.SplitSeq(addr, ",") {
		if strings.TrimSpace(a) != "" {
			n++
		}
	}
	return max(n, 1)
}

// releaseTimeout bounds a release, with its tries again, on addr: each
// address may take a dial timeout to skip, or answerTimeout to give up as
// silent.
func releaseTimeout(addr string) time.Duration {
	return max(10*time.Second, time.Duration(addrCount(addr))*(answerTimeout+dialPerAddr))
}

// dial connects with one connection. The server, not the client, judges
// leases and waits: one request per connection has nobody else to fail.
func dial(addr string, stderr io.Writer) (*client.Client, int) {
	n := addrCount(addr)
	per := dialOnly
	if n > 1 {
		per = dialPerAddr
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(n)*per+time.Second)
	defer cancel()
	cl, err := client.Dial(ctx, addr, client.WithConns(1),
		client.WithLimits(math.MaxInt64, math.MaxInt64),
		client.WithDialTimeout(per),
		client.WithAnswerTimeout(answerTimeout),
		client.WithBackoff(50*time.Millisecond, time.Second))
	if err != nil {
		return nil, report(stderr, err, "", addr, "")
	}
	return cl, exitOK
}

// report explains err to the user (what happened and what to do) and returns
// the exit code for it. op is the request ("acquire", "release"; "" for a
// dial), key names the key.
func report(stderr io.Writer, err error, op, addr, key string) int {
	msg, code := explain(err, op, addr, key)
	fmt.Fprintf(stderr, "ticketctl: %s\n", msg)
	return code
}

// refused tells whether se is an E line for a request that the server could
// not understand: it carried nothing out. Any other code (unavailable: no
// quorum, or one this ticketctl does not know) leaves the outcome unknown.
func refused(se *client.ServerError) bool {
	switch se.Code {
	case "syntax", "range", "too-long", "command":
		return true
	}
	return false
}

// mayHaveHappened says what an unknown outcome of op on key means.
func mayHaveHappened(op, key string) string {
	switch op {
	case "acquire":
		return fmt.Sprintf("%s may or may not have been acquired; if it was, it stays held until its lease (--lease) ends", key)
	case "release":
		return fmt.Sprintf("%s may or may not have been released; run the release again (exit 5 then means that the token no longer holds it)", key)
	}
	return "the request may or may not have been carried out"
}

func explain(err error, op, addr, key string) (string, int) {
	var (
		ce *client.ConnError
		se *client.ServerError
	)
	node := addr // the node that failed the request, when known
	if errors.As(err, &ce) {
		node = ce.Addr
	}
	isSE := errors.As(err, &se)
	var pe *client.ProtocolError
	switch {
	case errors.Is(err, client.ErrHeld):
		return fmt.Sprintf("%s is held by someone else; use --wait DURATION to queue for it", key), exitHeld
	case err == client.ErrBusy:
		return "ticketd is at capacity (its --max-keys, --max-waiters or --max-waiters-per-key limit); nothing was queued, try again later", exitBusy
	case err == client.ErrNotHeld:
		return "", exitNotHeld // the caller words it
	case errors.Is(err, client.ErrInvalid):
		return strings.TrimPrefix(err.Error(), "ticketd: "), exitUsage
	case isSE && se.Code == "range":
		return fmt.Sprintf("ticketd at %s refused the request as out of range (E range: %s): --lease or --wait is beyond the server's --max-lease/--max-wait (1h each by default); nothing was carried out",
			node, se.Text), exitUsage
	case isSE && refused(se):
		return fmt.Sprintf("ticketd at %s could not understand the request (E %s: %s); nothing was carried out. Are ticketctl and ticketd of the same version?",
			node, se.Code, se.Text), exitError
	case isSE && se.Code == "unavailable":
		next := "Try again, or point --addr at other nodes too"
		if addrCount(addr) > 1 {
			next = "Try again, or list another node first in --addr (this one may be cut off from the others)"
		}
		return fmt.Sprintf("ticketd at %s has no quorum for the key's shard (E unavailable: %s); %s. %s",
			node, se.Text, mayHaveHappened(op, key), next), exitError
	case isSE:
		return fmt.Sprintf("ticketd at %s gave up the request (E %s: %s); %s",
			node, se.Code, se.Text, mayHaveHappened(op, key)), exitError
	case errors.As(err, &pe):
		msg := fmt.Sprintf("what answers at %s does not speak ticketd's protocol (%s): is --addr another service's port, ticketd's --admin one say?", node, pe.Text)
		if ce != nil && ce.Unknown {
			msg += " If it is a ticketd, " + mayHaveHappened(op, key)
		}
		return msg, exitError
	case ce != nil && errors.Is(err, client.ErrClosedAtOnce):
		msg := fmt.Sprintf("ticketd at %s took the connection and closed it before answering anything: it is at its --max-conns limit, or starting or stopping", node)
		if ce.Unknown {
			return msg + "; " + mayHaveHappened(op, key), exitError
		}
		return msg + "; nothing was carried out, try again later", exitError
	case ce != nil && ce.Unknown:
		return fmt.Sprintf("the connection to ticketd at %s broke before it answered (%s); %s",
			node, cause(ce.Err), mayHaveHappened(op, key)), exitError
	case ce != nil:
		return fmt.Sprintf("cannot reach ticketd at %s: %s; is it running? start it with `ticketd`, or point --addr or $TICKETD_ADDR at it",
			node, cause(ce.Err)), exitError
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Sprintf("no answer from ticketd at %s in time; %s", addr, mayHaveHappened(op, key)), exitError
	case errors.Is(err, context.Canceled):
		return "interrupted", exitSignal + int(syscall.SIGINT)
	}
	return err.Error(), exitError
}

// cause shortens a network error to what a user can act on ("connection
// refused" rather than "dial tcp 127.0.0.1:7411: connect: connection refused").
// Failed attempts at several addresses are named one by one.
func cause(err error) string {
	if j, ok := err.(interface{ Unwrap() []error }); ok && len(j.Unwrap()) > 1 {
		var parts []string
		for _, e := range j.Unwrap() {
			c := cause(e)
			var oe *net.OpError
			if errors.As(e, &oe) && oe.Addr != nil {
				c = oe.Addr.String() + ": " + c
			}
			parts = append(parts, c)
		}
		return strings.Join(parts, "; ")
	}
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
	if code, ok := c.checkLeaseWait(*lease, *wait, stderr); !ok {
		return code
	}
	if code, ok := c.checkKeyOwner(key, *owner, stderr); !ok {
		return code
	}
	if stdout == io.Writer(os.Stdout) && stdoutClosedAtStart() {
		// The write would succeed, to /dev/null, and the lock stay held
		// to its lease's end with its token lost.
		fmt.Fprintf(stderr, "ticketctl: standard output is closed: the token of %s would be lost, the lock held until its lease ended; nothing was acquired\n", key)
		return exitError
	}
	// A stdout whose reader is gone must not kill ticketctl with the lock
	// taken and its token unprinted: with SIGPIPE ignored the write fails,
	// and the lock is given back.
	signal.Ignore(syscall.SIGPIPE)
	cl, code := dial(*c.addr, stderr)
	if cl == nil {
		return code
	}
	// Signals stay diverted to the exit, through Close, which can take
	// seconds: a signal's default action would end the process with 128+N
	// after its token was printed, and a script would drop the token of a
	// lock it holds.
	sigc, _ := notifyStop()
	defer cl.Close()
	t0 := time.Now()
	l, sig, err := acquireInterruptible(cl, sigc, *owner, key, *lease, *wait)
	if sig != nil {
		if err == nil {
			releaseAfter(cl, l, *c.addr, false, stderr)
		}
		fmt.Fprintf(stderr, "ticketctl: interrupted (%v) before %s was acquired\n", sig, key)
		return exitSignal + signum(sig)
	}
	if err != nil {
		return reportAcquire(stderr, cl, err, *c.addr, key, *wait, time.Since(t0))
	}
	if _, err := fmt.Fprintln(stdout, l.Token); err != nil {
		// Nobody has the token: the lock would only block others until
		// its lease ended.
		fmt.Fprintf(stderr, "ticketctl: cannot print the token of %s: %v; giving the lock back\n", key, err)
		releaseAfter(cl, l, *c.addr, false, stderr)
		return exitError
	}
	return exitOK
}

// checkLeaseWait refuses a lease or wait that no server takes (the server
// judges the upper limits, its --max-lease and --max-wait).
func (c *command) checkLeaseWait(lease, wait time.Duration, stderr io.Writer) (int, bool) {
	if lease < time.Millisecond {
		return usageError(stderr, c.name, fmt.Sprintf("--lease %v: want at least 1ms (and at most the server's --max-lease, 1h by default)", lease)), false
	}
	if wait < 0 || wait > 0 && wait < time.Millisecond {
		// Sent in whole milliseconds: under 1ms it would go as 0.
		return usageError(stderr, c.name, fmt.Sprintf("--wait %v: want 0, or 1ms or more (and at most the server's --max-wait, 1h by default)", wait)), false
	}
	return 0, true
}

// checkKeyOwner checks key and owner ("": a generated one) as the server
// would, before any dial: a bad one is a usage error, whether or not a
// server is up.
func (c *command) checkKeyOwner(key, owner string, stderr io.Writer) (int, bool) {
	if codec.ValidateRelease(1, []byte(key)) != nil {
		return usageError(stderr, c.name, fmt.Sprintf("key %q: want 1 to %d bytes without spaces or control bytes", key, codec.MaxKey)), false
	}
	if owner != "" && codec.ValidateAcquire([]byte(owner), []byte(key), 1, 0, codec.Limits{}) != nil {
		return usageError(stderr, c.name, fmt.Sprintf("--owner %q: want 1 to %d bytes without spaces or control bytes", owner, codec.MaxOwner)), false
	}
	return 0, true
}

// reportAcquire is report for an acquire of key that waited up to wait and
// failed after took. A T is not always a holder: a server that shuts down
// ends every wait with one, and one in its crash grace answers every key so.
func reportAcquire(stderr io.Writer, cl *client.Client, err error, addr, key string, wait, took time.Duration) int {
	switch {
	case err == client.ErrWaitEnded:
		who := "ticketd at " + addr
		if addrCount(addr) > 1 {
			who = "the ticketd node that had the wait (one of " + addr + ")"
		}
		fmt.Fprintf(stderr, "ticketctl: %s ended the wait for %s after %v of %v without granting it: it is shutting down or restarting. %s was not acquired and nothing is left queued; try again once ticketd is back\n",
			who, key, took.Round(10*time.Millisecond), wait, key)
		return exitEnded
	case !errors.Is(err, client.ErrHeld):
		return report(stderr, err, "acquire", addr, key)
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
// One ignored when ticketctl started (nohup; a background job of a shell
// without job control ignores SIGINT and SIGQUIT) stays ignored, for run's
// command too, which would otherwise get it back and die of it.
func notifyStop() (sigc <-chan os.Signal, stop func()) {
	c := make(chan os.Signal, 4)
	var sigs []os.Signal
	for _, s := range stopSignals {
		if !signal.Ignored(s) {
			sigs = append(sigs, s)
		}
	}
	signal.Notify(c, sigs...)
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
holdership. Exits 5 if TOKEN does not hold KEY: it was released before, its
lease ended and the key may have gone to someone else since, or ticketd
restarted after a crash. A release whose connection fails (a node down, or
without quorum) is sent again, to the next address if there are several:
a token releases its key only once, so that is safe.
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
	if code, ok := c.checkKeyOwner(key, "", stderr); !ok {
		return code
	}
	cl, code := dial(*c.addr, stderr)
	if cl == nil {
		return code
	}
	sigc, _ := notifyStop() // diverted to the exit, as in acquire
	defer cl.Close()
	tctx, cancel := context.WithTimeout(context.Background(), releaseTimeout(*c.addr))
	defer cancel()
	ctx, stop := withSignals(tctx, sigc)
	lost, err := release(ctx, cl, client.Lock{Key: key, Token: token})
	sig := stop()
	switch {
	case err == nil:
		return exitOK
	case err == client.ErrNotHeld:
		why := "it was released before, its lease ended, or ticketd restarted after a crash"
		if lost {
			why = "an earlier try, whose answer was lost with its connection, may have released it; or " + why
		}
		fmt.Fprintf(stderr, "ticketctl: token %d does not hold %s: %s\n", token, key, why)
		return exitNotHeld
	case sig != nil:
		fmt.Fprintf(stderr, "ticketctl: interrupted (%v) before ticketd answered; %s may or may not have been released\n", sig, key)
		return exitSignal + signum(sig)
	}
	msg, code := explain(err, "release", *c.addr, key)
	if lost && code == exitError && !errors.Is(err, client.ErrOutcomeUnknown) && !errors.Is(err, context.DeadlineExceeded) {
		msg += "; an earlier try's answer was lost with its connection, so " + mayHaveHappened("release", key)
	}
	fmt.Fprintf(stderr, "ticketctl: %s\n", msg)
	return code
}

// release gives l back. A try that fails on its connection (down, silent,
// E unavailable) is made again, after a pause that grows to a second, on
// whichever connection the client has up by then (it redials another
// address first), until ctx ends: not only to l.Deadline, which for a grant
// that waited queued longer than its lease has passed when it arrives,
// while the server's lease has just begun. Sending a release again is safe: a token releases its
// key once, and the later holders of the key have larger tokens. lost tells
// whether a try was sent and left unanswered: then an N at the end may
// answer a key that that try released.
func release(ctx context.Context, cl *client.Client, l client.Lock) (lost bool, err error) {
	pause := 50 * time.Millisecond
	for {
		err = cl.Release(ctx, l)
		var (
			ce *client.ConnError
			se *client.ServerError
		)
		if !errors.As(err, &ce) || errors.As(err, &se) && refused(se) || errors.Is(err, client.ErrClosed) {
			return lost, err
		}
		lost = lost || ce.Unknown
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return lost, err
		case <-t.C:
		}
		pause = min(2*pause, time.Second)
	}
}
