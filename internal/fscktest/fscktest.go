// Package fscktest plays, for tests, what a file system check leaves of a
// directory whose entries it found without a parent.
package fscktest

import (
	"fmt"
	"os"
	"path/filepath"
)

// IntoLostFound moves everything in dir into dir/lost+found, under the
// names fsck gives such files (#inode).
func IntoLostFound(dir string) error {
	lf := filepath.Join(dir, "lost+found")
	if err := os.MkdirAll(lf, 0o700); err != nil {
		return err
	}
	es, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for i, e := range es {
		if e.Name() != "lost+found" {
			if err := os.Rename(filepath.Join(dir, e.Name()), filepath.Join(lf, fmt.Sprintf("#%d", 1200+i))); err != nil {
				return err
			}
		}
	}
	return nil
}
