package codec

import (
	"slices"
	"strconv"
)

// The encoders write what they are given and do not validate it: the server
// echoes fields ParseRequest accepted, and a client checks its own with
// ValidateAcquire or ValidateRelease. Each grows dst at most once and does not
// allocate when dst has room.

// maxUintLen is the length of the longest uint64 in decimal.
const maxUintLen = 20

// AppendAcquired appends "A <token> <owner> <key>\n".
func AppendAcquired(dst []byte, token uint64, owner, key []byte) []byte {
	dst = slices.Grow(dst, 5+maxUintLen+len(owner)+len(key))
	dst = append(dst, 'A', ' ')
	dst = strconv.AppendUint(dst, token, 10)
	dst = append(dst, ' ')
	dst = append(dst, owner...)
	dst = append(dst, ' ')
	dst = append(dst, key...)
	return append(dst, '\n')
}

// AppendTimedOut appends "T <owner> <key>\n".
func AppendTimedOut(dst []byte, owner, key []byte) []byte {
	return appendOwnerKey(dst, 'T', owner, key)
}

// AppendBusy appends "B <owner> <key>\n".
func AppendBusy(dst []byte, owner, key []byte) []byte {
	return appendOwnerKey(dst, 'B', owner, key)
}

// AppendReleased appends "R <token> <key>\n".
func AppendReleased(dst []byte, token uint64, key []byte) []byte {
	return appendTokenKey(dst, 'R', token, key)
}

// AppendNotReleased appends "N <token> <key>\n".
func AppendNotReleased(dst []byte, token uint64, key []byte) []byte {
	return appendTokenKey(dst, 'N', token, key)
}

// AppendError appends "E <code> <text>\n". A control byte in e.Text would break
// the framing, so it is written as '?'; an empty text is left out with its space.
func AppendError(dst []byte, e *Error) []byte {
	code := e.Code.String()
	dst = slices.Grow(dst, 4+len(code)+len(e.Text))
	dst = append(dst, 'E', ' ')
	dst = append(dst, code...)
	if e.Text != "" {
		dst = append(dst, ' ')
		for i := 0; i < len(e.Text); i++ {
			c := e.Text[i]
			if c < ' ' || c == 0x7f {
				c = '?'
			}
			dst = append(dst, c)
		}
	}
	return append(dst, '\n')
}

// AppendAcquire appends the request "A <owner> <key> <lease_ms> <wait_ms>\n".
func AppendAcquire(dst []byte, owner, key []byte, leaseMs, waitMs uint64) []byte {
	dst = slices.Grow(dst, 6+2*maxUintLen+len(owner)+len(key))
	dst = append(dst, 'A', ' ')
	dst = append(dst, owner...)
	dst = append(dst, ' ')
	dst = append(dst, key...)
	dst = append(dst, ' ')
	dst = strconv.AppendUint(dst, leaseMs, 10)
	dst = append(dst, ' ')
	dst = strconv.AppendUint(dst, waitMs, 10)
	return append(dst, '\n')
}

// AppendRelease appends the request "R <token> <key>\n".
func AppendRelease(dst []byte, token uint64, key []byte) []byte {
	return appendTokenKey(dst, 'R', token, key)
}

func appendOwnerKey(dst []byte, kind byte, owner, key []byte) []byte {
	dst = slices.Grow(dst, 4+len(owner)+len(key))
	dst = append(dst, kind, ' ')
	dst = append(dst, owner...)
	dst = append(dst, ' ')
	dst = append(dst, key...)
	return append(dst, '\n')
}

func appendTokenKey(dst []byte, kind byte, token uint64, key []byte) []byte {
	dst = slices.Grow(dst, 4+maxUintLen+len(key))
	dst = append(dst, kind, ' ')
	dst = strconv.AppendUint(dst, token, 10)
	dst = append(dst, ' ')
	dst = append(dst, key...)
	return append(dst, '\n')
}

// Answer is one parsed server answer. Owner, Key, Code and Text are sub-slices of
// the parsed buffer, valid only as long as it is.
type Answer struct {
	Kind  byte   // 'A', 'T', 'B', 'R', 'N', 'E'
	Token uint64 // A, R, N
	Owner []byte // A, T, B
	Key   []byte // A, T, B, R, N
	Code  []byte // E
	Text  []byte // E (rest of the line)
}

// ErrBadAnswer matches (with errors.Is) every error ParseAnswer returns: the
// server sent something this protocol version does not allow, and the client
// should give up on the connection.
var ErrBadAnswer error = &answerError{"malformed answer"}

type answerError struct{ text string }

func (e *answerError) Error() string { return "codec: " + e.text }

func (e *answerError) Is(target error) bool { return target == ErrBadAnswer }

var (
	errAnsTooLong  = &answerError{"no answer line end within 1024 bytes"}
	errAnsEmpty    = &answerError{"empty answer line"}
	errAnsKind     = &answerError{"unknown answer kind"}
	errAnsField    = &answerError{"empty field in answer"}
	errAnsCount    = &answerError{"wrong field count in answer"}
	errAnsToken    = &answerError{"bad token in answer"}
	errAnsOwner    = &answerError{"bad owner in answer"}
	errAnsKey      = &answerError{"bad key in answer"}
	errAnsCode     = &answerError{"bad error code in answer"}
	errAnsTextByte = &answerError{"bad byte in error text"}
)

// ParseAnswer parses the first answer of buf into a, with the n/err convention of
// ParseRequest: n > 0 and err == nil for one answer of n bytes; n == 0 and
// err == nil for an incomplete one; err != nil (then n == 0) for a malformed one.
// It checks answers as strictly as the server checks requests (field counts,
// numbers, key and owner bytes and lengths), accepts "\r\n" like ParseRequest,
// accepts any well-formed error code, and does not allocate.
func ParseAnswer(buf []byte, a *Answer) (n int, err error) {
	if n := parseAnswerFast(buf, a); n > 0 {
		return n, nil
	}
	return parseAnswerSlow(buf, a)
}

// parseAnswerFast is parseFast for answers other than E: one pass over a
// complete, well-formed line, 0 for anything else.
func parseAnswerFast(buf []byte, a *Answer) int {
	if len(buf) > MaxLine {
		buf = buf[:MaxLine]
	}
	if len(buf) < 2 || buf[1] != ' ' {
		return 0
	}
	kind := buf[0]
	switch kind {
	case 'A', 'R', 'N':
		i, token := number(buf, 2)
		if i < 0 || i >= len(buf) || buf[i] != ' ' || token == 0 {
			return 0
		}
		var owner []byte
		if kind == 'A' {
			j, length := field(buf, i+1, MaxOwner)
			if length < 0 || buf[j] != ' ' {
				return 0
			}
			owner, i = buf[i+1:j:j], j
		}
		j, length := field(buf, i+1, MaxKey)
		if length < 0 {
			return 0
		}
		n := lineEnd(buf, j)
		if n == 0 {
			return 0
		}
		*a = Answer{Kind: kind, Token: token, Owner: owner, Key: buf[i+1 : j : j]}
		return n
	case 'T', 'B':
		i, length := field(buf, 2, MaxOwner)
		if length < 0 || buf[i] != ' ' {
			return 0
		}
		j, length := field(buf, i+1, MaxKey)
		if length < 0 {
			return 0
		}
		n := lineEnd(buf, j)
		if n == 0 {
			return 0
		}
		*a = Answer{Kind: kind, Owner: buf[2:i:i], Key: buf[i+1 : j : j]}
		return n
	}
	return 0
}

// parseAnswerSlow is ParseAnswer for any input.
func parseAnswerSlow(buf []byte, a *Answer) (n int, err error) {
	line, n := cutLine(buf)
	if n == 0 {
		if len(buf) >= MaxLine {
			return 0, errAnsTooLong
		}
		return 0, nil
	}
	if len(line) == 0 {
		return 0, errAnsEmpty
	}
	if len(line) > 1 && line[1] != ' ' {
		return 0, errAnsKind
	}
	kind := line[0]
	switch kind {
	case 'A', 'T', 'B', 'R', 'N':
	case 'E':
		return parseErrorAnswer(line, n, a)
	default:
		return 0, errAnsKind
	}

	var f [maxFields][]byte
	nf, ok := split(line, &f)
	if !ok {
		return 0, errAnsField
	}
	want := 3
	if kind == 'A' {
		want = 4
	}
	if nf != want {
		return 0, errAnsCount
	}
	var token uint64
	owner, key := f[1], f[2]
	if kind == 'A' || kind == 'R' || kind == 'N' {
		t, ok, over := parseUint(f[1])
		if !ok || over || t == 0 {
			return 0, errAnsToken
		}
		token, owner, key = t, nil, f[2]
		if kind == 'A' {
			owner, key = f[2], f[3]
		}
	}
	if owner != nil && (len(owner) > MaxOwner || !validBytes(owner)) {
		return 0, errAnsOwner
	}
	if len(key) > MaxKey || !validBytes(key) {
		return 0, errAnsKey
	}
	*a = Answer{Kind: kind, Token: token, Owner: owner, Key: key}
	return n, nil
}

// parseErrorAnswer parses "E <code>[ <text>]". The text is the rest of the line
// and may hold spaces; "E code " with an empty text after the space is rejected so
// that every accepted line is exactly what AppendError writes.
func parseErrorAnswer(line []byte, n int, a *Answer) (int, error) {
	if len(line) < 3 {
		return 0, errAnsField
	}
	rest := line[2:]
	code, text := rest, []byte(nil)
	for i, c := range rest {
		if c == ' ' {
			code, text = rest[:i:i], rest[i+1:]
			if len(text) == 0 {
				return 0, errAnsField
			}
			break
		}
	}
	if len(code) == 0 {
		return 0, errAnsField
	}
	if !validBytes(code) {
		return 0, errAnsCode
	}
	for _, c := range text {
		if c < ' ' || c == 0x7f {
			return 0, errAnsTextByte
		}
	}
	*a = Answer{Kind: 'E', Code: code, Text: text}
	return n, nil
}
