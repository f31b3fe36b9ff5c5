package client

import (
	"errors"
	"strings"
)

// Answers that are not errors of the connection. Each is returned as is, so
// compare with == or errors.Is (errors.Is(ErrWaitEnded, ErrHeld) holds).
var (
	// ErrHeld: the key is held by someone else and the wait (zero, or the
	// one given) passed first. The server answered T. After a crash restart
	// the server answers every key so until the leases granted before the
	// crash could have ended (its grace period): T cannot tell that apart.
	ErrHeld = errors.New("ticketd: key is held by someone else")

	// ErrWaitEnded: the server answered T before the wait sent could have
	// passed, so it ended the wait itself, as a single-mode server does for
	// every queued acquire when it shuts down. The key was not acquired and
	// nothing is left queued; whether it is held is unknown. It matches
	// ErrHeld with errors.Is (it is a T answer); compare with == to tell the
	// two apart.
	ErrWaitEnded error = waitEnded{}

	// ErrBusy: the server or the key's wait queue is at its capacity limit;
	// nothing was queued or registered. The server answered B.
	ErrBusy = errors.New("ticketd: server at capacity, nothing queued")

	// ErrNotHeld: the token does not hold the key (released before, its lease
	// ended and someone else took the key, or never granted). The server
	// answered N.
	ErrNotHeld = errors.New("ticketd: token does not hold the key")
)

// waitEnded is ErrWaitEnded: a type of its own, so that it can match ErrHeld.
type waitEnded struct{}

func (waitEnded) Error() string {
	return "ticketd: the server ended the wait before it passed (shutting down or restarting); not acquired"
}

func (waitEnded) Is(target error) bool { return target == ErrHeld }

var (
	// ErrConnBroken matches (with errors.Is) every *ConnError: the call could
	// not be carried out over a connection to the server.
	ErrConnBroken = errors.New("ticketd: connection failed")

	// ErrOutcomeUnknown matches a *ConnError whose request had been sent:
	// the server may have carried it out. An acquire that ends so may have
	// been granted; its lease then runs out by itself.
	ErrOutcomeUnknown = errors.New("ticketd: outcome unknown")

	// ErrClosed is returned by calls on a closed Client, and found (with
	// errors.Is) in the error of calls that Close interrupted.
	ErrClosed = errors.New("ticketd: client closed")

	// ErrInvalid matches errors for arguments that the server would refuse
	// (a bad key or owner, a lease or wait out of range). Nothing was sent:
	// a refused frame would make the server close the connection and fail
	// every other call on it.
	ErrInvalid = errors.New("ticketd: invalid argument")

	// ErrClosedAtOnce is found (with errors.Is) in the *ConnError of a call
	// whose connection the server closed within a second of its opening,
	// before it answered anything on it (the call sent or not, as Unknown
	// says), or made while nothing is connected after that: a server over
	// its --max-conns, starting or stopping, or something other than
	// ticketd.
	ErrClosedAtOnce = errors.New("ticketd: the server closed the connection before it answered anything")
)

// ConnError is the error of a call that lost its connection, or never had
// one. Unknown tells whether the request was sent (or may have been) without
// an answer: then the server may have acted on it. With Unknown false it was
// certainly not carried out and may be retried as is.
type ConnError struct {
	Addr    string // the server address, or every address when none could be reached
	Unknown bool
	Err     error // the cause: a network error, a *ServerError, ErrClosed, ...
}

func (e *ConnError) Error() string {
	var b strings.Builder
	b.WriteString("ticketd: connection to ")
	b.WriteString(e.Addr)
	if e.Unknown {
		b.WriteString(" failed with the request in flight (outcome unknown)")
	} else {
		b.WriteString(" failed before the request was sent")
	}
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

func (e *ConnError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrConnBroken) hold for every ConnError and
// errors.Is(err, ErrOutcomeUnknown) for one with Unknown set.
func (e *ConnError) Is(target error) bool {
	return target == ErrConnBroken || (target == ErrOutcomeUnknown && e.Unknown)
}

// ServerError is an E line: the server could not understand a request on the
// connection and closed it. It cannot be matched to one request, so every
// call still unanswered on that connection fails with a *ConnError that
// wraps it.
type ServerError struct {
	Code string // "syntax", "range", "too-long", "command", or a later one
	Text string
}

func (e *ServerError) Error() string {
	if e.Text == "" {
		return "ticketd: server refused a request: " + e.Code
	}
	return "ticketd: server refused a request: " + e.Code + ": " + e.Text
}

// ProtocolError: the server sent something this protocol version does not
// allow, or an answer that matches no request. The connection is given up.
type ProtocolError struct{ Text string }

func (e *ProtocolError) Error() string { return "ticketd: protocol violation by server: " + e.Text }
