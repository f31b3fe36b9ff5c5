package client

import "time"

// SetRecentFailure sets how long an address whose connection broke goes
// last, and returns the value before.
func SetRecentFailure(d time.Duration) time.Duration {
	old := recentFailure
	recentFailure = d
	return old
}

// SetGoHome sets how often a connection off its own address tries to go
// back, and how long it waits for its requests to drain; it returns a
// func that restores both.
func SetGoHome(after, limit time.Duration) (restore func()) {
	a, l := goHomeAfter, drainLimit
	goHomeAfter, drainLimit = after, limit
	return func() { goHomeAfter, drainLimit = a, l }
}

// SetBeforeMoveHome sets a func to run when a move home is decided, before
// the connection home takes the old one's place; it returns a func that
// removes it.
func SetBeforeMoveHome(fn func()) (restore func()) {
	beforeMoveHome = fn
	return func() { beforeMoveHome = nil }
}

// SetHeldFailing sets a func to run as held releases are about to fail; it
// returns a func that removes it.
func SetHeldFailing(fn func()) (restore func()) {
	heldFailing = fn
	return func() { heldFailing = nil }
}
