package shard

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// The model is the table written the plain way: a map of keys, each with a slice for its
// queue, and every timer found by scanning. It shares no code with the table; the random
// test below feeds both the same commands and compares every answer.

type mWaiter struct {
	from  Requester
	owner string
	lease uint64
	wait  int64
	id    uint64
}

type mKey struct {
	token    uint64 // 0: grace phantom
	deadline int64
	q        []mWaiter
}

type model struct {
	repl                      bool
	keyLimit, perKey, waiters int // 0: unlimited
	keys                      map[string]*mKey
	last, nextID              uint64
	grace, maxDeadline        int64
	st                        Stats
}

func newModel(cfg Config) *model {
	m := &model{repl: cfg.Replicated, keyLimit: cfg.MaxKeys, perKey: cfg.MaxWaitersPerKey,
		waiters: cfg.MaxWaiters, keys: map[string]*mKey{}}
	if cfg.Keys != nil && cfg.Keys.Max() > 0 && (m.keyLimit == 0 || cfg.Keys.Max() < m.keyLimit) {
		m.keyLimit = cfg.Keys.Max()
	}
	return m
}

func (m *model) nwait() int {
	n := 0
	for _, k := range m.keys {
		n += len(k.q)
	}
	return n
}

func (m *model) stats() Stats {
	s := m.st
	s.Keys, s.Waiters, s.LastToken = len(m.keys), m.nwait(), m.last
	return s
}

func (m *model) grant(out []Answer, key string, k *mKey, now int64, to Requester, owner string, lease uint64) []Answer {
	m.last++
	k.token, k.deadline = m.last, now+int64(lease)*1e6
	m.maxDeadline = max(m.maxDeadline, k.deadline)
	m.st.Grants++
	return append(out, Answer{To: to, Result: Acquired, Token: k.token, Owner: []byte(owner), Key: []byte(key), Deadline: k.deadline})
}

func (m *model) timeOut(out []Answer, key string, w mWaiter) []Answer {
	m.st.TimedOut++
	return append(out, Answer{To: w.from, Result: TimedOut, Owner: []byte(w.owner), Key: []byte(key)})
}

// handOver: the key's lease is over; the first waiter whose wait has not passed (single
// mode) gets it.
func (m *model) handOver(out []Answer, key string, k *mKey, now int64) ([]Answer, bool) {
	for len(k.q) > 0 {
		w := k.q[0]
		k.q = k.q[1:]
		if w.wait <= now {
			out = m.timeOut(out, key, w)
			continue
		}
		m.st.HandOvers++
		return m.grant(out, key, k, now, w.from, w.owner, w.lease), true
	}
	return out, false
}

// dropPhantom deletes a grace-held key whose queue is empty.
func (m *model) dropPhantom(key string) {
	if k := m.keys[key]; k != nil && k.token == 0 && len(k.q) == 0 {
		delete(m.keys, key)
	}
}

func (m *model) apply(now int64, c *Command) []Answer {
	var out []Answer
	key := string(c.Key)
	k := m.keys[key]
	switch c.Op {
	case OpAcquire:
		refuse := func(r Result) []Answer {
			if r == Busy {
				m.st.Busy++
			} else {
				m.st.TimedOut++
			}
			return append(out, Answer{To: c.From, Result: r, Owner: c.Owner, Key: c.Key})
		}
		keyRoom := m.keyLimit == 0 || len(m.keys) < m.keyLimit
		waiterRoom := (m.waiters == 0 || m.nwait() < m.waiters) && (m.perKey == 0 || k == nil || len(k.q) < m.perKey)
		w := mWaiter{from: c.From, owner: string(c.Owner), lease: c.LeaseMs, wait: now + int64(c.WaitMs)*1e6}
		switch {
		case k == nil && now < m.grace:
			if c.WaitMs == 0 {
				return refuse(TimedOut)
			}
			if !keyRoom || !waiterRoom {
				return refuse(Busy)
			}
			w.id = m.nextID
			m.nextID++
			m.keys[key] = &mKey{deadline: m.grace, q: []mWaiter{w}}
			return nil
		case k == nil:
			if !keyRoom {
				return refuse(Busy)
			}
			k = &mKey{}
			m.keys[key] = k
			return m.grant(out, key, k, now, c.From, string(c.Owner), c.LeaseMs)
		case !m.repl && k.deadline <= now:
			if k.token != 0 {
				m.st.Expiries++
			}
			return m.grant(out, key, k, now, c.From, string(c.Owner), c.LeaseMs)
		case c.WaitMs == 0:
			return refuse(TimedOut)
		case !waiterRoom:
			return refuse(Busy)
		}
		w.id = m.nextID
		m.nextID++
		k.q = append(k.q, w)
	case OpRelease:
		if k == nil || k.token == 0 || k.token != c.Token {
			m.st.NotReleased++
			return append(out, Answer{To: c.From, Result: NotReleased, Token: c.Token, Key: c.Key})
		}
		m.st.Released++
		out = append(out, Answer{To: c.From, Result: Released, Token: c.Token, Key: c.Key})
		var ok bool
		if out, ok = m.handOver(out, key, k, now); !ok {
			delete(m.keys, key)
		}
	case OpExpire:
		if k == nil || k.token != c.Token {
			return nil
		}
		if k.token != 0 {
			m.st.Expiries++
		}
		var ok bool
		if out, ok = m.handOver(out, key, k, now); !ok {
			delete(m.keys, key)
		}
	case OpWaitTimeout:
		if k == nil {
			return nil
		}
		for i, w := range k.q {
			if w.from == c.From {
				k.q = slices.Delete(k.q, i, i+1)
				out = m.timeOut(out, key, w)
				m.dropPhantom(key)
				break
			}
		}
	case OpWithdraw, OpWithdrawBelow:
		for key, k := range m.keys {
			k.q = slices.DeleteFunc(k.q, func(w mWaiter) bool {
				if w.from.Node == c.From.Node && withdrawn(c, w.from) {
					m.st.Withdrawn++
					return true
				}
				return false
			})
			m.dropPhantom(key)
		}
	}
	return out
}

// withdrawn tells whether the withdraw command c takes the waiter of r (same node).
func withdrawn(c *Command, r Requester) bool {
	if c.Op == OpWithdrawBelow {
		return r.Conn < c.From.Conn
	}
	return r.Conn == c.From.Conn
}

// mTimer is a deadline found by scanning: a wait end (waiter set) or a lease end.
type mTimer struct {
	at     int64
	isWait bool
	tie    uint64
	key    string
	from   Requester
	token  uint64
}

func cmpTimer(a, b mTimer) int {
	switch {
	case a.at != b.at:
		return cmpInt(a.at, b.at)
	case a.isWait != b.isWait:
		if a.isWait {
			return -1
		}
		return 1
	case a.tie != b.tie:
		return cmpInt(a.tie, b.tie)
	}
	return strings.Compare(a.key, b.key)
}

func cmpInt[T int64 | uint64](a, b T) int {
	if a < b {
		return -1
	} else if a > b {
		return 1
	}
	return 0
}

// timers lists every timer the table keeps: each wait end, and the lease ends of keys that
// need one (all holders when replicated, keys with waiters in single mode), sorted.
func (m *model) timers() []mTimer {
	var r []mTimer
	for key, k := range m.keys {
		for _, w := range k.q {
			r = append(r, mTimer{at: w.wait, isWait: true, tie: w.id, key: key, from: w.from})
		}
		if m.repl || len(k.q) > 0 {
			r = append(r, mTimer{at: k.deadline, tie: k.token, key: key, token: k.token})
		}
	}
	slices.SortFunc(r, cmpTimer)
	return r
}

// nextDue is the earliest timer with lease ends delayed by leaseDelay, found by scanning.
func (m *model) nextDue(leaseDelay int64) (int64, bool) {
	ts := m.timers()
	if len(ts) == 0 {
		return 0, false
	}
	best := int64(math.MaxInt64)
	for _, tm := range ts {
		if !tm.isWait {
			tm.at += leaseDelay
		}
		best = min(best, tm.at)
	}
	return best, true
}

func (m *model) nextDeadline() (int64, bool) {
	if ts := m.timers(); len(ts) > 0 {
		return ts[0].at, true
	}
	return 0, false
}

func (m *model) due(now int64) []Command {
	var r []Command
	for _, tm := range m.timers() {
		if tm.at > now {
			break
		}
		if tm.isWait {
			r = append(r, Command{Op: OpWaitTimeout, From: tm.from, Key: []byte(tm.key)})
		} else {
			r = append(r, Command{Op: OpExpire, Key: []byte(tm.key), Token: tm.token})
		}
	}
	return r
}

func (m *model) tick(now int64) []Answer {
	if m.repl {
		return nil
	}
	var out []Answer
	for {
		ts := m.timers()
		if len(ts) == 0 || ts[0].at > now {
			return out
		}
		tm := ts[0]
		k := m.keys[tm.key]
		if tm.isWait {
			i := slices.IndexFunc(k.q, func(w mWaiter) bool { return w.id == tm.tie })
			w := k.q[i]
			k.q = slices.Delete(k.q, i, i+1)
			out = m.timeOut(out, tm.key, w)
			m.dropPhantom(tm.key)
			continue
		}
		if k.token != 0 {
			m.st.Expiries++
		}
		out, _ = m.handOver(out, tm.key, k, now)
		m.dropPhantom(tm.key)
	}
}

func (m *model) sweep(now int64) int {
	if m.repl {
		return 0
	}
	n := 0
	for key, k := range m.keys {
		if len(k.q) == 0 && k.deadline <= now {
			if k.token != 0 {
				m.st.Expiries++
			}
			delete(m.keys, key)
			n++
		}
	}
	m.st.Swept += uint64(n)
	m.maxDeadline = 0 // the latest lease end still held; the grace phantom (token 0) holds none
	for _, k := range m.keys {
		if k.token != 0 {
			m.maxDeadline = max(m.maxDeadline, k.deadline)
		}
	}
	return n
}

// ---- the random run ----

// tracker checks what must hold whatever the implementation, from the answers alone.
type tracker struct {
	repl    bool
	grace   int64
	keys    map[string]*hKey
	waiting map[Requester]hWait
	lastTok uint64
}

type hKey struct {
	tok      uint64
	deadline int64
	live     bool // a lease granted and not yet released or expired by command
	queue    []Requester
}

type hWait struct {
	key  string
	wait int64
}

// waitingSorted lists the queued requesters in a fixed order (a seed must replay alike).
func (h *tracker) waitingSorted() []Requester {
	r := make([]Requester, 0, len(h.waiting))
	for q := range h.waiting {
		r = append(r, q)
	}
	slices.SortFunc(r, func(a, b Requester) int {
		if a.Node != b.Node {
			return cmpInt(uint64(a.Node), uint64(b.Node))
		}
		if a.Conn != b.Conn {
			return cmpInt(a.Conn, b.Conn)
		}
		return cmpInt(a.Seq, b.Seq)
	})
	return r
}

func (h *tracker) key(k string) *hKey {
	if h.keys[k] == nil {
		h.keys[k] = &hKey{}
	}
	return h.keys[k]
}

// observe checks the answers of one command (c nil for Tick) applied at now.
func (h *tracker) observe(now int64, c *Command, out []Answer) error {
	if c != nil {
		switch c.Op {
		case OpAcquire:
			if len(out) == 0 {
				k := h.key(string(c.Key))
				k.queue = append(k.queue, c.From)
				h.waiting[c.From] = hWait{string(c.Key), now + int64(c.WaitMs)*1e6}
				return nil
			}
			if len(out) != 1 || out[0].To != c.From {
				return fmt.Errorf("acquire answered %d times", len(out))
			}
		case OpExpire:
			if k := h.key(string(c.Key)); k.live && k.tok == c.Token {
				k.live = false
			}
		case OpWithdraw, OpWithdrawBelow:
			for r, w := range h.waiting {
				if r.Node == c.From.Node && withdrawn(c, r) {
					delete(h.waiting, r)
					k := h.keys[w.key]
					k.queue = slices.DeleteFunc(k.queue, func(q Requester) bool { return q == r })
				}
			}
		}
	}
	for i := range out {
		a := &out[i]
		k := h.key(string(a.Key))
		_, queued := h.waiting[a.To]
		immediate := c != nil && c.Op == OpAcquire && i == 0
		if (a.Result == Acquired || a.Result == TimedOut || a.Result == Busy) && !immediate {
			if !queued {
				return fmt.Errorf("answer %c to %v, which is not waiting (answered twice?)", a.Result.Letter(), a.To)
			}
			if a.Result == Busy {
				return fmt.Errorf("B to a queued acquire")
			}
		}
		switch a.Result {
		case Acquired:
			if a.Token <= h.lastTok || a.Token <= k.tok {
				return fmt.Errorf("token %d for %s not above %d", a.Token, a.Key, max(h.lastTok, k.tok))
			}
			h.lastTok = a.Token
			if k.live && (h.repl || k.deadline > now) {
				return fmt.Errorf("%s granted to %v while token %d holds it until %d", a.Key, a.To, k.tok, k.deadline)
			}
			if now < h.grace {
				return fmt.Errorf("grant during grace")
			}
			if !immediate {
				if len(k.queue) == 0 || k.queue[0] != a.To {
					return fmt.Errorf("hand-over of %s to %v, not the head %v", a.Key, a.To, k.queue)
				}
				if h.waiting[a.To].wait <= now {
					return fmt.Errorf("granted to %v after its wait passed", a.To)
				}
			}
			k.tok, k.deadline, k.live = a.Token, a.Deadline, true
		case Released:
			if !k.live || k.tok != a.Token {
				return fmt.Errorf("R %d %s, but the live token is %d (live %v)", a.Token, a.Key, k.tok, k.live)
			}
			k.live = false
		}
		if !immediate && queued {
			delete(h.waiting, a.To)
			k.queue = slices.DeleteFunc(k.queue, func(q Requester) bool { return q == a.To })
		}
	}
	return nil
}

func sameAnswers(got, want []Answer) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		g, w := &got[i], &want[i]
		if g.To != w.To || g.Result != w.Result || g.Token != w.Token || g.Deadline != w.Deadline ||
			!bytes.Equal(g.Owner, w.Owner) || !bytes.Equal(g.Key, w.Key) {
			return false
		}
	}
	return true
}

func fmtAnswers(as []Answer) string {
	var s []string
	for i := range as {
		s = append(s, fmtAnswer(&as[i]))
	}
	return "[" + strings.Join(s, "; ") + "]"
}

func fmtCommands(cs []Command) string {
	var s []string
	for i := range cs {
		s = append(s, fmtCommand(&cs[i]))
	}
	return "[" + strings.Join(s, "; ") + "]"
}

// reserver is a ReserveTokens hook that hands out blocks and checks how it is called.
type reserver struct {
	last    func() uint64
	ceiling uint64
	err     error
}

func (r *reserver) reserve(next uint64) uint64 {
	if r.err == nil && (next <= r.ceiling || next != r.last()+1) {
		r.err = fmt.Errorf("ReserveTokens(%d) with ceiling %d and last %d", next, r.ceiling, r.last())
	}
	r.ceiling = next + 4
	return r.ceiling
}

type impl struct {
	name string
	t    *Table
	res  *reserver
}

func TestModel(t *testing.T) {
	runs, steps := 400, 2500
	if raceEnabled { // one goroutine: the detector adds time, not insight
		runs = 100
	}
	if testing.Short() {
		runs, steps = 50, 1000
	}
	for run := range runs {
		seed := uint64(run)
		if err := modelRun(seed, steps); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
	}
}

func modelRun(seed uint64, steps int) error {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	pick := func(xs ...int) int { return xs[rng.IntN(len(xs))] }
	cfg := Config{
		Replicated:       rng.IntN(2) == 0,
		MaxKeys:          pick(0, 0, 2, 3),
		MaxWaitersPerKey: pick(0, 1, 2, 3),
		MaxWaiters:       pick(0, 2, 4, 6),
	}
	var budgetMax int
	if !cfg.Replicated && rng.IntN(3) == 0 {
		budgetMax = pick(1, 2, 3)
		cfg.Keys = NewBudget(budgetMax)
	}
	newImpl := func(name string, c Config) *impl {
		im := &impl{name: name, res: &reserver{}}
		if c.Keys != nil {
			c.Keys = NewBudget(budgetMax) // each table its own: they hold the same keys
		}
		c.ReserveTokens = im.res.reserve
		im.t = New(c)
		im.res.last = im.t.LastToken
		return im
	}
	m := newModel(cfg)
	impls := []*impl{newImpl("table", cfg)}
	h := &tracker{repl: cfg.Replicated, keys: map[string]*hKey{}, waiting: map[Requester]hWait{}}

	nkeys := pick(1, 2, 4, 6)
	keyName := func() []byte { return []byte(fmt.Sprintf("k%d", rng.IntN(nkeys))) }
	node := func() uint32 {
		if cfg.Replicated {
			return uint32(1 + rng.IntN(2))
		}
		return 0
	}
	seqs := map[connID]uint64{}
	newReq := func() Requester {
		r := Requester{Node: node(), Conn: uint64(1 + rng.IntN(3))}
		id := connID{r.Node, r.Conn}
		seqs[id]++
		r.Seq = seqs[id]
		return r
	}
	var now int64
	if rng.IntN(3) == 0 {
		g := int64(rng.IntN(60)) * 1e6
		tok := uint64(rng.IntN(1000))
		m.grace, h.grace = g, g
		m.last, h.lastTok = max(m.last, tok), tok
		for _, im := range impls {
			im.t.SetGrace(g)
			im.t.SetLastToken(tok)
		}
	}
	var pending []Command // commands Due reported, applied later or never
	snapAt := rng.IntN(steps)

	step := func(i int, desc string, do func(t *Table) []Answer, want []Answer, c *Command) error {
		for _, im := range impls {
			got := do(im.t)
			if !sameAnswers(got, want) {
				return fmt.Errorf("step %d %s on %s: got %s, model %s", i, desc, im.name, fmtAnswers(got), fmtAnswers(want))
			}
			for _, a := range got {
				if a.Result == Acquired && a.Token > im.res.ceiling {
					return fmt.Errorf("step %d %s: token %d above the reserved ceiling %d", i, im.name, a.Token, im.res.ceiling)
				}
			}
		}
		return h.observe(now, c, want)
	}

	for i := 0; i < steps; i++ {
		now += int64(pick(0, 0, 1, 2, 5, 10, 15)) * 1e6
		var err error
		switch r := rng.IntN(100); {
		case r < 38: // acquire
			c := Command{Op: OpAcquire, From: newReq(), Owner: []byte(fmt.Sprintf("o%d", rng.IntN(3))), Key: keyName(),
				LeaseMs: uint64(1 + rng.IntN(40)), WaitMs: uint64(pick(0, 0, 0, 1, 5, 20, 50))}
			want := m.apply(now, &c)
			err = step(i, "acquire", func(t *Table) []Answer { return t.Apply(now, &c, nil) }, want, &c)
		case r < 58: // release
			c := Command{Op: OpRelease, From: newReq(), Key: keyName()}
			hk := h.key(string(c.Key))
			switch rng.IntN(4) {
			case 0, 1:
				c.Token = hk.tok
			case 2:
				c.Token = uint64(rng.IntN(int(m.last) + 2))
			default:
				c.Token = hk.tok - 1
			}
			want := m.apply(now, &c)
			err = step(i, "release", func(t *Table) []Answer { return t.Apply(now, &c, nil) }, want, &c)
		case r < 70:
			if cfg.Replicated {
				// The leader's loop: Due, then apply some of what it reports, maybe
				// later, maybe twice.
				want := m.due(now)
				for _, im := range impls {
					got := im.t.Due(now, nil)
					if fmtCommands(got) != fmtCommands(want) {
						return fmt.Errorf("step %d due on %s: got %s, model %s", i, im.name, fmtCommands(got), fmtCommands(want))
					}
				}
				pending = append(pending, want...)
				var keep []Command
				for _, c := range pending {
					if rng.IntN(3) == 0 {
						keep = append(keep, c)
						continue
					}
					want := m.apply(now, &c)
					if err = step(i, fmtCommand(&c), func(t *Table) []Answer { return t.Apply(now, &c, nil) }, want, &c); err != nil {
						break
					}
				}
				pending = keep
			} else {
				want := m.tick(now)
				err = step(i, "tick", func(t *Table) []Answer { return t.Tick(now, nil) }, want, nil)
			}
		case r < 74:
			want := m.sweep(now)
			for _, im := range impls {
				if got := im.t.Sweep(now); got != want {
					return fmt.Errorf("step %d sweep on %s: %d, model %d", i, im.name, got, want)
				}
			}
		case r < 79: // withdraw a connection, or every connection of a node below one
			c := Command{Op: OpWithdraw, From: Requester{Node: node(), Conn: uint64(1 + rng.IntN(3))}}
			if rng.IntN(4) == 0 {
				c.Op = OpWithdrawBelow
			}
			want := m.apply(now, &c)
			err = step(i, "withdraw", func(t *Table) []Answer { return t.Apply(now, &c, nil) }, want, &c)
		case r < 84: // an expire with a current or stale token, in either mode
			c := Command{Op: OpExpire, Key: keyName()}
			c.Token = h.key(string(c.Key)).tok - uint64(rng.IntN(2))
			if c.Token == 0 && now < m.grace {
				c.Token = m.last + 1 // the leader expires a grace phantom (token 0) only at the grace's end
			}
			want := m.apply(now, &c)
			err = step(i, "expire", func(t *Table) []Answer { return t.Apply(now, &c, nil) }, want, &c)
		case r < 89: // a wait timeout for a queued acquire or for nobody
			c := Command{Op: OpWaitTimeout, From: newReq(), Key: keyName()}
			if w := h.waitingSorted(); len(w) > 0 && rng.IntN(3) > 0 {
				c.From = w[rng.IntN(len(w))]
				c.Key = []byte(h.waiting[c.From].key)
			}
			want := m.apply(now, &c)
			err = step(i, "waittimeout", func(t *Table) []Answer { return t.Apply(now, &c, nil) }, want, &c)
		default: // look only
			want := m.due(now)
			for _, im := range impls {
				if got := im.t.Due(now, nil); fmtCommands(got) != fmtCommands(want) {
					return fmt.Errorf("step %d due on %s: got %s, model %s", i, im.name, fmtCommands(got), fmtCommands(want))
				}
			}
		}
		if err != nil {
			return err
		}

		if i == snapAt {
			var buf bytes.Buffer
			if err := impls[0].t.WriteSnapshot(&buf); err != nil {
				return err
			}
			im := newImpl("restored", cfg)
			if err := im.t.ReadSnapshot(&buf); err != nil {
				return fmt.Errorf("step %d: read snapshot: %v", i, err)
			}
			impls = append(impls, im)
		}

		ms := m.stats()
		wd, wok := m.nextDeadline()
		for j, im := range impls {
			if err := checkTable(im.t); err != nil {
				return fmt.Errorf("step %d %s: %v", i, im.name, err)
			}
			if im.res.err != nil {
				return fmt.Errorf("step %d %s: %v", i, im.name, im.res.err)
			}
			st := im.t.Stats()
			if j > 0 { // counters start over in a restored table
				st.Grants, st.HandOvers, st.Expiries, st.TimedOut, st.Busy = ms.Grants, ms.HandOvers, ms.Expiries, ms.TimedOut, ms.Busy
				st.Released, st.NotReleased, st.Swept, st.Withdrawn = ms.Released, ms.NotReleased, ms.Swept, ms.Withdrawn
			}
			if st != ms {
				return fmt.Errorf("step %d %s: stats %+v, model %+v", i, im.name, st, ms)
			}
			if im.t.MaxDeadline() != m.maxDeadline {
				return fmt.Errorf("step %d %s: max deadline %d, model %d", i, im.name, im.t.MaxDeadline(), m.maxDeadline)
			}
			if d, ok := im.t.NextDeadline(); d != wd || ok != wok {
				return fmt.Errorf("step %d %s: next deadline %d %v, model %d %v", i, im.name, d, ok, wd, wok)
			}
			if m.repl {
				for _, delay := range []int64{0, 3e6, 500e6} {
					d, ok := im.t.NextDue(delay)
					if wd, wok := m.nextDue(delay); d != wd || ok != wok {
						return fmt.Errorf("step %d %s: next due with leases %dns later: %d %v, model %d %v", i, im.name, delay, d, ok, wd, wok)
					}
				}
			}
		}
		if len(h.waiting) != ms.Waiters {
			return fmt.Errorf("step %d: %d acquires wait for an answer, the table queues %d", i, len(h.waiting), ms.Waiters)
		}
	}
	if len(impls) == 2 {
		var a, b bytes.Buffer
		if err := impls[0].t.WriteSnapshot(&a); err != nil {
			return err
		}
		if err := impls[1].t.WriteSnapshot(&b); err != nil {
			return err
		}
		if !bytes.Equal(a.Bytes(), b.Bytes()) {
			return fmt.Errorf("the original and the restored table end in different states")
		}
	}
	return nil
}
