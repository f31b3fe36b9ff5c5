package chaos

import (
	"cmp"
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"
)

// The lock of one key as a sequential object, for porcupine. Leases make it
// time-dependent, and porcupine's step function sees no time, so each
// operation carries its own call and return times and the model asks only
// what they allow. Every operation takes effect at an instant between its
// call and its return, after the operations placed before it in the order,
// so no earlier than the latest instant one of them can have taken effect
// and its own call (the state's now: a grant over a holder, or an N to an
// expired one, took effect no earlier than that hold's end), and an
// operation that returned before that cannot be placed there. A lease that started then or later cannot end before that plus the
// lease, nor a waited grant's before the Go client's rule ends it
// (holds.clientEnd), so a later grant is possible only if that has passed by the later
// operation's return; a holder counts as live for a T (single mode) only
// while its answer's return plus lease has not passed by the T's earliest
// instant. These bounds are loose in the system's favour, so the model
// flags only histories no legal execution could produce. (An unknown
// outcome that never took effect can be placed after everything else,
// where its call moves nothing.)
//
// Where the end of a hold is not known that closely (a cluster ends a lease
// when its Expire commits; an unknown grant was made at some instant
// before its connection was found gone, or its wait ran out), a T still
// needs a holder whose lease could be running: granted by then (hBy), plus
// its lease and, in a cluster, the skew, how late a lagging replica may
// hold it (MaxLate) and clusterSlack; a fault that began before that bound
// moves it to afterFault past the fault's end (an Expire held up by an
// election, a partition, a paused node). A key left locked for good is
// flagged in both modes.

const ghost = math.MaxUint64 // a grant whose answer never arrived: token unknown

// lostMargin: an unknown grant ends early (released as undeliverable) only
// once the server has found its connection gone: after the client closed
// it, or, when the server closed it, a moment before the client saw that.
const lostMargin = int64(100 * time.Millisecond)

// crashGrace: after a kill -9 in single mode, no key is granted before the
// lease ceiling stored before the process died, which runs 2 s (the
// server's lease step; on a slow disk also the last synced write's time)
// past the latest deadline it granted, nor before what that ceiling had
// left at its write, counted from the restart (the restart does not trust
// its wall clock); but the grace never runs past the longest lease granted
// plus 2 s from the restart (the server records that lease before its
// answer); plus a few ms between the server's clock readings and the
// campaign's.
const crashGrace = int64(2*time.Second + 10*time.Millisecond)

// clusterSlack: how long a cluster may take, on a loaded machine, from a
// lease's due time on its leader's clock to its Expire's commit.
const clusterSlack = int64(time.Second)

// afterFault: how long after a fault a cluster may still be electing a
// leader and committing what the fault held up; a shard's first grant came
// within 1.5 s of every fault's end in campaign runs.
const afterFault = int64(5 * time.Second)

// ghostSlack: how long after its call (and its wait) or its connection's
// loss the server may still carry out an acquire whose answer never came:
// the time a loaded machine takes to read the request, or to see the
// close. A paused server's longer delays are faults.
const ghostSlack = int64(time.Second)

// grantedBy is the latest instant an acquire whose answer never came can
// have been granted at: before its wait ran out, and in single mode before
// the server found its connection gone (a queued acquire is then
// withdrawn). A cluster commits an attempt no later than MaxLate after it
// was sent (the proposer's unavailable timeout, and an abandoned attempt's
// retry), and grants it within its wait after that.
func grantedBy(in lockIn, single bool, maxLate int64) int64 {
	by := satAdd(in.call, in.wait)
	if !single {
		return satAdd(satAdd(by, maxLate), clusterSlack)
	}
	if in.lost > 0 {
		by = min(by, in.lost)
	}
	return satAdd(by, ghostSlack)
}

type lockState struct {
	holder     uint64 // 0: free
	hCall      int64  // earliest instant the holder's grant can have taken effect
	hRet       int64  // holder's acquire return (MaxInt64 for a ghost)
	hLost      int64  // a ghost's Op.LostAt (0: not recorded)
	hBy        int64  // the latest instant the holder's grant can have taken effect
	lease      int64  // holder's lease, ns
	hUntil     int64  // holder's hold cannot end before this (the client's rule; 0: none)
	forgotten  bool   // single mode: the server lost this holder in a crash; its lease still binds
	last       uint64 // largest token known granted
	graceUntil int64  // single mode: after a crash, free keys may answer T until then
	// ext: single mode, how much later than its lease the holder may be
	// held, by clean restarts since its grant (the server moves each lease
	// by the time from the stop's state write to the start, at most the
	// restart's length): T answers are allowed that long; a grant over it
	// is not required to wait for it.
	ext int64
	now int64 // the latest call among the operations placed so far
}

type lockIn struct {
	kind      byte // 'A', 'R', 'C' (crash: from the kill's send until the process had died), 'S' (clean restart: from SIGTERM until it listened again)
	token     uint64
	lease     int64
	call, ret int64
	lost      int64 // Op.LostAt
	wait      int64 // an acquire's wait, ns
	until     int64 // a grant's hold cannot end before this (holds.clientEnd; 0: none)
	restarted int64 // 'C': when the node listened again (0: not recorded)
	op        *Op
}

type lockOut struct {
	res   string
	token uint64
}

func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

func lockModel(cfg CheckConfig, events []*Event) porcupine.Model {
	single := cfg.Mode == "single"
	maxLate := cfg.MaxLate
	if maxLate == 0 {
		maxLate = int64(cmp.Or(cfg.Stall, DefaultStall))
	}
	// delayed: bound moved on by the faults that began before it: one
	// under way by then may hold up what bound dates (a grant, an Expire)
	// until afterFault past its end. A fault that began after it cannot:
	// what was due has come out within the recovery that afterFault
	// allows for (a shard grants again within 1.5 s of a fault's end), and
	// the campaign leaves at least 2 s between faults.
	delayed := func(bound int64) int64 {
		b := bound
		for _, e := range events {
			if e.Start < bound {
				if e.End == 0 {
					return math.MaxInt64
				}
				b = max(b, satAdd(e.End, afterFault))
			}
		}
		return b
	}
	// ended: the earliest instant the holder's hold can be over, at its
	// lease's end; a ghost's also once its connection was gone and it was
	// released as undeliverable (at any time, if that was not recorded).
	ended := func(s lockState) int64 {
		end := max(satAdd(s.hCall, s.lease), s.hUntil)
		if s.holder == ghost {
			// Released as undeliverable, but never before it began: its
			// hold, dated from the hold before it, cannot end that one's.
			if s.hLost == 0 {
				return s.hCall
			}
			end = max(s.hCall, min(end, s.hLost-lostMargin))
		}
		return end
	}
	canEnd := func(s lockState, ret int64) bool { return ended(s) <= ret }
	held := func(s lockState, at int64) bool {
		if s.holder == 0 {
			return false
		}
		if single && s.holder != ghost {
			return at < satAdd(satAdd(s.hRet, s.lease), s.ext)
		}
		end := satAdd(satAdd(s.hBy, s.lease), s.ext) // single mode: an unknown grant
		if !single {
			// Held until its Expire commits: a skew after its end on the
			// leader's clock, later by what a lagging leader applied late.
			end = satAdd(satAdd(s.hBy, s.lease), cfg.Skew+maxLate+clusterSlack)
		}
		return at < delayed(end)
	}
	step := func(st, inp, outp any) []any {
		s, in, out := st.(lockState), inp.(lockIn), outp.(lockOut)
		at := max(s.now, in.call)
		if at > in.ret {
			return nil // it took effect before it returned: not after these
		}
		same := s
		same.now = at
		free := lockState{last: s.last, graceUntil: s.graceUntil, now: at}
		switch in.kind {
		case 'C':
			n := same
			if n.holder != 0 {
				n.forgotten = true
			}
			n.graceUntil = max(n.graceUntil, satAdd(max(in.ret, in.restarted), cfg.MaxLease+crashGrace))
			return []any{n}
		case 'S':
			n := same
			if n.holder != 0 {
				n.ext = satAdd(n.ext, in.ret-in.call)
			}
			if n.graceUntil > in.call {
				n.graceUntil = satAdd(n.graceUntil, in.ret-in.call)
			}
			return []any{n}
		case 'A':
			canGrant := s.holder == 0 || canEnd(s, in.ret)
			grant := func(tok uint64) lockState {
				// A grant over a holder took effect no earlier than that
				// hold's end, and its own lease counts from there.
				start := at
				if s.holder != 0 {
					start = max(start, ended(s))
				}
				// Operations placed after it took effect after it did.
				n := lockState{holder: tok, hCall: start, hRet: in.ret, hBy: in.ret, lease: in.lease, last: s.last, graceUntil: s.graceUntil, now: start}
				if tok == ghost {
					n.hLost, n.hBy = in.lost, max(start, delayed(grantedBy(in, single, maxLate)))
				} else {
					n.last, n.hUntil = tok, in.until
				}
				return n
			}
			switch out.res {
			case ResGranted:
				if canGrant && out.token > s.last {
					return []any{grant(out.token)}
				}
				return nil
			case ResTimedOut:
				if held(s, at) || (single && at < s.graceUntil) {
					return []any{same}
				}
				return nil
			case ResBusy:
				return []any{same}
			default: // unknown: not carried out, or granted with a token never seen
				// Not granted later than its bound: a ghost placed after
				// operations that came later, or over a hold that ends
				// later, was not granted there. A cluster may commit the
				// acquire, and then the hand-over, each late.
				latest := delayed(grantedBy(in, single, maxLate))
				if !single {
					latest = satAdd(latest, maxLate)
				}
				if canGrant && max(at, ended(s)) <= latest {
					return []any{same, grant(ghost)}
				}
				return []any{same}
			}
		case 'R':
			mine := s.holder == in.token && !s.forgotten
			switch out.res {
			case ResReleased:
				if mine {
					return []any{free}
				}
				return nil
			case ResNotReleased:
				if !mine {
					return []any{same}
				}
				if canEnd(s, in.ret) { // expired and gone: not before the lease ended
					f := free
					f.now = max(at, ended(s))
					return []any{f}
				}
				return nil
			default:
				if mine {
					return []any{same, free}
				}
				return []any{same}
			}
		}
		return nil
	}
	nm := &porcupine.NondeterministicModel{
		Init: func() []any { return []any{lockState{}} },
		Step: step,
		DescribeOperation: func(inp, outp any) string {
			in, out := inp.(lockIn), outp.(lockOut)
			if in.op == nil && in.kind == 'S' {
				return "clean restart"
			}
			if in.op == nil {
				return "crash"
			}
			return fmt.Sprintf("%s -> %s %d", in.op.String(), out.res, out.token)
		},
	}
	return nm.ToModel()
}

// registerModel: a register that keeps the largest token written and
// refuses lower ones.
func registerModel() porcupine.Model {
	return porcupine.Model{
		Init: func() any { return uint64(0) },
		Step: func(st, inp, outp any) (bool, any) {
			cur, tok, ok := st.(uint64), inp.(uint64), outp.(bool)
			if ok {
				return tok >= cur, max(cur, tok)
			}
			return tok < cur, cur
		},
	}
}

func checkLinearizable(h *History, byKey map[string][]*Op, keys []string, crashes []*Event, hd *holds, cfg CheckConfig, r *CheckResult) {
	model := lockModel(cfg, h.Events)
	reg := registerModel()
	var lockHist, regHist [][]porcupine.Operation
	var lockKeys, regKeys []string
	for _, k := range keys {
		var lh, rh []porcupine.Operation
		for _, o := range byKey[k] {
			ret := o.Complete
			if ret < 0 {
				ret = math.MaxInt64
			}
			switch o.Kind {
			case 'A', 'R':
				lh = append(lh, porcupine.Operation{ClientId: o.Worker, Call: o.Invoke, Return: ret,
					Input: lockIn{kind: o.Kind, token: o.Token, lease: int64(o.LeaseMs) * int64(time.Millisecond), call: o.Invoke, ret: ret, lost: o.LostAt, wait: int64(o.WaitMs) * int64(time.Millisecond),
						until: hd.clientEnd(o), op: o},
					Output: lockOut{res: o.Result, token: o.Token}})
			case 'W':
				rh = append(rh, porcupine.Operation{ClientId: o.Worker, Call: o.Invoke, Return: o.Complete,
					Input: o.Token, Output: o.Result == ResAccepted})
			}
		}
		if len(lh) > 0 { // a key's only operation is judged too: a T for a free key
			for _, c := range crashes {
				lh = append(lh, porcupine.Operation{ClientId: -1, Call: c.Start, Return: c.killed(),
					Input: lockIn{kind: 'C', call: c.Start, ret: c.killed(), restarted: c.End}, Output: lockOut{}})
			}
			for _, e := range h.Events {
				if cfg.Mode == "single" && e.Kind == EvRestart && e.End > e.Start {
					lh = append(lh, porcupine.Operation{ClientId: -1, Call: e.Start, Return: e.End,
						Input: lockIn{kind: 'S', call: e.Start, ret: e.End}, Output: lockOut{}})
				}
			}
			sort.SliceStable(lh, func(i, j int) bool { return lh[i].Call < lh[j].Call })
			lockHist = append(lockHist, lh)
			lockKeys = append(lockKeys, k)
		}
		if len(rh) > 0 {
			regHist = append(regHist, rh)
			regKeys = append(regKeys, k)
		}
	}
	run := func(name string, m porcupine.Model, hists [][]porcupine.Operation, ks []string) {
		for i, hist := range hists {
			res, info := porcupine.CheckOperationsVerbose(m, hist, cfg.LinTimeout)
			switch res {
			case porcupine.Illegal:
				v := Violation{Check: name, Key: ks[i], What: "no linearization exists; the longest partial one stops before these operations"}
				v.Ops, v.At = illegalOps(info, hist)
				r.Violations = append(r.Violations, v)
			case porcupine.Unknown:
				r.Undecided = append(r.Undecided, Undecided{Check: name, Key: ks[i], Ops: len(hist), Limit: cfg.LinTimeout})
			}
		}
	}
	run(CheckLinearLock, model, lockHist, lockKeys)
	run(CheckLinearFence, reg, regHist, regKeys)
}

// illegalOps picks, from porcupine's longest partial linearization, the
// operations right after where it got stuck: the first operation (by call)
// not in it, and the few linearized last.
func illegalOps(info porcupine.LinearizationInfo, hist []porcupine.Operation) ([]*Op, int64) {
	parts := info.PartialLinearizations()
	var best []int
	for _, p := range parts {
		for _, l := range p {
			if len(l) > len(best) {
				best = l
			}
		}
	}
	in := map[int]bool{}
	for _, i := range best {
		in[i] = true
	}
	var ops []*Op
	var at int64
	tail := best
	if len(tail) > 4 {
		tail = tail[len(tail)-4:]
	}
	for _, i := range tail {
		if li, ok := hist[i].Input.(lockIn); ok && li.op != nil {
			ops = append(ops, li.op)
		}
	}
	for i := range hist {
		if !in[i] {
			if li, ok := hist[i].Input.(lockIn); ok && li.op != nil {
				ops = append(ops, li.op)
				at = li.op.Invoke
			}
			break
		}
	}
	return ops, at
}
