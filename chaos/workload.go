package chaos

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ticketd/ticketd/internal/redial"
)

// Worker roles. Each worker owns one connection at a time and has at most
// one request in flight, so every owner is distinct per outstanding request.
const (
	RoleMutex    = "mutex"     // few keys, many clients, short leases, waits; fenced writes
	RoleManyKeys = "many-keys" // a large key space, uncontended acquire+release
	RoleWaiter   = "waiter"    // long holds and short waits: timeouts
	RoleExpirer  = "expirer"   // holders that never release: leases expire
)

// registers are the guarded resources: one per key, refusing a token lower
// than the highest it accepted, the way a resource should use the token.
type registers struct {
	mu  sync.Mutex
	max map[string]uint64
	h   *History
}

// write offers g's token to the key's register while its holder counts
// its lease as running (deadline on the campaign clock); the write is one
// instant under the register's lock.
func (r *registers) write(worker int, g *Op, deadline int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.h.Now()
	if now >= deadline {
		return
	}
	res := ResAccepted
	if g.Token < r.max[g.Key] {
		res = ResRefused
	} else {
		r.max[g.Key] = g.Token
	}
	op := &Op{Worker: worker, Kind: 'W', Key: g.Key, Token: g.Token, Grant: g.ID, Workload: g.Workload}
	r.h.mu.Lock()
	r.h.nextID++
	op.ID, op.Invoke, op.Complete, op.Result = r.h.nextID, now, now, res
	r.h.Ops = append(r.h.Ops, op)
	r.h.mu.Unlock()
}

type worker struct {
	id    int
	role  string
	rng   *rand.Rand
	h     *History
	tg    *target
	reg   *registers
	stop  *atomic.Bool
	c     *conn
	seq   int
	conns *atomic.Int64

	// Redialling, as the Go client does (redial.Order): order holds the
	// indexes into tg.nodes to try, at is the one tried or up now, since
	// when it has been up.
	order    []int
	at       int
	failedAt []time.Time
	upSince  time.Time
	pace     redial.Home
}

// dial gets a connection, trying the nodes in order, round and round,
// until one answers or the campaign stops.
func (w *worker) dial() bool {
	if w.order == nil {
		n := len(w.tg.nodes)
		w.failedAt = make([]time.Time, n)
		w.order = redial.Order(w.id%n, -1, w.failedAt, time.Now(), redial.RecentFailure)
	}
	for !w.stop.Load() {
		if w.c != nil && !w.c.isBroken() {
			w.goHome()
			return true
		}
		n := w.tg.nodes[w.order[w.at%len(w.order)]]
		c, err := dialConn(w.h, int(w.conns.Add(1)), n.id, n.listen)
		if err == nil {
			w.c, w.upSince = c, time.Now()
			return true
		}
		w.at++
		time.Sleep(time.Duration(50+w.rng.IntN(100)) * time.Millisecond)
	}
	return false
}

// after drops a broken connection. The next dial tries the worker's own
// node first, unless it or another broke a connection lately (down, cut
// off, or without a leader for some shard), as the Go client does: the
// workers stay spread over the nodes instead of gathering on one after a
// few restarts, where a fault of any other node would meet no client, and
// they leave the two sides of a bridge for the node that sees both.
func (w *worker) after() {
	if w.c != nil && w.c.isBroken() {
		w.c = nil
		n := len(w.tg.nodes)
		failed := w.order[w.at%len(w.order)]
		now := time.Now()
		w.failedAt[failed] = now
		w.pace.Broke(now, failed == w.id%n)
		w.order, w.at = redial.Order(w.id%n, failed, w.failedAt, now, redial.RecentFailure), 0
	}
}

// goHome moves a worker that has been off its own node for a while
// (redial.Home) back there if it answers, as the Go client does; between
// requests, with nothing in flight to lose.
func (w *worker) goHome() {
	n := len(w.tg.nodes)
	home := w.id % n
	if w.order[w.at%len(w.order)] == home || time.Since(w.upSince) < w.pace.After() {
		return
	}
	w.upSince = time.Now() // if home does not answer, try again later
	nd := w.tg.nodes[home]
	c, err := dialConn(w.h, int(w.conns.Add(1)), nd.id, nd.listen)
	if err != nil {
		return
	}
	w.c.close()
	w.c = c
	now := time.Now()
	w.pace.Arrived(now)
	w.order, w.at = redial.Order(home, -1, w.failedAt, now, redial.RecentFailure), 0
}

func (w *worker) timeout(waitMs uint64) time.Duration {
	return time.Duration(waitMs)*time.Millisecond + 12*time.Second
}

func (w *worker) acquire(key string, leaseMs, waitMs uint64) *Op {
	if !w.dial() {
		return nil
	}
	w.seq++
	op := &Op{Worker: w.id, Kind: 'A', Workload: w.role, Owner: fmt.Sprintf("w%d.%d", w.id, w.seq), Key: key, LeaseMs: leaseMs, WaitMs: waitMs}
	w.c.do(op, w.timeout(waitMs))
	w.after()
	return op
}

// release releases g's token and returns the last copy sent: as the Go
// client does, a release whose connection broke unanswered goes again on the
// next connection while g's lease runs (counted from the acquire's invoke,
// so conservatively), and the checker then judges the copy's R or N against
// a first copy that may have taken effect.
func (w *worker) release(g *Op) *Op {
	if !w.dial() {
		return nil
	}
	op := &Op{Worker: w.id, Kind: 'R', Workload: w.role, Key: g.Key, Token: g.Token}
	w.c.do(op, w.timeout(0))
	w.after()
	for op.Result == ResUnknown && w.dial() && w.h.Now() < leaseDeadline(g) {
		op = &Op{Worker: w.id, Kind: 'R', Workload: w.role, Key: g.Key, Token: g.Token, Again: true}
		w.c.do(op, w.timeout(0))
		w.after()
	}
	return op
}

func (w *worker) sleep(lo, hi int) {
	time.Sleep(time.Duration(lo+w.rng.IntN(hi-lo+1)) * time.Millisecond)
}

func leaseDeadline(g *Op) int64 { return g.Invoke + int64(g.LeaseMs)*int64(time.Millisecond) }

// holdUntil is when a holder that dates its lease as the Go client does
// stops using it: the later of send + lease and, for a grant that may
// have waited, the client's rule (Op.Start). The server promises both.
func holdUntil(g *Op) int64 { return max(leaseDeadline(g), g.clientDeadline()) }

func (w *worker) run() {
	defer func() {
		if w.c != nil {
			w.c.close()
		}
	}()
	for !w.stop.Load() {
		switch w.role {
		case RoleMutex:
			key := fmt.Sprintf("mutex-%d", w.rng.IntN(3))
			wait := uint64(0)
			if w.rng.IntN(3) > 0 {
				wait = uint64(100 + w.rng.IntN(1400))
			}
			g := w.acquire(key, uint64(300+w.rng.IntN(700)), wait)
			if g == nil || g.Result != ResGranted {
				w.sleep(0, 30)
				continue
			}
			w.reg.write(w.id, g, holdUntil(g))
			w.sleep(0, 80)
			w.reg.write(w.id, g, holdUntil(g))
			switch p := w.rng.IntN(20); {
			case p < 2: // let it expire
			case p < 3: // release twice: the second must be N
				if r := w.release(g); r != nil && r.Result == ResReleased {
					w.release(g)
				}
			default:
				w.release(g)
			}
		case RoleManyKeys:
			g := w.acquire(fmt.Sprintf("k-%d", w.rng.IntN(100000)), 2000, 0)
			if g != nil && g.Result == ResGranted {
				w.release(g)
			}
			w.sleep(1, 5) // keeps the history to a size the checker can hold
		case RoleWaiter:
			key := fmt.Sprintf("wait-%d", w.rng.IntN(2))
			g := w.acquire(key, uint64(800+w.rng.IntN(1200)), uint64(50+w.rng.IntN(400)))
			if g != nil && g.Result == ResGranted {
				w.reg.write(w.id, g, holdUntil(g))
				w.sleep(100, 500)
				w.reg.write(w.id, g, holdUntil(g))
				w.release(g)
			}
		case RoleExpirer:
			key := fmt.Sprintf("exp-%d", w.rng.IntN(3))
			g := w.acquire(key, uint64(100+w.rng.IntN(300)), uint64(w.rng.IntN(800)))
			if g != nil && g.Result == ResGranted {
				w.reg.write(w.id, g, holdUntil(g))
				if w.rng.IntN(4) == 0 { // a release after the lease ended: R or N are both fine
					w.sleep(int(g.LeaseMs)+50, int(g.LeaseMs)+400)
					w.release(g)
				}
			} else {
				w.sleep(0, 50)
			}
		}
	}
}
