package netloop

import "github.com/ticketd/ticketd/shard"

// Mailboxes finds the open connection with an id; *Server is one. Backends
// are given this, not the whole server, to deliver late answers.
type Mailboxes interface {
	Conn(id uint64) *Conn
}

// Outbox gathers answers decided away from their connections' loops (a
// hand-over, a timer, a commit) and posts them with one Post per connection.
// A grant whose connection has gone comes back through the orphan callback,
// typed, for the mode to release. Not safe for concurrent use: each
// goroutine that decides answers keeps its own.
type Outbox struct {
	conns map[uint64]*connOut
	order []uint64
	free  []*connOut
	gs    []Grant // scratch for PostGrants
}

type connOut struct {
	b      []byte
	n      int
	grants []grantAt
	keys   []byte // the grants' keys, back to back
}

type grantAt struct {
	token    uint64
	off, end int // in keys
}

// Grant is a granted lock: what an orphaned grant's release needs and, for
// a Backend that renews late hand-overs (LateRenewer), the clock reading
// its lease counts from (Since; 0: not renewed) and its deadline, both the
// Backend's. Key is valid only during the callback that is given it.
type Grant struct {
	Token           uint64
	Key             []byte
	Since, Deadline int64
}

// Add encodes a for connection conn.
func (o *Outbox) Add(conn uint64, a *shard.Answer) {
	co := o.conns[conn]
	if co == nil {
		if o.conns == nil {
			o.conns = make(map[uint64]*connOut)
		}
		if k := len(o.free); k > 0 {
			co, o.free = o.free[k-1], o.free[:k-1]
		} else {
			co = &connOut{}
		}
		o.conns[conn] = co
		o.order = append(o.order, conn)
	}
	co.b = AppendAnswer(co.b, a)
	co.n++
	if a.Result == shard.Acquired {
		// The key is copied: a's slices die with the table's next call.
		off := len(co.keys)
		co.keys = append(co.keys, a.Key...)
		co.grants = append(co.grants, grantAt{a.Token, off, len(co.keys)})
	}
}

// Len is the number of connections with answers waiting.
func (o *Outbox) Len() int { return len(o.order) }

// Flush posts everything added, in order per connection, and empties the
// outbox. For each grant whose connection is gone (or mb is nil) it calls
// orphan.
func (o *Outbox) Flush(mb Mailboxes, orphan func(Grant)) {
	for _, id := range o.order {
		co := o.conns[id]
		var c *Conn
		if mb != nil {
			c = mb.Conn(id)
		}
		o.gs = o.gs[:0]
		for _, g := range co.grants {
			o.gs = append(o.gs, Grant{Token: g.token, Key: co.keys[g.off:g.end:g.end]})
		}
		if c == nil || !c.PostGrants(co.b, co.n, o.gs) {
			for _, g := range o.gs {
				orphan(g)
			}
		}
		clear(o.gs) // no key outlives this flush through the scratch
		// One burst must not pin large buffers.
		if cap(co.b) > 64<<10 || cap(co.grants) > 4096 || cap(co.keys) > 64<<10 {
			co.b, co.grants, co.keys = nil, nil, nil
		}
		co.b, co.n, co.grants, co.keys = co.b[:0], 0, co.grants[:0], co.keys[:0]
		if len(o.free) < 256 {
			o.free = append(o.free, co)
		}
	}
	clear(o.conns)
	o.order = o.order[:0]
}
