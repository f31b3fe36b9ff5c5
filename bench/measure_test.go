package bench

// What a run counts and what it refuses to leave out: answers that mean
// the server lost a lock, requests never answered, waits across the
// window's edges, and stalls at its end.

import (
	"bytes"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketd/ticketd/codec"
)

// policy decides a scripted server's answer to one request, and how long
// after its arrival to send it (hold < 0: never).
type policy func(req *codec.Request, sinceAccept time.Duration, tok uint64) (answer []byte, hold time.Duration)

// startScripted is a server that speaks ticketd's protocol with no lock
// table behind it: pol decides every answer.
func startScripted(t *testing.T, pol policy) string {
	t.Helper()
	var tok atomic.Uint64
	return serveConns(t, func(nc net.Conn) {
		defer nc.Close()
		t0 := time.Now()
		var wmu sync.Mutex
		write := func(b []byte) { wmu.Lock(); nc.Write(b); wmu.Unlock() }
		var buf, out []byte
		rd := make([]byte, 4096)
		for {
			n, err := nc.Read(rd)
			buf = append(buf, rd[:n]...)
			out = out[:0]
			for {
				var req codec.Request
				m, perr := codec.ParseRequest(buf, codec.Limits{}, &req)
				if perr != nil || m == 0 {
					break
				}
				a, hold := pol(&req, time.Since(t0), tok.Add(1))
				buf = buf[m:]
				switch {
				case hold == 0:
					out = append(out, a...)
				case hold > 0:
					a = bytes.Clone(a)
					time.AfterFunc(hold, func() { write(a) })
				}
			}
			if len(out) > 0 {
				write(out)
			}
			if err != nil {
				return
			}
		}
	})
}

// grantAll grants every acquire and releases every release.
func grantAll(req *codec.Request, tok uint64) []byte {
	if req.Kind == codec.Acquire {
		return codec.AppendAcquired(nil, tok, req.Owner, req.Key)
	}
	return codec.AppendReleased(nil, req.Token, req.Key)
}

// The bench's leases outlast its runs: N to its own release means the
// server lost a lock it granted, which must not pass as a refused pair.
func TestNotHeldEndsTheRun(t *testing.T) {
	addr := startScripted(t, func(req *codec.Request, _ time.Duration, tok uint64) ([]byte, time.Duration) {
		if req.Kind == codec.Release {
			return codec.AppendNotReleased(nil, req.Token, req.Key), 0
		}
		return grantAll(req, tok), 0
	})
	_, err := Run(ctxT(t), Load{System: Ticketd, Addr: addr, Conns: 4, Depth: 1,
		Warmup: 50 * time.Millisecond, Duration: 200 * time.Millisecond, Keys: Dist{Keys: 4}})
	if err == nil || !strings.Contains(err.Error(), "not held") {
		t.Fatalf("err = %v, want the release answered not held", err)
	}
}

// A request of the window still unanswered when the drain ends fails the
// run: left out, it would take the worst of the tail with it.
func TestUnansweredRequestFailsTheRun(t *testing.T) {
	var once atomic.Bool
	addr := startScripted(t, func(req *codec.Request, since time.Duration, tok uint64) ([]byte, time.Duration) {
		if req.Kind == codec.Acquire && since > 150*time.Millisecond && once.CompareAndSwap(false, true) {
			return nil, -1
		}
		return grantAll(req, tok), 0
	})
	_, err := Run(ctxT(t), Load{System: Ticketd, Addr: addr, Conns: 2, Depth: 1, WaitMs: 60_000,
		Warmup: 50 * time.Millisecond, Duration: 300 * time.Millisecond, Drain: 200 * time.Millisecond,
		Keys: Dist{Keys: 4}})
	if err == nil || !strings.Contains(err.Error(), "1 requests of the window unanswered") {
		t.Fatalf("err = %v, want one request unanswered", err)
	}
}

// A wait that began in the warm-up and ended in the window is not in the
// window's percentiles, but it is the longest wait.
func TestLongestWaitCountsAWaitFromTheWarmUp(t *testing.T) {
	const held = 400 * time.Millisecond
	addr := startScripted(t, func(req *codec.Request, _ time.Duration, tok uint64) ([]byte, time.Duration) {
		if req.Kind == codec.Acquire && string(req.Owner) == "c0.0.1" { // the first acquire, in the warm-up
			return grantAll(req, tok), held
		}
		return grantAll(req, tok), 0
	})
	res, err := Run(ctxT(t), Load{System: Ticketd, Addr: addr, Conns: 2, Depth: 1, WaitMs: 60_000,
		Warmup: 100 * time.Millisecond, Duration: 500 * time.Millisecond, Keys: Dist{Keys: 4}})
	if err != nil {
		t.Fatal(err)
	}
	row := rowOf(ScenarioContended, res)
	if row.AcqMax < held-50*time.Millisecond {
		t.Fatalf("longest wait %s, want about %s", row.AcqMax, held)
	}
	if p := Q(res.Acquire, 99.9); p >= held/2 {
		t.Fatalf("acquire p99.9 %s: the warm-up's wait went into the window's percentiles", p)
	}
}

// Open loop: a stall over the end of the window is charged like one in its
// middle. Its answers come in the drain, and the acquires due while it
// lasted still go out, stamped when they were due.
func TestOpenLoopChargesAStallAtTheWindowsEnd(t *testing.T) {
	const from, to = 460 * time.Millisecond, 800 * time.Millisecond // the window ends about 610ms in
	addr := stallingEcho(t, from, to)
	res, err := Run(ctxT(t), Load{System: Echo, Addr: addr, Conns: 1, Rate: 1000,
		Warmup: 100 * time.Millisecond, Duration: 500 * time.Millisecond, Keys: Dist{Keys: 10}})
	if err != nil {
		t.Fatal(err)
	}
	// About 500 acquires were due in the window, the last 150 or so during
	// the stall.
	if n := res.Acquire.TotalCount(); n < 480 {
		t.Fatalf("%d acquires recorded, about 500 were due", n)
	}
	if p := Q(res.Acquire, 99); p < 100*time.Millisecond {
		t.Fatalf("acquire p99 %s: the stall at the end was not charged", p)
	}
}

// Targets that a report without the figures they need must not pass.
func TestTargetsWithoutTheirEvidenceMiss(t *testing.T) {
	verdicts := func(r *Report) map[string]Target {
		m := map[string]Target{}
		for _, tg := range r.Targets {
			m[tg.Name] = tg
		}
		return m
	}
	// A failover run in which no shard is known to have been led by the
	// killed node: a gap of 0 over no shards is no recovery.
	f := &Failover{Killed: 1}
	for sh := range 16 {
		f.Shards = append(f.Shards, ShardGap{Shard: sh, Quiet: 5 * time.Second, Unrecovered: true})
	}
	r := &Report{plan: FullPlan(), Cluster: &ClusterReport{Failover: f}}
	r.evaluateCluster(func(string, string) {})
	for name, tg := range verdicts(r) {
		if strings.Contains(name, "kill -9") && tg.Verdict != "MISS" {
			t.Errorf("%s: %s, %s", name, tg.Verdict, tg.Got)
		}
	}
	// Cluster runs that reconnected (E unavailable, closed connections)
	// left requests out of their figures.
	r = &Report{plan: FullPlan(), Cluster: &ClusterReport{}}
	for _, x := range []struct {
		sys   System
		depth int
		pairs float64
	}{{TicketdCluster, 1, 5000}, {TicketdCluster, 64, 900_000}, {Etcd, 1, 3000}} {
		r.Rows = append(r.Rows, Row{Scenario: ScenarioCluster, System: x.sys, Depth: x.depth, PairsPerSec: x.pairs,
			P99: time.Millisecond})
	}
	r.Rows[0].Reconnects, r.Rows[0].Unavailable, r.Rows[0].Lost = 2, 2, 2
	r.Rows[1].Reconnects, r.Rows[1].Lost = 1, 64
	r.evaluateCluster(func(string, string) {})
	got := verdicts(r)
	for name, tg := range got {
		if strings.Contains(name, "etcd") || strings.Contains(name, "p99 at depth 1") {
			if tg.Verdict != "MISS" || !strings.Contains(tg.Got, "requests lost") {
				t.Errorf("%s: %s, %s; want MISS for the lost requests", name, tg.Verdict, tg.Got)
			}
		}
	}
	if len(got) < 2 {
		t.Fatalf("targets %v", got)
	}
}

// The machine's busy time counts user, nice, system, irq and softirq, not
// steal, nor guest and guest_nice, which user and nice hold already.
func TestBusyTicks(t *testing.T) {
	//            user nice system idle iowait irq softirq steal guest guest_nice
	line := "cpu  100 10 50 9000 40 3 7 500 60 6"
	if got, want := busyTicks(line), int64(100+10+50+3+7); got != want {
		t.Errorf("busyTicks(%q) = %d, want %d", line, got, want)
	}
	if got := busyTicks("cpu0 1 2 3 4 5 6"); got != 0 {
		t.Errorf("a line of one core counted: %d", got)
	}
}
