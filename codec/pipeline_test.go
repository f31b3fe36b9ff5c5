package codec

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// randField returns 1 to max bytes drawn from everything a key or owner may hold,
// with the extremes (length 1 and max, bytes 0x21, 0x7E, 0x80, 0xFF) over-weighted.
func randField(r *rand.Rand, max int) []byte {
	n := 1 + r.IntN(max)
	switch r.IntN(8) {
	case 0:
		n = 1
	case 1:
		n = max
	}
	b := make([]byte, n)
	for i := range b {
		switch r.IntN(6) {
		case 0:
			b[i] = []byte{0x21, 0x7e, 0x80, 0xff}[r.IntN(4)]
		case 1:
			b[i] = byte(0x80 + r.IntN(0x80))
		default:
			b[i] = byte(0x21 + r.IntN(0x7f-0x21))
		}
	}
	return b
}

// randNumber returns a value in [lo, hi] with the bounds over-weighted.
func randNumber(r *rand.Rand, lo, hi uint64) uint64 {
	switch r.IntN(6) {
	case 0:
		return lo
	case 1:
		return hi
	case 2:
		return lo + r.Uint64N(min(hi-lo, 1000)+1)
	}
	if hi-lo == ^uint64(0) {
		return r.Uint64()
	}
	return lo + r.Uint64N(hi-lo+1)
}

// randRequest makes a valid request within lim and its frame, with LF or CRLF.
func randRequest(r *rand.Rand, lim Limits) (Request, []byte) {
	var req Request
	var frame []byte
	if r.IntN(2) == 0 {
		req = Request{Kind: Acquire, Owner: randField(r, MaxOwner), Key: randField(r, MaxKey),
			LeaseMs: randNumber(r, 1, lim.lease()), WaitMs: randNumber(r, 0, lim.wait())}
		frame = AppendAcquire(nil, req.Owner, req.Key, req.LeaseMs, req.WaitMs)
	} else {
		req = Request{Kind: Release, Key: randField(r, MaxKey), Token: randNumber(r, 1, ^uint64(0))}
		frame = AppendRelease(nil, req.Token, req.Key)
	}
	if r.IntN(2) == 0 {
		frame = append(frame[:len(frame)-1], '\r', '\n')
	}
	return req, frame
}

// serverFeed parses chunks the way the server does with a gnet buffer: append
// what arrived, parse frames until one is incomplete, keep the rest for the next
// read. It checks each frame's fields point into the buffer and copies them out.
func serverFeed(t *testing.T, chunks [][]byte, lim Limits) (got []Request, err *Error, leftover []byte) {
	t.Helper()
	var acc []byte
	for _, c := range chunks {
		acc = append(acc, c...)
		for {
			var req Request
			n, e := ParseRequest(acc, lim, &req)
			if e != nil {
				return got, e, acc
			}
			if n == 0 {
				break
			}
			if !within(req.Key, acc[:n]) || !within(req.Owner, acc[:n]) {
				t.Fatalf("frame %d: fields are not sub-slices of the buffer", len(got))
			}
			req.Owner = bytes.Clone(req.Owner)
			req.Key = bytes.Clone(req.Key)
			got = append(got, req)
			acc = acc[n:]
		}
		// Move the leftover to the front as a ring buffer would.
		acc = append(acc[:0:0], acc...)
	}
	return got, nil, acc
}

// splitRandom cuts b at random points, including 1-byte chunks and one big chunk.
func splitRandom(r *rand.Rand, b []byte) [][]byte {
	var chunks [][]byte
	for len(b) > 0 {
		var n int
		switch r.IntN(4) {
		case 0:
			n = 1
		case 1:
			n = 1 + r.IntN(16)
		case 2:
			n = 1 + r.IntN(2*MaxLine)
		default:
			n = len(b)
		}
		n = min(n, len(b))
		chunks = append(chunks, b[:n])
		b = b[n:]
	}
	return chunks
}

func TestRandomPipelines(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 42))
	limits := []Limits{{}, custom, {MaxLeaseMs: 1, MaxWaitMs: 1}, {^uint64(0), ^uint64(0)}}
	rounds := 300
	if testing.Short() {
		rounds = 30
	}
	for round := 0; round < rounds; round++ {
		lim := limits[r.IntN(len(limits))]
		frames := 1 + r.IntN(400)
		want := make([]Request, 0, frames)
		var stream []byte
		for range frames {
			req, frame := randRequest(r, lim)
			want = append(want, req)
			stream = append(stream, frame...)
		}
		// Half the pipelines end with a bad frame and then more good ones, which
		// must not be reached.
		var wantErr *Error
		if r.IntN(2) == 0 {
			bad := []struct {
				frame string
				err   *Error
			}{
				{"A o k 0 0\n", ErrLeaseRange},
				{"a o k 1 0\n", ErrCommand},
				{"R 1 k x\n", ErrFieldCount},
				{"R 1 k\x00\r\n", ErrKeyByte},
				{string(bytes.Repeat([]byte{'A'}, MaxLine)), ErrTooLong},
			}[r.IntN(5)]
			stream = append(stream, bad.frame...)
			wantErr = bad.err
			_, frame := randRequest(r, lim)
			stream = append(stream, frame...)
		}

		got, err, leftover := serverFeed(t, splitRandom(r, stream), lim)
		if err != wantErr {
			t.Fatalf("round %d: err %v, want %v", round, err, wantErr)
		}
		if wantErr == nil && len(leftover) != 0 {
			t.Fatalf("round %d: %d bytes left over", round, len(leftover))
		}
		if len(got) != len(want) {
			t.Fatalf("round %d: parsed %d frames, generated %d", round, len(got), len(want))
		}
		for i := range want {
			if !sameRequest(got[i], want[i]) {
				t.Fatalf("round %d frame %d: parsed %+v, generated %+v", round, i, got[i], want[i])
			}
		}
	}
}

// TestPipelineCompareDiffers makes sure the comparison above can fail: a
// pipeline checked against a list with one changed field must not match.
func TestPipelineCompareDiffers(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	req, frame := randRequest(r, Limits{})
	got, err, _ := serverFeed(t, [][]byte{frame}, Limits{})
	if err != nil || len(got) != 1 || !sameRequest(got[0], req) {
		t.Fatalf("setup: %v %+v", err, got)
	}
	changed := req
	changed.Key = append(bytes.Clone(req.Key), 'x')
	if sameRequest(got[0], changed) {
		t.Fatal("sameRequest ignores a changed key")
	}
	changed = req
	changed.Token++
	changed.LeaseMs++
	if sameRequest(got[0], changed) {
		t.Fatal("sameRequest ignores a changed number")
	}
}

// TestRoundTripRequests: AppendAcquire and AppendRelease write what ParseRequest
// reads back, and Validate accepts exactly those arguments.
func TestRoundTripRequests(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	for range 2000 {
		req, frame := randRequest(r, Limits{})
		var got Request
		n, err := ParseRequest(frame, Limits{}, &got)
		if err != nil || n != len(frame) || !sameRequest(got, req) {
			t.Fatalf("%q: n=%d err=%v got %+v want %+v", frame, n, err, got, req)
		}
		var verr *Error
		if req.Kind == Acquire {
			verr = ValidateAcquire(req.Owner, req.Key, req.LeaseMs, req.WaitMs, Limits{})
		} else {
			verr = ValidateRelease(req.Token, req.Key)
		}
		if verr != nil {
			t.Fatalf("Validate rejects %+v: %v", req, verr)
		}
	}
}
