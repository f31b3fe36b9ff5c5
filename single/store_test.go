package single

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A damaged data dir stops the start with an error that says so, instead of
// serving from state that cannot be trusted.
func TestCorruptDataDir(t *testing.T) {
	dir := t.TempDir()
	r, err := Open(Options{DataDir: dir, Shards: 2, SweepInterval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	manifests, _ := filepath.Glob(filepath.Join(dir, "MANIFEST-*"))
	if len(manifests) == 0 {
		t.Fatal("no MANIFEST in the data dir")
	}
	for _, m := range manifests {
		if err := os.WriteFile(m, []byte("not a manifest at all"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	_, err = Open(Options{DataDir: dir, Shards: 2, SweepInterval: time.Second})
	if err == nil || !strings.Contains(err.Error(), "corrupt") || !strings.Contains(err.Error(), dir) {
		t.Fatalf("open of a corrupt data dir: %v; want an error naming the dir and saying corrupt", err)
	}
}

func TestDataDirThatIsAFile(t *testing.T) {
	f := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(f, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(Options{DataDir: f, Shards: 1, SweepInterval: time.Second}); err == nil || !strings.Contains(err.Error(), f) {
		t.Fatalf("open of a file as data dir: %v; want an error naming it", err)
	}
}
