package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ticketd/ticketd/internal/serverproc"
)

// cluster is three ticketd processes in cluster mode on loopback. Each node
// keeps its ports and data dir across restarts, as a real one would.
type cluster struct {
	t      *testing.T
	nodes  []*server
	dirs   []string
	listen []string
	peers  string
	flags  []string
}

func freeAddr(t testing.TB) string {
	t.Helper()
	addr, err := serverproc.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// startCluster starts three nodes with --shards 4 (and flags) and waits until
// every node knows a leader for every shard.
func startCluster(t *testing.T, flags ...string) *cluster {
	t.Helper()
	c := newCluster(t, flags...)
	for i := range 3 {
		c.start(i)
	}
	c.waitReady()
	return c
}

// newCluster picks three nodes' addresses and data dirs, and starts none.
func newCluster(t *testing.T, flags ...string) *cluster {
	t.Helper()
	c := &cluster{t: t, nodes: make([]*server, 3), flags: flags}
	var peers []string
	for i := range 3 {
		peers = append(peers, fmt.Sprintf("%d=%s", i+1, freeAddr(t)))
		c.listen = append(c.listen, freeAddr(t))
		c.dirs = append(c.dirs, t.TempDir())
	}
	c.peers = strings.Join(peers, ",")
	return c
}

func (c *cluster) start(i int) {
	c.t.Helper()
	c.nodes[i] = startServerDir(c.t, c.dirs[i], c.args(i)...)
}

// args are node i's flags after its data dir.
func (c *cluster) args(i int) []string {
	return append([]string{
		"--node-id", fmt.Sprint(i + 1), "--peers", c.peers, "--listen", c.listen[i], "--bootstrap",
		"--shards", "4", "--admin", "127.0.0.1:0", "--election-rtt", "20",
	}, c.flags...)
}

// asServer is the cluster as one server whose connections go to its nodes
// in turn, for the tests that run in both modes.
func (c *cluster) asServer() *server {
	return &server{t: c.t, p: c.nodes[0].p, addr: c.nodes[0].addr, ring: c.listen}
}

// bothModes runs f against single mode and against a 3-node cluster: the
// same protocol, with each test's connections spread over the nodes.
func bothModes(t *testing.T, f func(t *testing.T, s *server)) {
	t.Run("single", func(t *testing.T) { t.Parallel(); f(t, startServer(t)) })
	t.Run("cluster", func(t *testing.T) { t.Parallel(); f(t, startCluster(t).asServer()) })
}

// addrs lists the nodes' client addresses, for the Go client.
func (c *cluster) addrs() string { return strings.Join(c.listen, ",") }

func (c *cluster) dial(i int) *conn { return c.nodes[i].dial(c.t) }

func (c *cluster) waitReady() {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for _, s := range c.nodes {
		if s == nil || s.exited() {
			continue
		}
		for !c.ready(s) {
			if time.Now().After(deadline) {
				c.t.Fatalf("node (pid %d) not ready within 30s", s.pid())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

func (c *cluster) ready(s *server) bool {
	resp, err := http.Get("http://" + s.adminAddr() + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

type shardStatus struct {
	Shard   int    `json:"shard"`
	Leader  uint64 `json:"leader"`
	Term    uint64 `json:"term"`
	Applied uint64 `json:"applied"`
	Digest  string `json:"digest"`
}

func (c *cluster) status(s *server, digest bool) ([]shardStatus, error) {
	url := "http://" + s.adminAddr() + "/debug/cluster"
	if digest {
		url += "?digest=1"
	}
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var st []shardStatus
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// leader is the index of the node that leads shard 0.
func (c *cluster) leader() int {
	c.t.Helper()
	for _, s := range c.nodes {
		if s == nil || s.exited() {
			continue
		}
		if st, err := c.status(s, false); err == nil && st[0].Leader != 0 {
			return int(st[0].Leader) - 1
		}
	}
	c.t.Fatal("no node knows a leader of shard 0")
	return -1
}

// agree waits until the running nodes have applied the same index of every
// shard, and checks that their replicas' states are then identical.
func (c *cluster) agree() {
	c.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var all [][]shardStatus
		for _, s := range c.nodes {
			if s == nil || s.exited() {
				continue
			}
			st, err := c.status(s, true)
			if err != nil {
				c.t.Fatal(err)
			}
			all = append(all, st)
		}
		same := true
		for sh := range all[0] {
			for _, o := range all[1:] {
				if o[sh].Applied != all[0][sh].Applied {
					same = false
				} else if o[sh].Digest != all[0][sh].Digest {
					c.t.Fatalf("shard %d at index %d: replicas differ (%s, %s)", sh, o[sh].Applied, all[0][sh].Digest, o[sh].Digest)
				}
			}
		}
		if same {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("replicas did not reach the same index in 20s: %+v", all)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (c *cluster) signal(i int, sig syscall.Signal) {
	c.t.Helper()
	if err := syscall.Kill(c.nodes[i].pid(), sig); err != nil {
		c.t.Fatal(err)
	}
}

// pause stops node i and returns once every thread of it has stopped
// (serverproc.Proc.Pause).
func (c *cluster) pause(i int) {
	c.t.Helper()
	if err := c.nodes[i].p.Pause(10 * time.Second); err != nil {
		c.t.Fatalf("node %d: %v", i+1, err)
	}
}

// The protocol's tables, with each test's connections on different nodes.
func TestClusterProtocol(t *testing.T) {
	c := startCluster(t, "--max-waiters-per-key", "1")

	t.Run("example session", func(t *testing.T) {
		a, b, r := c.dial(0).on(t), c.dial(1).on(t), c.dial(2).on(t)
		a.send("A worker-7 invoices 30000 0")
		a.expect("A 1 worker-7 invoices")
		b.send("A worker-9 invoices 30000 0")
		b.expect("T worker-9 invoices")
		b.send("A worker-9 invoices 30000 5000")
		r.send("R 1 invoices")
		r.expect("R 1 invoices")
		b.expect("A 2 worker-9 invoices")
		r.send("R 1 invoices")
		r.expect("N 1 invoices")
	})
	t.Run("queue full is B, and FIFO hand-over across nodes", func(t *testing.T) {
		h, w1, w2 := c.dial(0).on(t), c.dial(1).on(t), c.dial(2).on(t)
		h.send("A h fifo 30000 0")
		h.expect("A 1 h fifo")
		w1.send("A w1 fifo 30000 10000")
		time.Sleep(300 * time.Millisecond) // w1's acquire commits first
		w2.send("A w2 fifo 30000 10000")
		w2.expect("B w2 fifo")
		h.send("R 1 fifo")
		h.expect("R 1 fifo")
		w1.expect("A 2 w1 fifo")
	})
	t.Run("wait timeout is committed", func(t *testing.T) {
		h, w := c.dial(1).on(t), c.dial(2).on(t)
		h.send("A h wt 30000 0")
		h.expect("A 1 h wt")
		start := time.Now()
		w.send("A w wt 30000 300")
		w.expect("T w wt")
		if d := time.Since(start); d < 300*time.Millisecond {
			t.Fatalf("T after %v, before the wait passed", d)
		}
	})
	t.Run("an expired lease is held until its Expire commits", func(t *testing.T) {
		h, x := c.dial(2).on(t), c.dial(0).on(t)
		h.send("A h ex 100 0")
		h.expect("A 1 h ex")
		time.Sleep(200 * time.Millisecond) // past the lease, within --max-clock-skew
		x.send("A x ex 30000 0")
		x.expect("T x ex")
		h.send("R 1 ex")
		h.expect("R 1 ex")
		// Left alone, a lease ends by a committed Expire, skew included.
		h.send("A h2 ex 100 0")
		h.expect("A 2 h2 ex")
		start := time.Now()
		x.send("A x ex 30000 5000")
		x.expect("A 3 x ex")
		if d := time.Since(start); d < 500*time.Millisecond {
			t.Fatalf("hand-over %v after the grant, before lease + skew", d)
		}
	})
	t.Run("a closed connection's waiter is withdrawn", func(t *testing.T) {
		h, w, x := c.dial(0).on(t), c.dial(1).on(t), c.dial(2).on(t)
		h.send("A h wd 30000 0")
		tok := h.expectAcquired("h", "wd")
		w.send("A w wd 30000 20000")
		time.Sleep(300 * time.Millisecond)
		w.close()
		time.Sleep(300 * time.Millisecond)
		h.send(fmt.Sprintf("R %d wd", tok))
		h.expect(fmt.Sprintf("R %d wd", tok))
		x.send("A x wd 30000 0")
		// The next token of the shard: the withdrawn waiter was never granted.
		x.expect(fmt.Sprintf("A %d x wd", tok+1))
	})
	t.Run("a client that ends its stream gets the answers that commit after", func(t *testing.T) {
		// `nc -N`: requests, then the end of the client's stream, then
		// reading to the end of the server's. The answers are known only
		// once the requests commit, after the end has arrived.
		const n = 300
		h, x := c.dial(1).on(t), c.dial(2).on(t)
		var lines []string
		for i := range n {
			lines = append(lines, acq("h", fmt.Sprintf("eof%d", i), 30000, 0))
		}
		lines = append(lines, "a bad frame")
		h.send(lines...)
		if err := h.c.(*net.TCPConn).CloseWrite(); err != nil {
			t.Fatal(err)
		}
		_ = h.c.SetReadDeadline(time.Now().Add(10 * time.Second))
		all, err := io.ReadAll(h.r)
		if err != nil {
			t.Fatalf("reading to the end: %v after %q", err, clip(all))
		}
		got := strings.Split(strings.TrimSuffix(string(all), "\n"), "\n")
		if len(got) != n+1 || !strings.HasPrefix(got[n], "E command") {
			t.Fatalf("%d lines, want %d answers and the bad frame's E line: %q", len(got), n, clip(all))
		}
		// Shards answer in the order they commit; each key once.
		keys := map[string]bool{}
		for _, l := range got[:n] {
			f := strings.Fields(l)
			if len(f) != 4 || f[0] != "A" || f[2] != "h" || keys[f[3]] {
				t.Fatalf("answer %q: want a grant to h of a key not answered before", l)
			}
			keys[f[3]] = true
		}
		// Delivered, so held: not given back as a grant nobody read.
		x.send(acq("x", "eof0", 30000, 0), acq("x", fmt.Sprintf("eof%d", n-1), 30000, 0))
		x.expect(timedOut("x", "eof0"), timedOut("x", fmt.Sprintf("eof%d", n-1)))
	})
	t.Run("bad input", func(t *testing.T) {
		// The answer to the request before the bad line comes before the
		// E line, as in single mode, though it is known only once it
		// commits; nothing after the bad line is carried out, and the key
		// is free once the grant's lease has passed.
		b, x := c.dial(1).on(t), c.dial(0).on(t)
		b.send("A o bad 1000 0", "a o bad 1000 0", "A o2 bad2 1000 0")
		b.expectAcquired("o", "bad")
		b.expectError("command")
		deadline := time.Now().Add(5 * time.Second)
		for {
			x.send("A x bad 30000 0")
			if l := x.next(); strings.HasPrefix(l, "A ") {
				break
			} else if time.Now().After(deadline) {
				t.Fatalf("bad stayed held: %q", l)
			}
			time.Sleep(50 * time.Millisecond)
		}
		x.send("A x bad2 30000 0")
		x.expectAcquired("x", "bad2")
	})
	c.agree()
}

// The lease promise under clock skew: with the proposer's clock 240ms behind
// and the shard leader's 240ms ahead (480ms apart, inside the default
// --max-clock-skew of 500ms), no lease ends before lease_ms has passed since
// the request was sent.
func TestClusterLeaseUnderClockSkew(t *testing.T) {
	dir := t.TempDir()
	var files []string
	for i := range 3 {
		f := fmt.Sprintf("%s/clock%d", dir, i)
		if err := os.WriteFile(f, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	c := newCluster(t)
	for i := range 3 {
		c.flags = []string{"--unsafe-test-clock-offset-file", files[i]}
		c.start(i)
	}
	c.waitReady()
	lead := c.leader() // of shard 0, which key "hot0" is on with 4 shards
	prop := (lead + 1) % 3
	set := func(i int, off string) {
		if err := os.WriteFile(files[i], []byte(off), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	set(lead, "240ms")
	set(prop, "-240ms")
	time.Sleep(200 * time.Millisecond) // the nodes re-read the files every 50ms
	h, w := c.dial(prop), c.dial((lead+2)%3)
	for round := range 3 {
		start := time.Now()
		h.send("A h hot0 600 0")
		h.expectAcquired("h", "hot0")
		w.send("A w hot0 600 5000")
		tok := w.expectAcquired("w", "hot0")
		if d := time.Since(start); d < 600*time.Millisecond {
			t.Fatalf("round %d: the lease ended %v after its request was sent, before its 600ms", round, d)
		}
		w.send(fmt.Sprintf("R %d hot0", tok))
		w.expect(fmt.Sprintf("R %d hot0", tok))
	}
}
