// Package redial decides where a client connection goes, for the Go
// client and the fault campaign's workers alike: the order in which a
// broken one tries the addresses, and when one off its own goes back.
package redial

import (
	"slices"
	"time"
)

// RecentFailure is how long an address whose connection broke goes after
// the others.
const RecentFailure = 5 * time.Second

// GoHomeAfter is how often a connection that is not on its own address
// tries to go back there.
const GoHomeAfter = 10 * time.Second

// Order is the order in which a connection tries its addresses (one per
// entry of failedAt, the time each one's connection last broke). The one
// whose connection broke last (failed; -1: none), and any that broke within
// recent of now, go last, the latest last: a cluster node that broke the
// connection (it stopped, or answered E unavailable: no quorum or no leader
// there for some shard) is the one to avoid. Before them: its own (home)
// first, then the others in turn after failed. So a connection that moved
// off its own node goes back there at its next break, and a rolling restart
// (nodes 1, 2, 3 in turn) does not leave every connection of every client
// on one node; and where two nodes fail it (a bridge: two nodes cut apart,
// each without a leader for the shards the other leads) it goes to the
// third rather than back and forth between them.
func Order(home, failed int, failedAt []time.Time, now time.Time, recent time.Duration) []int {
	n := len(failedAt)
	avoid := func(j int) bool {
		return j == failed || !failedAt[j].IsZero() && now.Sub(failedAt[j]) < recent
	}
	order := make([]int, 0, n)
	if !avoid(home) {
		order = append(order, home)
	}
	from := failed
	if failed < 0 {
		from = home
	}
	for k := 1; k <= n; k++ {
		if j := (from + k) % n; j != home && !avoid(j) {
			order = append(order, j)
		}
	}
	late := len(order)
	for j := range n {
		if avoid(j) {
			order = append(order, j)
		}
	}
	slices.SortStableFunc(order[late:], func(a, b int) int { return failedAt[a].Compare(failedAt[b]) })
	return order
}

// Home paces a connection's returns to its own address. A return that
// ends in a break within Every (the node accepts connections but cannot
// serve: cut off from the leader, say) doubles the time to the next one,
// up to 32 times Every; a stay at home that lasts resets it. So a
// connection does not go back every 10 s to a node that fails each request
// it is sent for minutes on end.
type Home struct {
	Every     time.Duration // 0: GoHomeAfter
	doublings int
	arrived   time.Time
}

func (h *Home) every() time.Duration {
	if h.Every > 0 {
		return h.Every
	}
	return GoHomeAfter
}

// After is how long to wait, off home, before trying to return.
func (h *Home) After() time.Duration { return h.every() << h.doublings }

// Arrived records a return home at now.
func (h *Home) Arrived(now time.Time) { h.arrived = now }

// Broke records that the connection broke at now, on its own address
// (atHome) or not.
func (h *Home) Broke(now time.Time, atHome bool) {
	switch {
	case !atHome || h.arrived.IsZero():
	case now.Sub(h.arrived) < h.every():
		h.doublings = min(h.doublings+1, 5)
	default:
		h.doublings = 0
	}
	h.arrived = time.Time{}
}
