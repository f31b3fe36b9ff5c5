package codec

import (
	"bytes"
	"regexp"
	"strconv"
	"strings"
)

// refParse is a slow, plain reading of the protocol and the documented error
// order, written without the parser's helpers so that the two can check each
// other: table tests run both, and the fuzz target compares them on every input.
// ok is false for an incomplete frame.
func refParse(buf []byte, lim Limits) (n int, req Request, err *Error) {
	i := bytes.IndexByte(buf, '\n')
	if i < 0 || i >= MaxLine {
		if len(buf) >= MaxLine {
			return 0, Request{}, ErrTooLong
		}
		return 0, Request{}, nil
	}
	s := strings.TrimSuffix(string(buf[:i]), "\r")
	if s == "" {
		return 0, Request{}, ErrEmptyLine
	}
	fields := strings.Split(s, " ")
	if fields[0] == "" {
		return 0, Request{}, ErrEmptyField
	}
	if fields[0] != "A" && fields[0] != "R" {
		return 0, Request{}, ErrCommand
	}
	for _, f := range fields {
		if f == "" {
			return 0, Request{}, ErrEmptyField
		}
	}
	maxLease, maxWait := lim.MaxLeaseMs, lim.MaxWaitMs
	if maxLease == 0 {
		maxLease = 3600000
	}
	if maxWait == 0 {
		maxWait = 3600000
	}
	if fields[0] == "R" {
		if len(fields) != 3 {
			return 0, Request{}, ErrFieldCount
		}
		if !refNumber(fields[1]) {
			return 0, Request{}, ErrTokenSyntax
		}
		if e := refText(fields[2], 250, ErrKeyTooLong, ErrKeyByte); e != nil {
			return 0, Request{}, e
		}
		tok, perr := strconv.ParseUint(fields[1], 10, 64)
		if perr != nil || tok == 0 {
			return 0, Request{}, ErrTokenRange
		}
		return i + 1, Request{Kind: Release, Key: []byte(fields[2]), Token: tok}, nil
	}
	if len(fields) != 5 {
		return 0, Request{}, ErrFieldCount
	}
	if e := refText(fields[1], 128, ErrOwnerTooLong, ErrOwnerByte); e != nil {
		return 0, Request{}, e
	}
	if e := refText(fields[2], 250, ErrKeyTooLong, ErrKeyByte); e != nil {
		return 0, Request{}, e
	}
	if !refNumber(fields[3]) {
		return 0, Request{}, ErrLeaseSyntax
	}
	if !refNumber(fields[4]) {
		return 0, Request{}, ErrWaitSyntax
	}
	lease, perr := strconv.ParseUint(fields[3], 10, 64)
	if perr != nil || lease < 1 || lease > maxLease {
		return 0, Request{}, ErrLeaseRange
	}
	wait, perr := strconv.ParseUint(fields[4], 10, 64)
	if perr != nil || wait > maxWait {
		return 0, Request{}, ErrWaitRange
	}
	return i + 1, Request{Kind: Acquire, Owner: []byte(fields[1]), Key: []byte(fields[2]), LeaseMs: lease, WaitMs: wait}, nil
}

var refNumberRE = regexp.MustCompile(`^(0|[1-9][0-9]*)$`)

func refNumber(s string) bool { return refNumberRE.MatchString(s) }

func refText(s string, max int, long, bad *Error) *Error {
	if len(s) > max {
		return long
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] == 0x7f {
			return bad
		}
	}
	return nil
}

// sameRequest compares two requests field by field (a nil and an empty slice
// are equal: neither can occur in a parsed key or owner).
func sameRequest(a, b Request) bool {
	return a.Kind == b.Kind && bytes.Equal(a.Owner, b.Owner) && bytes.Equal(a.Key, b.Key) &&
		a.LeaseMs == b.LeaseMs && a.WaitMs == b.WaitMs && a.Token == b.Token
}

// within reports whether s is a sub-slice of buf (an empty s is).
func within(s, buf []byte) bool {
	if len(s) == 0 {
		return true
	}
	if len(buf) == 0 {
		return false
	}
	for i := range buf {
		if &buf[i] == &s[0] {
			return i+len(s) <= len(buf)
		}
	}
	return false
}
