package shard

// TimeoutWaiters answers T to every queued acquire and drops it; holders
// keep their keys. Single mode calls it at a clean shutdown, so that no
// client is left waiting on a server that is going away. The answers' order
// is unspecified.
func (t *Table) TimeoutWaiters(out []Answer) []Answer {
	for _, w := range t.conns {
		for w != nil {
			next, e := w.cnext, w.e
			out = t.timeOut(w, out)
			t.settle(e)
			w = next
		}
	}
	return out
}
