package shard

import "sync/atomic"

// Budget is a count of registered keys (or queued acquires) shared by several tables, each
// on its own goroutine: it is safe for concurrent use. A table takes one unit when it
// registers a key (queues an acquire) and gives it back when the key is deleted (the acquire
// leaves its queue).
type Budget struct {
	n   atomic.Int64
	max int64
}

// NewBudget returns a budget of max keys; max <= 0: unlimited (only counts).
func NewBudget(max int) *Budget { return &Budget{max: int64(max)} }

// Used is the number of keys currently registered against the budget.
func (b *Budget) Used() int { return int(b.n.Load()) }

// Max is the budget's limit (<= 0: unlimited).
func (b *Budget) Max() int { return int(b.max) }

// take claims one key; false: the budget is spent. A compare-and-swap loop rather than add
// and undo, so that a failed attempt never makes another table's attempt fail too.
func (b *Budget) take() bool {
	for {
		n := b.n.Load()
		if b.max > 0 && n >= b.max {
			return false
		}
		if b.n.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// force claims one key past the limit if need be (restoring a snapshot must not lose keys).
func (b *Budget) force() { b.n.Add(1) }

func (b *Budget) put() { b.n.Add(-1) }
