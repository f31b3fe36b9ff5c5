//go:build !race

package codec

import (
	"math/rand/v2"
	"testing"
)

// The race detector allocates on its own, so these run only without it.

func TestParseAllocs(t *testing.T) {
	buf, frames := benchPipeline(64 << 10)
	var req Request
	allocs := testing.AllocsPerRun(50, func() {
		b, got := buf, 0
		for {
			n, err := ParseRequest(b, Limits{}, &req)
			if err != nil || n == 0 {
				break
			}
			b = b[n:]
			got++
		}
		if got != frames {
			t.Fatalf("parsed %d of %d frames", got, frames)
		}
	})
	if allocs != 0 {
		t.Fatalf("ParseRequest over a pipeline: %v allocs, want 0", allocs)
	}

	bad := [][]byte{[]byte("A o k 0 0\n"), []byte("x\n"), []byte("R 1 k k\n"), make([]byte, MaxLine)}
	allocs = testing.AllocsPerRun(50, func() {
		for _, b := range bad {
			if _, err := ParseRequest(b, Limits{}, &req); err == nil {
				t.Fatal("accepted a bad frame")
			}
		}
	})
	if allocs != 0 {
		t.Fatalf("ParseRequest errors: %v allocs, want 0", allocs)
	}
}

func TestEncodeAllocs(t *testing.T) {
	owner, key := []byte("client-17.4242"), []byte("orders:eu-west:12345")
	dst := make([]byte, 0, 4096)
	allocs := testing.AllocsPerRun(100, func() {
		dst = encodeAll(dst[:0], owner, key, 18446744073709551615)
	})
	if allocs != 0 {
		t.Fatalf("encoders: %v allocs, want 0", allocs)
	}
}

func TestParseAnswerAllocs(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	var stream []byte
	for range 200 {
		stream = encodeAnswers(stream, randField(r, MaxOwner), randField(r, MaxKey), randNumber(r, 1, ^uint64(0)))
	}
	var a Answer
	allocs := testing.AllocsPerRun(50, func() {
		b := stream
		for len(b) > 0 {
			n, err := ParseAnswer(b, &a)
			if err != nil || n == 0 {
				t.Fatalf("n=%d err=%v", n, err)
			}
			if a.Kind == 'E' {
				if _, ok := ParseCode(a.Code); !ok {
					t.Fatalf("code %q", a.Code)
				}
			}
			b = b[n:]
		}
	})
	if allocs != 0 {
		t.Fatalf("ParseAnswer: %v allocs, want 0", allocs)
	}
}

// encodeAll appends one answer of every kind and both requests.
func encodeAll(dst, owner, key []byte, token uint64) []byte {
	dst = encodeAnswers(dst, owner, key, token)
	dst = AppendAcquire(dst, owner, key, 30000, 5000)
	return AppendRelease(dst, token, key)
}

// encodeAnswers appends one answer of every kind.
func encodeAnswers(dst, owner, key []byte, token uint64) []byte {
	dst = AppendAcquired(dst, token, owner, key)
	dst = AppendTimedOut(dst, owner, key)
	dst = AppendBusy(dst, owner, key)
	dst = AppendReleased(dst, token, key)
	dst = AppendNotReleased(dst, token, key)
	return AppendError(dst, ErrWaitRange)
}
