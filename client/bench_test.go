package client_test

// The client's overhead: acquire+release through Client against a raw load
// generator that writes the same requests as pipelined bytes over the same
// number of connections, with the same number of operations in flight.
//
//	go test -run '^$' -bench AcquireRelease -benchtime 200000x ./client
//
// The ratio of the two ns/op is the cost of the client (matching, pooling,
// goroutine hand-offs) over what the server and the network cost anyway.
// The NoWait and Pipelined pair does the same with releases that nobody
// waits for, each sent beside the key's next acquire. The Func benchmarks
// are the same two loads through AcquireFunc and ReleaseFunc, which hand
// answers over without a goroutine switch.

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketd/ticketd/client"
	"github.com/ticketd/ticketd/codec"
)

const (
	benchConns    = 2  // connections, for both
	benchInFlight = 64 // goroutines for the client; window of operations for the raw generator
)

func BenchmarkClientAcquireRelease(b *testing.B) { benchClient(b, false) }

// BenchmarkClientAcquireReleaseNoWait releases with ReleaseNoWait: the
// caller's next acquire goes out beside its release. Its floor is
// BenchmarkClientAcquireReleaseFunc is BenchmarkClientAcquireRelease with
// AcquireFunc and ReleaseFunc: benchInFlight chains, each acquiring its key,
// releasing it and acquiring it again from the funcs, with no goroutine of
// their own.
func BenchmarkClientAcquireReleaseFunc(b *testing.B) { benchFunc(b, false) }

// BenchmarkClientAcquireReleaseFuncNoWait releases with ReleaseNoWait and
// acquires again at once, from AcquireFunc's func. Its floor is
// BenchmarkRawAcquireReleasePipelined.
func BenchmarkClientAcquireReleaseFuncNoWait(b *testing.B) { benchFunc(b, true) }

func benchFunc(b *testing.B, noWait bool) {
	srv := startServer(b, "", "")
	cl := dial(b, srv.addr, client.WithConns(benchConns))
	var (
		left atomic.Int64 // pairs not yet started
		wg   sync.WaitGroup
	)
	left.Store(int64(b.N))
	chains := make([]funcChain, benchInFlight)
	for i := range chains {
		ch := &chains[i]
		ch.b, ch.cl, ch.left, ch.wg, ch.noWait = b, cl, &left, &wg, noWait
		ch.key = "bench-func-" + strconv.Itoa(i)
		ch.onAcquire, ch.onRelease = ch.acquired, ch.released // bound once: no allocation per call
	}
	b.ReportAllocs()
	b.ResetTimer()
	wg.Add(len(chains))
	for i := range chains {
		chains[i].next()
	}
	wg.Wait()
}

// funcChain acquires and releases one key over and over from the funcs.
type funcChain struct {
	b         *testing.B
	cl        *client.Client
	key       string
	left      *atomic.Int64
	wg        *sync.WaitGroup
	noWait    bool
	onAcquire func(client.Lock, error)
	onRelease func(error)
}

func (ch *funcChain) next() {
	if ch.left.Add(-1) < 0 {
		ch.wg.Done()
		return
	}
	if err := ch.cl.AcquireFunc(ch.key, 30*time.Second, 0, ch.onAcquire); err != nil {
		ch.fail(err)
	}
}

func (ch *funcChain) acquired(l client.Lock, err error) {
	switch {
	case err != nil:
		ch.fail(err)
	case ch.noWait:
		if err := ch.cl.ReleaseNoWait(l); err != nil {
			ch.fail(err)
			return
		}
		ch.next()
	default:
		if err := ch.cl.ReleaseFunc(l, ch.onRelease); err != nil {
			ch.fail(err)
		}
	}
}

func (ch *funcChain) released(err error) {
	if err != nil {
		ch.fail(err)
		return
	}
	ch.next()
}

func (ch *funcChain) fail(err error) {
	ch.b.Error(err)
	ch.wg.Done()
}

// BenchmarkRawAcquireReleasePipelined.
func BenchmarkClientAcquireReleaseNoWait(b *testing.B) { benchClient(b, true) }

func benchClient(b *testing.B, noWait bool) {
	srv := startServer(b, "", "")
	cl := dial(b, srv.addr, client.WithConns(benchConns))
	ctx := context.Background()
	var next atomic.Int64
	b.SetParallelism((benchInFlight + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		key := "bench-" + strconv.FormatInt(next.Add(1), 10) // one key per goroutine: no contention
		for pb.Next() {
			l, err := cl.Acquire(ctx, key, 30*time.Second, 0)
			if err != nil {
				b.Error(err)
				return
			}
			if noWait {
				err = cl.ReleaseNoWait(l)
			} else {
				err = cl.Release(ctx, l)
			}
			if err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkRawAcquireRelease is the floor: per connection one goroutine keeps
// a window of keys busy, answering each A with an R and each R with the next
// A, and writes all requests of one read at once.
func BenchmarkRawAcquireRelease(b *testing.B) { benchRaw(b, false) }

// BenchmarkRawAcquireReleasePipelined answers each A with its R and the
// key's next A at once, as ReleaseNoWait lets a client do.
func BenchmarkRawAcquireReleasePipelined(b *testing.B) { benchRaw(b, true) }

func benchRaw(b *testing.B, pipelined bool) {
	srv := startServer(b, "", "")
	window := benchInFlight / benchConns
	var wg sync.WaitGroup
	errs := make(chan error, benchConns)
	conns := make([]net.Conn, benchConns)
	for i := range conns {
		nc, err := net.Dial("tcp", srv.addr)
		if err != nil {
			b.Fatal(err)
		}
		defer nc.Close()
		conns[i] = nc
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i, nc := range conns {
		ops := b.N / benchConns
		if i < b.N%benchConns {
			ops++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := rawLoad(nc, i, window, ops, pipelined); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}

func rawLoad(nc net.Conn, conn, window, ops int, pipelined bool) error {
	keys := make([][]byte, window)
	owner := []byte("raw-" + strconv.Itoa(conn))
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "raw-%d-%d", conn, i)
	}
	prefix := len(fmt.Sprintf("raw-%d-", conn))
	keyIndex := func(k []byte) int {
		n := 0
		for _, c := range k[prefix:] {
			n = n*10 + int(c-'0')
		}
		return n
	}
	var out []byte
	started, done := 0, 0
	for i := 0; i < window && started < ops; i++ {
		out = codec.AppendAcquire(out, owner, keys[i], 30000, 0)
		started++
	}
	r := bufio.NewReaderSize(nc, 64<<10)
	buf := make([]byte, 64<<10)
	pending := 0
	var a codec.Answer
	for done < ops {
		if len(out) > 0 {
			if _, err := nc.Write(out); err != nil {
				return err
			}
			out = out[:0]
		}
		n, err := r.Read(buf[pending:])
		if err != nil {
			return err
		}
		data := buf[:pending+n]
		for {
			m, err := codec.ParseAnswer(data, &a)
			if err != nil {
				return err
			}
			if m == 0 {
				break
			}
			switch a.Kind {
			case 'A':
				out = codec.AppendRelease(out, a.Token, a.Key)
				if pipelined && started < ops {
					out = codec.AppendAcquire(out, owner, keys[keyIndex(a.Key)], 30000, 0)
					started++
				}
			case 'R':
				done++
				if !pipelined && started < ops {
					out = codec.AppendAcquire(out, owner, keys[keyIndex(a.Key)], 30000, 0)
					started++
				}
			default:
				return fmt.Errorf("unexpected answer %c for %s", a.Kind, a.Key)
			}
			data = data[m:]
		}
		pending = copy(buf, data)
	}
	return nil
}
