package atomicfile

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestWriteReplacesWhole(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	if err := Write(p, []byte("old")); err != nil {
		t.Fatal(err)
	}
	if err := Write(p, []byte("ne"), []byte("w")); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(p); err != nil || string(b) != "new" {
		t.Fatalf("%q, %v", b, err)
	}
	if _, err := os.Stat(p + ".tmp"); !os.IsNotExist(err) {
		t.Fatalf("temporary file left: %v", err)
	}
	if err := Write(filepath.Join(dir, "missing", "f"), []byte("x")); err == nil {
		t.Fatal("write into a missing dir succeeded")
	}
}

// MkdirAll syncs the parent of every directory it creates, top down, and
// nothing for a directory that was there.
func TestMkdirAllSyncsWhatItCreates(t *testing.T) {
	var synced []string
	syncDir = func(dir string) error { synced = append(synced, dir); return SyncDir(dir) }
	defer func() { syncDir = SyncDir }()
	base := t.TempDir()
	dir := filepath.Join(base, "a", "b", "c")
	if err := MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		t.Fatalf("not created: %v", err)
	}
	want := []string{base, filepath.Join(base, "a"), filepath.Join(base, "a", "b")}
	if !slices.Equal(synced, want) {
		t.Errorf("synced %q, want %q", synced, want)
	}
	synced = nil
	if err := MkdirAll(dir, 0o755); err != nil || len(synced) != 0 {
		t.Errorf("an existing dir: %v, synced %q", err, synced)
	}
}
