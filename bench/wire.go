package bench

import (
	"bytes"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"

	"github.com/ticketd/ticketd/codec"
)

// System names a server the generator can drive.
type System string

const (
	Ticketd System = "ticketd"
	Redis   System = "redis"
	Echo    System = "echo"
)

// outcome is what one answer means for the pair it belongs to.
type outcome uint8

const (
	outAcquired    outcome = iota + 1 // granted; token (ticketd) or value (Redis) releases it
	outRefused                        // T, or Redis nil: no grant, pair over
	outReleased                       // R, or Redis 1
	outNotReleased                    // N, or Redis 0
)

// wire is one system's encoding of the lock pair. Each connection owns its
// wire's state through conn; no method is called from two goroutines at once.
type wire interface {
	appendAcquire(dst []byte, c *conn, s *slot) []byte
	appendRelease(dst []byte, c *conn, s *slot) []byte
	// parse reads the first answer in buf: n == 0 and err == nil when it is
	// incomplete. si is the slot it answers.
	parse(buf []byte, c *conn) (n int, si int32, out outcome, token uint64, err error)
	// ordered: answers come in request order, so conn keeps a FIFO of slots.
	ordered() bool
}

func newWire(sys System) (wire, error) {
	switch sys {
	case Ticketd:
		return ticketdWire{}, nil
	case Redis:
		return redisWire{}, nil
	case Echo:
		return echoWire{}, nil
	}
	return nil, fmt.Errorf("bench: unknown system %q", sys)
}

// ErrServer is wrapped by every error a server answered with (ticketd E, a
// Redis error reply): the load run stops, since such an answer is a bug.
var ErrServer = errors.New("server error answer")

// ticketdWire speaks PROTOCOL.md through codec. Owners are
// "c<conn>.<slot>.<generation>", so an A/T/B answer names its slot; an R/N
// answer is found by its token and key: tokens grow per key (per shard), so
// two keys may have grants with the same token.
type ticketdWire struct{}

func (ticketdWire) ordered() bool { return false }

func (ticketdWire) appendAcquire(dst []byte, c *conn, s *slot) []byte {
	return codec.AppendAcquire(dst, s.owner, s.key, c.leaseMs, c.waitMs)
}

func (ticketdWire) appendRelease(dst []byte, c *conn, s *slot) []byte {
	c.releases.put(s.token, s.index)
	return codec.AppendRelease(dst, s.token, s.key)
}

func (ticketdWire) parse(buf []byte, c *conn) (int, int32, outcome, uint64, error) {
	if n, si, out, tok := parseExpected(buf, c); n > 0 {
		return n, si, out, tok, nil
	}
	return parseAnswer(buf, c)
}

// parseAnswer is ticketdWire.parse for any input.
func parseAnswer(buf []byte, c *conn) (int, int32, outcome, uint64, error) {
	var a codec.Answer
	n, err := codec.ParseAnswer(buf, &a)
	if n == 0 || err != nil {
		return 0, 0, 0, 0, err
	}
	switch a.Kind {
	case 'A', 'T', 'B':
		si, ok := c.slotOfOwner(a.Owner)
		if !ok {
			return 0, 0, 0, 0, fmt.Errorf("answer %q for an owner this connection has not sent", buf[:n-1])
		}
		out := outAcquired
		switch a.Kind {
		case 'T':
			out = outRefused
		case 'B':
			// The bench's loads stay within the server's default limits:
			// a full queue means the scenario or the server is wrong.
			return 0, 0, 0, 0, fmt.Errorf("%w: %q: a queue full under the default limits", ErrServer, buf[:n-1])
		}
		return n, si, out, a.Token, nil
	case 'R', 'N':
		si := c.releases.take(a.Token, a.Key, c.slots)
		if si < 0 {
			return 0, 0, 0, 0, fmt.Errorf("answer %q for a release this connection has not sent", buf[:n-1])
		}
		out := outReleased
		if a.Kind == 'N' {
			out = outNotReleased
		}
		return n, si, out, a.Token, nil
	}
	if a.Kind == 'E' && string(a.Code) == "unavailable" {
		return 0, 0, 0, 0, fmt.Errorf("%w: %w: %q", ErrServer, errUnavailable, buf[:n-1])
	}
	return 0, 0, 0, 0, fmt.Errorf("%w: %q", ErrServer, buf[:n-1])
}

// parseExpected reads the answers a run expects, written as the server
// writes them: "A <token> <owner> <key>\n" with the owner and key of a slot
// that is acquiring, "R|N <token> <key>\n" with the token and key of a
// release in flight. Comparing the owner and key with the bytes sent checks
// them as strictly as ParseAnswer and slotOfOwner do, for a third of the
// generator's CPU on them: CPU that the server on the same cores then has.
// 0 for anything else, which the general path reads (or reports).
func parseExpected(buf []byte, c *conn) (n int, si int32, out outcome, token uint64) {
	if len(buf) < 4 || buf[1] != ' ' || buf[2] == '0' {
		return 0, 0, 0, 0
	}
	kind := buf[0]
	if kind != 'A' && kind != 'R' && kind != 'N' {
		return 0, 0, 0, 0
	}
	i := 2
	for ; i < len(buf) && i < 2+19; i++ {
		d := buf[i] - '0'
		if d > 9 {
			break
		}
		token = token*10 + uint64(d)
	}
	if i == 2 || i >= len(buf) || buf[i] != ' ' {
		return 0, 0, 0, 0
	}
	i++
	if kind != 'A' {
		j := bytes.IndexByte(buf[i:], '\n')
		if j <= 0 {
			return 0, 0, 0, 0
		}
		if si = c.releases.take(token, buf[i:i+j], c.slots); si < 0 {
			return 0, 0, 0, 0
		}
		out = outReleased
		if kind == 'N' {
			out = outNotReleased
		}
		return i + j + 1, si, out, token
	}
	rest := buf[i:]
	if !bytes.HasPrefix(rest, c.ownerPrefix) {
		return 0, 0, 0, 0
	}
	x := 0
	for j := len(c.ownerPrefix); j < len(rest) && rest[j] != '.'; j++ {
		d := rest[j] - '0'
		if d > 9 || x >= len(c.slots) {
			return 0, 0, 0, 0
		}
		x = x*10 + int(d)
	}
	if x >= len(c.slots) {
		return 0, 0, 0, 0
	}
	s := &c.slots[x]
	o, k := s.owner, s.key
	if s.state != slotAcquiring || len(rest) < len(o)+len(k)+2 || !bytes.Equal(rest[:len(o)], o) ||
		rest[len(o)] != ' ' || !bytes.Equal(rest[len(o)+1:len(o)+1+len(k)], k) || rest[len(o)+1+len(k)] != '\n' {
		return 0, 0, 0, 0
	}
	return i + len(o) + len(k) + 2, int32(x), outAcquired, token
}

// errUnavailable marks `E unavailable` (cluster mode: a shard without quorum
// too long); the server closes the connection after it.
var errUnavailable = errors.New("unavailable")

// echoWire sends ticketd's own request lines to a server that returns them
// unchanged: every acquire "succeeds" and is released with a made-up token.
type echoWire struct{}

func (echoWire) ordered() bool { return true }

func (echoWire) appendAcquire(dst []byte, c *conn, s *slot) []byte {
	return codec.AppendAcquire(dst, s.owner, s.key, c.leaseMs, c.waitMs)
}

func (echoWire) appendRelease(dst []byte, c *conn, s *slot) []byte {
	return codec.AppendRelease(dst, s.token, s.key)
}

func (echoWire) parse(buf []byte, c *conn) (int, int32, outcome, uint64, error) {
	i := bytes.IndexByte(buf, '\n')
	if i < 0 {
		if len(buf) >= codec.MaxLine {
			return 0, 0, 0, 0, errors.New("echo: line longer than the protocol allows")
		}
		return 0, 0, 0, 0, nil
	}
	si, ok := c.popFIFO()
	if !ok {
		return 0, 0, 0, 0, errors.New("echo: a line nobody asked for")
	}
	switch buf[0] {
	case 'A':
		c.fakeToken++
		return i + 1, si, outAcquired, c.fakeToken, nil
	case 'R':
		return i + 1, si, outReleased, 0, nil
	}
	return 0, 0, 0, 0, fmt.Errorf("echo: unexpected line %q", buf[:i])
}

// Redis: acquire is SET key value NX PX lease; release runs releaseScript by
// EVALSHA, deleting the key only while it still holds this acquire's value.
// The value is the owner, unique per acquire as a Redis lock value must be.
const releaseScript = `if redis.call("get",KEYS[1]) == ARGV[1] then return redis.call("del",KEYS[1]) else return 0 end`

var releaseSHA = func() string {
	h := sha1.Sum([]byte(releaseScript))
	return hex.EncodeToString(h[:])
}()

type redisWire struct{}

func (redisWire) ordered() bool { return true }

func appendBulk(dst, b []byte) []byte {
	dst = append(dst, '$')
	dst = strconv.AppendInt(dst, int64(len(b)), 10)
	dst = append(dst, '\r', '\n')
	dst = append(dst, b...)
	return append(dst, '\r', '\n')
}

func (redisWire) appendAcquire(dst []byte, c *conn, s *slot) []byte {
	dst = append(dst, "*6\r\n$3\r\nSET\r\n"...)
	dst = appendBulk(dst, s.key)
	dst = appendBulk(dst, s.owner)
	dst = append(dst, "$2\r\nNX\r\n$2\r\nPX\r\n"...)
	return appendBulk(dst, c.leaseText)
}

func (redisWire) appendRelease(dst []byte, c *conn, s *slot) []byte {
	dst = append(dst, "*5\r\n$7\r\nEVALSHA\r\n$40\r\n"...)
	dst = append(dst, releaseSHA...)
	dst = append(dst, "\r\n$1\r\n1\r\n"...)
	dst = appendBulk(dst, s.key)
	return appendBulk(dst, s.owner)
}

// parse knows the few RESP2 replies SET NX and the script give: +OK, $-1,
// :0, :1, and errors.
func (redisWire) parse(buf []byte, c *conn) (int, int32, outcome, uint64, error) {
	i := bytes.IndexByte(buf, '\n')
	if i < 0 {
		if len(buf) > 4096 {
			return 0, 0, 0, 0, errors.New("redis: reply line too long")
		}
		return 0, 0, 0, 0, nil
	}
	if i < 2 || buf[i-1] != '\r' {
		return 0, 0, 0, 0, fmt.Errorf("redis: malformed reply %q", buf[:i])
	}
	line := buf[:i-1]
	var out outcome
	switch string(line) {
	case "+OK":
		out = outAcquired
	case "$-1":
		out = outRefused
	case ":1":
		out = outReleased
	case ":0":
		out = outNotReleased
	default:
		return 0, 0, 0, 0, fmt.Errorf("%w: redis: %q", ErrServer, line)
	}
	si, ok := c.popFIFO()
	if !ok {
		return 0, 0, 0, 0, errors.New("redis: a reply nobody asked for")
	}
	return i + 1, si, out, 0, nil
}
