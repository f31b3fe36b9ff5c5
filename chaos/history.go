// Package chaos is ticketd's fault campaign: it starts ticketd (one process,
// or a 3-node cluster), drives workloads over many raw protocol connections,
// injects faults on a seeded schedule (kill -9, SIGSTOP, clean restarts,
// partitions, clock offsets), records every request with its invoke and
// complete time on one monotonic clock, and checks the history for the
// properties a lock service promises: one holder per key, fencing tokens that
// only grow, acknowledged grants and releases that stay true, and every
// request answered exactly once unless its connection broke.
package chaos

import (
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"time"
)

// Result of an operation. Unknown means the outcome cannot be known: the
// connection broke (or the client gave up) with the request unanswered.
const (
	ResGranted     = "A"
	ResTimedOut    = "T"
	ResBusy        = "B"
	ResReleased    = "R"
	ResNotReleased = "N"
	ResUnknown     = "?"
	ResAccepted    = "ok"      // register write accepted
	ResRefused     = "refused" // register write refused (lower token)
)

// Op is one request in the history. Times are nanoseconds since the
// campaign's start on the campaign's monotonic clock; Complete is -1 while
// the outcome is unknown.
type Op struct {
	ID       int64  `json:"id"`
	Worker   int    `json:"worker"`
	Conn     int    `json:"conn"`
	Node     int    `json:"node"`
	Kind     byte   `json:"kind"` // 'A' acquire, 'R' release, 'W' fenced register write
	Workload string `json:"workload,omitempty"`
	Owner    string `json:"owner,omitempty"`
	Key      string `json:"key"`
	LeaseMs  uint64 `json:"lease_ms,omitempty"`
	WaitMs   uint64 `json:"wait_ms,omitempty"`
	Token    uint64 `json:"token,omitempty"` // A: granted; R: released; W: written
	Invoke   int64  `json:"invoke"`
	Complete int64  `json:"complete"`
	Result   string `json:"result"`
	Why      string `json:"why,omitempty"` // for an unknown outcome
	// For a register write: the grant (op id) whose token is written.
	Grant int64 `json:"grant,omitempty"`
	// A release sent again after the one before it had an unknown outcome.
	Again bool `json:"again,omitempty"`
	// LostAt is when the outcome became unknown: the client closed the
	// connection or saw it closed. A grant the server makes after it finds
	// the connection gone is released as undeliverable, so an unknown grant
	// can end early only from about then (0: not recorded; any time).
	LostAt int64 `json:"lost_at,omitempty"`
	// For a grant to an acquire that could wait (wait_ms > 0), the Go
	// client's dating of its lease: Start is its send, or the latest send
	// of a request answered before it on its connection if later (0: not
	// recorded). The client holds the key until Start + lease_ms.
	Start int64 `json:"start,omitempty"`
}

// clientDeadline is when the Go client's rule ends g's lease (0: no
// client-rule start recorded).
func (o *Op) clientDeadline() int64 {
	if o.Start == 0 {
		return 0
	}
	return o.Start + int64(o.LeaseMs)*int64(time.Millisecond)
}

// progressed tells whether o was answered with a grant or a release: what
// a shard that serves makes, and one stuck after a fault does not.
func (o *Op) progressed() bool {
	return o.Complete >= 0 && (o.Result == ResGranted || o.Result == ResReleased)
}

func (o *Op) String() string {
	c := "?"
	if o.Complete >= 0 {
		c = fmtT(o.Complete)
	}
	switch o.Kind {
	case 'A':
		s := fmt.Sprintf("#%d [%s..%s] w%d c%d n%d A %s %s lease=%d wait=%d -> %s", o.ID, fmtT(o.Invoke), c, o.Worker, o.Conn, o.Node, o.Owner, o.Key, o.LeaseMs, o.WaitMs, o.Result)
		if o.Result == ResGranted {
			s += fmt.Sprintf(" token=%d", o.Token)
		}
		if o.Start != 0 {
			s += fmt.Sprintf(" start=%s", fmtT(o.Start))
		}
		return s + o.lost()
	case 'R':
		s := fmt.Sprintf("#%d [%s..%s] w%d c%d n%d R %d %s -> %s", o.ID, fmtT(o.Invoke), c, o.Worker, o.Conn, o.Node, o.Token, o.Key, o.Result)
		return s + o.lost()
	default:
		return fmt.Sprintf("#%d [%s..%s] w%d register %s write token=%d (grant #%d) -> %s", o.ID, fmtT(o.Invoke), c, o.Worker, o.Key, o.Token, o.Grant, o.Result)
	}
}

// lost says why and when an outcome became unknown.
func (o *Op) lost() string {
	switch {
	case o.Why == "":
		return ""
	case o.LostAt > 0:
		return " (" + o.Why + ", at " + fmtT(o.LostAt) + ")"
	}
	return " (" + o.Why + ")"
}

// Event is a fault or a process action, with the window it covered.
type Event struct {
	Start int64 `json:"start"`
	End   int64 `json:"end"`
	// Killed is, for a crash, when the killed process had exited (the node
	// is restarted after that, and End is once it listens again); 0 in
	// histories that did not record it.
	Killed int64  `json:"killed,omitempty"`
	Kind   string `json:"kind"` // see the Ev* constants
	Nodes  []int  `json:"nodes,omitempty"`
	Detail string `json:"detail,omitempty"`
}

// killed is when a crash's process had certainly died: Killed, or End in
// histories without it.
func (e *Event) killed() int64 {
	if e.Killed > 0 {
		return e.Killed
	}
	return e.End
}

// Event kinds. A crash is kill -9 through the restart that follows.
const (
	EvCrash     = "crash"      // kill -9, then restart on the same data dir
	EvPause     = "pause"      // SIGSTOP ... SIGCONT
	EvRestart   = "restart"    // SIGTERM, then restart (clean)
	EvPartition = "partition"  // network cut between node groups
	EvClock     = "clock"      // a node's clock offset (or jump)
	EvCrashAll  = "crash-all"  // kill -9 of every node, then restart
	EvSlowFsync = "slow-fsync" // every fsync of a node held up (strace)
)

// Anomaly is something the recorder saw that the protocol rules out: an
// answer nobody asked for (a duplicate), or a line it could not parse.
type Anomaly struct {
	At   int64  `json:"at"`
	Conn int    `json:"conn"`
	Node int    `json:"node"`
	What string `json:"what"`
	Line string `json:"line"`
}

// History is what a campaign recorded. It is safe for concurrent use while
// recording.
type History struct {
	mu        sync.Mutex
	start     time.Time
	nextID    int64
	Ops       []*Op      `json:"ops"`
	Events    []*Event   `json:"events"`
	Anomalies []*Anomaly `json:"anomalies"`
	Unavail   []int64    `json:"unavailable"` // times of E unavailable lines
}

// NewHistory starts the campaign clock.
func NewHistory() *History { return &History{start: time.Now()} }

// Now is the campaign clock.
func (h *History) Now() int64 { return int64(time.Since(h.start)) }

// Invoke records the start of op (its Invoke is set now) and returns it.
func (h *History) Invoke(op *Op) *Op {
	h.mu.Lock()
	h.nextID++
	op.ID = h.nextID
	op.Complete = -1
	op.Result = ResUnknown
	op.Invoke = h.Now()
	h.Ops = append(h.Ops, op)
	h.mu.Unlock()
	return op
}

// Complete records op's outcome at time at.
func (h *History) Complete(op *Op, at int64, result string, token uint64) {
	h.complete(op, at, result, token, nil)
}

// complete is Complete that also keeps a connection's floor the way the Go
// client does: a grant that may have waited is dated from its send, or
// from *floor if later, the latest send of a request answered before it on
// the connection; every answer then raises *floor to its request's send.
func (h *History) complete(op *Op, at int64, result string, token uint64, floor *int64) {
	h.mu.Lock()
	op.Complete, op.Result = at, result
	if token != 0 {
		op.Token = token
	}
	if floor != nil {
		if op.Kind == 'A' && op.WaitMs > 0 && result == ResGranted {
			op.Start = max(op.Invoke, *floor)
		}
		*floor = max(*floor, op.Invoke)
	}
	h.mu.Unlock()
}

// Lose marks op's outcome as unknown as of now, after its connection was
// closed or seen closed. The first loss counts.
func (h *History) Lose(op *Op, why string) {
	h.mu.Lock()
	if op.Complete < 0 && op.LostAt == 0 {
		op.Why, op.LostAt = why, h.Now()
	}
	h.mu.Unlock()
}

// Event records a fault window.
func (h *History) Event(e *Event) {
	h.mu.Lock()
	h.Events = append(h.Events, e)
	h.mu.Unlock()
}

// Anomaly records an anomaly.
func (h *History) Anomaly(a *Anomaly) {
	h.mu.Lock()
	h.Anomalies = append(h.Anomalies, a)
	h.mu.Unlock()
}

func (h *History) unavailable(at int64) {
	h.mu.Lock()
	h.Unavail = append(h.Unavail, at)
	h.mu.Unlock()
}

// WriteJSON writes the history, one op per line after a header of events,
// anomalies and the times of E unavailable.
func (h *History) WriteJSON(w io.Writer) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	enc := json.NewEncoder(w)
	for _, e := range h.Events {
		if err := enc.Encode(map[string]any{"event": e}); err != nil {
			return err
		}
	}
	for _, a := range h.Anomalies {
		if err := enc.Encode(map[string]any{"anomaly": a}); err != nil {
			return err
		}
	}
	if len(h.Unavail) > 0 {
		if err := enc.Encode(map[string]any{"unavailable": h.Unavail}); err != nil {
			return err
		}
	}
	for _, o := range h.Ops {
		if err := enc.Encode(o); err != nil {
			return err
		}
	}
	return nil
}

func fmtT(ns int64) string { return fmt.Sprintf("%.3fs", float64(ns)/1e9) }

// ReadHistory reads a history written by a campaign (gzip'd JSON lines:
// optionally the campaign's config, then events, anomalies, the times of E
// unavailable and operations).
func ReadHistory(r io.Reader) (*History, *Config, error) {
	h := &History{}
	var cfg *Config
	dec := json.NewDecoder(r)
	for {
		var line struct {
			Config  *Config  `json:"config"`
			Event   *Event   `json:"event"`
			Anomaly *Anomaly `json:"anomaly"`
			Unavail []int64  `json:"unavailable"`
			Op
		}
		line.Op.Complete = -2
		if err := dec.Decode(&line); err == io.EOF {
			break
		} else if err != nil {
			return nil, nil, err
		}
		switch {
		case line.Config != nil:
			cfg = line.Config
		case line.Event != nil:
			h.Events = append(h.Events, line.Event)
		case line.Anomaly != nil:
			h.Anomalies = append(h.Anomalies, line.Anomaly)
		case line.Unavail != nil:
			h.Unavail = append(h.Unavail, line.Unavail...)
		case line.Op.Complete != -2:
			op := line.Op
			h.Ops = append(h.Ops, &op)
		}
	}
	return h, cfg, nil
}
