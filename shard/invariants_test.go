package shard

import (
	"fmt"
)

// checkTable verifies the table's internal bookkeeping: key index, counts, queues, connection
// lists, the indexed heap and the rule for which lease timers exist.
func checkTable(t *Table) error {
	nwait := 0
	timers := 0
	var ents []*entry
	t.keys.each(func(e *entry) { ents = append(ents, e) })
	if len(ents) != t.keys.len() {
		return fmt.Errorf("key index holds %d entries, counts %d", len(ents), t.keys.len())
	}
	for _, e := range ents {
		k := string(e.key)
		if t.keys.get(e.key) != e {
			return fmt.Errorf("key index does not find %q", k)
		}
		if !e.live {
			return fmt.Errorf("%q is in the key index but not registered", k)
		}
		if e.token == 0 && e.nwait == 0 {
			return fmt.Errorf("grace phantom %q without waiters", k)
		}
		if e.token > t.last {
			return fmt.Errorf("%q token %d above last %d", k, e.token, t.last)
		}
		n := 0
		var prev *waiter
		for w := e.head; w != nil; w = w.next {
			n++
			if w.e != e || w.prev != prev {
				return fmt.Errorf("%q queue links broken", k)
			}
			if prev != nil && prev.id >= w.id {
				return fmt.Errorf("%q queue not in arrival order", k)
			}
			if w.hidx < 0 || w.hidx >= len(t.heap) || t.heap[w.hidx].w != w || t.heap[w.hidx].at != w.wait {
				return fmt.Errorf("%q waiter %v wait timer missing", k, w.from)
			}
			if w.id >= t.nextID {
				return fmt.Errorf("waiter id %d not below next %d", w.id, t.nextID)
			}
			found := false
			for c := t.conns[connID{w.from.Node, w.from.Conn}]; c != nil; c = c.cnext {
				if c == w {
					found = true
				}
			}
			if !found {
				return fmt.Errorf("%q waiter %v not on its connection list", k, w.from)
			}
			prev = w
			timers++
		}
		if prev != e.tail || n != e.nwait {
			return fmt.Errorf("%q tail or count wrong (%d vs %d)", k, n, e.nwait)
		}
		nwait += n
		want := t.cfg.Replicated || e.nwait > 0
		if want != (e.hidx >= 0) {
			return fmt.Errorf("%q lease timer present=%v, want %v", k, e.hidx >= 0, want)
		}
		if e.hidx >= 0 {
			if e.hidx >= len(t.heap) || t.heap[e.hidx].e != e || t.heap[e.hidx].w != nil ||
				t.heap[e.hidx].at != e.deadline || t.heap[e.hidx].tie != e.token {
				return fmt.Errorf("%q lease timer does not match", k)
			}
			timers++
		}
	}
	if nwait != t.nwait {
		return fmt.Errorf("counts waiters=%d/%d", nwait, t.nwait)
	}
	if timers != len(t.heap) {
		return fmt.Errorf("heap holds %d timers, table has %d", len(t.heap), timers)
	}
	for i := 1; i < len(t.heap); i++ {
		if t.heap.less(i, (i-1)/2) {
			return fmt.Errorf("heap order broken at %d", i)
		}
	}
	conns := 0
	for id, w := range t.conns {
		if w == nil || w.cprev != nil {
			return fmt.Errorf("connection %v list head wrong", id)
		}
		head, n := w, 0
		for ; w != nil; w = w.cnext {
			n++
			if (connID{w.from.Node, w.from.Conn}) != id || w.e == nil {
				return fmt.Errorf("connection %v lists a foreign or freed waiter", id)
			}
			if w.cnext != nil && w.cnext.cprev != w {
				return fmt.Errorf("connection %v back link broken", id)
			}
			conns++
		}
		if head.cn != n || t.QueuedOf(id.node, id.conn) != n {
			return fmt.Errorf("connection %v lists %d waiters, its count says %d", id, n, head.cn)
		}
	}
	if conns != nwait {
		return fmt.Errorf("connection lists hold %d waiters, queues %d", conns, nwait)
	}
	return nil
}
