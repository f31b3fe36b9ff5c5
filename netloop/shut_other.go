//go:build !unix

package netloop

// shutWrite is a no-op here: a lingering connection is closed when its
// client closes, or after lingerFor.
func shutWrite(int) error { return nil }
