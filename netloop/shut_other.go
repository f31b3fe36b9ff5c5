//go:build !unix

package netloop

import "errors"

// shutWrite is a no-op here: a lingering connection is closed when its
// client closes, or after lingerFor.
func shutWrite(int) error { return nil }

// dupFD is not offered here: the output unsent at a close is released.
func dupFD(int) (int, error) { return -1, errors.New("not supported") }
