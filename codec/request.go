package codec

import (
	"bytes"
	"encoding/binary"
	"math/bits"
)

// maxFields is the most fields any frame has (an A answer has 4, an A request 5).
const maxFields = 5

// ParseRequest parses the first frame of buf into req.
// n > 0, err == nil: one frame, n bytes consumed (terminator included).
// n == 0, err == nil: incomplete frame; call again with more bytes (buf untouched).
// err != nil: the first frame is bad; the caller answers AppendError and closes.
//
// n is 0 whenever err is non-nil, so a caller that forgets to look at err never
// consumes a bad frame. req is written only on success. buf is never modified, and
// ParseRequest neither allocates nor keeps a reference to buf. Errors are reported
// in the order documented in the package comment.
func ParseRequest(buf []byte, lim Limits, req *Request) (n int, err *Error) {
	if n := parseFast(buf, lim, req); n > 0 {
		return n, nil
	}
	return parseSlow(buf, lim, req)
}

// parseFast reads a complete, well-formed frame in one pass over its bytes,
// and returns 0 for anything else (an incomplete frame, a bad one, a line
// end farther than MaxLine), which parseSlow then reads and judges. On the
// frames it accepts the two agree; the fuzz target holds them to the
// reference reading.
func parseFast(buf []byte, lim Limits, req *Request) int {
	if len(buf) > MaxLine {
		buf = buf[:MaxLine] // a line end beyond this is ErrTooLong: parseSlow's
	}
	if len(buf) < 2 || buf[1] != ' ' {
		return 0
	}
	switch Kind(buf[0]) {
	case Acquire:
		i, owner := field(buf, 2, MaxOwner)
		if owner < 0 || buf[i] != ' ' {
			return 0
		}
		j, key := field(buf, i+1, MaxKey)
		if key < 0 || buf[j] != ' ' {
			return 0
		}
		k, lease := number(buf, j+1)
		if k < 0 || k >= len(buf) || buf[k] != ' ' || lease == 0 || lease > lim.lease() {
			return 0
		}
		m, wait := number(buf, k+1)
		if m < 0 || wait > lim.wait() {
			return 0
		}
		n := lineEnd(buf, m)
		if n == 0 {
			return 0
		}
		// Field by field: a literal would be built in a temporary and copied
		// with 16-byte loads of its 8-byte stores, which stall on store
		// forwarding (2-3% of the server's CPU at depth 64, in pprof).
		req.Kind, req.Owner, req.Key, req.LeaseMs, req.WaitMs, req.Token = Acquire, buf[2:i:i], buf[i+1:j:j], lease, wait, 0
		return n
	case Release:
		i, token := number(buf, 2)
		if i < 0 || i >= len(buf) || buf[i] != ' ' || token == 0 {
			return 0
		}
		j, key := field(buf, i+1, MaxKey)
		if key < 0 {
			return 0
		}
		n := lineEnd(buf, j)
		if n == 0 {
			return 0
		}
		req.Kind, req.Owner, req.Key, req.LeaseMs, req.WaitMs, req.Token = Release, nil, buf[i+1:j:j], 0, 0, token
		return n
	}
	return 0
}

// field scans a key or owner of 1 to limit bytes from buf[i]; it returns the
// index of the byte that ends it (a space or a line end for the caller to
// check) and its length, or -1 as length when the field is empty, too long
// or not followed by a byte.
func field(buf []byte, i, limit int) (end, length int) {
	start := i
	for i+8 <= len(buf) {
		if m := stops(binary.LittleEndian.Uint64(buf[i:])); m != 0 {
			i += bits.TrailingZeros64(m) / 8
			goto found
		}
		i += 8
	}
	for ; i < len(buf); i++ {
		c := buf[i]
		if c <= ' ' || c == 0x7f {
			break
		}
	}
found:
	if i == start || i-start > limit || i >= len(buf) {
		return i, -1
	}
	return i, i - start
}

// stops marks, with the top bit of its byte, the first byte of w (in
// memory order, w read little-endian) that ends a field: a control byte, a
// space or DEL; 0 if none does. Bytes after the first may be marked too, as
// a borrow runs on; the first mark is exact. Eight bytes at a time, as keys
// and owners are mostly longer than that.
func stops(w uint64) uint64 {
	const ones, tops = 0x0101010101010101, 0x8080808080808080
	low := (w - 0x21*ones) &^ w & tops // bytes below 0x21
	x := w ^ 0x7f*ones
	del := (x - ones) &^ x & tops // bytes equal to 0x7f
	return low | del
}

// number scans a protocol number of 1 to 19 digits (no overflow possible)
// from buf[i]; it returns the index after it and its value, or -1 as index
// for a malformed or long one.
func number(buf []byte, i int) (end int, v uint64) {
	start := i
	for ; i < len(buf) && i-start < 20; i++ {
		d := buf[i] - '0'
		if d > 9 {
			break
		}
		v = v*10 + uint64(d)
	}
	if i == start || i-start > 19 || (buf[start] == '0' && i-start > 1) {
		return -1, 0
	}
	return i, v
}

// lineEnd returns the frame's length if buf[i:] starts with "\n" or
// "\r\n", else 0.
func lineEnd(buf []byte, i int) int {
	if i < 0 || i >= len(buf) {
		return 0
	}
	if buf[i] == '\n' {
		return i + 1
	}
	if buf[i] == '\r' && i+1 < len(buf) && buf[i+1] == '\n' {
		return i + 2
	}
	return 0
}

// parseSlow is ParseRequest for any input, in the documented error order.
func parseSlow(buf []byte, lim Limits, req *Request) (n int, err *Error) {
	line, n := cutLine(buf)
	if n == 0 {
		if len(buf) >= MaxLine {
			return 0, ErrTooLong
		}
		return 0, nil
	}
	if len(line) == 0 {
		return 0, ErrEmptyLine
	}

	var f [maxFields][]byte
	nf, ok := split(line, &f)
	if nf == 0 { // the line starts with a space: an empty first field
		return 0, ErrEmptyField
	}
	if len(f[0]) != 1 || (f[0][0] != byte(Acquire) && f[0][0] != byte(Release)) {
		return 0, ErrCommand
	}
	if !ok {
		return 0, ErrEmptyField
	}

	if Kind(f[0][0]) == Release {
		if nf != 3 {
			return 0, ErrFieldCount
		}
		token, ok, over := parseUint(f[1])
		if !ok {
			return 0, ErrTokenSyntax
		}
		if e := checkKey(f[2]); e != nil {
			return 0, e
		}
		if over || token == 0 {
			return 0, ErrTokenRange
		}
		*req = Request{Kind: Release, Key: f[2], Token: token}
		return n, nil
	}

	if nf != 5 {
		return 0, ErrFieldCount
	}
	if e := checkOwner(f[1]); e != nil {
		return 0, e
	}
	if e := checkKey(f[2]); e != nil {
		return 0, e
	}
	lease, ok, leaseOver := parseUint(f[3])
	if !ok {
		return 0, ErrLeaseSyntax
	}
	wait, ok, waitOver := parseUint(f[4])
	if !ok {
		return 0, ErrWaitSyntax
	}
	if leaseOver || lease == 0 || lease > lim.lease() {
		return 0, ErrLeaseRange
	}
	if waitOver || wait > lim.wait() {
		return 0, ErrWaitRange
	}
	*req = Request{Kind: Acquire, Owner: f[1], Key: f[2], LeaseMs: lease, WaitMs: wait}
	return n, nil
}

// ValidateAcquire reports the error a server with limits lim would answer to the
// frame AppendAcquire writes for these arguments, or nil. A client calls it before
// sending, because one bad frame costs every request in flight on the connection.
func ValidateAcquire(owner, key []byte, leaseMs, waitMs uint64, lim Limits) *Error {
	if len(owner) == 0 || len(key) == 0 {
		return ErrEmptyField
	}
	if e := checkOwner(owner); e != nil {
		return e
	}
	if e := checkKey(key); e != nil {
		return e
	}
	if leaseMs == 0 || leaseMs > lim.lease() {
		return ErrLeaseRange
	}
	if waitMs > lim.wait() {
		return ErrWaitRange
	}
	return nil
}

// ValidateRelease is ValidateAcquire for AppendRelease.
func ValidateRelease(token uint64, key []byte) *Error {
	if len(key) == 0 {
		return ErrEmptyField
	}
	if e := checkKey(key); e != nil {
		return e
	}
	if token == 0 {
		return ErrTokenRange
	}
	return nil
}

// cutLine returns the first line of buf without its terminator, and the length of
// the line with its terminator; n == 0 means there is no line end within MaxLine
// bytes. The line's capacity is cut to its length so that no sub-slice of it
// reaches into the next frame.
func cutLine(buf []byte) (line []byte, n int) {
	window := buf
	if len(window) > MaxLine {
		window = window[:MaxLine]
	}
	i := bytes.IndexByte(window, '\n')
	if i < 0 {
		return nil, 0
	}
	if i > 0 && buf[i-1] == '\r' {
		return buf[: i-1 : i-1], i + 1
	}
	return buf[:i:i], i + 1
}

// split cuts a non-empty line at single spaces into f and returns how many fields
// the line has (possibly more than len(f); only the first len(f) are stored).
// It stops at the first empty field and then returns ok == false with the count of
// the non-empty fields before it.
func split(line []byte, f *[maxFields][]byte) (nf int, ok bool) {
	for {
		sp := bytes.IndexByte(line, ' ')
		if sp < 0 {
			if len(line) == 0 { // trailing space
				return nf, false
			}
			if nf < maxFields {
				f[nf] = line
			}
			return nf + 1, true
		}
		if sp == 0 { // leading or double space
			return nf, false
		}
		if nf < maxFields {
			f[nf] = line[:sp:sp]
		}
		nf++
		line = line[sp+1:]
	}
}

func checkOwner(b []byte) *Error {
	if len(b) > MaxOwner {
		return ErrOwnerTooLong
	}
	if !validBytes(b) {
		return ErrOwnerByte
	}
	return nil
}

func checkKey(b []byte) *Error {
	if len(b) > MaxKey {
		return ErrKeyTooLong
	}
	if !validBytes(b) {
		return ErrKeyByte
	}
	return nil
}

// SWAR constants: a byte-wise test on eight bytes at once.
const (
	ones  = 0x0101010101010101
	highs = 0x8080808080808080
)

// validBytes reports whether b holds only bytes allowed in a key or owner: no
// space and no control byte (0x00-0x1F, 0x7F). Bytes >= 0x80 are allowed.
// Keys are scanned on every request, so it tests eight bytes per step.
func validBytes(b []byte) bool {
	for len(b) >= 8 {
		x := binary.LittleEndian.Uint64(b)
		// A byte below 0x21 (control or space): exact for thresholds up to 0x80.
		low := (x - ones*0x21) &^ x & highs
		// A byte equal to 0x7F: a zero byte in x^0x7F...
		y := x ^ (ones * 0x7f)
		del := (y - ones) &^ y & highs
		if low|del != 0 {
			return false
		}
		b = b[8:]
	}
	for _, c := range b {
		if c <= ' ' || c == 0x7f {
			return false
		}
	}
	return true
}

// parseUint parses a protocol number: ASCII digits, no sign, no leading zero
// except "0" itself. ok is false for a malformed number; over is true for a
// well-formed number above 2^64-1 (v is then meaningless).
func parseUint(b []byte) (v uint64, ok, over bool) {
	if len(b) == 0 || (len(b) > 1 && b[0] == '0') {
		return 0, false, false
	}
	if len(b) <= 19 { // 10^19-1 < 2^64: cannot overflow
		for _, c := range b {
			d := c - '0'
			if d > 9 {
				return 0, false, false
			}
			v = v*10 + uint64(d)
		}
		return v, true, false
	}
	// Keep scanning after an overflow: a later non-digit makes it a syntax error.
	for _, c := range b {
		d := c - '0'
		if d > 9 {
			return 0, false, false
		}
		if over {
			continue
		}
		hi, lo := bits.Mul64(v, 10)
		sum, carry := bits.Add64(lo, uint64(d), 0)
		if hi != 0 || carry != 0 {
			over = true
			continue
		}
		v = sum
	}
	return v, true, over
}
