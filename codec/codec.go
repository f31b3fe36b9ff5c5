package codec

import "strconv"

// Limits of the wire protocol.
const (
	MaxLine  = 1024 // bytes, including the terminator ("\r\n" counts as two)
	MaxKey   = 250
	MaxOwner = 128
)

// Protocol defaults for a zero Limits field.
const (
	DefaultMaxLeaseMs = 3_600_000
	DefaultMaxWaitMs  = 3_600_000
)

// Kind is the command letter of a request.
type Kind byte

// Request kinds.
const (
	Acquire Kind = 'A'
	Release Kind = 'R'
)

// Request is one parsed frame. Owner and Key are sub-slices of the parsed buffer:
// they are valid only as long as that buffer is (with gnet: until the next Discard).
// Their capacity ends with their length, so an append to them copies instead of
// overwriting the buffer.
type Request struct {
	Kind    Kind
	Owner   []byte // Acquire only
	Key     []byte
	LeaseMs uint64 // Acquire only
	WaitMs  uint64 // Acquire only
	Token   uint64 // Release only
}

// Limits are the server's bounds on lease_ms and wait_ms.
// A zero field means the protocol default (3,600,000 ms).
type Limits struct{ MaxLeaseMs, MaxWaitMs uint64 }

func (l Limits) lease() uint64 {
	if l.MaxLeaseMs == 0 {
		return DefaultMaxLeaseMs
	}
	return l.MaxLeaseMs
}

func (l Limits) wait() uint64 {
	if l.MaxWaitMs == 0 {
		return DefaultMaxWaitMs
	}
	return l.MaxWaitMs
}

// Code is the class of a protocol error, sent as the second field of an E answer.
type Code uint8

// Error codes.
const (
	CodeSyntax      Code = iota + 1 // "syntax"
	CodeRange                       // "range"
	CodeTooLong                     // "too-long"
	CodeCommand                     // "command"
	CodeUnavailable                 // "unavailable" (cluster mode: a shard without quorum)
)

// String returns the code as written on the wire.
func (c Code) String() string {
	switch c {
	case CodeSyntax:
		return "syntax"
	case CodeRange:
		return "range"
	case CodeTooLong:
		return "too-long"
	case CodeCommand:
		return "command"
	case CodeUnavailable:
		return "unavailable"
	}
	return "Code(" + strconv.Itoa(int(c)) + ")"
}

// ParseCode maps a code as written on the wire (the Code field of an Answer) back
// to its Code; ok is false for a code this version does not know.
func ParseCode(b []byte) (c Code, ok bool) {
	switch string(b) { // no allocation: the compiler compares in place
	case "syntax":
		return CodeSyntax, true
	case "range":
		return CodeRange, true
	case "too-long":
		return CodeTooLong, true
	case "command":
		return CodeCommand, true
	case "unavailable":
		return CodeUnavailable, true
	}
	return 0, false
}

// Error is a protocol error; all values are package-level, so returning one never allocates.
type Error struct {
	Code Code
	Text string
}

func (e *Error) Error() string { return "codec: " + e.Code.String() + ": " + e.Text }

// The errors ParseRequest and the Validate functions return. Compare with ==.
var (
	ErrTooLong = &Error{CodeTooLong, "no line end within 1024 bytes"}

	// ErrUnavailable is the server's own (cluster mode), never ParseRequest's.
	ErrUnavailable = &Error{CodeUnavailable, "a shard of this request has no quorum; outcome unknown, try another node"}
	// ErrBehind is ErrUnavailable's code for a node that fell behind its
	// shard (cluster mode): it never applied the decision on this
	// connection's queued acquires (it caught up from a snapshot that
	// skipped it), or applied a grant so late that its lease had ended.
	ErrBehind = &Error{CodeUnavailable, "this node fell behind its shard; outcome unknown, try another node"}

	ErrEmptyLine    = &Error{CodeSyntax, "empty line"}
	ErrCommand      = &Error{CodeCommand, "unknown command"}
	ErrEmptyField   = &Error{CodeSyntax, "empty field"}
	ErrFieldCount   = &Error{CodeSyntax, "wrong field count"}
	ErrOwnerTooLong = &Error{CodeSyntax, "owner longer than 128 bytes"}
	ErrOwnerByte    = &Error{CodeSyntax, "bad byte in owner"}
	ErrKeyTooLong   = &Error{CodeSyntax, "key longer than 250 bytes"}
	ErrKeyByte      = &Error{CodeSyntax, "bad byte in key"}
	ErrLeaseSyntax  = &Error{CodeSyntax, "malformed number in lease_ms"}
	ErrWaitSyntax   = &Error{CodeSyntax, "malformed number in wait_ms"}
	ErrTokenSyntax  = &Error{CodeSyntax, "malformed number in token"}

	ErrLeaseRange = &Error{CodeRange, "lease out of range"}
	ErrWaitRange  = &Error{CodeRange, "wait out of range"}
	ErrTokenRange = &Error{CodeRange, "token out of range"}
)
