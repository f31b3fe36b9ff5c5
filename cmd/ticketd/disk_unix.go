//go:build unix && !linux

package main

import "golang.org/x/sys/unix"

// freeSpace is what an unprivileged writer may still use of dir's
// filesystem, and its size.
func freeSpace(dir string) (free, total uint64, err error) {
	var s unix.Statfs_t
	if err := unix.Statfs(dir, &s); err != nil {
		return 0, 0, err
	}
	// Signed on some systems, and below 0 when root's reserve is in use.
	return uint64(max(int64(s.Bavail), 0)) * uint64(s.Bsize), uint64(s.Blocks) * uint64(s.Bsize), nil
}
