package bench

import (
	"bufio"
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ticketd/ticketd/shard"
)

// closingServer reads want request lines from each connection, then writes
// last (if any) and closes it, as a node that loses quorum (E unavailable)
// or dies does.
func closingServer(t *testing.T, want int, last string) string {
	t.Helper()
	return serveConns(t, func(nc net.Conn) {
		defer nc.Close()
		rd := bufio.NewReader(nc)
		for range want {
			if _, err := rd.ReadString('\n'); err != nil {
				return
			}
		}
		nc.Write([]byte(last))
	})
}

// A connection ended by E unavailable, or closed, is dialled again to the
// next address; its pairs in flight are counted lost and started again.
func TestReconnect(t *testing.T) {
	const depth = 4
	unavailable := closingServer(t, depth, "E unavailable shard 3 has no quorum\n")
	dead := closingServer(t, depth, "")
	f := startFake(t)
	res, err := Run(ctxT(t), Load{System: Ticketd, Addrs: []string{unavailable, dead, f.addr()}, Conns: 3, Depth: depth,
		Warmup: 50 * time.Millisecond, Duration: 300 * time.Millisecond, Keys: Dist{Keys: 1000}, Reconnect: true})
	if err != nil {
		t.Fatal(err)
	}
	checkPairs(t, res)
	// Connection 0: unavailable, then dead, then the fake; 1: dead, then
	// the fake; 2: the fake from the start.
	if res.Reconnects != 3 || res.Unavailable != 1 || res.Lost != 3*depth {
		t.Fatalf("%d reconnects, %d unavailable, %d lost; want 3, 1, %d", res.Reconnects, res.Unavailable, res.Lost, 3*depth)
	}
	if n := f.held(); n != 0 {
		t.Fatalf("run left %d keys held", n)
	}

	// Without Reconnect the same E ends the run.
	_, err = Run(ctxT(t), Load{System: Ticketd, Addr: unavailable, Conns: 1, Depth: depth,
		Duration: time.Second, Keys: Dist{Keys: 10}})
	if err == nil || !strings.Contains(err.Error(), "E unavailable") {
		t.Fatalf("err = %v, want the server's E answer", err)
	}
}

func TestDialSpread(t *testing.T) {
	var addrs []string
	for range 3 {
		addrs = append(addrs, startEchoInProcess(t))
	}
	ncs, err := dialSpread(ctxT(t), addrs, 7, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, nc := range ncs {
		if got := nc.RemoteAddr().String(); got != addrs[i%3] {
			t.Errorf("connection %d to %s, want %s", i, got, addrs[i%3])
		}
		nc.Close()
	}
}

// A shard that gets no answers for a while shows as its gap; the others'
// longest quiet stretch before the mark is the baseline.
func TestTraceGaps(t *testing.T) {
	tr := NewTrace(2, time.Millisecond)
	ms := int64(time.Millisecond)
	tr.begin(0, time.Second)
	keyOf := map[int][]byte{}
	for i := 0; len(keyOf) < 2; i++ {
		k := []byte("k" + string(rune('a'+i%26)) + string(rune('a'+i/26)))
		if idx := shard.Index(k, 2); keyOf[idx] == nil {
			keyOf[idx] = k
		}
	}
	mark := 500 * ms
	for at := int64(0); at < 1000*ms; at += ms {
		if at == 100*ms || at == 101*ms { // a 2 ms baseline gap on shard 1
			continue
		}
		tr.add(keyOf[1], at-ms, at)
		if at >= mark && at < 800*ms { // shard 0 quiet from the mark for 300 ms
			continue
		}
		if at == 800*ms {
			tr.mark.Store(mark)
			tr.add(keyOf[0], at-300*ms, at) // a request that waited the whole gap
			continue
		}
		tr.add(keyOf[0], at-ms, at)
	}
	tr.end(0, 1000*ms)
	g := tr.Gaps()
	if g[0].Quiet != 300*time.Millisecond || g[0].QuietFrom != 0 || g[0].MaxLatency != 300*time.Millisecond || g[0].Unrecovered {
		t.Errorf("shard 0: %+v", g[0])
	}
	if g[1].Baseline != 2*time.Millisecond || g[1].Quiet != 0 {
		t.Errorf("shard 1: %+v", g[1])
	}
	at, rate := tr.Rate([]int{0}, 100*time.Millisecond)
	if len(at) != 10 || at[5] != 0 || rate[5] != 0 || rate[0] != 1000 {
		t.Errorf("rate %v at %v", rate, at)
	}
}

func sampleClusterReport() *Report {
	r := sampleReport()
	ms := func(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
	add := func(sys System, depth int, pairs float64, p99 time.Duration) {
		r.Rows = append(r.Rows, Row{Scenario: ScenarioCluster, System: sys, Depth: depth, Conns: 50,
			PairsPerSec: pairs, LinesPerSec: 2 * pairs, P50: p99 / 3, P99: p99, P999: 2 * p99})
	}
	add(TicketdCluster, 1, 20000, ms(4))
	add(Ticketd, 1, 30000, ms(1))
	add(Etcd, 1, 1000, ms(40))
	add(TicketdCluster, 64, 150000, ms(20))
	add(Ticketd, 64, 300000, ms(5))
	f := &Failover{Killed: 1, KilledShards: []int{0, 3}, Conns: 50, Depth: 16, Gap: ms(2500), Quiet: ms(2500),
		MaxLatency: ms(900), Shards: []ShardGap{{Shard: 0}}, ElectedIn: map[int]time.Duration{0: ms(300)}}
	f.Timeline.At = []float64{-0.02, 0, 0.02}
	f.Timeline.Killed = []float64{100, 0, 80}
	f.Timeline.Others = []float64{200, 150, 210}
	cs := &Failover{Clean: true, Killed: 2, KilledShards: []int{1, 4}, Conns: 50, Depth: 16, Gap: ms(40), Quiet: ms(35),
		MaxLatency: ms(40), Shards: []ShardGap{{Shard: 1}}, ElectedIn: map[int]time.Duration{1: ms(20)}}
	r.Cluster = &ClusterReport{Nodes: 3, Shards: 16, Conns: 50, EtcdVersion: "etcd 3.4.23",
		LeadersPerNode: map[int]int{1: 6, 2: 5, 3: 5}, DiskUse: map[int]int64{1: 30 << 20}, Failover: f, CleanStop: cs,
		Rejoin: &Rejoin{Node: 2, StartAfter: 4 * time.Second, Window: 16 * time.Second, Ready: ms(800), MaxLatency: ms(670), Quiet: ms(600),
			LeadingIn: map[int]time.Duration{1: ms(900), 4: ms(1200)}}}
	r.evaluate()
	return r
}

func TestClusterReport(t *testing.T) {
	r := sampleClusterReport()
	want := map[string]string{
		"cluster: ticketd (3 nodes, pipelined) >= 100x etcd's concurrency.Mutex pairs/s, same clients": "PASS", // 150x
		"cluster: ticketd p99 at depth 1 < 10.0ms":                                                     "PASS",
		"cluster: after kill -9 of a leader's node, its shards answered again within 2.00s":            "MISS",
	}
	found := 0
	for _, tg := range r.Targets {
		if v, ok := want[tg.Name]; ok {
			found++
			if v != tg.Verdict {
				t.Errorf("%s: %s (%s), want %s", tg.Name, tg.Verdict, tg.Got, v)
			}
		}
	}
	if found != len(want) || len(r.Targets) != 14+len(want) {
		t.Fatalf("targets %+v", r.Targets)
	}
	dir := t.TempDir()
	md, err := writeResults(r, dir, "quick")
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"## 4. Cluster", "| 64 | ticketd, 3-node cluster | 150,000 | 300,000 |", "150x", "| 1 | etcd, concurrency.Mutex | 1,000 |",
		"**2.50s**", "![answers per second around the kill](bench-quick.failover.png)", "node 1: 6, node 2: 5",
		"### Clean stop: SIGTERM of node 2 under load", "| **failover gap** on the stopped node's shards (the longer of the next two) | **40.0ms** |",
		"| new leader logged by a surviving node after the stop, per shard | 20.0ms to 20.0ms |",
		"### Rejoin: node 2 started again under load", "4.00s into a measured window of 16.00s node 2 was started again", "| **longest wait of a request** on any shard after the start | **670.0ms** |",
		"| shards it came to lead (handed back, or by an election) / logged after the start | 2 / 900.0ms to 1.20s |"} {
		if !strings.Contains(md, w) {
			t.Errorf("Markdown lacks %q", w)
		}
	}
	if t.Failed() {
		t.Log(md)
	}
	for _, f := range []string{"bench-quick.png", "bench-quick.failover.png"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil || !bytes.HasPrefix(b, []byte("\x89PNG")) {
			t.Errorf("%s: not a PNG (%v)", f, err)
		}
	}

	// Without cluster rows every cluster target is skipped.
	r.Rows = r.Rows[:len(r.Rows)-5]
	r.Cluster.Failover = nil
	r.evaluate()
	for _, tg := range r.Targets {
		if strings.HasPrefix(tg.Name, "cluster:") && !strings.HasPrefix(tg.Verdict, "SKIP") {
			t.Errorf("%s: %s without cluster rows", tg.Name, tg.Verdict)
		}
	}
}
