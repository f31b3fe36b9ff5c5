package client

import "time"

// SetRecentFailure sets how long an address whose connection broke goes
// last, and returns the value before.
func SetRecentFailure(d time.Duration) time.Duration {
	old := recentFailure
	recentFailure = d
	return old
}
