// Package atomicfile provides the one way ticketd replaces a small file so that
// a crash leaves the old contents or the new, never a torn mix.
package atomicfile

import (
	"os"
	"path/filepath"
)

// Write writes parts to path whole: into path+".tmp" beside it, synced,
// renamed into place, and the directory synced. On failure the temporary
// file is removed and path is as it was.
func Write(path string, parts ...[]byte) error {
	tmp := path + ".tmp"
	err := func() error {
		f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
		if err != nil {
			return err
		}
		for _, p := range parts {
			if _, err := f.Write(p); err != nil {
				_ = f.Close()
				return err
			}
		}
		if err := f.Sync(); err != nil {
			_ = f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
		return os.Rename(tmp, path)
	}()
	if err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return SyncDir(filepath.Dir(path))
}

// SyncDir makes the directory's entries (a rename, a new file) durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// MkdirAll is os.MkdirAll that also makes every directory it creates
// durable, by syncing the parent of each: a data dir whose entry a power
// loss took away would be taken for a new one at the next start, with
// everything it made durable gone with it.
func MkdirAll(dir string, perm os.FileMode) error {
	var created []string
	for d := filepath.Clean(dir); ; {
		if _, err := os.Lstat(d); err == nil {
			break
		}
		created = append(created, d)
		parent := filepath.Dir(d)
		if parent == d {
			break
		}
		d = parent
	}
	if err := os.MkdirAll(dir, perm); err != nil {
		return err
	}
	for i := len(created) - 1; i >= 0; i-- {
		if err := syncDir(filepath.Dir(created[i])); err != nil {
			return err
		}
	}
	return nil
}

var syncDir = SyncDir // tests record the calls

// LostFound is the number of entries in dir's lost+found, as far as they
// can be read (0: none, no lost+found, or one this process may not list).
// A data dir that looks new while its file system's check has put entries
// there may be a used one whose files it moved: starting it as new would
// forget the grants and tokens they recorded.
func LostFound(dir string) int {
	es, _ := os.ReadDir(filepath.Join(dir, "lost+found"))
	return len(es)
}
