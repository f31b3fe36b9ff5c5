package chaos

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/ticketd/ticketd/shard"
)

// CheckConfig says what the history's system promised.
type CheckConfig struct {
	// Mode is "single" or "cluster". In single mode a crash (kill -9) makes
	// the server forget its holders (their leases still bind every later
	// grant, and their tokens then release nothing); in cluster mode nothing
	// acknowledged is ever forgotten, and a lease counts as held until its
	// Expire commits (any time after its end).
	Mode string
	// MaxLease bounds the crash grace period of single mode (in ns).
	MaxLease int64
	// LinTimeout bounds the porcupine search per key (0: DefaultLinTimeout).
	LinTimeout time.Duration
	// Shards is the servers' --shards, for the progress check (0: one).
	Shards int
	// Stall bounds, per shard, the time outside faults with requests sent
	// and no grant or release answered (0: DefaultStall).
	Stall time.Duration
	// MaxLate bounds, in a cluster, how long past its end and the skew a
	// lease is held by a replica that applied its grant late (the
	// unavailable timeout, one proposal attempt and the skew: replica's
	// maxLate), in ns (0: Stall).
	MaxLate int64
	// Skew is the cluster's --max-clock-skew (ns): while node clocks are
	// offset, the Go client's dating of waited grants is promised only
	// within half of it (0: such grants are then not judged by that rule).
	Skew int64
}

// Violation is one broken promise, with the operations that show it.
type Violation struct {
	Check string
	Key   string
	What  string
	At    int64 // campaign time the evidence points at
	Ops   []*Op
}

func (v Violation) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "[%s] key %q at %s: %s", v.Check, v.Key, fmtT(v.At), v.What)
	for _, o := range v.Ops {
		b.WriteString("\n    " + o.String())
	}
	return b.String()
}

// Check names, as the report shows them.
const (
	CheckExclusion   = "mutual exclusion"
	CheckTokens      = "token order"
	CheckDurability  = "durability"
	CheckOnce        = "exactly-once answers"
	CheckLiveness    = "answer on a live connection"
	CheckProgress    = "progress after faults"
	CheckRegister    = "fenced register"
	CheckLinearLock  = "lock linearizability (porcupine)"
	CheckLinearFence = "register linearizability (porcupine)"
)

// Undecided is a porcupine search that hit its time limit: neither a
// violation nor a pass, so the run fails.
type Undecided struct {
	Check string
	Key   string
	Ops   int
	Limit time.Duration
}

func (u Undecided) String() string {
	return fmt.Sprintf("[%s] key %q (%d operations): not decided within %v", u.Check, u.Key, u.Ops, u.Limit)
}

// CheckResult is the checker's verdict.
type CheckResult struct {
	Violations []Violation
	Undecided  []Undecided
	// Counts of what was checked.
	Grants, Keys int
}

// Failed reports whether the history broke a promise or could not be
// decided.
func (r *CheckResult) Failed() bool { return len(r.Violations) > 0 || len(r.Undecided) > 0 }

// DefaultStall is the default of CheckConfig.Stall: once a fault ends, a
// shard's first grant comes after an election (about a second) or single
// mode's crash grace (the longest lease granted plus 2 s: at most 4 s with
// the campaign's leases); ten seconds is far beyond either, and far short
// of a shard that never comes back.
const DefaultStall = 10 * time.Second

// DefaultLinTimeout is the porcupine time limit per key: the busiest keys of
// a campaign are decided in milliseconds, so a key that takes this long is
// a search gone astray, reported as not decided rather than waited out.
const DefaultLinTimeout = 60 * time.Second

// Check runs every check over h.
func Check(h *History, cfg CheckConfig) *CheckResult {
	if cfg.LinTimeout == 0 {
		cfg.LinTimeout = DefaultLinTimeout
	}
	r := &CheckResult{}
	byKey := map[string][]*Op{}
	for _, o := range h.Ops {
		byKey[o.Key] = append(byKey[o.Key], o)
	}
	r.Keys = len(byKey)
	crashes := crashWindows(h, cfg)
	hd := newHolds(h, cfg)
	checkOnce(h, r)
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		ops := byKey[k]
		grants := grantsOf(ops)
		r.Grants += len(grants)
		releases := releasesByToken(ops)
		checkExclusion(k, grants, releases, hd, r)
		checkTokens(k, grants, r)
		checkDurability(k, grants, releases, crashes, cfg, r)
		checkRegister(k, ops, grants, releases, hd, r)
	}
	checkLinearizable(h, byKey, keys, crashes, hd, cfg, r)
	checkLiveness(h, r)
	checkProgress(h, cfg, r)
	slices.SortStableFunc(r.Violations, func(a, b Violation) int {
		if a.At != b.At {
			if a.At < b.At {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Check, b.Check)
	})
	return r
}

func crashWindows(h *History, cfg CheckConfig) []*Event {
	if cfg.Mode != "single" {
		return nil // a cluster forgets nothing it acknowledged
	}
	var out []*Event
	for _, e := range h.Events {
		if e.Kind == EvCrash || e.Kind == EvCrashAll {
			out = append(out, e)
		}
	}
	return out
}

func grantsOf(ops []*Op) []*Op {
	var g []*Op
	for _, o := range ops {
		if o.Kind == 'A' && o.Result == ResGranted {
			g = append(g, o)
		}
	}
	return g
}

func releasesByToken(ops []*Op) map[uint64][]*Op {
	m := map[uint64][]*Op{}
	for _, o := range ops {
		if o.Kind == 'R' {
			m[o.Token] = append(m[o.Token], o)
		}
	}
	return m
}

// clientMargin is how much earlier than the Go client's rule the checks
// end a waited grant's lease. The rule dates the grant from its send, or
// from the latest send of a request answered before it on its connection:
// that answer left the server before this one, and the server renews a
// hand-over whose answer leaves late, so that its lease runs at least
// from when its answer leaves (less 10µs in single mode; in a cluster the
// answer leaves within half the skew of the lease's start, and the lease
// ends a skew after its deadline). Unlike dating from the answer's arrival
// less a round trip, which this rule replaced, no stall of the server
// before its write or of the reader before its read can make it late (a
// campaign with strace holding up the server's syscalls found those), nor
// a pause: a server stopped between its renewal and its write has read
// nothing since, so every request answered before the grant was sent
// before the renewal. The margin covers the single-mode slack alone; a
// hand-over the server did not renew is caught on a connection whose later
// request was answered first.
const clientMargin = int64(time.Millisecond)

// holds dates the leases of grants that may have waited by the Go client's
// rule (Op.Start), where the server promises it.
type holds struct {
	// clocks: the client's rule holds while node clocks differ by less
	// than half the skew; the clock faults stay within the skew, so a
	// lease that runs while one is under way loses the other half.
	clocks []*Event
	skew   int64
}

func newHolds(h *History, cfg CheckConfig) *holds {
	hd := &holds{skew: cfg.Skew}
	for _, e := range h.Events {
		if e.Kind == EvClock {
			hd.clocks = append(hd.clocks, e)
		}
	}
	return hd
}

// clientEnd is the time until which g, a grant to an acquire that could
// wait, certainly held its key by the client's rule, less the margins;
// 0 if the rule is not recorded or not promised for g.
func (hd *holds) clientEnd(g *Op) int64 {
	d := g.clientDeadline()
	if d == 0 || g.Kind != 'A' || g.Result != ResGranted || g.WaitMs == 0 || g.Complete < 0 {
		return 0
	}
	d -= clientMargin
	for _, e := range hd.clocks {
		if e.Start < d && (e.End == 0 || e.End > g.Invoke) {
			if hd.skew <= 0 {
				return 0
			}
			d -= hd.skew / 2
			break
		}
	}
	return d
}

// sureEnd is the end of the time in which g certainly held its key: its
// lease cannot have ended before invoke+lease (the lease starts when the
// server grants, which is after the invoke), nor, for a grant that may
// have waited, before the client's rule ends it (clientEnd), and no
// release of its token can have taken effect before that release was
// sent. A release answered N changed nothing, so it does not end the
// interval.
func sureEnd(g *Op, releases map[uint64][]*Op, hd *holds) int64 {
	end := max(g.Invoke+int64(g.LeaseMs)*int64(time.Millisecond), hd.clientEnd(g))
	for _, r := range releases[g.Token] {
		if r.Result != ResNotReleased && r.Invoke < end {
			end = r.Invoke
		}
	}
	return end
}

// checkExclusion: two grants of one key must never both be certainly held
// at one instant. g certainly holds from its answer (Complete) to sureEnd.
// A grant answered after sureEnd (a queued one, granted late) holds for
// certain at no instant we can name, but it was granted at some instant
// between its send and its answer: if that whole window lies inside another
// grant's certain interval, the key was granted while held.
//
// With the client's rule a waited grant's certain interval runs on to
// clientEnd: a hand-over answered late and not renewed ends before its
// holder stops, and the next grant lands inside that interval.
func checkExclusion(key string, grants []*Op, releases map[uint64][]*Op, hd *holds, r *CheckResult) {
	type iv struct {
		g          *Op
		start, end int64
	}
	var ivs []iv
	var late []*Op
	for _, g := range grants {
		if e := sureEnd(g, releases, hd); g.Complete < e {
			ivs = append(ivs, iv{g, g.Complete, e})
		} else {
			late = append(late, g)
		}
	}
	slices.SortFunc(ivs, func(a, b iv) int { return cmp64(a.start, b.start) })
	maxEnd := make([]int64, len(ivs)) // the latest end among ivs[:i+1]
	for i, v := range ivs {
		maxEnd[i] = v.end
		if i > 0 {
			maxEnd[i] = max(maxEnd[i], maxEnd[i-1])
		}
	}
	for _, g := range late {
		i, _ := slices.BinarySearchFunc(ivs, g.Invoke+1, func(v iv, t int64) int { return cmp64(v.start, t) })
		for i--; i >= 0 && maxEnd[i] > g.Complete; i-- {
			if o := ivs[i]; o.end > g.Complete {
				r.Violations = append(r.Violations, Violation{Check: CheckExclusion, Key: key, At: g.Invoke,
					What: fmt.Sprintf("two holders at once: token %d was certainly held from %s to %s%s, token %d was granted within it (sent %s, answered %s)",
						o.g.Token, fmtT(o.start), fmtT(o.end), hd.by(o.g, o.end), g.Token, fmtT(g.Invoke), fmtT(g.Complete)),
					Ops: append([]*Op{o.g, g}, releases[o.g.Token]...)})
			}
		}
	}
	var open []iv // intervals whose end is still ahead
	for _, cur := range ivs {
		keep := open[:0]
		for _, o := range open {
			if o.end > cur.start {
				keep = append(keep, o)
			}
		}
		open = keep
		for _, o := range open {
			r.Violations = append(r.Violations, Violation{Check: CheckExclusion, Key: key, At: cur.start,
				What: fmt.Sprintf("two holders at once: token %d was certainly held from %s to %s%s, token %d was granted (answered) at %s",
					o.g.Token, fmtT(o.start), fmtT(o.end), hd.by(o.g, o.end), cur.g.Token, fmtT(cur.start)),
				Ops: append([]*Op{o.g, cur.g}, releases[o.g.Token]...)})
		}
		open = append(open, cur)
	}
}

// checkTokens: per key, tokens are distinct, and a grant that began after
// another was answered carries a larger token.
func checkTokens(key string, grants []*Op, r *CheckResult) {
	seen := map[uint64]*Op{}
	for _, g := range grants {
		if p, ok := seen[g.Token]; ok {
			r.Violations = append(r.Violations, Violation{Check: CheckTokens, Key: key, At: g.Complete,
				What: fmt.Sprintf("token %d granted twice", g.Token), Ops: []*Op{p, g}})
		}
		seen[g.Token] = g
	}
	byInvoke := slices.Clone(grants)
	slices.SortFunc(byInvoke, func(a, b *Op) int { return cmp64(a.Invoke, b.Invoke) })
	byComplete := slices.Clone(grants)
	slices.SortFunc(byComplete, func(a, b *Op) int { return cmp64(a.Complete, b.Complete) })
	var best *Op // the largest token among grants answered so far
	i := 0
	for _, g := range byInvoke {
		for i < len(byComplete) && byComplete[i].Complete < g.Invoke {
			if best == nil || byComplete[i].Token > best.Token {
				best = byComplete[i]
			}
			i++
		}
		if best != nil && g.Token <= best.Token {
			r.Violations = append(r.Violations, Violation{Check: CheckTokens, Key: key, At: g.Complete,
				What: fmt.Sprintf("token went back: %d granted after %d had been answered", g.Token, best.Token),
				Ops:  []*Op{best, g}})
		}
	}
}

// checkDurability: an acknowledged grant stays true. A release of its token
// sent while the grant certainly still held must succeed (R), unless (single
// mode only) the server crashed in between, which the protocol allows to
// forget holders. And a token is released at most once.
func checkDurability(key string, grants []*Op, releases map[uint64][]*Op, crashes []*Event, cfg CheckConfig, r *CheckResult) {
	for _, g := range grants {
		rels := releases[g.Token]
		leaseEnd := g.Invoke + int64(g.LeaseMs)*int64(time.Millisecond)
		var okRel []*Op
		for _, rel := range rels {
			if rel.Result == ResReleased {
				okRel = append(okRel, rel)
			}
		}
		if len(okRel) > 1 {
			r.Violations = append(r.Violations, Violation{Check: CheckDurability, Key: key, At: okRel[1].Complete,
				What: fmt.Sprintf("token %d released twice (the first release was lost)", g.Token), Ops: append([]*Op{g}, okRel...)})
		}
		for _, rel := range rels {
			if rel.Result != ResNotReleased || rel.Invoke < g.Complete || rel.Complete >= leaseEnd {
				continue
			}
			// Earlier releases of this token that may have taken effect explain an N.
			explained := false
			for _, o := range rels {
				if o != rel && o.Result != ResNotReleased && o.Invoke < rel.Complete {
					explained = true
				}
			}
			for _, c := range crashes {
				// The process may have died after it made the grant: the
				// kill is sent at Start and lands by Killed, so a grant
				// sent in between may still have been answered. A grant
				// sent after Killed was made by the restarted process.
				if c.killed() > g.Invoke && c.Start < rel.Complete {
					explained = true
				}
			}
			if !explained {
				r.Violations = append(r.Violations, Violation{Check: CheckDurability, Key: key, At: rel.Complete,
					What: fmt.Sprintf("acknowledged grant forgotten: release of token %d answered N while its lease still ran (until at least %s)", g.Token, fmtT(leaseEnd)),
					Ops:  []*Op{g, rel}})
			}
		}
	}
}

// checkRegister: each holder writes its token to the key's register, which
// refuses tokens lower than the highest it accepted. A write made while its
// holder certainly held the key must be accepted (a refusal means a holder
// with a higher token wrote first: two holders), an accepted write must
// come from a holder whose lease could still run, and no write of a higher
// token (a holder granted later) may be accepted while a lower one was
// certainly still held.
func checkRegister(key string, ops []*Op, grants []*Op, releases map[uint64][]*Op, hd *holds, r *CheckResult) {
	byID := map[int64]*Op{}
	for _, g := range grants {
		byID[g.ID] = g
	}
	// Grants by token, each with the latest certain end among it and the
	// lower tokens. A grant holds from its grant, which comes before every
	// grant of a higher token, so the interval's start needs no test.
	byTok := slices.Clone(grants)
	slices.SortFunc(byTok, func(a, b *Op) int { return cmp.Compare(a.Token, b.Token) })
	ends := make([]int64, len(byTok))
	latest := make([]int, len(byTok)) // index in byTok of the grant with ends[i]
	for i, g := range byTok {
		ends[i], latest[i] = sureEnd(g, releases, hd), i
		if i > 0 && ends[i-1] > ends[i] {
			ends[i], latest[i] = ends[i-1], latest[i-1]
		}
	}
	for _, w := range ops {
		if w.Kind != 'W' {
			continue
		}
		g := byID[w.Grant]
		if g == nil {
			r.Violations = append(r.Violations, Violation{Check: CheckRegister, Key: key, At: w.Invoke,
				What: "register write from no recorded grant", Ops: []*Op{w}})
			continue
		}
		switch w.Result {
		case ResRefused:
			if e := sureEnd(g, releases, hd); w.Invoke >= g.Complete && w.Invoke < e {
				r.Violations = append(r.Violations, Violation{Check: CheckRegister, Key: key, At: w.Invoke,
					What: fmt.Sprintf("write of token %d refused while its holder certainly held the key (until %s%s): a higher token had written", w.Token, fmtT(e), hd.by(g, e)),
					Ops:  []*Op{g, w}})
			}
		case ResAccepted:
			if w.Invoke >= g.Complete+int64(g.LeaseMs)*int64(time.Millisecond) {
				r.Violations = append(r.Violations, Violation{Check: CheckRegister, Key: key, At: w.Invoke,
					What: fmt.Sprintf("write of token %d accepted after its holder's lease had certainly ended", w.Token),
					Ops:  []*Op{g, w}})
			}
			i, _ := slices.BinarySearchFunc(byTok, w.Token, func(o *Op, t uint64) int { return cmp.Compare(o.Token, t) })
			if i > 0 && ends[i-1] > w.Invoke {
				o := byTok[latest[i-1]]
				r.Violations = append(r.Violations, Violation{Check: CheckRegister, Key: key, At: w.Invoke,
					What: fmt.Sprintf("write of token %d accepted while token %d was certainly held (until %s%s): two holders", w.Token, o.Token, fmtT(ends[i-1]), hd.by(o, ends[i-1])),
					Ops:  append([]*Op{o, g, w}, releases[o.Token]...)})
			}
		}
	}
}

// checkOnce: every answer matched exactly one request in flight.
func checkOnce(h *History, r *CheckResult) {
	for _, a := range h.Anomalies {
		r.Violations = append(r.Violations, Violation{Check: CheckOnce, At: a.At,
			What: fmt.Sprintf("%s on connection %d (node %d): %q", a.What, a.Conn, a.Node, strings.TrimRight(a.Line, "\r\n"))})
	}
}

// checkLiveness: a request the client gave up on (no answer within its
// wait plus a generous margin, on a connection still open) is a hang,
// unless a fault was under way around it.
func checkLiveness(h *History, r *CheckResult) {
	for _, o := range h.Ops {
		if o.Complete >= 0 || !strings.Contains(o.Why, "client gave up") {
			continue
		}
		// A fault explains the hang only if it began before the client
		// gave up (LostAt; histories without it: its wait and 15 s).
		gaveUp := o.LostAt
		if gaveUp == 0 {
			gaveUp = o.Invoke + int64(o.WaitMs)*int64(time.Millisecond) + int64(15*time.Second)
		}
		faulty := false
		for _, e := range h.Events {
			end := e.End
			if end == 0 {
				end = math.MaxInt64
			}
			if e.Start < gaveUp && end+int64(2*time.Second) > o.Invoke {
				faulty = true
			}
		}
		if !faulty {
			r.Violations = append(r.Violations, Violation{Check: CheckLiveness, Key: o.Key, At: o.Invoke,
				What: "no answer on a live connection with no fault under way", Ops: []*Op{o}})
		}
	}
}

// checkProgress: a shard that stops granting and releasing while its
// clients go on asking is a failure even if each request gets an answer (an
// E, a T) or its connection breaks, which the other checks accept. Time
// under a fault is not counted: a paused server or a cut-off leader makes
// no progress by design. So on each shard, between one grant or release
// and the next (or the end of the run), the time outside faults, from the
// first request sent after the earlier one, must stay within cfg.Stall.
func checkProgress(h *History, cfg CheckConfig, r *CheckResult) {
	stall := cfg.Stall
	if stall == 0 {
		stall = DefaultStall
	}
	shards := max(cfg.Shards, 1)
	type shardOps struct{ progress, sent []*Op }
	per := make([]shardOps, shards)
	for _, o := range h.Ops {
		if o.Kind == 'W' {
			continue
		}
		s := &per[shard.Index(o.Key, shards)]
		s.sent = append(s.sent, o)
		if o.progressed() {
			s.progress = append(s.progress, o)
		}
	}
	last := h.last()
	// faultFree is the time in [lo, hi] with no fault under way.
	// A single-mode crash grants nothing until its grace is over, which
	// runs from the restart for up to the longest lease and the ceiling's
	// step: counted as the fault's. So graces can reach into the next
	// fault, and the spans are merged.
	type span struct{ from, to int64 }
	var spans []span
	for _, e := range h.Events {
		end := e.End
		if end == 0 {
			end = last
		}
		if cfg.Mode == "single" && (e.Kind == EvCrash || e.Kind == EvCrashAll) {
			end = satAdd(end, cfg.MaxLease+crashGrace)
		}
		spans = append(spans, span{e.Start, end})
	}
	slices.SortFunc(spans, func(a, b span) int { return cmp64(a.from, b.from) })
	faultFree := func(lo, hi int64) time.Duration {
		free, at := hi-lo, lo // at: how far the faults counted so far reach
		for _, sp := range spans {
			if a, b := max(at, sp.from), min(hi, sp.to); b > a {
				free -= b - a
				at = b
			}
		}
		return time.Duration(max(free, 0))
	}
	for sh, s := range per {
		slices.SortFunc(s.progress, func(a, b *Op) int { return cmp64(a.Complete, b.Complete) })
		slices.SortFunc(s.sent, func(a, b *Op) int { return cmp64(a.Invoke, b.Invoke) })
		from := int64(0)
		var prev *Op
		check := func(to int64, next *Op) {
			// From the first request sent after the last progress: a shard
			// nobody asks anything has nothing to answer.
			i, _ := slices.BinarySearchFunc(s.sent, from, func(o *Op, t int64) int { return cmp64(o.Invoke, t) })
			if i == len(s.sent) || s.sent[i].Invoke >= to {
				return
			}
			asked := s.sent[i]
			if free := faultFree(asked.Invoke, to); free > stall {
				what := fmt.Sprintf("shard %d granted and released nothing for %v outside faults (%s to %s), with requests sent",
					sh, free.Round(time.Millisecond), fmtT(asked.Invoke), fmtT(to))
				ops := []*Op{asked}
				if prev != nil {
					ops = append([]*Op{prev}, ops...)
				}
				if next != nil {
					ops = append(ops, next)
				}
				r.Violations = append(r.Violations, Violation{Check: CheckProgress, Key: asked.Key, At: asked.Invoke, What: what, Ops: ops})
			}
		}
		for _, p := range s.progress {
			check(p.Complete, p)
			from, prev = p.Complete, p
		}
		check(last, nil)
	}
}

// by says which rule gave a certain end: the client's, or send + lease.
func (hd *holds) by(g *Op, end int64) string {
	if c := hd.clientEnd(g); c == end && c > g.Invoke+int64(g.LeaseMs)*int64(time.Millisecond) {
		return fmt.Sprintf(" by the client's rule: from %s (a send answered before it on its connection), plus the lease, less %v", fmtT(g.Start), time.Duration(g.clientDeadline()-c))
	}
	return ""
}

func cmp64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
