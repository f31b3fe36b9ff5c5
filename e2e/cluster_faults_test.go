package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ticketd/ticketd/client"
	"github.com/ticketd/ticketd/shard"
)

// record is one call of the workload as the client saw it. Times are on
// this process's monotonic clock.
type record struct {
	key            string
	lease          time.Duration
	invoke, done   time.Time
	granted        bool
	token          uint64
	relInvoke      time.Time // when its release was sent; zero: never (the lease ran out)
	unknown        bool      // the connection broke after the request was sent
	noAnswer       bool      // the call's context ended without an answer or a broken connection
	released, lost bool      // release answered R; answered N (the lease had ended first)
}

// workload runs acquire/hold/release loops on a few hot keys from several
// goroutines over connections spread across the nodes, until stop.
type workload struct {
	mu   sync.Mutex
	hist []*record
	wg   sync.WaitGroup
	stop chan struct{}
}

func startWorkload(t *testing.T, addrs string, workers int) *workload {
	t.Helper()
	cl, err := client.Dial(context.Background(), addrs, client.WithConns(6), client.WithBackoff(20*time.Millisecond, 200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	w := &workload{stop: make(chan struct{})}
	for i := range workers {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			for {
				select {
				case <-w.stop:
					return
				default:
				}
				w.one(cl, rng)
			}
		}()
	}
	t.Cleanup(func() { w.finish(); cl.Close() })
	return w
}

func (w *workload) one(cl *client.Client, rng *rand.Rand) {
	r := &record{key: fmt.Sprintf("hot%d", rng.IntN(6)), lease: time.Duration(200+rng.IntN(600)) * time.Millisecond}
	wait := time.Duration(rng.IntN(4)) * 100 * time.Millisecond
	// Longer than --unavailable-timeout: every call ends by an answer or a
	// broken connection, never by this context.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	r.invoke = time.Now()
	l, err := cl.Acquire(ctx, r.key, r.lease, wait)
	r.done = time.Now()
	w.add(r)
	switch {
	case err == nil:
		r.granted, r.token = true, l.Token
	case errors.Is(err, client.ErrOutcomeUnknown):
		r.unknown = true
		return
	case errors.Is(err, context.DeadlineExceeded):
		r.noAnswer = true
		return
	default:
		if !errors.Is(err, client.ErrHeld) && !errors.Is(err, client.ErrBusy) && !errors.Is(err, client.ErrConnBroken) {
			r.noAnswer = true // anything else is unexpected: counted as a failure
		}
		time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
		return
	}
	time.Sleep(time.Duration(rng.IntN(30)) * time.Millisecond)
	if rng.IntN(5) == 0 {
		return // let the lease run out
	}
	w.mu.Lock()
	r.relInvoke = time.Now()
	w.mu.Unlock()
	err = cl.Release(ctx, l)
	w.mu.Lock()
	r.released, r.lost = err == nil, errors.Is(err, client.ErrNotHeld)
	w.mu.Unlock()
}

func (w *workload) add(r *record) {
	w.mu.Lock()
	w.hist = append(w.hist, r)
	w.mu.Unlock()
}

func (w *workload) finish() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	w.wg.Wait()
}

// check stops the workload and fails t for every violation in its history.
// It returns how many grants it saw.
func (w *workload) check(t *testing.T) int {
	t.Helper()
	w.finish()
	w.mu.Lock()
	defer w.mu.Unlock()
	bad, grants := violations(w.hist)
	for _, v := range bad {
		t.Error(v)
	}
	if grants == 0 {
		t.Error("no grants: the workload did not run")
	}
	return grants
}

// violations checks a history: per key, no grant while an earlier one could
// not yet have ended (its release not yet sent, its lease not yet run from
// the acquire's invoke), tokens unique and in real-time order, and every
// call answered or failed by a broken connection.
func violations(hist []*record) (bad []string, grants int) {
	byKey := map[string][]*record{}
	unanswered := 0
	for _, r := range hist {
		if r.noAnswer {
			unanswered++
		}
		if r.granted {
			byKey[r.key] = append(byKey[r.key], r)
		}
	}
	if unanswered > 0 {
		bad = append(bad, fmt.Sprintf("%d calls ended with neither an answer nor a broken connection", unanswered))
	}
	for key, gs := range byKey {
		grants += len(gs)
		slices.SortFunc(gs, func(a, b *record) int { return int64cmp(a.token, b.token) })
		for i := 1; i < len(gs); i++ {
			if gs[i].token == gs[i-1].token {
				bad = append(bad, fmt.Sprintf("%s: token %d granted twice", key, gs[i].token))
			}
		}
		for i, a := range gs {
			held := a.invoke.Add(a.lease)
			if !a.relInvoke.IsZero() && a.relInvoke.Before(held) {
				held = a.relInvoke
			}
			for _, b := range gs[i+1:] {
				// b's token is larger, so the server granted it after a,
				// and no later than b.done.
				if b.done.Before(held) {
					bad = append(bad, fmt.Sprintf("%s: token %d granted (answered at +%v) while token %d could not have ended before +%v",
						key, b.token, b.done.Sub(a.invoke), a.token, held.Sub(a.invoke)))
				}
				if b.done.Before(a.invoke) {
					bad = append(bad, fmt.Sprintf("%s: token %d answered before token %d was asked for, yet is larger", key, b.token, a.token))
				}
			}
		}
	}
	return bad, grants
}

func TestViolationsFindsPlantedFaults(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	grant := func(tok uint64, inv, done, rel int) *record {
		r := &record{key: "k", lease: time.Second, invoke: at(inv), done: at(done), granted: true, token: tok}
		if rel >= 0 {
			r.relInvoke = at(rel)
		}
		return r
	}
	for _, tc := range []struct {
		name string
		hist []*record
		bad  bool
	}{
		{"release then grant", []*record{grant(1, 0, 5, 100), grant(2, 50, 120, -1)}, false},
		{"lease end then grant", []*record{grant(1, 0, 5, -1), grant(2, 50, 1010, -1)}, false},
		{"double grant", []*record{grant(1, 0, 5, 500), grant(2, 50, 120, -1)}, true},
		{"grant before the lease could end", []*record{grant(1, 0, 5, -1), grant(2, 50, 900, -1)}, true},
		{"token reused", []*record{grant(1, 0, 5, 10), grant(1, 50, 60, -1)}, true},
		{"token goes back", []*record{grant(2, 0, 5, 10), grant(1, 50, 60, -1)}, true},
		{"unanswered", []*record{grant(1, 0, 5, 10), {key: "k", noAnswer: true}}, true},
	} {
		bad, _ := violations(tc.hist)
		if (len(bad) > 0) != tc.bad {
			t.Errorf("%s: violations %q", tc.name, bad)
		}
	}
}

func int64cmp(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// leaderOf0 returns the node index leading shard 0, as the given node sees it.
func (c *cluster) busiestLeader() int { return c.leader() }

func TestClusterKillLeaderUnderLoad(t *testing.T) {
	c := startCluster(t)
	w := startWorkload(t, c.addrs(), 12)
	time.Sleep(time.Second)
	victim := c.busiestLeader()
	c.nodes[victim].kill()
	time.Sleep(1500 * time.Millisecond)
	c.start(victim) // same data dir and ports
	c.waitReady()
	time.Sleep(time.Second)
	n := w.check(t)
	t.Logf("%d grants", n)
	c.agree()
}

// After a node's restart, the Go client's connections that had moved off
// it go back, under load (the client spreads them over the nodes again),
// and the workload's history stays clean.
func TestClusterClientGoesHomeAfterRestart(t *testing.T) {
	c := startCluster(t)
	w := startWorkload(t, c.addrs(), 12) // 6 connections: 2 of them node 1's
	time.Sleep(time.Second)
	c.nodes[0].stop()
	time.Sleep(time.Second)
	c.start(0)
	c.waitReady()
	// They try every 5-10 s once node 1 is back.
	deadline := time.Now().Add(40 * time.Second)
	for {
		v, err := c.nodes[0].metric("ticketd_connections")
		if err == nil && v >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node 1 has %v client connections 40s after its restart (%v), want its 2 back", v, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("%d grants", w.check(t))
	c.agree()
}

func TestClusterPauseLeader(t *testing.T) {
	c := startCluster(t)
	w := startWorkload(t, c.addrs(), 12)
	time.Sleep(time.Second)
	victim := c.busiestLeader()
	c.pause(victim)
	time.Sleep(1500 * time.Millisecond) // several election timeouts (200ms)
	c.signal(victim, syscall.SIGCONT)
	time.Sleep(1500 * time.Millisecond)
	w.check(t)
	c.agree()
}

// lagHandOver starts a cluster in which w, on a follower of the shard of
// "hot0", waits with a lease of leaseMs behind h's grant tok; it pauses
// that node (lag; the caller resumes it) and has h release, so the
// hand-over to w commits on the other two. x is a connection to the third
// node.
func lagHandOver(t *testing.T, leaseMs int) (c *cluster, lag int, w, x *conn, tok uint64) {
	c = startCluster(t)
	lead := c.leader() // of shard 0, which key "hot0" is on with 4 shards
	lag = (lead + 1) % 3
	h := c.dial(lead)
	w, x = c.dial(lag), c.dial((lead+2)%3)
	tok = h.acquire("h", "hot0", 10000, 0)
	w.send(acq("w", "hot0", leaseMs, 30000))
	w.sync("hot0") // queued, and applied on the lagging node
	c.pause(lag)
	h.release(tok, "hot0")
	return c, lag, w, x, tok
}

// A node that applies a hand-over late (here: paused while the release
// commits on the other two) must not answer it at once: its holder counts
// the lease from the answer, and the leader would end it from the release's
// time. It renews the grant through the log and answers once the renewal is
// back, so nobody else gets the key within the lease after that answer.
//
// The lease is 3 s so that the renewal, proposed once the node is resumed,
// commits before the lease ends on a loaded machine too (with 1 s it once
// came back too late and the grant lapsed). Without the renewal x still
// gets the key sooner than a lease after w's answer, whatever the lease:
// the leader ends it the skew (500ms) after its deadline, and w's answer
// comes more than the pause (700ms) after the hand-over.
func TestClusterLaggingNodeRenewsALateGrant(t *testing.T) {
	const lease = 3 * time.Second
	c, lag, w, x, tok := lagHandOver(t, int(lease/time.Millisecond))
	time.Sleep(700 * time.Millisecond) // past half the skew (500ms), within the 800ms a node waits without a leader
	c.signal(lag, syscall.SIGCONT)

	if got := w.expectAcquired("w", "hot0"); got != tok+1 {
		t.Fatalf("w got token %d, want the hand-over's %d", got, tok+1)
	}
	answered := time.Now()
	x.send(acq("x", "hot0", 10000, 30000))
	if got := x.expectAcquired("x", "hot0"); got != tok+2 {
		t.Fatalf("x got token %d, want %d", got, tok+2)
	}
	if d := time.Since(answered); d < lease {
		t.Fatalf("x got the key %v after w heard of its grant, within w's lease of %v", d, lease)
	}
	if v, err := c.nodes[lag].metric("ticketd_late_grants_renewed_total"); err != nil || v != 1 {
		t.Fatalf("late grants renewed on the lagging node: %v (%v), want 1", v, err)
	}
	c.agree()
}

// A grant its node applies later than its lease and the skew (the node
// paused) is not renewed: the waiter's connection is told the outcome is
// unknown, and the key is not held for it.
func TestClusterLaggingNodeLapsedGrant(t *testing.T) {
	c, lag, w, x, tok := lagHandOver(t, 200)
	x.send(acq("x", "hot0", 10000, 30000))
	if got := x.expectAcquired("x", "hot0"); got != tok+2 { // after w's 200ms and the skew
		t.Fatalf("x got token %d, want %d", got, tok+2)
	}
	c.signal(lag, syscall.SIGCONT)
	w.expectError("unavailable this node fell behind its shard;") // codec.ErrBehind
	c.agree()
}

func TestClusterLaggingNodeCatchesUp(t *testing.T) {
	c := startCluster(t, "--raft-snapshot-entries", "50")
	c.nodes[2].stop()
	w := startWorkload(t, c.addrs(), 8)
	time.Sleep(2 * time.Second)
	c.start(2)
	c.waitReady()
	time.Sleep(500 * time.Millisecond)
	w.check(t)
	c.agree()
	if v, err := c.nodes[2].metric("ticketd_raft_snapshots_received_total"); err != nil || v == 0 {
		t.Fatalf("the restarted node caught up without a snapshot (%v, %v): the test did not test that", v, err)
	}
}

func TestClusterWholeCrashKeepsHolders(t *testing.T) {
	c := startCluster(t)
	h := c.dial(0)
	var held []string
	for i := range 12 {
		h.send(fmt.Sprintf("A keeper k%d 600000 0", i))
	}
	toks := map[string]uint64{}
	for range 12 {
		var tok uint64
		var key string
		if _, err := fmt.Sscanf(h.next(), "A %d keeper %s", &tok, &key); err != nil {
			t.Fatal(err)
		}
		toks[key] = tok
		held = append(held, key)
	}
	w := startWorkload(t, c.addrs(), 8)
	time.Sleep(time.Second)
	for i := range c.nodes {
		c.nodes[i].kill()
	}
	w.finish()
	for i := range c.nodes {
		c.start(i)
	}
	c.waitReady()
	x := c.dial(1)
	for _, key := range held {
		x.send(fmt.Sprintf("A x %s 1000 0", key))
		x.expect(fmt.Sprintf("T x %s", key))
		x.send(fmt.Sprintf("R %d %s", toks[key], key))
		x.expect(fmt.Sprintf("R %d %s", toks[key], key))
		x.send(fmt.Sprintf("A x %s 1000 0", key))
		if tok := x.expectAcquired("x", key); tok <= toks[key] {
			t.Fatalf("%s: token %d after the restart, not above %d", key, tok, toks[key])
		}
	}
	w.check(t)
	c.agree()
}

// A release that its node cannot commit (here: node 1 without quorum, which
// answers E unavailable) is sent again by the Go client on its other
// connection, so that the lock does not stay held to the end of its 30 s
// lease: the release returns nil once the cluster is whole again, and the
// key is free at once.
func TestClusterReleaseSentAgainAfterUnavailable(t *testing.T) {
	c := startCluster(t, "--unavailable-timeout", "1s")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := client.Dial(ctx, c.addrs(), client.WithConns(2)) // node 1 and node 2
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	key := "door0"
	for i := 1; shard.Index(key, 2) != 0; i++ { // a key of the connection to node 1
		key = fmt.Sprintf("door%d", i)
	}
	l, err := cl.Acquire(ctx, key, 30*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // a stopped node would not stop on SIGTERM
		for i := 1; i < 3; i++ {
			syscall.Kill(c.nodes[i].pid(), syscall.SIGCONT)
		}
	})
	c.pause(1)
	c.pause(2)
	released := make(chan error, 1)
	go func() { released <- cl.Release(ctx, l) }()
	// Node 1 gives up within a second or two (leaderless, or the timeout);
	// the copy then waits on node 2's connection until node 2 runs again.
	deadline := time.Now().Add(10 * time.Second)
	for {
		v, err := c.nodes[0].metric("ticketd_unavailable_total")
		if err == nil && v > 0 {
			break
		}
		if time.Now().After(deadline) {
			// What node 1 saw, to tell a release that never reached it
			// from one it held without giving up.
			conns, _ := c.nodes[0].metric("ticketd_connections")
			props, _ := c.nodes[0].metric("ticketd_raft_proposals_total")
			given, _ := c.nodes[0].metric("ticketd_batches_given_up_total")
			t.Fatalf("node 1 without quorum answered no E unavailable within 10s (%v, %v; its connections %v, proposals %v, batches given up %v)",
				v, err, conns, props, given)
		}
		time.Sleep(50 * time.Millisecond)
	}
	select {
	case err := <-released:
		t.Fatalf("Release returned %v while nodes 2 and 3 were stopped", err)
	case <-time.After(300 * time.Millisecond):
	}
	c.signal(1, syscall.SIGCONT)
	c.signal(2, syscall.SIGCONT)
	if err := <-released; err != nil {
		t.Fatalf("Release across node 1's E unavailable: %v, want nil (sent again on node 2)", err)
	}
	h := c.dial(2)
	h.send(acq("next", key, 1000, 0))
	if tok := h.expectAcquired("next", key); tok <= l.Token {
		t.Fatalf("token %d after %d", tok, l.Token)
	}
}
