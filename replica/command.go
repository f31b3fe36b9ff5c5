package replica

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/ticketd/ticketd/shard"
)

// An entry of a shard's raft log is one batch of commands from one node:
//
//	version(1 byte) node incarnation batchID floor stamp count command*
//
// Integers are uvarints; stamp is a zig-zag varint of unix nanoseconds on
// the proposer's clock at this attempt (a retry is stamped anew, so that a
// lease granted by a batch that committed late on a retry still runs from
// about its grant; the leader covers any other lateness, fsm.covers). floor is the proposer's lowest batch id still unresolved (in
// flight) for this shard: every id below it committed or was given up, so a
// replica forgets them and refuses them from then on. batchID numbers the proposals of one
// incarnation of one node to one shard from 1 up; 0 marks a batch whose
// commands are harmless to apply twice (the leader's Expire and WaitTimeout),
// which is not remembered for deduplication. A batch with id 0 and no
// commands is a notice; its floor tells which. Notices of the hand-over of
// the shard's leadership (see Node.quiesce) change no state:
// noticeHandOver, from the leader about to hand over, or noticeDrained,
// from a node that holds its proposals to the shard and has none in
// flight. noticeSettings is followed by its proposer's settings,
//
//	shards maxKeys maxWaiters maxWaitersPerKey
//
// and the first one applied becomes the shard's (see fsm.settings).
// noticeLimits, followed likewise, changes the shard's limits from there on
// (Node.SetLimits). A command is its Op byte, then:
//
//	acquire       conn seq owner key leaseMs waitMs
//	release       conn seq key token
//	expire        key token            (an older ticketd's: any deadline)
//	expire-at     key token deadline   (deadline: a zig-zag varint, the lease end it was made for)
//	wait-timeout  node conn seq key
//	withdraw      conn
//	withdraw-below node conn  (the leader's: the acquires queued by node's incarnations below conn's)
//	renew         conn seq owner key token leaseMs allowMs
//
// Byte strings are a uvarint length and the bytes. Requests carry the
// proposer's node id implicitly: From.Node of an acquire, release or withdraw
// is the batch's node.
const entryVersion = 1

const (
	noticeHandOver = 0
	noticeDrained  = 1
	noticeSettings = 2
	noticeLimits   = 3
)

// settings are the flags that decide what a shard's replicas answer: the
// shard count, which routes keys to shards, the limits, which decide B
// (totals over the cluster, as given on the command line), and the clock
// skew, which decides when a leader ends a lease.
type settings struct {
	shards int
	limits
	skew int64 // nanoseconds; 0: not announced (a notice of an older ticketd)
}

func (s settings) String() string {
	str := fmt.Sprintf("--shards %d --max-keys %d --max-waiters %d --max-waiters-per-key %d",
		s.shards, s.MaxKeys, s.MaxWaiters, s.MaxWaitersPerKey)
	if s.skew != 0 {
		str += " --max-clock-skew " + time.Duration(s.skew).String()
	}
	return str
}

// same tells whether s and o may run side by side: the same shards and
// limits, and the same skew unless one of them did not announce it.
func (s settings) same(o settings) bool {
	return s.shards == o.shards && s.limits == o.limits && (s.skew == o.skew || s.skew == 0 || o.skew == 0)
}

// appendSettings encodes s: shards, the three limits, then the skew, which
// a notice of an older ticketd leaves out.
func appendSettings(b []byte, s settings) []byte {
	for _, v := range []int{s.shards, s.MaxKeys, s.MaxWaiters, s.MaxWaitersPerKey} {
		b = binary.AppendUvarint(b, uint64(v))
	}
	return binary.AppendUvarint(b, uint64(s.skew))
}

type header struct {
	node  uint32
	inc   uint64 // incarnation of node
	batch uint64 // 0: not deduplicated
	floor uint64 // lowest batch id the proposer still has in flight
	stamp int64
	count uint64
}

// notice tells an entry of the hand-over and settings protocol (no batch,
// no commands), whose floor is its kind, from a batch.
func (h *header) notice() bool { return h.batch == 0 && h.count == 0 }

func appendHeader(b []byte, h header) []byte {
	b = append(b, entryVersion)
	b = binary.AppendUvarint(b, uint64(h.node))
	b = binary.AppendUvarint(b, h.inc)
	b = binary.AppendUvarint(b, h.batch)
	b = binary.AppendUvarint(b, h.floor)
	b = binary.AppendVarint(b, h.stamp)
	return binary.AppendUvarint(b, h.count)
}

func appendBytes(b, s []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// opExpireAt is the log's code for an expire that names the lease end it
// was made for, which a renewal since makes stale (shard.Command.Deadline).
const opExpireAt = 0x80 | byte(shard.OpExpire)

// appendCommand encodes c; From.Node of requests is left out (it is the batch's).
func appendCommand(b []byte, c *shard.Command) []byte {
	if c.Op == shard.OpExpire && c.Deadline != 0 {
		b = append(b, opExpireAt)
		b = appendBytes(b, c.Key)
		b = binary.AppendUvarint(b, c.Token)
		return binary.AppendVarint(b, c.Deadline)
	}
	b = append(b, byte(c.Op))
	switch c.Op {
	case shard.OpAcquire:
		b = binary.AppendUvarint(b, c.From.Conn)
		b = binary.AppendUvarint(b, c.From.Seq)
		b = appendBytes(b, c.Owner)
		b = appendBytes(b, c.Key)
		b = binary.AppendUvarint(b, c.LeaseMs)
		b = binary.AppendUvarint(b, c.WaitMs)
	case shard.OpRelease:
		b = binary.AppendUvarint(b, c.From.Conn)
		b = binary.AppendUvarint(b, c.From.Seq)
		b = appendBytes(b, c.Key)
		b = binary.AppendUvarint(b, c.Token)
	case shard.OpExpire:
		b = appendBytes(b, c.Key)
		b = binary.AppendUvarint(b, c.Token)
	case shard.OpWaitTimeout:
		b = binary.AppendUvarint(b, uint64(c.From.Node))
		b = binary.AppendUvarint(b, c.From.Conn)
		b = binary.AppendUvarint(b, c.From.Seq)
		b = appendBytes(b, c.Key)
	case shard.OpWithdraw:
		b = binary.AppendUvarint(b, c.From.Conn)
	case shard.OpWithdrawBelow:
		b = binary.AppendUvarint(b, uint64(c.From.Node))
		b = binary.AppendUvarint(b, c.From.Conn)
	case shard.OpRenew:
		b = binary.AppendUvarint(b, c.From.Conn)
		b = binary.AppendUvarint(b, c.From.Seq)
		b = appendBytes(b, c.Owner)
		b = appendBytes(b, c.Key)
		b = binary.AppendUvarint(b, c.Token)
		b = binary.AppendUvarint(b, c.LeaseMs)
		b = binary.AppendUvarint(b, c.WaitMs)
	default:
		panic("replica: cannot encode " + c.Op.String())
	}
	return b
}

var errEntry = errors.New("replica: malformed log entry")

// reader decodes an entry; the first error sticks and every later read
// returns zero values.
type reader struct {
	b   []byte
	err error
}

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = errEntry
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) varint() int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.err = errEntry
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) byte() byte {
	if r.err != nil || len(r.b) == 0 {
		r.err = errEntry
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

// bytes returns a slice into the entry, valid while the entry is.
func (r *reader) bytes() []byte {
	n := r.uvarint()
	if r.err != nil || n > uint64(len(r.b)) {
		r.err = errEntry
		return nil
	}
	s := r.b[:n:n]
	r.b = r.b[n:]
	return s
}

func (r *reader) header() header {
	if v := r.byte(); v != entryVersion && r.err == nil {
		r.err = errors.New("replica: log entry of an unknown version (a newer ticketd wrote it?)")
	}
	h := header{}
	n := r.uvarint()
	if n > 1<<32-1 {
		r.err = errEntry
	}
	h.node = uint32(n)
	h.inc = r.uvarint()
	h.batch = r.uvarint()
	h.floor = r.uvarint()
	h.stamp = r.varint()
	h.count = r.uvarint()
	return h
}

func (r *reader) settings() settings {
	var v [4]int
	for i := range v {
		n := r.uvarint()
		if n > math.MaxInt64 {
			r.err = errEntry
		}
		v[i] = int(n)
	}
	if v[0] == 0 {
		r.err = errEntry // no node runs without shards
	}
	s := settings{shards: v[0], limits: limits{MaxKeys: v[1], MaxWaiters: v[2], MaxWaitersPerKey: v[3]}}
	if len(r.b) > 0 {
		if k := r.uvarint(); k > math.MaxInt64 {
			r.err = errEntry
		} else {
			s.skew = int64(k)
		}
	}
	return s
}

// command decodes the next command into c; slices point into the entry.
func (r *reader) command(node uint32, c *shard.Command) {
	op := r.byte()
	if op == opExpireAt {
		*c = shard.Command{Op: shard.OpExpire, Key: r.bytes(), Token: r.uvarint(), Deadline: r.varint()}
		return
	}
	*c = shard.Command{Op: shard.Op(op)}
	switch c.Op {
	case shard.OpAcquire:
		c.From = shard.Requester{Node: node, Conn: r.uvarint(), Seq: r.uvarint()}
		c.Owner = r.bytes()
		c.Key = r.bytes()
		c.LeaseMs = r.uvarint()
		c.WaitMs = r.uvarint()
	case shard.OpRelease:
		c.From = shard.Requester{Node: node, Conn: r.uvarint(), Seq: r.uvarint()}
		c.Key = r.bytes()
		c.Token = r.uvarint()
	case shard.OpExpire:
		c.Key = r.bytes()
		c.Token = r.uvarint()
	case shard.OpWaitTimeout:
		n := r.uvarint()
		if n > 1<<32-1 {
			r.err = errEntry
		}
		c.From = shard.Requester{Node: uint32(n), Conn: r.uvarint(), Seq: r.uvarint()}
		c.Key = r.bytes()
	case shard.OpWithdraw:
		c.From = shard.Requester{Node: node, Conn: r.uvarint()}
	case shard.OpWithdrawBelow:
		n := r.uvarint()
		if n > 1<<32-1 {
			r.err = errEntry
		}
		c.From = shard.Requester{Node: uint32(n), Conn: r.uvarint()}
	case shard.OpRenew:
		c.From = shard.Requester{Node: node, Conn: r.uvarint(), Seq: r.uvarint()}
		c.Owner = r.bytes()
		c.Key = r.bytes()
		c.Token = r.uvarint()
		c.LeaseMs = r.uvarint()
		c.WaitMs = r.uvarint()
	default:
		if r.err == nil {
			r.err = errEntry
		}
	}
}
