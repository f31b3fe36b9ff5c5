package redial

import (
	"slices"
	"testing"
	"time"
)

func TestOrder(t *testing.T) {
	now := time.Now()
	ago := func(d time.Duration) time.Time { return now.Add(-d) }
	var never time.Time
	old := ago(RecentFailure + time.Second)
	for _, tc := range []struct {
		name     string
		home     int
		failed   int
		failedAt []time.Time
		want     []int
	}{
		{"one address", 0, -1, []time.Time{never}, []int{0}},
		{"one address, broke", 0, 0, []time.Time{ago(0)}, []int{0}},
		{"first dial", 0, -1, []time.Time{never, never, never}, []int{0, 1, 2}},
		{"first dial, home 1", 1, -1, []time.Time{never, never, never}, []int{1, 2, 0}},
		{"its own broke: the next one, its own last", 0, 0, []time.Time{ago(0), never, never}, []int{1, 2, 0}},
		{"moved to 1, which broke: home first", 0, 1, []time.Time{old, ago(0), never}, []int{0, 2, 1}},
		{"moved to 2, which broke", 0, 2, []time.Time{old, never, ago(0)}, []int{0, 1, 2}},
		{"home 2, 0 broke", 2, 0, []time.Time{ago(0), never, never}, []int{2, 1, 0}},
		{"five addresses", 1, 3, []time.Time{never, old, never, ago(0), never}, []int{1, 4, 0, 2, 3}},
		// A bridge: its own broke, then the next one: the third, then the
		// two that broke, the earlier first.
		{"own and next broke", 0, 1, []time.Time{ago(2 * time.Second), ago(0), never}, []int{2, 0, 1}},
		{"all broke", 0, 1, []time.Time{ago(time.Second), ago(0), ago(2 * time.Second)}, []int{2, 0, 1}},
		{"failures forgotten", 0, 1, []time.Time{old, old, never}, []int{0, 2, 1}},
	} {
		if got := Order(tc.home, tc.failed, tc.failedAt, now, RecentFailure); !slices.Equal(got, tc.want) {
			t.Errorf("%s: Order(home %d, failed %d) = %v, want %v", tc.name, tc.home, tc.failed, got, tc.want)
		}
	}
}

func TestHome(t *testing.T) {
	var h Home // Every 0: GoHomeAfter
	now := time.Now()
	if h.After() != GoHomeAfter {
		t.Fatalf("first wait %v, want %v", h.After(), GoHomeAfter)
	}
	// Back home, failed at once, again and again: the wait doubles, to 32x.
	for i, want := range []time.Duration{2, 4, 8, 16, 32, 32} {
		h.Arrived(now)
		now = now.Add(time.Second)
		h.Broke(now, true)
		if got := h.After(); got != want*GoHomeAfter {
			t.Fatalf("after %d quick failures: %v, want %v", i+1, got, want*GoHomeAfter)
		}
	}
	// A break off home changes nothing; a long stay at home resets it.
	h.Broke(now, false)
	if got := h.After(); got != 32*GoHomeAfter {
		t.Fatalf("after a break off home: %v, want %v", got, 32*GoHomeAfter)
	}
	h.Arrived(now)
	h.Broke(now.Add(GoHomeAfter), true)
	if got := h.After(); got != GoHomeAfter {
		t.Fatalf("after a long stay: %v, want %v", got, GoHomeAfter)
	}
}
