package codec

import (
	"fmt"
	"testing"
)

// benchPipeline returns up to size bytes of complete, mixed A and R frames shaped
// like real traffic (short owners and keys, a third of them CRLF) and their count.
func benchPipeline(size int) ([]byte, int) {
	buf := make([]byte, 0, size)
	var frame []byte
	for i := 0; ; i++ {
		owner := fmt.Appendf(nil, "client-%d.%d", i%64, i)
		key := fmt.Appendf(nil, "orders:eu-west:%d", i*7919%100000)
		if i%2 == 0 {
			frame = AppendAcquire(frame[:0], owner, key, 30000, uint64(i%3)*1000)
		} else {
			frame = AppendRelease(frame[:0], uint64(i)*1_000_003, key)
		}
		if i%3 == 0 {
			frame = append(frame[:len(frame)-1], '\r', '\n')
		}
		if len(buf)+len(frame) > size {
			return buf, i
		}
		buf = append(buf, frame...)
	}
}

func BenchmarkParsePipeline(b *testing.B) {
	buf, frames := benchPipeline(64 << 10)
	var req Request
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	iters := 0
	for b.Loop() {
		rest := buf
		for {
			n, err := ParseRequest(rest, Limits{}, &req)
			if err != nil {
				b.Fatal(err)
			}
			if n == 0 {
				break
			}
			rest = rest[n:]
		}
		iters++
	}
	b.ReportMetric(float64(frames)*float64(iters)/b.Elapsed().Seconds(), "frames/s")
}

func BenchmarkEncodeAnswers(b *testing.B) {
	owner, key := []byte("client-17.4242"), []byte("orders:eu-west:12345")
	dst := make([]byte, 0, 64<<10)
	const perIter = 6
	b.ReportAllocs()
	iters := 0
	for b.Loop() {
		if len(dst) > 60<<10 {
			dst = dst[:0]
		}
		dst = AppendAcquired(dst, uint64(iters)+1, owner, key)
		dst = AppendTimedOut(dst, owner, key)
		dst = AppendBusy(dst, owner, key)
		dst = AppendReleased(dst, uint64(iters)+1, key)
		dst = AppendNotReleased(dst, 18446744073709551615, key)
		dst = AppendError(dst, ErrFieldCount)
		iters++
	}
	b.ReportMetric(float64(perIter)*float64(iters)/b.Elapsed().Seconds(), "answers/s")
}
