package replica

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lni/vfs"
)

// stall is a disk that stalls at will: MaybeError, as Dragonboat's error
// injection calls it before each file operation (the only file systems it
// takes besides the operating system's), holds every Sync while a stall
// lasts and injects no error.
type stall struct {
	mu    sync.Mutex
	until chan struct{} // closed when the stall ends; nil: no stall
	slow  time.Duration // every Sync takes this much longer
}

func (s *stall) setSlow(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.slow = d
}

func (s *stall) start() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.until == nil {
		s.until = make(chan struct{})
	}
}

func (s *stall) end() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.until != nil {
		close(s.until)
		s.until = nil
	}
}

func (s *stall) MaybeError(op vfs.Op) error {
	if op != vfs.OpSync {
		return nil
	}
	s.mu.Lock()
	ch, d := s.until, s.slow
	s.mu.Unlock()
	if ch != nil {
		<-ch
	}
	time.Sleep(d)
	return nil
}

// stallingCluster is a ready cluster of one shard whose node 1 has a disk
// that stalls at will, with the unavailable timeout given.
func stallingCluster(t *testing.T, unavailable time.Duration) (*testCluster, *stall) {
	t.Helper()
	c := newStoppedCluster(t, 1, func(o *Options) { o.UnavailableTimeout = unavailable })
	disk := &stall{}
	t.Cleanup(disk.end) // runs before the cluster's stop, registered earlier
	opt := c.options(1, c.dirs[0])
	opt.fs = vfs.Wrap(vfs.Default, disk)
	c.startWith(0, opt)
	c.start(1)
	c.start(2)
	c.waitReady()
	return c, disk
}

// A node whose disk stalls answers the requests it cannot settle with
// E unavailable after the unavailable timeout, and is not ready until its
// raft step moves again: Dragonboat's own timeout counts ticks, which stop
// while the step waits on the disk, and a review saw clients held for the
// whole of a 30 s stall, with /readyz 200 throughout. With node 1 leading,
// nothing commits during the stall; with another node leading, the acquire
// given up commits there (its outcome was unknown), and the key it took is
// free again once node 1 has caught up and found nobody to answer.
func TestClusterStalledDiskAnswersUnavailable(t *testing.T) {
	const unavailable = 2 * time.Second
	for _, leader := range []uint64{1, 2} {
		t.Run(fmt.Sprintf("node %d leads", leader), func(t *testing.T) {
			c, disk := stallingCluster(t, unavailable)
			g := c.nodes[0].grps[0]
			for deadline := time.Now().Add(10 * time.Second); g.leader.Load() != leader; time.Sleep(50 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("node %d did not take the shard's leadership", leader)
				}
				_ = c.nodes[0].nh.RequestLeaderTransfer(g.id, leader)
			}
			a := c.dial(0)
			a.send("A a k 60000 0")
			a.expect("A 1 a k")

			disk.start()
			stalled := time.Now()
			b := c.dial(0)
			b.send("A b j 60000 0")
			_ = b.c.SetReadDeadline(time.Now().Add(4 * unavailable))
			got, err := b.r.ReadString('\n')
			if err != nil || !strings.HasPrefix(got, "E unavailable") {
				t.Fatalf("%v into a stall of node 1's disk: %q (%v), want E unavailable", time.Since(stalled), got, err)
			}
			if c.nodes[0].Ready() {
				t.Fatal("ready with its disk stalled and a proposal given up")
			}
			// The others go on: the key held through node 1 is still held.
			x := c.dial(1)
			x.send("A x k 60000 0")
			x.expect("T x k")

			disk.end()
			for deadline := time.Now().Add(20 * time.Second); !c.nodes[0].Ready(); time.Sleep(20 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("not ready again after its disk came back")
				}
			}
			y := c.dial(0)
			y.send("A y j 60000 8000")
			y.expectGrant("y", "j")
			// One answer a request: a grant that came late went to nobody.
			_ = b.c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
			if more, err := b.r.ReadString('\n'); err == nil {
				t.Fatalf("a second answer to the request answered E unavailable: %q", more)
			}
		})
	}
}

// A node whose disk stalls while its shards are quiet is not ready once a
// write to its data dir has taken the unavailable timeout, without a
// client's request having to wait it out first (before, it stayed ready
// until one did), and is ready again once a write takes less; the others
// stay ready throughout. A disk that slow on every write keeps it not
// ready, without flapping.
func TestClusterIdleStalledDiskIsNotReady(t *testing.T) {
	const unavailable = time.Second
	c, disk := stallingCluster(t, unavailable)
	a := c.dial(0)
	a.send("A a k 60000 0")
	a.expect("A 1 a k")
	a.send("R 1 k")
	a.expect("R 1 k")

	disk.start()
	stalled := time.Now()
	for deadline := stalled.Add(10 * unavailable); c.nodes[0].Ready(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("still ready %v into a stall of its disk, with no request", time.Since(stalled))
		}
	}
	if d := time.Since(stalled); d < unavailable {
		t.Fatalf("not ready %v into the stall, before the unavailable timeout (%v)", d, unavailable)
	}
	if why := c.nodes[0].NotReady(); !strings.Contains(why, "write to the data dir") {
		t.Errorf("not ready for its stalled disk, and says %q", why)
	}
	for i := 1; i < 3; i++ {
		if !c.nodes[i].Ready() {
			t.Fatalf("node %d not ready, with only node 1's disk stalled", i+1)
		}
	}
	disk.setSlow(2 * unavailable)
	disk.end()
	for end := time.Now().Add(3 * unavailable); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if c.nodes[0].Ready() {
			t.Fatal("ready between writes that each take longer than the unavailable timeout")
		}
	}
	disk.setSlow(0)
	for deadline := time.Now().Add(20 * time.Second); !c.nodes[0].Ready(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("not ready again after its disk came back")
		}
	}
}

// A probe that failed keeps being made while the node is busy, so that the
// node is ready again once one succeeds: skipped while its own proposals
// commit, it left the node not ready for as long as traffic lasted (a
// review: 6 s of steady traffic after the fault had gone).
func TestClusterProbeThatFailedIsMadeAgainWhileBusy(t *testing.T) {
	const unavailable = time.Second
	c := newTestClusterWith(t, 1, func(o *Options) { o.UnavailableTimeout = unavailable })
	p := filepath.Join(c.dirs[0], probeName)
	_ = os.Remove(p)
	if err := os.Mkdir(p, 0o755); err != nil { // the probe's create fails
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * unavailable); c.nodes[0].Ready(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("still ready with every write to its data dir failing")
		}
	}
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	a := c.dial(0)
	fixed := time.Now()
	for i := 0; !c.nodes[0].Ready(); i++ {
		if time.Since(fixed) > 4*unavailable {
			t.Fatalf("not ready %v into steady traffic after the fault went away", time.Since(fixed))
		}
		a.send(fmt.Sprintf("A a k%d 500 0", i))
		a.expectGrant("a", fmt.Sprintf("k%d", i))
		time.Sleep(20 * time.Millisecond)
	}
}

// A request whose attempt comes late (here it waited out a hold of its shard
// for most of the unavailable timeout) and then meets a stalled disk is
// answered within the timeout and twice Dragonboat's own after that
// attempt: each attempt had a whole timeout of its own, about twice the
// bound the README gives (a review: 3.9 s for a timeout of 2 s).
func TestClusterStalledDiskAfterALateAttemptAnswersInTime(t *testing.T) {
	const unavailable = 2 * time.Second
	c, disk := stallingCluster(t, unavailable)
	g := c.nodes[0].grps[0]
	// Node 1 leads, so that the attempt must sync its own log.
	for deadline := time.Now().Add(10 * time.Second); g.leader.Load() != 1; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("node 1 did not take the shard's leadership")
		}
		_ = c.nodes[0].nh.RequestLeaderTransfer(g.id, 1)
	}
	h := &holdOn{from: 1, done: make(chan struct{})} // as a hand-over to node 1 would
	g.hold.Store(h)
	b := c.dial(0)
	sent := time.Now()
	b.send("A b j 60000 0")
	time.Sleep(unavailable - 100*time.Millisecond) // held: no attempt yet
	disk.start()
	g.endHold(h)
	_ = b.c.SetReadDeadline(time.Now().Add(4 * unavailable))
	got, err := b.r.ReadString('\n')
	took := time.Since(sent)
	if err != nil || !strings.HasPrefix(got, "E unavailable") {
		t.Fatalf("%v after the request: %q (%v), want E unavailable", took, got, err)
	}
	if most := unavailable + 2*c.nodes[0].opt.ProposeTimeout + 500*time.Millisecond; took > most {
		t.Fatalf("E unavailable %v after the request, more than %v", took, most)
	}
}
