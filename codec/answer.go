package codec

import (
	"math/bits"
	"slices"
)

// The encoders write what they are given and do not validate it: the server
// echoes fields ParseRequest accepted, and a client checks its own with
// ValidateAcquire or ValidateRelease. Each grows dst at most once and does not
// allocate when dst has room. Lines with numbers are sized first and written
// in place: strconv.AppendUint formats into a scratch buffer and copies it,
// and that copy was a third of its cost on the server's answer path.

// AppendAcquired appends "A <token> <owner> <key>\n".
func AppendAcquired(dst []byte, token uint64, owner, key []byte) []byte {
	w := uintLen(token)
	dst, b := grow(dst, 5+w+len(owner)+len(key))
	b[0], b[1] = 'A', ' '
	putUint(b[2:2+w], token)
	i := 2 + w
	b[i] = ' '
	i += 1 + copy(b[i+1:], owner)
	b[i] = ' '
	copy(b[i+1:], key)
	b[len(b)-1] = '\n'
	return dst
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
	wl, ww := uintLen(leaseMs), uintLen(waitMs)
	dst, b := grow(dst, 6+len(owner)+len(key)+wl+ww)
	b[0], b[1] = 'A', ' '
	i := 2 + copy(b[2:], owner)
	b[i] = ' '
	i += 1 + copy(b[i+1:], key)
	b[i] = ' '
	putUint(b[i+1:i+1+wl], leaseMs)
	i += 1 + wl
	b[i] = ' '
	putUint(b[i+1:i+1+ww], waitMs)
	b[len(b)-1] = '\n'
	return dst
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
	w := uintLen(token)
	dst, b := grow(dst, 4+w+len(key))
	b[0], b[1] = kind, ' '
	putUint(b[2:2+w], token)
	b[2+w] = ' '
	copy(b[3+w:], key)
	b[len(b)-1] = '\n'
	return dst
}

// grow extends dst by n bytes, reallocating at most once, and returns it
// with the new bytes as b.
func grow(dst []byte, n int) (out, b []byte) {
	l := len(dst)
	dst = slices.Grow(dst, n)[:l+n]
	return dst, dst[l:]
}

// pow10[i] is 10^i.
var pow10 = [...]uint64{
	1, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9,
	1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19,
}

// uintLen is the number of decimal digits of v.
func uintLen(v uint64) int {
	// 1233/4096 is just above log10(2): n is the length or one short.
	n := bits.Len64(v) * 1233 >> 12
	if n < len(pow10) && v >= pow10[n] {
		n++
	}
	return max(n, 1)
}

// digits2 holds "00" to "99".
const digits2 = "0001020304050607080910111213141516171819" +
	"2021222324252627282930313233343536373839" +
	"4041424344454647484950515253545556575859" +
	"6061626364656667686970717273747576777879" +
	"8081828384858687888990919293949596979899"

// putUint writes v in decimal to b, whose length is uintLen(v).
func putUint(b []byte, v uint64) {
	i := len(b)
	for v >= 100 {
		q := v / 100
		r := (v - q*100) * 2
		i -= 2
		b[i], b[i+1] = digits2[r], digits2[r+1]
		v = q
	}
	if v >= 10 {
		b[i-2], b[i-1] = digits2[v*2], digits2[v*2+1]
	} else {
		b[i-1] = byte('0' + v)
	}
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
