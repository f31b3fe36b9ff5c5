package chaos

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// Nemeses by name. Each runs one fault to its end (the process restarted,
// the network healed, the clocks reset) and records its window.
const (
	NemCrash       = "crash"            // kill -9 a node (cluster: a random one), restart it
	NemCrashLeader = "crash-leader"     // cluster: kill -9 the leader of a random shard
	NemCrashAll    = "crash-all"        // cluster: kill -9 every node, restart them
	NemPause       = "pause"            // SIGSTOP a node past the election timeout, then SIGCONT
	NemPauseLeader = "pause-leader"     // cluster: the same to the leader of a random shard
	NemRestart     = "restart"          // SIGTERM (clean shutdown) and restart
	NemPartition   = "partition"        // cluster: one node cut off from the other two
	NemPartLeader  = "partition-leader" // cluster: a shard leader cut off from the others
	NemBridge      = "bridge"           // cluster: two nodes cut apart, the third sees both
	NemClock       = "clock"            // cluster: node clocks offset within --max-clock-skew, then a jump
	// NemSlowFsync holds up every fsync of the server (strace): a
	// hand-over decided before a synced write is answered late, which the
	// server must cover by renewing its lease (single mode: renewLate).
	NemSlowFsync = "slow-fsync"
	// NemCrashFastClock: single mode, kill -9, a restart on a wall clock
	// ahead (a host back from a power cut, time not yet synced), and a
	// second kill -9 0-300 ms after it listens, often before the run's
	// first ceiling round, 250 ms after its start (a review found a double
	// grant there).
	NemCrashFastClock = "crash-fast-clock"
	// NemClockUnsafe breaks the lease promise's precondition on purpose (a
	// node 2s ahead, four times --max-clock-skew): only on request, to show
	// that the campaign sees the double grants that follow.
	NemClockUnsafe = "clock-unsafe"
)

// NemesesFor lists the nemeses that apply to a mode. Single mode has no
// peers to cut apart, and no test clock (its leases run on the monotonic
// clock within a run). A slow fsync (single mode) needs strace.
func NemesesFor(mode string, partitions bool) []string {
	if mode == "single" {
		return []string{NemCrash, NemPause, NemRestart, NemSlowFsync, NemCrashFastClock}
	}
	n := []string{NemCrashLeader, NemCrash, NemPauseLeader, NemPause, NemRestart, NemClock, NemCrashAll}
	if partitions {
		n = append(n, NemPartition, NemPartLeader, NemBridge)
	}
	return n
}

type nemesis struct {
	tg  *target
	h   *History
	rng *rand.Rand
	// current describes the fault under way, for the progress line.
	current func(string)
	errs    []string
	skipped []string // faults that could not be made here, and why
	// ahead: how far ahead single mode's wall clock reads from its next
	// start on (NemCrashFastClock). Only ever forward: a clock set back
	// across a clean restart lengthens every restored lease by as much, as
	// documented, which no campaign model allows.
	ahead time.Duration
}

func (n *nemesis) dur(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(n.rng.Int64N(int64(hi-lo)+1))
}

func (n *nemesis) randomNode() int { return n.tg.ids()[n.rng.IntN(len(n.tg.nodes))] }

// leader is the leader of a random shard, or a random node if none is known.
func (n *nemesis) leader() (int, string) {
	ls := n.tg.leaders()
	if len(ls) == 0 {
		id := n.randomNode()
		return id, "no leader known; random node"
	}
	shards := make([]int, 0, len(ls))
	for s := range ls {
		shards = append(shards, s)
	}
	slices.Sort(shards)
	s := shards[n.rng.IntN(len(shards))]
	return ls[s], fmt.Sprintf("leader of shard %d", s)
}

func (n *nemesis) fail(format string, args ...any) {
	n.errs = append(n.errs, fmt.Sprintf(format, args...))
}

// run performs one nemesis and returns its event.
func (n *nemesis) run(name string) *Event {
	ev := &Event{Start: n.h.Now()}
	defer func() {
		ev.End = n.h.Now()
		n.h.Event(ev)
		n.current("")
		if err := n.tg.waitReady(30 * time.Second); err != nil {
			n.fail("after %s: %v", name, err)
		}
	}()
	say := func(format string, args ...any) {
		ev.Detail = fmt.Sprintf(format, args...)
		n.current(name + ": " + ev.Detail)
	}
	switch name {
	case NemCrash, NemCrashLeader:
		id, why := n.randomNode(), "random node"
		if name == NemCrashLeader {
			id, why = n.leader()
		}
		down := n.dur(300*time.Millisecond, 2*time.Second)
		ev.Kind, ev.Nodes = EvCrash, []int{id}
		say("kill -9 node %d (%s), restart after %v", id, why, down.Round(time.Millisecond))
		n.tg.kill(id)
		ev.Killed = n.h.Now() // kill waits for the process to exit
		time.Sleep(down)
		if err := n.tg.start(n.tg.node(id)); err != nil {
			n.fail("restart node %d: %v", id, err)
		}
	case NemCrashAll:
		ev.Kind, ev.Nodes = EvCrashAll, n.tg.ids()
		say("kill -9 every node, restart after 1s")
		for _, id := range n.tg.ids() {
			n.tg.kill(id)
		}
		ev.Killed = n.h.Now()
		time.Sleep(time.Second)
		for _, nd := range n.tg.nodes {
			if err := n.tg.launch(nd); err != nil {
				n.fail("restart node %d: %v", nd.id, err)
			}
		}
		for _, nd := range n.tg.nodes {
			if err := n.tg.waitListening(nd, 60*time.Second); err != nil {
				n.fail("restart node %d: %v", nd.id, err)
			}
		}
	case NemCrashFastClock:
		id := n.randomNode()
		step, again := n.dur(time.Minute, time.Hour), n.dur(0, 300*time.Millisecond)
		n.ahead += step
		ev.Kind, ev.Nodes = EvCrash, []int{id}
		say("kill -9 node %d, restart on a wall clock %v ahead, kill -9 again %v after it listens, restart",
			id, n.ahead.Round(time.Second), again.Round(time.Millisecond))
		if err := n.tg.setClock(id, n.ahead); err != nil {
			n.fail("clock: %v", err)
		}
		// Leases must run at the first kill, or a grace cut short has
		// nothing to break: past an earlier crash's grace, and a moment
		// for the workers to take some.
		if n.tg.granting(10 * time.Second) {
			time.Sleep(500 * time.Millisecond)
		}
		ev.Start = n.h.Now()
		// Two crashes, each its own event, the first recorded here.
		for i := range 2 {
			if i == 1 {
				first := *ev
				first.End = n.h.Now()
				n.h.Event(&first)
				time.Sleep(again)
				ev.Start = n.h.Now()
			}
			n.tg.kill(id)
			ev.Killed = n.h.Now()
			time.Sleep(300 * time.Millisecond)
			if err := n.tg.start(n.tg.node(id)); err != nil {
				n.fail("restart node %d: %v", id, err)
			}
		}
	case NemPause, NemPauseLeader:
		id, why := n.randomNode(), "random node"
		if name == NemPauseLeader {
			id, why = n.leader()
		}
		d := n.dur(time.Second, 4*time.Second)
		ev.Kind, ev.Nodes = EvPause, []int{id}
		say("SIGSTOP node %d (%s) for %v", id, why, d.Round(time.Millisecond))
		if err := n.tg.pause(id); err != nil {
			n.fail("SIGSTOP node %d: %v", id, err)
		}
		time.Sleep(d)
		if err := n.tg.resume(id); err != nil {
			n.fail("SIGCONT node %d: %v", id, err)
		}
	case NemRestart:
		id := n.randomNode()
		ev.Kind, ev.Nodes = EvRestart, []int{id}
		say("SIGTERM node %d, restart", id)
		if err := n.tg.term(id); err != nil {
			n.fail("clean shutdown of node %d: %v", id, err)
		}
		if err := n.tg.start(n.tg.node(id)); err != nil {
			n.fail("restart node %d: %v", id, err)
		}
	case NemPartition, NemPartLeader, NemBridge:
		ev.Kind = EvPartition
		d := n.dur(2*time.Second, 7*time.Second)
		ids := n.tg.ids()
		var a, b []int
		var what string
		switch name {
		case NemBridge:
			perm := n.rng.Perm(3)
			a, b = []int{ids[perm[0]]}, []int{ids[perm[1]]}
			what = fmt.Sprintf("bridge: %d and %d cut apart, %d sees both", a[0], b[0], ids[perm[2]])
		default:
			id, why := n.randomNode(), "random node"
			if name == NemPartLeader {
				id, why = n.leader()
			}
			a = []int{id}
			for _, o := range ids {
				if o != id {
					b = append(b, o)
				}
			}
			what = fmt.Sprintf("node %d (%s) cut off from %v", id, why, b)
		}
		ev.Nodes = append(slices.Clone(a), b...)
		say("%s for %v", what, d.Round(time.Millisecond))
		if err := n.tg.net.cut(a, b); err != nil {
			n.fail("partition: %v", err)
		}
		time.Sleep(d)
		if err := n.tg.net.heal(); err != nil {
			n.fail("heal: %v", err)
		}
	case NemSlowFsync:
		// Not a pause: the server runs, but each synced write takes
		// delay, and everything it decided before one waits for it.
		id := n.randomNode()
		d, delay := n.dur(3*time.Second, 6*time.Second), n.dur(500*time.Millisecond, 2*time.Second)
		ev.Kind, ev.Nodes = EvSlowFsync, []int{id}
		say("every fsync of node %d takes %v more, for %v", id, delay.Round(time.Millisecond), d.Round(time.Millisecond))
		stop, err := n.tg.slowFsync(id, delay)
		if err != nil {
			say("not made: %v", err)
			if !contains(n.skipped, err.Error()) {
				n.skipped = append(n.skipped, err.Error())
			}
			break
		}
		time.Sleep(d)
		stop()
	case NemClockUnsafe:
		id, why := n.leader()
		ev.Kind, ev.Nodes = EvClock, []int{id}
		d := n.dur(6*time.Second, 10*time.Second)
		say("node %d (%s) 2s ahead for %v: beyond --max-clock-skew, outside the promise", id, why, d.Round(time.Millisecond))
		if err := n.tg.setClock(id, 2*time.Second); err != nil {
			n.fail("clock: %v", err)
		}
		time.Sleep(d)
		n.tg.setClock(id, 0)
		time.Sleep(100 * time.Millisecond)
	case NemClock:
		// Offsets within ±240ms keep every pair of nodes less than
		// --max-clock-skew (500ms) apart, where the lease promise holds.
		ev.Kind, ev.Nodes = EvClock, n.tg.ids()
		offs := map[int]time.Duration{}
		var parts []string
		for _, id := range n.tg.ids() {
			offs[id] = time.Duration(n.rng.IntN(481)-240) * time.Millisecond
			parts = append(parts, fmt.Sprintf("n%d %+v", id, offs[id]))
		}
		jumper := n.randomNode()
		to := 240 * time.Millisecond
		if offs[jumper] > 0 {
			to = -to
		}
		say("offsets %s, then node %d jumps to %+v", strings.Join(parts, ", "), jumper, to)
		for id, o := range offs {
			if err := n.tg.setClock(id, o); err != nil {
				n.fail("clock: %v", err)
			}
		}
		time.Sleep(n.dur(3*time.Second, 6*time.Second))
		n.tg.setClock(jumper, to)
		time.Sleep(n.dur(2*time.Second, 4*time.Second))
		for _, id := range n.tg.ids() {
			n.tg.setClock(id, 0)
		}
		time.Sleep(100 * time.Millisecond) // the nodes re-read the file every 50ms
	}
	return ev
}

// heal undoes whatever a fault left: a paused node resumed, a dead one
// restarted, links up, clocks reset.
func (n *nemesis) heal() {
	for _, nd := range n.tg.nodes {
		if nd.paused {
			n.tg.resume(nd.id)
		}
		if nd.clock != "" && n.tg.mode != "single" { // single mode reads it at a start only
			n.tg.setClock(nd.id, 0)
		}
	}
	if n.tg.net != nil {
		n.tg.net.heal()
	}
	for _, nd := range n.tg.nodes {
		if nd.proc.Exited() {
			if err := n.tg.start(nd); err != nil {
				n.fail("restart node %d at the end: %v", nd.id, err)
			}
		}
	}
}
