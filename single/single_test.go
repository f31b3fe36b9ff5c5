package single

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/ticketd/ticketd/codec"
	"github.com/ticketd/ticketd/netloop"
)

// startInProcess runs a runner and a network side in this process, so that
// tests can look at its allocations.
func startInProcess(t testing.TB, dir string) (string, func()) {
	t.Helper()
	return startLoops(t, dir, 1)
}

// startLoops is startInProcess with loops event loops: with one, Handle
// applies a batch in request order under all its shards' locks; with more,
// shard by shard.
func startLoops(t testing.TB, dir string, loops int) (string, func()) {
	t.Helper()
	p, stop := startServer(t, dir, 4, loops)
	return p.addr, stop
}

// inProcess is a runner and its network side, listening on addr.
type inProcess struct {
	r    *Runner
	srv  *netloop.Server
	addr string
}

// startServer runs a runner of shards shards behind loops event loops.
func startServer(t testing.TB, dir string, shards, loops int) (*inProcess, func()) {
	t.Helper()
	r, err := Open(Options{DataDir: dir, Shards: shards, SweepInterval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := netloop.New(netloop.Config{Backend: r, MaxConns: 100, Loops: loops})
	if err != nil {
		t.Fatal(err)
	}
	r.Attach(srv)
	if r.inOrder != (loops == 1) {
		t.Fatalf("%d loops: in order %v", loops, r.inOrder)
	}
	if err := srv.Serve(ln); err != nil {
		t.Fatal(err)
	}
	return &inProcess{r, srv, ln.Addr().String()}, func() {
		srv.StopAccepting()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := r.Shutdown(ctx); err != nil {
			t.Error(err)
		}
		_ = srv.Stop(ctx)
	}
}

// pairs drives acquire+release of keys k0..k(depth-1) over one connection,
// depth frames per write, with buffers made once: what it allocates itself is
// nothing, so the process's allocations are the server's.
type pairs struct {
	c     net.Conn
	r     *bufio.Reader
	req   []byte
	toks  []uint64
	depth int
}

func newPairs(t testing.TB, addr string, depth int) *pairs {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return &pairs{c: c, r: bufio.NewReaderSize(c, 64<<10), req: make([]byte, 0, 64<<10), toks: make([]uint64, depth), depth: depth}
}

var keyNames = func() [][]byte {
	k := make([][]byte, 1024)
	for i := range k {
		k[i] = []byte("key-" + strconv.Itoa(i))
	}
	return k
}()

func (p *pairs) round(t testing.TB) {
	var a codec.Answer
	p.req = p.req[:0]
	for i := 0; i < p.depth; i++ {
		p.req = codec.AppendAcquire(p.req, []byte("owner"), keyNames[i], 30000, 0)
	}
	p.exchange(t, func(i int, line []byte) {
		if _, err := codec.ParseAnswer(line, &a); err != nil || a.Kind != 'A' {
			t.Fatalf("acquire %d: %q", i, line)
		}
		p.toks[i] = a.Token
	})
	p.req = p.req[:0]
	for i := 0; i < p.depth; i++ {
		p.req = codec.AppendRelease(p.req, p.toks[i], keyNames[i])
	}
	p.exchange(t, func(i int, line []byte) {
		if line[0] != 'R' {
			t.Fatalf("release %d: %q", i, line)
		}
	})
}

// exchange writes p.req and hands each of its depth answers to check.
func (p *pairs) exchange(t testing.TB, check func(i int, line []byte)) {
	if _, err := p.c.Write(p.req); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < p.depth; i++ {
		line, err := p.r.ReadSlice('\n')
		if err != nil {
			t.Fatal(err)
		}
		check(i, line)
	}
}

// The server's whole request path (read, parse, table, encode, write)
// allocates nothing per request once warm.
func TestServerPathDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	for _, loops := range []int{1, 2} {
		t.Run(strconv.Itoa(loops)+"loops", func(t *testing.T) { serverPathAllocs(t, loops) })
	}
}

func serverPathAllocs(t *testing.T, loops int) {
	addr, stop := startLoops(t, t.TempDir(), loops)
	defer stop()
	p := newPairs(t, addr, 64)
	defer p.c.Close()
	for i := 0; i < 200; i++ { // warm: free lists, buffers, pools
		p.round(t)
	}
	const rounds = 2000
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := 0; i < rounds; i++ {
		p.round(t)
	}
	runtime.ReadMemStats(&after)
	requests := float64(rounds * 64 * 2)
	perReq := float64(after.Mallocs-before.Mallocs) / requests
	t.Logf("%.4f allocations per request over %.0f requests", perReq, requests)
	// Background work (timers, the runtime) may allocate a little; per
	// request it must round to nothing.
	if perReq > 0.01 {
		t.Fatalf("%.4f allocations per request, want 0", perReq)
	}
}

func BenchmarkServerPairs(b *testing.B) {
	addr, stop := startInProcess(b, b.TempDir())
	defer stop()
	p := newPairs(b, addr, 64)
	defer p.c.Close()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		p.round(b)
	}
	b.ReportMetric(float64(b.N*64)/b.Elapsed().Seconds(), "pairs/s")
}

func TestCleanRestartKeepsHolders(t *testing.T) {
	dir := t.TempDir()
	addr, stop := startInProcess(t, dir)
	p := newPairs(t, addr, 1)
	p.req = codec.AppendAcquire(p.req[:0], []byte("o"), []byte("kept"), 60000, 0)
	_, _ = p.c.Write(p.req)
	line, err := p.r.ReadSlice('\n')
	if err != nil {
		t.Fatal(err)
	}
	var a codec.Answer
	if _, err := codec.ParseAnswer(line, &a); err != nil || a.Kind != 'A' {
		t.Fatalf("acquire: %q", line)
	}
	tok := a.Token
	stop()
	_ = p.c.Close()

	r, err := Open(Options{DataDir: dir, Shards: 4, SweepInterval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.Crashed || r.Restored != 1 || r.TokenFloor != tok {
		t.Fatalf("after clean restart: crashed=%v restored=%d floor=%d, want false 1 %d", r.Crashed, r.Restored, r.TokenFloor, tok)
	}
	if _, err := Open(Options{DataDir: dir, Shards: 4, SweepInterval: time.Second}); !errors.Is(err, ErrDataDirInUse) {
		t.Fatalf("a second runner on a data dir in use: %v, want ErrDataDirInUse", err)
	}
}

func TestSnapshotNeedsSameShards(t *testing.T) {
	dir := t.TempDir()
	addr, stop := startInProcess(t, dir)
	p := newPairs(t, addr, 1)
	p.req = codec.AppendAcquire(p.req[:0], []byte("o"), []byte("kept"), 60000, 0)
	_, _ = p.c.Write(p.req)
	if line, err := p.r.ReadSlice('\n'); err != nil || line[0] != 'A' {
		t.Fatalf("acquire: %q, %v", line, err)
	}
	p.c.Close()
	stop()
	if _, err := Open(Options{DataDir: dir, Shards: 8, SweepInterval: time.Second}); err == nil {
		t.Fatal("loaded a 4-shard snapshot holding a key into 8 shards")
	}
}

// One read's frames are applied shard by shard, but the answers decided at
// once still come in request order.
func TestBatchAnswersInRequestOrder(t *testing.T) {
	for _, loops := range []int{1, 2} {
		t.Run(strconv.Itoa(loops)+"loops", func(t *testing.T) {
			addr, stop := startLoops(t, t.TempDir(), loops)
			defer stop()
			p := newPairs(t, addr, 200)
			var a codec.Answer
			p.req = p.req[:0]
			for i := 0; i < p.depth; i++ {
				p.req = codec.AppendAcquire(p.req, []byte("o"+strconv.Itoa(i)), keyNames[i], 30000, 0)
			}
			p.exchange(t, func(i int, line []byte) {
				if _, err := codec.ParseAnswer(line, &a); err != nil || a.Kind != 'A' || string(a.Owner) != "o"+strconv.Itoa(i) {
					t.Fatalf("answer %d: %q", i, line)
				}
			})
		})
	}
}

// Acquires queued for their key do not count against --max-inflight: a
// connection with more of them than that is still read, so the release it
// pipelines behind them is carried out at once and hands the key on. A
// client may pipeline any number of requests; the table's limits (B) bound
// the queues.
func TestQueuedAcquiresDoNotStopReading(t *testing.T) {
	g := startRig(t, t.TempDir(), rigOpts{maxInflight: 8})
	c := g.dial()
	tok := c.acquire("h", "K", 60000)
	var lines []string
	for i := range 20 {
		lines = append(lines, fmt.Sprintf("A w%d K 60000 30000", i))
	}
	c.send(append(lines, fmt.Sprintf("R %d K", tok))...)
	c.expect(fmt.Sprintf("R %d K", tok))
	c.granted("w0", "K")
	// Past the limit, requests that are not queued still count: the
	// connection is read again as they are answered.
	c.send("A x other 60000 0")
	c.granted("x", "other")
}
