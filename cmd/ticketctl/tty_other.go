//go:build !unix

package main

// ctty: no process groups here; every signal is passed on.
type ctty struct{}

func openTTY() *ctty           { return nil }
func (*ctty) close()           {}
func (*ctty) foreground() bool { return false }

func stdoutClosedAtStart() bool { return false }
