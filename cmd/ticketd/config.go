package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap/zapcore"

	"github.com/ticketd/ticketd/internal/cliflag"
	"github.com/ticketd/ticketd/netloop"
)

// config is the server's configuration, checked once at start.
type config struct {
	listen           string
	dataDir          string
	shards           int
	sweepInterval    time.Duration
	maxLease         time.Duration
	maxWait          time.Duration
	maxWaitersPerKey int
	maxWaiters       int
	maxKeys          int
	maxConns         int
	maxInflight      int
	sendBuffer       int
	loops            int
	logLevel         string
	logFormat        string
	admin            string
	version          bool
	shutdownTimeout  time.Duration
	recoverDamaged   bool
	cluster          clusterFlags
	idleTimeout      time.Duration
	frameTimeout     time.Duration

	level zapcore.Level
}

// maxLeaseLimit bounds --max-lease. A lease is also how long a crash
// restart may refuse every grant, and a recovery of a damaged data dir
// refuses them for --max-lease: a month is already more than a lock
// service should make anyone wait.
const maxLeaseLimit = 30 * 24 * time.Hour

// descriptorReserve is kept free of client connections for the listener,
// the data dir's files, the admin listener, the event loops' pollers and the
// enrolls in flight.
const descriptorReserve = 256 + netloop.EnrollDescriptors

func parseConfig(args []string, stderr io.Writer) (*config, error) {
	c := &config{}
	fs := flag.NewFlagSet("ticketd", flag.ContinueOnError)
	// The usage goes out for --help only: a bad value gets one line (main
	// prints it), not the flag list after it.
	var usage bytes.Buffer
	fs.SetOutput(&usage)
	fs.StringVar(&c.listen, "listen", "127.0.0.1:7411", "TCP address to serve the protocol on (port 0 picks a free port)")
	fs.StringVar(&c.dataDir, "data-dir", "./ticketd-data", "directory for the durable state (token and lease ceilings, shutdown snapshot)")
	fs.IntVar(&c.shards, "shards", 16, "number of lock-table shards (keys map to shards by a stable hash)")
	fs.DurationVar(&c.sweepInterval, "sweep-interval", 5*time.Second, "single mode: how often expired keys without waiters are deleted (10ms at least)")
	fs.DurationVar(&c.maxLease, "max-lease", time.Hour, "largest lease_ms accepted (1ms to 720h, whole milliseconds)")
	fs.DurationVar(&c.maxWait, "max-wait", time.Hour, "largest wait_ms accepted (at least 1ms, whole milliseconds; wait_ms 0 is always allowed)")
	fs.IntVar(&c.maxWaitersPerKey, "max-waiters-per-key", 100_000, "queued acquires per key before B")
	fs.IntVar(&c.maxWaiters, "max-waiters", 1_000_000, "queued acquires in the server before B")
	fs.IntVar(&c.maxKeys, "max-keys", 10_000_000, "registered keys in the server before B")
	fs.IntVar(&c.maxConns, "max-conns", 0, "open connections; more are refused (default: the descriptor limit less a reserve)")
	fs.IntVar(&c.maxInflight, "max-inflight", 4096, "unanswered requests per connection before it stops being read (acquires queued for their key do not count)")
	fs.IntVar(&c.sendBuffer, "send-buffer", 0, "SO_SNDBUF of client connections in bytes, which bounds the kernel memory a client that does not read holds (0: the kernel's autotuned size)")
	fs.IntVar(&c.loops, "loops", 0, "event loops (default: single mode half the cores, at least 1, with as many Go Ps; cluster mode one per core)")
	fs.StringVar(&c.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&c.logFormat, "log-format", "console", "console or json")
	fs.StringVar(&c.admin, "admin", "", "address of the admin HTTP listener (pprof, metrics, health); off unless given")
	fs.BoolVar(&c.version, "version", false, "print the version and exit")
	fs.DurationVar(&c.shutdownTimeout, "shutdown-timeout", 10*time.Second, "how long a clean shutdown may take before the process exits 1 without a snapshot (1s at least)")
	fs.BoolVar(&c.recoverDamaged, "recover-damaged-data-dir", false,
		"start on a data dir whose state cannot be read back whole, or on an older copy put back: set the damaged files aside, grant nothing for --max-lease plus 2s, restart tokens above the current unix time in ns (every start with it is such a recovery: give it once)")
	fs.DurationVar(&c.idleTimeout, "idle-timeout", netloop.DefaultIdleTimeout, "close a connection with nothing pending that has sent nothing for this long (0: never)")
	fs.DurationVar(&c.frameTimeout, "frame-timeout", netloop.DefaultFrameTimeout, "close a connection whose unfinished line has waited this long for its end (0: never)")
	c.cluster.register(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			_, _ = stderr.Write(usage.Bytes())
			return nil, err
		}
		// The flag package names the flag in its message.
		return nil, fmt.Errorf("%w (ticketd --help lists the flags)", cliflag.Explain(fs, err))
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q (flags start with --)", fs.Arg(0))
	}
	c.cluster.parsed(fs)
	return c, c.validate()
}

func (c *config) validate() error {
	bad := func(flag, format string, args ...any) error {
		return fmt.Errorf("invalid --%s: %s", flag, fmt.Sprintf(format, args...))
	}
	if c.version {
		return nil
	}
	if _, _, err := net.SplitHostPort(c.listen); err != nil {
		return bad("listen", "%q is not host:port", c.listen)
	}
	if c.admin != "" {
		if _, _, err := net.SplitHostPort(c.admin); err != nil {
			return bad("admin", "%q is not host:port", c.admin)
		}
		_, port, _ := net.SplitHostPort(c.admin)
		if p, err := net.LookupPort("tcp", port); c.admin == c.listen && err == nil && p != 0 { // 0 (or ""): two ports the kernel picks
			return bad("admin", "%q is --listen's address too: give the admin listener a port of its own", c.admin)
		}
	}
	if strings.TrimSpace(c.dataDir) == "" {
		return bad("data-dir", "must not be empty")
	}
	if c.shards < 1 || c.shards > 4096 {
		return bad("shards", "%d is not between 1 and 4096", c.shards)
	}
	if c.sweepInterval < 10*time.Millisecond && !c.cluster.enabled() { // a cluster refuses the flag itself, below
		// Each sweep walks every shard under its lock: shorter keeps an
		// idle server busy.
		return bad("sweep-interval", "%v must be at least 10ms", c.sweepInterval)
	}
	// The protocol counts in milliseconds: a value that is not a whole
	// number of them (0 included, which the codec would take as "no limit")
	// is refused rather than rounded into another meaning.
	if c.maxLease < time.Millisecond || c.maxLease > maxLeaseLimit {
		return bad("max-lease", "%v is not between 1ms and %v", c.maxLease, maxLeaseLimit)
	}
	if c.maxLease%time.Millisecond != 0 {
		return bad("max-lease", "%v is not a whole number of milliseconds", c.maxLease)
	}
	if c.maxWait < time.Millisecond {
		return bad("max-wait", "%v must be at least 1ms (wait_ms 0, no waiting, is always allowed)", c.maxWait)
	}
	if c.maxWait%time.Millisecond != 0 {
		return bad("max-wait", "%v is not a whole number of milliseconds", c.maxWait)
	}
	if c.shutdownTimeout < time.Second {
		// Shorter cuts every stop short of its snapshot: each would be
		// restarted as after a crash, every key refused for a grace.
		return bad("shutdown-timeout", "%v must be at least 1s", c.shutdownTimeout)
	}
	for _, f := range []struct {
		name string
		v    int
	}{
		{"max-waiters-per-key", c.maxWaitersPerKey},
		{"max-waiters", c.maxWaiters},
		{"max-keys", c.maxKeys},
		{"max-inflight", c.maxInflight},
	} {
		if f.v < 1 {
			return bad(f.name, "%d must be at least 1", f.v)
		}
	}
	if c.sendBuffer < 0 {
		return bad("send-buffer", "%d must not be negative", c.sendBuffer)
	}
	if c.loops < 0 || c.loops > 1024 {
		return bad("loops", "%d is not between 0 and 1024", c.loops)
	}
	// zap reads dpanic, panic and fatal too; at those even the line that
	// says why a start failed is not written.
	if err := c.level.UnmarshalText([]byte(c.logLevel)); err != nil || c.level > zapcore.ErrorLevel {
		return bad("log-level", "%q is not debug, info, warn or error", c.logLevel)
	}
	if c.logFormat != "console" && c.logFormat != "json" {
		return bad("log-format", "%q is not console or json", c.logFormat)
	}
	limit := descriptorLimit()
	// Under a limit too small for the reserve a few connections are still
	// allowed (accepting then meets EMFILE, which the accept loop survives),
	// the same for the default as for an explicit value.
	fit := max(int(limit)-descriptorReserve, 16)
	switch {
	case c.maxConns < 0:
		return bad("max-conns", "%d must not be negative", c.maxConns)
	case c.maxConns == 0:
		c.maxConns = fit
	case c.maxConns > fit:
		return bad("max-conns", "%d does not fit under the process's descriptor limit of %d (at most %d; raise `ulimit -n` first)", c.maxConns, limit, fit)
	}
	if c.idleTimeout < 0 {
		return bad("idle-timeout", "%v must not be negative", c.idleTimeout)
	}
	if c.frameTimeout < 0 {
		return bad("frame-timeout", "%v must not be negative", c.frameTimeout)
	}
	if err := c.cluster.validate(bad); err != nil {
		return err
	}
	if c.cluster.enabled() && c.recoverDamaged {
		return bad("recover-damaged-data-dir", "is for single mode; a cluster node whose data dir is lost rejoins as README says")
	}
	if c.cluster.enabled() && c.cluster.given["sweep-interval"] {
		// Ignored, it would mislead: a cluster ends leases by committed
		// expiries, and has no sweep.
		return bad("sweep-interval", "is for single mode; in a cluster a key whose lease ended goes by a committed expiry, with no sweep")
	}
	return nil
}

// descriptorLimit raises the soft descriptor limit to the hard one and
// returns it.
func descriptorLimit() uint64 {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 1024
	}
	if rl.Cur < rl.Max {
		rl.Cur = rl.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl)
		_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl)
	}
	return rl.Cur
}

func ms(d time.Duration) uint64 { return uint64(d / time.Millisecond) }
