package codec

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
)

func sameAnswer(a, b Answer) bool {
	return a.Kind == b.Kind && a.Token == b.Token && bytes.Equal(a.Owner, b.Owner) &&
		bytes.Equal(a.Key, b.Key) && bytes.Equal(a.Code, b.Code) && bytes.Equal(a.Text, b.Text)
}

// encodeAnswer writes a with the encoder of its kind.
func encodeAnswer(dst []byte, a Answer) []byte {
	switch a.Kind {
	case 'A':
		return AppendAcquired(dst, a.Token, a.Owner, a.Key)
	case 'T':
		return AppendTimedOut(dst, a.Owner, a.Key)
	case 'B':
		return AppendBusy(dst, a.Owner, a.Key)
	case 'R':
		return AppendReleased(dst, a.Token, a.Key)
	case 'N':
		return AppendNotReleased(dst, a.Token, a.Key)
	}
	// E: a code the package may not know is written as it is.
	dst = append(dst, 'E', ' ')
	dst = append(dst, a.Code...)
	if len(a.Text) > 0 {
		dst = append(dst, ' ')
		dst = append(dst, a.Text...)
	}
	return append(dst, '\n')
}

func TestEncodeAnswers(t *testing.T) {
	cases := []struct {
		got  []byte
		want string
	}{
		{AppendAcquired(nil, 1, []byte("worker-7"), []byte("invoices")), "A 1 worker-7 invoices\n"},
		{AppendAcquired(nil, 18446744073709551615, []byte("o"), []byte("k")), "A 18446744073709551615 o k\n"},
		{AppendTimedOut(nil, []byte("worker-9"), []byte("invoices")), "T worker-9 invoices\n"},
		{AppendBusy(nil, []byte("o"), []byte("k")), "B o k\n"},
		{AppendReleased(nil, 1, []byte("invoices")), "R 1 invoices\n"},
		{AppendNotReleased(nil, 10, []byte("k")), "N 10 k\n"},
		{AppendError(nil, ErrFieldCount), "E syntax wrong field count\n"},
		{AppendError(nil, ErrTooLong), "E too-long no line end within 1024 bytes\n"},
		{AppendError(nil, &Error{CodeRange, "a\nb\rc\x7f"}), "E range a?b?c?\n"},
		{AppendError(nil, &Error{CodeCommand, ""}), "E command\n"},
		{AppendAcquire(nil, []byte("worker-7"), []byte("invoices"), 30000, 0), "A worker-7 invoices 30000 0\n"},
		{AppendRelease(nil, 18446744073709551615, []byte("k")), "R 18446744073709551615 k\n"},
		{AppendBusy([]byte("prefix\n"), []byte("o"), []byte("k")), "prefix\nB o k\n"},
	}
	for _, c := range cases {
		if string(c.got) != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}

func TestAnswerRoundTrip(t *testing.T) {
	answers := []Answer{
		{Kind: 'A', Token: 1, Owner: []byte("o"), Key: []byte("k")},
		{Kind: 'A', Token: 18446744073709551615, Owner: []byte(owner128), Key: []byte(key250)},
		{Kind: 'T', Owner: []byte("\x80\xff"), Key: []byte("~!")},
		{Kind: 'B', Owner: []byte(owner128), Key: []byte(key250)},
		{Kind: 'R', Token: 7, Key: []byte("k")},
		{Kind: 'N', Token: 18446744073709551615, Key: []byte(key250)},
		{Kind: 'E', Code: []byte("syntax"), Text: []byte("wrong field count")},
		{Kind: 'E', Code: []byte("range"), Text: []byte("  spaces  inside ")},
		{Kind: 'E', Code: []byte("future-code")},
	}
	r := rand.New(rand.NewPCG(3, 4))
	for range 2000 {
		a := Answer{Kind: "ATBRN"[r.IntN(5)], Key: randField(r, MaxKey)}
		if a.Kind == 'A' || a.Kind == 'R' || a.Kind == 'N' {
			a.Token = randNumber(r, 1, ^uint64(0))
		}
		if a.Kind == 'A' || a.Kind == 'T' || a.Kind == 'B' {
			a.Owner = randField(r, MaxOwner)
		}
		answers = append(answers, a)
	}
	for _, e := range []*Error{ErrTooLong, ErrCommand, ErrKeyByte, ErrTokenRange} {
		line := AppendError(nil, e)
		var a Answer
		n, err := ParseAnswer(line, &a)
		if err != nil || n != len(line) || a.Kind != 'E' || string(a.Text) != e.Text {
			t.Fatalf("%q: n=%d err=%v %+v", line, n, err, a)
		}
		if c, ok := ParseCode(a.Code); !ok || c != e.Code {
			t.Fatalf("%q: code %q", line, a.Code)
		}
	}

	// All answers as one pipelined stream, split at random points.
	var stream []byte
	for _, a := range answers {
		stream = encodeAnswer(stream, a)
	}
	var acc []byte
	i := 0
	for _, chunk := range splitRandom(r, stream) {
		acc = append(acc, chunk...)
		for {
			var a Answer
			n, err := ParseAnswer(acc, &a)
			if err != nil {
				t.Fatalf("answer %d: %v", i, err)
			}
			if n == 0 {
				break
			}
			for _, f := range [][]byte{a.Owner, a.Key, a.Code, a.Text} {
				if !within(f, acc[:n]) {
					t.Fatalf("answer %d: field not a sub-slice", i)
				}
			}
			if !sameAnswer(a, answers[i]) {
				t.Fatalf("answer %d: parsed %+v, encoded %+v", i, a, answers[i])
			}
			i++
			acc = acc[n:]
		}
	}
	if i != len(answers) || len(acc) != 0 {
		t.Fatalf("parsed %d of %d answers, %d bytes left", i, len(answers), len(acc))
	}
}

func TestParseAnswerCRLF(t *testing.T) {
	var a Answer
	n, err := ParseAnswer([]byte("R 5 k\r\nrest"), &a)
	if err != nil || n != 7 || !sameAnswer(a, Answer{Kind: 'R', Token: 5, Key: []byte("k")}) {
		t.Fatalf("n=%d err=%v %+v", n, err, a)
	}
}

func TestParseAnswerRejects(t *testing.T) {
	bad := []string{
		"\n", "\r\n", " A 1 o k\n",
		"X 1 k\n", "a 1 o k\n", "AA 1 o k\n", "Ax 1 o k\n",
		"A 1 o k \n", "A 1  o k\n", "T o  k\n",
		"A 1 o\n", "A 1 o k x\n", "T o\n", "T o k x\n", "B o\n", "R 1\n", "R 1 k x\n", "N 1\n", "A\n", "R\n",
		"A 0 o k\n", "A 01 o k\n", "R -1 k\n", "N x k\n", "R 18446744073709551616 k\n",
		"A 1 " + owner129 + " k\n", "T " + owner129 + " k\n", "A 1 o " + key251 + "\n", "R 1 " + key251 + "\n",
		"T o\x01 k\n", "B o k\x7f\n", "N 1 k\rx\n", "T o k\r\r\n",
		"E\n", "E \n", "E syntax \n", "E  text\n", "E syn\x01tax text\n", "E syntax te\x01xt\n",
		strings.Repeat("A", MaxLine), "R 1 " + strings.Repeat("k", 1019) + "\r\n",
	}
	for _, s := range bad {
		a := Answer{Kind: 'Z'}
		n, err := ParseAnswer([]byte(s), &a)
		if err == nil || n != 0 || a.Kind != 'Z' {
			t.Errorf("%q: n=%d err=%v %+v, want an error", s, n, err, a)
			continue
		}
		if !errors.Is(err, ErrBadAnswer) {
			t.Errorf("%q: %v does not match ErrBadAnswer", s, err)
		}
	}
	for _, s := range []string{"", "A 1 o k", "E syntax text\r", strings.Repeat("x", MaxLine-1)} {
		if n, err := ParseAnswer([]byte(s), new(Answer)); n != 0 || err != nil {
			t.Errorf("%q: n=%d err=%v, want incomplete", s, n, err)
		}
	}
}

// The encoders write numbers in place; they must read as strconv's.
func TestPutUint(t *testing.T) {
	vals := []uint64{0, 1, 9, 10, 11, 99, 100, 101, 999, 1000, 1<<32 - 1, 1 << 32,
		9999999999999999999, 10000000000000000000, 1<<64 - 1}
	for p := uint64(1); p < 1e19; p *= 10 {
		vals = append(vals, p-1, p, p+1)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for range 100000 {
		vals = append(vals, rng.Uint64()>>rng.IntN(64))
	}
	for _, v := range vals {
		want := strconv.FormatUint(v, 10)
		if n := uintLen(v); n != len(want) {
			t.Fatalf("uintLen(%d) = %d, want %d", v, n, len(want))
		}
		b := make([]byte, len(want))
		putUint(b, v)
		if string(b) != want {
			t.Fatalf("putUint(%d) = %q", v, b)
		}
		if got := string(AppendReleased([]byte("x"), v, []byte("k"))); got != "xR "+want+" k\n" {
			t.Fatalf("AppendReleased(%d) = %q", v, got)
		}
		if got := string(AppendAcquire(nil, []byte("o"), []byte("k"), v, v)); got != "A o k "+want+" "+want+"\n" {
			t.Fatalf("AppendAcquire(%d) = %q", v, got)
		}
	}
}
