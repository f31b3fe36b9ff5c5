package chaos

import (
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
		checkExclusion(k, grants, releases, r)
		checkTokens(k, grants, r)
		checkDurability(k, grants, releases, crashes, cfg, r)
		checkRegister(k, ops, grants, releases, r)
	}
	checkLinearizable(h, byKey, keys, crashes, cfg, r)
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

// sureEnd is the end of the time in which g certainly held its key: its
// lease cannot have ended before invoke+lease (the lease starts when the
// server grants, which is after the invoke), and no release of its token can
// have taken effect before that release was sent. A release answered N
// changed nothing, so it does not end the interval.
func sureEnd(g *Op, releases map[uint64][]*Op) int64 {
	end := g.Invoke + int64(g.LeaseMs)*int64(time.Millisecond)
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
func checkExclusion(key string, grants []*Op, releases map[uint64][]*Op, r *CheckResult) {
	type iv struct {
		g          *Op
		start, end int64
	}
	var ivs []iv
	var late []*Op
	for _, g := range grants {
		if e := sureEnd(g, releases); g.Complete < e {
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
					What: fmt.Sprintf("two holders at once: token %d was certainly held from %s to %s, token %d was granted within it (sent %s, answered %s)",
						o.g.Token, fmtT(o.start), fmtT(o.end), g.Token, fmtT(g.Invoke), fmtT(g.Complete)),
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
				What: fmt.Sprintf("two holders at once: token %d was certainly held from %s to %s, token %d was granted (answered) at %s",
					o.g.Token, fmtT(o.start), fmtT(o.end), cur.g.Token, fmtT(cur.start)),
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
// with a higher token wrote first: two holders), and an accepted write must
// come from a holder whose lease could still run.
func checkRegister(key string, ops []*Op, grants []*Op, releases map[uint64][]*Op, r *CheckResult) {
	byID := map[int64]*Op{}
	for _, g := range grants {
		byID[g.ID] = g
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
			if w.Invoke >= g.Complete && w.Invoke < sureEnd(g, releases) {
				r.Violations = append(r.Violations, Violation{Check: CheckRegister, Key: key, At: w.Invoke,
					What: fmt.Sprintf("write of token %d refused while its holder certainly held the key: a higher token had written", w.Token),
					Ops:  []*Op{g, w}})
			}
		case ResAccepted:
			if w.Invoke >= g.Complete+int64(g.LeaseMs)*int64(time.Millisecond) {
				r.Violations = append(r.Violations, Violation{Check: CheckRegister, Key: key, At: w.Invoke,
					What: fmt.Sprintf("write of token %d accepted after its holder's lease had certainly ended", w.Token),
					Ops:  []*Op{g, w}})
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
		faulty := false
		for _, e := range h.Events {
			end := e.End
			if end == 0 {
				end = math.MaxInt64
			}
			if e.Start < o.Invoke+int64(o.WaitMs)*int64(time.Millisecond)+int64(15*time.Second) && end+int64(2*time.Second) > o.Invoke {
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
	faultFree := func(lo, hi int64) time.Duration {
		free := hi - lo
		for _, e := range h.Events {
			end := e.End
			if end == 0 {
				end = last
			}
			if a, b := max(lo, e.Start), min(hi, end); b > a {
				free -= b - a // faults do not overlap: one at a time
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

func cmp64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
