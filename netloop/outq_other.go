//go:build !linux

package netloop

// unacked is unknown here: a lingering connection is closed when its
// client closes, or after lingerFor.
func unacked(int) int { return -1 }
