package single

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ticketd/ticketd/codec"
	"github.com/ticketd/ticketd/netloop"
	"github.com/ticketd/ticketd/shard"
)

// fakeClock is virtual time. Advance fires the timers that fall due and
// returns once each loop they woke has armed its timer again (or stopped
// it): a round of every loop is over when Advance returns.
type fakeClock struct {
	mu     sync.Mutex
	cond   *sync.Cond
	t      int64
	timers []*fakeTimer
	wall   int64 // how far the wall clock is ahead (ahead)
}

type fakeTimer struct {
	c     *fakeClock
	ch    chan time.Time
	at    int64
	armed bool
	gen   uint64 // counts Reset and Stop
}

func newFakeClock(start int64) *fakeClock {
	c := &fakeClock{t: start}
	c.cond = sync.NewCond(&c.mu)
	return c
}

func (c *fakeClock) now() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) ahead() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.wall
}

// stepWall moves the wall clock ahead by d, and not the runner's.
func (c *fakeClock) stepWall(d time.Duration) {
	c.mu.Lock()
	c.wall += int64(d)
	c.mu.Unlock()
}

func (c *fakeClock) newTimer(d time.Duration) timer {
	t := &fakeTimer{c: c, ch: make(chan time.Time, 1)}
	c.mu.Lock()
	c.timers = append(c.timers, t)
	c.mu.Unlock()
	t.Reset(d)
	return t
}

func (t *fakeTimer) C() <-chan time.Time { return t.ch }

func (t *fakeTimer) Reset(d time.Duration) {
	c := t.c
	c.mu.Lock()
	defer c.mu.Unlock()
	t.gen++
	select { // no stale tick after Reset
	case <-t.ch:
	default:
	}
	t.at, t.armed = c.t+int64(d), true
	if d <= 0 {
		t.armed = false
		t.ch <- time.Unix(0, c.t)
	}
	c.cond.Broadcast()
}

func (t *fakeTimer) Stop() {
	c := t.c
	c.mu.Lock()
	defer c.mu.Unlock()
	t.gen++
	t.armed = false
	select {
	case <-t.ch:
	default:
	}
	c.cond.Broadcast()
}

// jump moves time on by d without firing a timer: time that passes while
// the runner is busy (a slow synced write).
func (c *fakeClock) jump(d time.Duration) {
	c.mu.Lock()
	c.t += int64(d)
	c.mu.Unlock()
}

// waitTimers returns once n timers were made on c; a runner that has not
// made them within 10 s fails t rather than hanging the test.
func (c *fakeClock) waitTimers(t *testing.T, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		c.mu.Lock()
		made := len(c.timers)
		c.mu.Unlock()
		if made >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d timers made on the fake clock after 10s, want %d", made, n)
		}
	}
}

// Advance moves time on by d, in steps that stop at every timer on the way.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	end := c.t + int64(d)
	for {
		next := end
		for _, t := range c.timers {
			if t.armed && t.at < next {
				next = t.at
			}
		}
		c.t = max(c.t, next)
		type fired struct {
			t   *fakeTimer
			gen uint64
		}
		var woke []fired
		for _, t := range c.timers {
			if t.armed && t.at <= c.t {
				t.armed = false
				t.ch <- time.Unix(0, c.t)
				woke = append(woke, fired{t, t.gen})
			}
		}
		for _, f := range woke {
			for f.t.gen == f.gen {
				c.cond.Wait()
			}
		}
		if c.t >= end {
			return
		}
	}
}

// faultStore wraps the real store: it tracks what is durable, and can hold
// writes back or make them fail.
type faultStore struct {
	durable
	mu      sync.Mutex
	st      state // the last state save returned for
	snaps   int
	saveErr func(s state) error // nil: write
	snapErr func() error
}

func (f *faultStore) save(s state) error {
	f.mu.Lock()
	hook := f.saveErr
	f.mu.Unlock()
	if hook != nil {
		if err := hook(s); err != nil {
			return err
		}
	}
	if err := f.durable.save(s); err != nil {
		return err
	}
	f.mu.Lock()
	f.st = s
	f.mu.Unlock()
	return nil
}

func (f *faultStore) putSnapshot(seq uint64, created int64, b []byte) error {
	f.mu.Lock()
	hook := f.snapErr
	f.mu.Unlock()
	if hook != nil {
		if err := hook(); err != nil {
			return err
		}
	}
	f.mu.Lock()
	f.snaps++
	f.mu.Unlock()
	return f.durable.putSnapshot(seq, created, b)
}

func (f *faultStore) state() state {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.st
}

func (f *faultStore) setSaveErr(h func(s state) error) { f.mu.Lock(); f.saveErr = h; f.mu.Unlock() }
func (f *faultStore) setSnapErr(h func() error)        { f.mu.Lock(); f.snapErr = h; f.mu.Unlock() }

// testStart is the virtual time every test starts at.
const testStart = int64(1_800_000_000) * 1e9

// rig is a runner on virtual time and a fault store, served in this
// process over loopback. Every grant is checked as it leaves: its token and
// deadline must be covered by what the store has made durable.
type rig struct {
	t     *testing.T
	dir   string
	clock *fakeClock
	store *faultStore
	r     *Runner
	srv   *netloop.Server
	addr  string
	logs  *observer.ObservedLogs

	mu       sync.Mutex
	deliver  func(a *shard.Answer, b []byte) bool // optional override
	scanned  func(earliest int64)
	stopped  bool
	violated []string
}

type rigOpts struct {
	shards      int
	clock       *fakeClock
	tokenBlock  uint64
	limits      codec.Limits
	loops       int           // event loops; 0: one
	maxInflight int           // netloop's MaxInflight; 0: its default
	sweep       time.Duration // SweepInterval; 0: an hour
}

func startRig(t *testing.T, dir string, o rigOpts) *rig {
	t.Helper()
	if o.shards == 0 {
		o.shards = 4
	}
	if o.loops == 0 {
		o.loops = 1
	}
	if o.clock == nil {
		o.clock = newFakeClock(testStart)
	}
	core, logs := observer.New(zap.DebugLevel)
	g := &rig{t: t, dir: dir, clock: o.clock, logs: logs}
	e := env{
		clock:      o.clock,
		tokenBlock: o.tokenBlock,
		wrapStore: func(d durable) durable {
			g.store = &faultStore{durable: d}
			return g.store
		},
		granting: g.check,
		deliver: func(a *shard.Answer, since int64, b []byte) bool {
			g.mu.Lock()
			h := g.deliver
			g.mu.Unlock()
			if h != nil && !h(a, b) {
				return false
			}
			return postAnswer(g.srv.Conn(a.To.Conn), a, since, b)
		},
		scanned: func(earliest int64) {
			g.mu.Lock()
			h := g.scanned
			g.mu.Unlock()
			if h != nil {
				h(earliest)
			}
		},
	}
	if o.sweep == 0 {
		o.sweep = time.Hour
	}
	// No idle writes of the state (StallTimeout/2): on the fake clock they
	// fall on the steps tests advance to, where lowerLease, which skips a
	// round while a write holds the state, would lower nothing.
	r, err := open(Options{DataDir: dir, Shards: o.shards, SweepInterval: o.sweep, Logger: zap.New(core), MaxLease: time.Hour, StallTimeout: time.Hour}, e)
	if err != nil {
		t.Fatal(err)
	}
	g.r = r
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if o.limits.MaxLeaseMs == 0 {
		o.limits = codec.Limits{MaxLeaseMs: 100 * 3600_000, MaxWaitMs: 100 * 3600_000}
	}
	g.srv, err = netloop.New(netloop.Config{Backend: r, Limits: o.limits, MaxConns: 100, Loops: o.loops, MaxInflight: o.maxInflight})
	if err != nil {
		t.Fatal(err)
	}
	o.clock.mu.Lock()
	timers := len(o.clock.timers)
	o.clock.mu.Unlock()
	r.Attach(g.srv)
	// The runner's loops make their timers as they start: an Advance before
	// that would not reach them.
	o.clock.waitTimers(t, timers+3)
	if err := g.srv.Serve(ln); err != nil {
		t.Fatal(err)
	}
	g.addr = ln.Addr().String()
	t.Cleanup(func() {
		g.crash()
		g.mu.Lock()
		defer g.mu.Unlock()
		for _, v := range g.violated {
			t.Error(v)
		}
	})
	return g
}

// check is the durability rule, seen from outside.
func (g *rig) check(a *shard.Answer) {
	st := g.store.state()
	if a.Token > st.TokenCeil || a.Deadline > st.LeaseCeil {
		g.mu.Lock()
		g.violated = append(g.violated, fmt.Sprintf("grant %d of %s (deadline %d) left before it was durable: token ceiling %d, lease ceiling %d",
			a.Token, a.Key, a.Deadline, st.TokenCeil, st.LeaseCeil))
		g.mu.Unlock()
	}
}

func (g *rig) setDeliver(h func(a *shard.Answer, b []byte) bool) {
	g.mu.Lock()
	g.deliver = h
	g.mu.Unlock()
}

func (g *rig) setScanned(h func(int64)) { g.mu.Lock(); g.scanned = h; g.mu.Unlock() }

// crash stops everything without a snapshot, as a kill would.
func (g *rig) crash() {
	g.mu.Lock()
	done := g.stopped
	g.stopped = true
	g.mu.Unlock()
	if done {
		return
	}
	g.srv.StopAccepting()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = g.srv.Stop(ctx)
	_ = g.r.Close()
}

// shutdown is a clean stop in the order cmd/ticketd uses.
func (g *rig) shutdown(ctx context.Context) error {
	g.mu.Lock()
	g.stopped = true
	g.mu.Unlock()
	g.srv.StopAccepting()
	g.r.Quiesce()
	_ = g.srv.Stop(ctx)
	return g.r.Shutdown(ctx)
}

// client is one connection; reads are bounded so a missing answer fails.
type client struct {
	t *testing.T
	c net.Conn
	r *bufio.Reader
}

func (g *rig) dial() *client {
	g.t.Helper()
	c, err := net.Dial("tcp", g.addr)
	if err != nil {
		g.t.Fatal(err)
	}
	g.t.Cleanup(func() { c.Close() })
	return &client{t: g.t, c: c, r: bufio.NewReader(c)}
}

func (c *client) send(lines ...string) {
	c.t.Helper()
	if _, err := c.c.Write([]byte(strings.Join(lines, "\n") + "\n")); err != nil {
		c.t.Fatal(err)
	}
}

func (c *client) read() (string, error) {
	_ = c.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := c.r.ReadString('\n')
	return strings.TrimSuffix(line, "\n"), err
}

func (c *client) expect(want string) {
	c.t.Helper()
	line, err := c.read()
	if err != nil || line != want {
		c.t.Fatalf("got %q (%v), want %q", line, err, want)
	}
}

// acquire sends an acquire that must be granted at once; it returns the token.
func (c *client) acquire(owner, key string, leaseMs int) uint64 {
	c.t.Helper()
	c.send(fmt.Sprintf("A %s %s %d 0", owner, key, leaseMs))
	return c.granted(owner, key)
}

// granted reads an answer that must be A <token> owner key.
func (c *client) granted(owner, key string) uint64 {
	c.t.Helper()
	line, err := c.read()
	var tok uint64
	if err != nil {
		c.t.Fatalf("want A <token> %s %s: %v", owner, key, err)
	}
	if _, serr := fmt.Sscanf(line, "A %d "+owner+" "+key, &tok); serr != nil || line != fmt.Sprintf("A %d %s %s", tok, owner, key) {
		c.t.Fatalf("got %q, want A <token> %s %s", line, owner, key)
	}
	return tok
}

// expectClosed reads until the server closes the connection.
func (c *client) expectClosed() {
	c.t.Helper()
	line, err := c.read()
	if err == nil {
		c.t.Fatalf("got %q, want the connection closed", line)
	}
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		c.t.Fatal("connection still open")
	}
}

// keyOf returns a key that maps to shard i of n.
func keyOf(i, n int) string {
	for k := 0; ; k++ {
		key := fmt.Sprintf("key%d", k)
		if shard.Index([]byte(key), n) == i {
			return key
		}
	}
}
