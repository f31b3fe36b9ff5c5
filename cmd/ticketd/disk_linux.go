package main

import "golang.org/x/sys/unix"

// freeSpace is what an unprivileged writer may still use of dir's
// filesystem, and its size (Linux counts blocks in fragment-size units,
// as df does).
func freeSpace(dir string) (free, total uint64, err error) {
	var s unix.Statfs_t
	if err := unix.Statfs(dir, &s); err != nil {
		return 0, 0, err
	}
	return s.Bavail * uint64(s.Frsize), s.Blocks * uint64(s.Frsize), nil
}
