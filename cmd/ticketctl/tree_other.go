//go:build !linux

package main

import "syscall"

// Without /proc and a subreaper, --kill-on-expiry signals the command's own
// process only (see tree_linux.go).

func becomeSubreaper()               {}
func descendants() []int             { return nil }
func signalTree(syscall.Signal, int) {}
func reapOrphans(int)                {}
