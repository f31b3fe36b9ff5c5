package client

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/ticketd/ticketd/codec"
)

// Option changes a default of Dial.
type Option func(*config)

type config struct {
	conns         int
	clientID      string
	dialTimeout   time.Duration
	backoffMin    time.Duration
	backoffMax    time.Duration
	maxLease      time.Duration
	maxWait       time.Duration
	answerTimeout time.Duration
}

func defaultConfig() config {
	return config{
		conns:         2,
		dialTimeout:   5 * time.Second,
		backoffMin:    50 * time.Millisecond,
		backoffMax:    2 * time.Second,
		maxLease:      codec.DefaultMaxLeaseMs * time.Millisecond,
		maxWait:       codec.DefaultMaxWaitMs * time.Millisecond,
		answerTimeout: 20 * time.Second,
	}
}

// WithConns sets how many connections the client keeps (default 2). Calls are
// spread over them by key; one connection already carries many calls at
// once, so a few are enough.
func WithConns(n int) Option { return func(c *config) { c.conns = n } }

// WithClientID sets the prefix of the owner names the client sends
// ("<id>.<sequence>"). The default is 16 random hex digits. The id shows in
// the server's logs and admin views, so a name that says who runs the client
// helps there; it must be unique among the server's clients.
func WithClientID(id string) Option { return func(c *config) { c.clientID = id } }

// WithDialTimeout bounds each connection attempt (default 5s).
func WithDialTimeout(d time.Duration) Option { return func(c *config) { c.dialTimeout = d } }

// WithBackoff sets the first and the longest pause between attempts to
// reconnect a broken connection (default 50ms, 2s). The pause doubles after
// each failed attempt, with jitter.
func WithBackoff(min, max time.Duration) Option {
	return func(c *config) { c.backoffMin, c.backoffMax = min, max }
}

// WithLimits tells the client the server's --max-lease and --max-wait
// (default 1h each, the server's defaults). Calls beyond them fail with
// ErrInvalid before anything is sent, because the server answers a frame
// beyond its limits with E and closes the connection, failing every other
// call on it.
func WithLimits(maxLease, maxWait time.Duration) Option {
	return func(c *config) { c.maxLease, c.maxWait = maxLease, maxWait }
}

// WithAnswerTimeout sets how long a connection may leave a request
// unanswered past its wait, while nothing at all arrives on it, before the
// client gives the connection up as silent (default 20s): a node that died
// without a reset, or a link cut between the client and the node, which
// the kernel would take many minutes to report. The connection's calls then
// fail as on a break (an acquire's outcome unknown, a release sent again on
// another connection), and new calls go to another address. A server
// answers a request that does not wait within its --unavailable-timeout
// (5s by default) even when it cannot carry it out; keep the timeout well
// above that.
func WithAnswerTimeout(d time.Duration) Option { return func(c *config) { c.answerTimeout = d } }

// maxSeqLen is the longest "." + decimal uint64 that follows the client id.
const maxSeqLen = 21

func (c *config) validate() error {
	if c.conns < 1 || c.conns > 1024 {
		return fmt.Errorf("%w: WithConns(%d): want 1 to 1024", ErrInvalid, c.conns)
	}
	if c.clientID == "" {
		var b [8]byte
		rand.Read(b[:]) // never fails (crypto/rand panics instead)
		c.clientID = hex.EncodeToString(b[:])
	}
	if !validField(c.clientID, codec.MaxOwner-maxSeqLen) {
		return fmt.Errorf("%w: WithClientID(%q): want 1 to %d bytes without spaces or control bytes",
			ErrInvalid, c.clientID, codec.MaxOwner-maxSeqLen)
	}
	if c.dialTimeout <= 0 {
		return fmt.Errorf("%w: WithDialTimeout(%v): want > 0", ErrInvalid, c.dialTimeout)
	}
	if c.backoffMin <= 0 || c.backoffMax < c.backoffMin {
		return fmt.Errorf("%w: WithBackoff(%v, %v): want 0 < min <= max", ErrInvalid, c.backoffMin, c.backoffMax)
	}
	if c.answerTimeout <= 0 {
		return fmt.Errorf("%w: WithAnswerTimeout(%v): want > 0", ErrInvalid, c.answerTimeout)
	}
	if c.maxLease < time.Millisecond || c.maxWait < 0 {
		return fmt.Errorf("%w: WithLimits(%v, %v): want lease >= 1ms, wait >= 0", ErrInvalid, c.maxLease, c.maxWait)
	}
	return nil
}

// validField reports whether s is 1 to max bytes (max <= codec.MaxKey) that
// the server accepts in a key or owner. The byte rules are codec's: with a
// valid token, ValidateRelease judges only the key. []byte(s) does not
// escape, so it does not copy.
func validField(s string, max int) bool {
	return len(s) <= max && codec.ValidateRelease(1, []byte(s)) == nil
}
