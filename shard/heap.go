package shard

import "bytes"

// timer is a deadline: a queued acquire's wait end (w != nil) or a key's lease end (e).
// Its owner records the timer's heap position, so a timer leaves the heap the moment it no
// longer matches the table (waiter answered or withdrawn, key handed over or deleted): the
// heap holds exactly the live timers, however long the waits and however high the
// hand-over rate.
type timer struct {
	at  int64
	tie uint64 // lease: the holder's token; wait: the waiter's arrival number
	e   *entry
	w   *waiter
}

// timerHeap is a binary min-heap indexed by its owners (entry.hidx, waiter.hidx).
type timerHeap []timer

// less is a total order, so timers pop in the same order whatever the history of the heap
// (a table restored from a snapshot acts like the original): deadline, then wait timeouts
// before lease ends, then token or arrival, then key (several grace phantoms share token 0).
func (h timerHeap) less(i, j int) bool {
	a, b := &h[i], &h[j]
	if a.at != b.at {
		return a.at < b.at
	}
	if (a.w != nil) != (b.w != nil) {
		return a.w != nil
	}
	if a.tie != b.tie {
		return a.tie < b.tie
	}
	if a.w == nil {
		return bytes.Compare(a.e.key, b.e.key) < 0
	}
	return false
}

func (h timerHeap) setIdx(i int) {
	if h[i].w != nil {
		h[i].w.hidx = i
	} else {
		h[i].e.hidx = i
	}
}

func (h timerHeap) swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h.setIdx(i)
	h.setIdx(j)
}

func (h *timerHeap) push(tm timer) {
	*h = append(*h, tm)
	i := len(*h) - 1
	h.setIdx(i)
	h.up(i)
}

// remove takes out the timer at position i and clears its owner's position.
func (h *timerHeap) remove(i int) {
	s := *h
	n := len(s) - 1
	if s[i].w != nil {
		s[i].w.hidx = -1
	} else {
		s[i].e.hidx = -1
	}
	if i != n {
		s[i] = s[n]
		s.setIdx(i)
	}
	s[n] = timer{}
	*h = s[:n]
	if i != n {
		h.fix(i)
	}
}

// fix restores the heap after the timer at i changed.
func (h timerHeap) fix(i int) {
	if !h.down(i) {
		h.up(i)
	}
}

func (h timerHeap) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !h.less(i, p) {
			return
		}
		h.swap(i, p)
		i = p
	}
}

func (h timerHeap) down(i int) bool {
	start := i
	for {
		l := 2*i + 1
		if l >= len(h) {
			break
		}
		m := l
		if r := l + 1; r < len(h) && h.less(r, l) {
			m = r
		}
		if !h.less(m, i) {
			break
		}
		h.swap(i, m)
		i = m
	}
	return i > start
}
