package codec

import (
	"bytes"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/ticketd/ticketd/internal/dirty"
)

var (
	owner128 = strings.Repeat("o", 128)
	owner129 = strings.Repeat("o", 129)
	key250   = strings.Repeat("k", 250)
	key251   = strings.Repeat("k", 251)
)

type requestCase struct {
	name string
	in   string
	lim  Limits
	n    int     // for an accepted frame
	want Request // for an accepted frame
	err  *Error  // for a bad frame
}

func acq(owner, key string, lease, wait uint64) Request {
	return Request{Kind: Acquire, Owner: []byte(owner), Key: []byte(key), LeaseMs: lease, WaitMs: wait}
}

func rel(token uint64, key string) Request {
	return Request{Kind: Release, Key: []byte(key), Token: token}
}

var custom = Limits{MaxLeaseMs: 5000, MaxWaitMs: 7000}

var requestCases = []requestCase{
	// Accepted frames.
	{name: "acquire LF", in: "A o k 1 0\n", n: 10, want: acq("o", "k", 1, 0)},
	{name: "acquire CRLF", in: "A o k 1 0\r\n", n: 11, want: acq("o", "k", 1, 0)},
	{name: "release", in: "R 1 k\n", n: 6, want: rel(1, "k")},
	{name: "release CRLF", in: "R 1 k\r\n", n: 7, want: rel(1, "k")},
	{name: "only the first frame", in: "R 7 a\nA x y 1 0\n", n: 6, want: rel(7, "a")},
	{name: "bad frame after a good one", in: "R 7 a\nbad\n", n: 6, want: rel(7, "a")},
	{name: "owner 128 key 250", in: "A " + owner128 + " " + key250 + " 3600000 3600000\n",
		n: 2 + 128 + 1 + 250 + 17, want: acq(owner128, key250, 3600000, 3600000)},
	{name: "non-ASCII bytes", in: "A \x80\xff k\xe2\x82\xac 1 0\n", n: 14, want: acq("\x80\xff", "k\xe2\x82\xac", 1, 0)},
	{name: "printable ASCII edges", in: "A !~ ~! 1 0\n", n: 12, want: acq("!~", "~!", 1, 0)},
	{name: "field chars like commands", in: "A A R 1 0\n", n: 10, want: acq("A", "R", 1, 0)},
	{name: "max token", in: "R 18446744073709551615 k\n", n: 25, want: rel(18446744073709551615, "k")},
	{name: "token 10", in: "R 10 k\n", n: 7, want: rel(10, "k")},
	{name: "wait 0 ok", in: "A o k 5 0\n", n: 10, want: acq("o", "k", 5, 0)},
	{name: "default max lease and wait", in: "A o k 3600000 3600000\n", n: 22, want: acq("o", "k", 3600000, 3600000)},
	{name: "custom max lease", in: "A o k 5000 0\n", lim: custom, n: 13, want: acq("o", "k", 5000, 0)},
	{name: "custom max wait", in: "A o k 1 7000\n", lim: custom, n: 13, want: acq("o", "k", 1, 7000)},
	{name: "huge limits", in: "A o k 18446744073709551615 18446744073709551615\n",
		lim: Limits{^uint64(0), ^uint64(0)}, n: 48, want: acq("o", "k", ^uint64(0), ^uint64(0))},
	{name: "key with dots and colons", in: "R 3 app:lock/1.2\n", n: 17, want: rel(3, "app:lock/1.2")},

	// too-long and its boundary.
	{name: "1023+LF is a line", in: "R 1 " + strings.Repeat("k", 1019) + "\n", err: ErrKeyTooLong},
	{name: "1023+CRLF too-long", in: "R 1 " + strings.Repeat("k", 1019) + "\r\n", err: ErrTooLong},
	{name: "1024 no LF too-long", in: strings.Repeat("A", 1024), err: ErrTooLong},
	{name: "LF at 1025 too-long", in: strings.Repeat("x", 1024) + "\n", err: ErrTooLong},
	{name: "too-long before command", in: strings.Repeat("x", 2000), err: ErrTooLong},
	{name: "1022+CRLF is a line", in: "X" + strings.Repeat("y", 1021) + "\r\n", err: ErrCommand},

	// Empty line.
	{name: "empty line", in: "\n", err: ErrEmptyLine},
	{name: "empty line CRLF", in: "\r\n", err: ErrEmptyLine},

	// command.
	{name: "lower a", in: "a o k 1 0\n", err: ErrCommand},
	{name: "lower r", in: "r 1 k\n", err: ErrCommand},
	{name: "two letters", in: "AA o k 1 0\n", err: ErrCommand},
	{name: "unknown letter", in: "X\n", err: ErrCommand},
	{name: "answer letter", in: "T o k\n", err: ErrCommand},
	{name: "NUL command", in: "\x00\n", err: ErrCommand},
	{name: "lone CR command", in: "\r\r\n", err: ErrCommand},
	{name: "A with CR", in: "A\r o k 1 0\n", err: ErrCommand},
	{name: "command before empty field", in: "Q  x\n", err: ErrCommand},
	{name: "command before count", in: "X 1 2 3 4 5 6\n", err: ErrCommand},

	// Empty fields and field count.
	{name: "leading space", in: " A o k 1 0\n", err: ErrEmptyField},
	{name: "only a space", in: " \n", err: ErrEmptyField},
	{name: "double space", in: "A o  k 1 0\n", err: ErrEmptyField},
	{name: "trailing space", in: "A o k 1 0 \n", err: ErrEmptyField},
	{name: "trailing space CRLF", in: "R 1 k \r\n", err: ErrEmptyField},
	{name: "empty field before count", in: "R 1 k  x y\n", err: ErrEmptyField},
	{name: "A alone", in: "A\n", err: ErrFieldCount},
	{name: "R alone", in: "R\n", err: ErrFieldCount},
	{name: "acquire 4 fields", in: "A o k 1\n", err: ErrFieldCount},
	{name: "acquire 6 fields", in: "A o k 1 0 x\n", err: ErrFieldCount},
	{name: "release 2 fields", in: "R 1\n", err: ErrFieldCount},
	{name: "release 4 fields", in: "R 1 k x\n", err: ErrFieldCount},
	{name: "release shaped like acquire", in: "R o k 1 0\n", err: ErrFieldCount},
	{name: "count before field syntax", in: "A o\x01 k 1\n", err: ErrFieldCount},

	// Owner and key.
	{name: "owner 129", in: "A " + owner129 + " k 1 0\n", err: ErrOwnerTooLong},
	{name: "key 251", in: "A o " + key251 + " 1 0\n", err: ErrKeyTooLong},
	{name: "release key 251", in: "R 1 " + key251 + "\n", err: ErrKeyTooLong},
	{name: "length before bytes", in: "A o " + key251[:250] + "\x01 1 0\n", err: ErrKeyTooLong},
	{name: "owner control byte", in: "A o\x01 k 1 0\n", err: ErrOwnerByte},
	{name: "owner NUL", in: "A \x00 k 1 0\n", err: ErrOwnerByte},
	{name: "owner tab", in: "A o\tp k 1 0\n", err: ErrOwnerByte},
	{name: "owner 0x1F", in: "A \x1f k 1 0\n", err: ErrOwnerByte},
	{name: "key DEL", in: "A o k\x7f 1 0\n", err: ErrKeyByte},
	{name: "key lone CR", in: "A o k\r 1 0\n", err: ErrKeyByte},
	{name: "release key lone CR", in: "R 1 k\rx\n", err: ErrKeyByte},
	{name: "release key CR CR LF", in: "R 1 k\r\r\n", err: ErrKeyByte},
	{name: "key bad byte after 8", in: "R 1 abcdefghijklmnop\x1bq\n", err: ErrKeyByte},
	{name: "owner before key", in: "A o\x01 " + key251 + " 1 0\n", err: ErrOwnerByte},
	{name: "key before numbers", in: "A o k\x01 x y\n", err: ErrKeyByte},

	// Malformed numbers.
	{name: "lease 00", in: "A o k 00 0\n", err: ErrLeaseSyntax},
	{name: "lease 01", in: "A o k 01 0\n", err: ErrLeaseSyntax},
	{name: "lease plus", in: "A o k +1 0\n", err: ErrLeaseSyntax},
	{name: "lease minus", in: "A o k -1 0\n", err: ErrLeaseSyntax},
	{name: "lease suffix", in: "A o k 1x 0\n", err: ErrLeaseSyntax},
	{name: "lease hex", in: "A o k 0x10 0\n", err: ErrLeaseSyntax},
	{name: "lease decimal point", in: "A o k 1.5 0\n", err: ErrLeaseSyntax},
	{name: "lease CR", in: "A o k 1\r 0\n", err: ErrLeaseSyntax},
	{name: "wait 00", in: "A o k 1 00\n", err: ErrWaitSyntax},
	{name: "wait minus", in: "A o k 1 -0\n", err: ErrWaitSyntax},
	{name: "wait CR CR LF", in: "A o k 1 0\r\r\n", err: ErrWaitSyntax},
	{name: "wait non-ASCII digit", in: "A o k 1 \xd9\xa1\n", err: ErrWaitSyntax},
	{name: "token 00", in: "R 00 k\n", err: ErrTokenSyntax},
	{name: "token 01", in: "R 01 k\n", err: ErrTokenSyntax},
	{name: "token minus", in: "R -1 k\n", err: ErrTokenSyntax},
	{name: "token plus", in: "R +1 k\n", err: ErrTokenSyntax},
	{name: "token letters", in: "R abc k\n", err: ErrTokenSyntax},
	{name: "token before key", in: "R x k\x01\n", err: ErrTokenSyntax},
	{name: "overflowing digits then junk", in: "A o k 99999999999999999999x 0\n", err: ErrLeaseSyntax},
	{name: "long zero run", in: "R 000000000000000000000000 k\n", err: ErrTokenSyntax},

	// Range, only once every field is well formed.
	{name: "token 0", in: "R 0 k\n", err: ErrTokenRange},
	{name: "token 2^64", in: "R 18446744073709551616 k\n", err: ErrTokenRange},
	{name: "token 21 digits", in: "R 100000000000000000000 k\n", err: ErrTokenRange},
	{name: "token 2^64 CRLF", in: "R 18446744073709551616 k\r\n", err: ErrTokenRange},
	{name: "lease 0", in: "A o k 0 0\n", err: ErrLeaseRange},
	{name: "lease default max+1", in: "A o k 3600001 0\n", err: ErrLeaseRange},
	{name: "wait default max+1", in: "A o k 1 3600001\n", err: ErrWaitRange},
	{name: "lease custom max+1", in: "A o k 5001 0\n", lim: custom, err: ErrLeaseRange},
	{name: "wait custom max+1", in: "A o k 1 7001\n", lim: custom, err: ErrWaitRange},
	{name: "lease overflow", in: "A o k 18446744073709551616 0\n", lim: Limits{^uint64(0), ^uint64(0)}, err: ErrLeaseRange},
	{name: "wait overflow", in: "A o k 1 18446744073709551616\n", lim: Limits{^uint64(0), ^uint64(0)}, err: ErrWaitRange},
	{name: "syntax of a later field before range", in: "A o k 0 01\n", err: ErrWaitSyntax},
	{name: "key syntax before token range", in: "R 0 k\x01\n", err: ErrKeyByte},
	{name: "lease range before wait range", in: "A o k 0 9999999\n", err: ErrLeaseRange},
}

func TestParseRequestTable(t *testing.T) {
	for _, tc := range requestCases {
		t.Run(tc.name, func(t *testing.T) {
			buf := []byte(tc.in)
			orig := bytes.Clone(buf)
			sentinel := Request{Kind: 'Z', Token: 99}
			req := sentinel
			n, err := ParseRequest(buf, tc.lim, &req)
			if !bytes.Equal(buf, orig) {
				t.Fatalf("buffer modified")
			}
			if tc.err != nil {
				if err != tc.err || n != 0 {
					t.Fatalf("got n=%d err=%v, want n=0 err=%v", n, err, tc.err)
				}
				if !sameRequest(req, sentinel) {
					t.Fatalf("req written on error: %+v", req)
				}
			} else {
				if err != nil || n != tc.n {
					t.Fatalf("got n=%d err=%v, want n=%d", n, err, tc.n)
				}
				if !sameRequest(req, tc.want) {
					t.Fatalf("got %+v, want %+v", req, tc.want)
				}
				if !within(req.Key, buf[:n]) || !within(req.Owner, buf[:n]) {
					t.Fatalf("fields are not sub-slices of the frame")
				}
				if cap(req.Key) != len(req.Key) || cap(req.Owner) != len(req.Owner) {
					t.Fatalf("field capacity reaches past the field")
				}
			}
			// The reference reading of the protocol must agree.
			rn, rreq, rerr := refParse(buf, tc.lim)
			if rn != n || rerr != err || (err == nil && !sameRequest(rreq, req)) {
				t.Fatalf("reference: n=%d err=%v req=%+v; parser: n=%d err=%v req=%+v", rn, rerr, rreq, n, err, req)
			}
		})
	}
}

func TestParseRequestIncomplete(t *testing.T) {
	frames := []string{
		"A o k 1 0\n", "A o k 1 0\r\n", "R 1 k\n", "R 18446744073709551615 k\r\n",
		"A " + owner128 + " " + key250 + " 3600000 3600000\r\n",
		"X bad\n", " \n", "\n",
	}
	for _, fr := range frames {
		for i := 0; i < len(fr); i++ {
			if fr[i] == '\n' {
				break
			}
			req := Request{Kind: 'Z'}
			n, err := ParseRequest([]byte(fr[:i]), Limits{}, &req)
			if n != 0 || err != nil || req.Kind != 'Z' {
				t.Fatalf("prefix %q: n=%d err=%v req=%+v, want incomplete", fr[:i], n, err, req)
			}
		}
	}
	// Up to 1023 bytes without a line end is incomplete, whatever the bytes.
	for _, size := range []int{1, 100, 1022, 1023} {
		buf := bytes.Repeat([]byte{'\r'}, size)
		if n, err := ParseRequest(buf, Limits{}, new(Request)); n != 0 || err != nil {
			t.Fatalf("%d bytes: n=%d err=%v, want incomplete", size, n, err)
		}
	}
	// 1023 bytes ending in "\r" then "\n": a line of exactly 1024 bytes.
	buf := append([]byte("R 1 "+strings.Repeat("k", 1018)), '\r')
	if n, err := ParseRequest(buf, Limits{}, new(Request)); n != 0 || err != nil {
		t.Fatalf("1023 bytes: n=%d err=%v", n, err)
	}
	buf = append(buf, '\n')
	if n, err := ParseRequest(buf, Limits{}, new(Request)); err != ErrKeyTooLong || n != 0 {
		t.Fatalf("1024-byte CRLF line: n=%d err=%v, want %v", n, err, ErrKeyTooLong)
	}
}

// TestErrorTexts guards the wire form of every request error.
func TestErrorTexts(t *testing.T) {
	all := []*Error{ErrTooLong, ErrEmptyLine, ErrCommand, ErrEmptyField, ErrFieldCount,
		ErrOwnerTooLong, ErrOwnerByte, ErrKeyTooLong, ErrKeyByte, ErrLeaseSyntax,
		ErrWaitSyntax, ErrTokenSyntax, ErrLeaseRange, ErrWaitRange, ErrTokenRange}
	seen := map[string]bool{}
	for _, e := range all {
		if e.Text == "" || seen[e.Text] || strings.ContainsAny(e.Text, "\r\n") {
			t.Errorf("bad or duplicate text %q", e.Text)
		}
		seen[e.Text] = true
		line := AppendError(nil, e)
		want := "E " + e.Code.String() + " " + e.Text + "\n"
		if string(line) != want {
			t.Errorf("AppendError = %q, want %q", line, want)
		}
		if e.Error() != "codec: "+e.Code.String()+": "+e.Text {
			t.Errorf("Error() = %q", e.Error())
		}
	}
	for c, s := range map[Code]string{CodeSyntax: "syntax", CodeRange: "range", CodeTooLong: "too-long", CodeCommand: "command", CodeUnavailable: "unavailable", 0: "Code(0)", 9: "Code(9)"} {
		if c.String() != s {
			t.Errorf("Code(%d).String() = %q, want %q", c, c.String(), s)
		}
		if got, ok := ParseCode([]byte(s)); ok != (c >= CodeSyntax && c <= CodeUnavailable) || (ok && got != c) {
			t.Errorf("ParseCode(%q) = %v, %v", s, got, ok)
		}
	}
}

func TestValidate(t *testing.T) {
	cases := []struct {
		owner, key  string
		lease, wait uint64
		lim         Limits
		want        *Error
	}{
		{"o", "k", 1, 0, Limits{}, nil},
		{owner128, key250, 3600000, 3600000, Limits{}, nil},
		{"", "k", 1, 0, Limits{}, ErrEmptyField},
		{"o", "", 1, 0, Limits{}, ErrEmptyField},
		{owner129, "k", 1, 0, Limits{}, ErrOwnerTooLong},
		{"o", key251, 1, 0, Limits{}, ErrKeyTooLong},
		{"a b", "k", 1, 0, Limits{}, ErrOwnerByte},
		{"o", "k\n", 1, 0, Limits{}, ErrKeyByte},
		{"o", "k", 0, 0, Limits{}, ErrLeaseRange},
		{"o", "k", 5001, 0, custom, ErrLeaseRange},
		{"o", "k", 5000, 7001, custom, ErrWaitRange},
		{"o", "k", 5000, 7000, custom, nil},
	}
	for _, c := range cases {
		got := ValidateAcquire([]byte(c.owner), []byte(c.key), c.lease, c.wait, c.lim)
		if got != c.want {
			t.Errorf("ValidateAcquire(%q, %q, %d, %d) = %v, want %v", c.owner, c.key, c.lease, c.wait, got, c.want)
		}
		// Whatever Validate accepts, the parser accepts; what it rejects, the parser rejects the same way.
		frame := AppendAcquire(nil, []byte(c.owner), []byte(c.key), c.lease, c.wait)
		_, perr := ParseRequest(frame, c.lim, new(Request))
		if c.owner != "a b" && c.key != "k\n" && perr != got {
			t.Errorf("frame %q: parser says %v, Validate %v", frame, perr, got)
		}
	}
	if e := ValidateRelease(1, []byte("k")); e != nil {
		t.Errorf("ValidateRelease ok: %v", e)
	}
	if e := ValidateRelease(0, []byte("k")); e != ErrTokenRange {
		t.Errorf("ValidateRelease token 0: %v", e)
	}
	if e := ValidateRelease(1, nil); e != ErrEmptyField {
		t.Errorf("ValidateRelease empty key: %v", e)
	}
	if e := ValidateRelease(0, []byte("k k")); e != ErrKeyByte {
		t.Errorf("ValidateRelease space in key: %v", e)
	}
}

// TestValidBytes checks the eight-at-a-time scan against a byte loop for every
// byte value at every position of a 17-byte field.
func TestValidBytes(t *testing.T) {
	naive := func(b []byte) bool {
		for _, c := range b {
			if c <= ' ' || c == 0x7f {
				return false
			}
		}
		return true
	}
	field := bytes.Repeat([]byte{'x'}, 17)
	for pos := range field {
		for c := 0; c < 256; c++ {
			field[pos] = byte(c)
			for _, fill := range []byte{'x', 0x80, 0xff, '!'} {
				b := bytes.Clone(field)
				for i := range b {
					if i != pos {
						b[i] = fill
					}
				}
				if validBytes(b) != naive(b) {
					t.Fatalf("validBytes(%q) = %v", b, validBytes(b))
				}
			}
		}
		field[pos] = 'x'
	}
}

// field reads eight bytes at a time; it must end fields where the byte
// loop does, whatever the bytes around the end (borrows run between bytes).
func TestFieldWordAtATime(t *testing.T) {
	alphabet := []byte{0x00, 0x01, 0x09, 0x0a, 0x0d, 0x1f, 0x20, 0x21, 0x22, 'a', 'z', '0',
		0x7e, 0x7f, 0x80, 0x81, 0xa0, 0xa1, 0xde, 0xdf, 0xfe, 0xff}
	byteLoop := func(buf []byte, i, limit int) (int, int) {
		start := i
		for ; i < len(buf); i++ {
			if c := buf[i]; c <= ' ' || c == 0x7f {
				break
			}
		}
		if i == start || i-start > limit || i >= len(buf) {
			return i, -1
		}
		return i, i - start
	}
	rng := rand.New(rand.NewPCG(5, 6))
	buf := make([]byte, 40)
	for n := range 500000 {
		buf = buf[:rng.IntN(40)]
		for i := range buf {
			if rng.IntN(3) == 0 {
				buf[i] = alphabet[rng.IntN(len(alphabet))]
			} else {
				buf[i] = byte(0x21 + rng.IntN(0x5e)) // printable, not a stop
			}
		}
		from, limit := 0, 1+rng.IntN(40)
		if len(buf) > 0 {
			from = rng.IntN(len(buf))
		}
		ge, gl := field(buf, from, limit)
		we, wl := byteLoop(buf, from, limit)
		if ge != we || gl != wl {
			t.Fatalf("case %d: field(%q, %d, %d) = %d, %d; the byte loop says %d, %d", n, buf, from, limit, ge, gl, we, wl)
		}
	}
}

// TestParseRequestSetsEveryField: the fast path fills the request field by
// field, so a field it forgot would keep the previous frame's value.
func TestParseRequestSetsEveryField(t *testing.T) {
	for _, frame := range []string{"A o k 1000 5\n", "R 42 k\n", "A o k 1000 0\r\n", "R 9 k\r\n"} {
		var clean, used Request
		dirty.Fill(&used)
		n1, err1 := ParseRequest([]byte(frame), Limits{}, &clean)
		n2, err2 := ParseRequest([]byte(frame), Limits{}, &used)
		if err1 != nil || err2 != nil || n1 != n2 || !reflect.DeepEqual(clean, used) {
			t.Errorf("%q: into a zero request %+v, into a used one %+v", frame, clean, used)
		}
	}
}
