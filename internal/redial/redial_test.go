package client

import (
	"slices"
	"testing"
)

func TestDialOrder(t *testing.T) {
	for _, tc := range []struct {
		n, home, failed int
		want            []int
	}{
		{1, 0, -1, []int{0}},
		{1, 0, 0, []int{0}},
		{3, 0, -1, []int{0, 1, 2}},
		{3, 1, -1, []int{1, 2, 0}},
		{3, 0, 0, []int{1, 2, 0}}, // its own broke: the next one, its own last
		{3, 0, 1, []int{0, 2, 1}}, // moved to 1, which broke: home first
		{3, 0, 2, []int{0, 1, 2}},
		{3, 2, 0, []int{2, 1, 0}},
		{5, 1, 3, []int{1, 4, 0, 2, 3}},
	} {
		if got := dialOrder(tc.n, tc.home, tc.failed); !slices.Equal(got, tc.want) {
			t.Errorf("dialOrder(%d, home %d, failed %d) = %v, want %v", tc.n, tc.home, tc.failed, got, tc.want)
		}
	}
}
