package codec

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The seed corpora live in testdata/fuzz/<target>/ and cover every error class.

func FuzzParseRequest(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte, maxLease, maxWait uint64) {
		lim := Limits{MaxLeaseMs: maxLease, MaxWaitMs: maxWait}
		orig := bytes.Clone(data)
		sentinel := Request{Kind: 'Z'}
		req := sentinel
		n, err := ParseRequest(data, lim, &req)
		if !bytes.Equal(data, orig) {
			t.Fatal("buffer modified")
		}
		if n < 0 || n > len(data) || n > MaxLine {
			t.Fatalf("n=%d out of bounds (len %d)", n, len(data))
		}
		nl := bytes.IndexByte(data[:min(len(data), MaxLine)], '\n')

		rn, rreq, rerr := refParse(data, lim)
		if rn != n || rerr != err || (err == nil && n > 0 && !sameRequest(rreq, req)) {
			t.Fatalf("reference: n=%d err=%v req=%+v; parser: n=%d err=%v req=%+v", rn, rerr, rreq, n, err, req)
		}

		switch {
		case err != nil:
			if n != 0 || !sameRequest(req, sentinel) {
				t.Fatalf("error %v with n=%d req=%+v", err, n, req)
			}
			if (err == ErrTooLong) != (nl < 0) {
				t.Fatalf("error %v but line end at %d", err, nl)
			}
			if err == ErrTooLong && len(data) < MaxLine {
				t.Fatalf("too-long with %d bytes", len(data))
			}
		case n == 0:
			if nl >= 0 || len(data) >= MaxLine || !sameRequest(req, sentinel) {
				t.Fatalf("incomplete, but line end at %d, %d bytes", nl, len(data))
			}
		default:
			if n != nl+1 {
				t.Fatalf("n=%d, line end at %d", n, nl)
			}
			if !within(req.Owner, data[:n]) || !within(req.Key, data[:n]) {
				t.Fatal("fields are not sub-slices of the frame")
			}
			// The grammar has one spelling per request, so re-encoding gives
			// back the line (less an optional "\r"), which parses the same.
			var enc []byte
			if req.Kind == Acquire {
				enc = AppendAcquire(nil, req.Owner, req.Key, req.LeaseMs, req.WaitMs)
			} else {
				enc = AppendRelease(nil, req.Token, req.Key)
			}
			line := bytes.TrimSuffix(data[:n-1], []byte{'\r'})
			if !bytes.Equal(enc[:len(enc)-1], line) {
				t.Fatalf("re-encoded %q, line %q", enc, line)
			}
			var again Request
			n2, err2 := ParseRequest(enc, lim, &again)
			if err2 != nil || n2 != len(enc) || !sameRequest(again, req) {
				t.Fatalf("re-encoded %q: n=%d err=%v %+v", enc, n2, err2, again)
			}
			var verr *Error
			if req.Kind == Acquire {
				verr = ValidateAcquire(req.Owner, req.Key, req.LeaseMs, req.WaitMs, lim)
			} else {
				verr = ValidateRelease(req.Token, req.Key)
			}
			if verr != nil {
				t.Fatalf("Validate rejects a parsed request: %v", verr)
			}
		}
	})
}

func FuzzParseAnswer(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		orig := bytes.Clone(data)
		a := Answer{Kind: 'Z'}
		n, err := ParseAnswer(data, &a)
		if !bytes.Equal(data, orig) {
			t.Fatal("buffer modified")
		}
		// The one-pass reading must agree with the full one wherever it answers.
		slow := Answer{Kind: 'Z'}
		if sn, serr := parseAnswerSlow(data, &slow); sn != n || (serr == nil) != (err == nil) || !sameAnswer(slow, a) {
			t.Fatalf("full reading: n=%d err=%v %+v; parser: n=%d err=%v %+v", sn, serr, slow, n, err, a)
		}
		if n < 0 || n > len(data) || n > MaxLine {
			t.Fatalf("n=%d out of bounds (len %d)", n, len(data))
		}
		nl := bytes.IndexByte(data[:min(len(data), MaxLine)], '\n')
		switch {
		case err != nil:
			if n != 0 || a.Kind != 'Z' || !errors.Is(err, ErrBadAnswer) {
				t.Fatalf("error %v with n=%d %+v", err, n, a)
			}
			if nl < 0 && len(data) < MaxLine {
				t.Fatalf("error %v on an incomplete line", err)
			}
		case n == 0:
			if nl >= 0 || len(data) >= MaxLine || a.Kind != 'Z' {
				t.Fatalf("incomplete, but line end at %d, %d bytes", nl, len(data))
			}
		default:
			if n != nl+1 {
				t.Fatalf("n=%d, line end at %d", n, nl)
			}
			for _, f := range [][]byte{a.Owner, a.Key, a.Code, a.Text} {
				if !within(f, data[:n]) {
					t.Fatal("field is not a sub-slice of the line")
				}
			}
			enc := encodeAnswer(nil, a)
			line := bytes.TrimSuffix(data[:n-1], []byte{'\r'})
			if !bytes.Equal(enc[:len(enc)-1], line) {
				t.Fatalf("re-encoded %q, line %q", enc, line)
			}
			if a.Kind == 'E' {
				if c, ok := ParseCode(a.Code); ok && len(a.Text) > 0 {
					if e := AppendError(nil, &Error{c, string(a.Text)}); !bytes.Equal(e, enc) {
						t.Fatalf("AppendError %q, line %q", e, enc)
					}
				}
			}
			var again Answer
			n2, err2 := ParseAnswer(enc, &again)
			if err2 != nil || n2 != len(enc) || !sameAnswer(again, a) {
				t.Fatalf("re-encoded %q: n=%d err=%v %+v", enc, n2, err2, again)
			}
		}
	})
}

// TestSeedCorpus keeps the committed seeds honest: together they must reach every
// outcome, each request error code and, for answers, success and failure.
func TestSeedCorpus(t *testing.T) {
	reqs := readSeeds(t, "FuzzParseRequest")
	seen := map[string]bool{}
	for name, args := range reqs {
		lim := Limits{MaxLeaseMs: args.u[0], MaxWaitMs: args.u[1]}
		n, err := ParseRequest(args.data, lim, new(Request))
		outcome := "ok"
		switch {
		case err != nil:
			outcome = err.Code.String()
		case n == 0:
			outcome = "incomplete"
		}
		seen[outcome] = true
		if !strings.HasPrefix(strings.ReplaceAll(name, "_", "-"), outcome) {
			t.Errorf("seed %s: outcome %s", name, outcome)
		}
	}
	for _, want := range []string{"ok", "incomplete", "syntax", "range", "too-long", "command"} {
		if !seen[want] {
			t.Errorf("no FuzzParseRequest seed gives %s", want)
		}
	}
	var good, bad int
	for _, args := range readSeeds(t, "FuzzParseAnswer") {
		if _, err := ParseAnswer(args.data, new(Answer)); err != nil {
			bad++
		} else {
			good++
		}
	}
	if len(reqs) < 15 || good == 0 || bad == 0 {
		t.Errorf("seed corpora too thin: %d request seeds, %d good and %d bad answers", len(reqs), good, bad)
	}
}

type seedArgs struct {
	data []byte
	u    []uint64
}

// readSeeds reads the "go test fuzz v1" files of one target: a []byte line then
// uint64 lines.
func readSeeds(t *testing.T, target string) map[string]seedArgs {
	t.Helper()
	dir := filepath.Join("testdata", "fuzz", target)
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	seeds := map[string]seedArgs{}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if lines[0] != "go test fuzz v1" {
			t.Fatalf("%s: bad header %q", e.Name(), lines[0])
		}
		var args seedArgs
		for _, l := range lines[1:] {
			if s, ok := strings.CutPrefix(l, "[]byte("); ok {
				q, err := strconv.Unquote(strings.TrimSuffix(s, ")"))
				if err != nil {
					t.Fatalf("%s: %v", e.Name(), err)
				}
				args.data = []byte(q)
			} else if s, ok := strings.CutPrefix(l, "uint64("); ok {
				u, err := strconv.ParseUint(strings.TrimSuffix(s, ")"), 10, 64)
				if err != nil {
					t.Fatalf("%s: %v", e.Name(), err)
				}
				args.u = append(args.u, u)
			}
		}
		seeds[e.Name()] = args
	}
	return seeds
}
