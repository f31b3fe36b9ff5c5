package main

import (
	"bytes"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// runTicketd runs a ticketd process that is expected to stop by itself,
// and returns its exit code and output.
func runTicketd(t *testing.T, nofile int, args ...string) (int, string) {
	t.Helper()
	cmd := helperCommand(nofile, args...)
	var out bytes.Buffer
	cmd.Stderr = &out
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), out.String()
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0, out.String()
}

// dirFiles maps each file under dir to its contents.
func dirFiles(t *testing.T, dir string) map[string]string {
	t.Helper()
	files := map[string]string{}
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		files[strings.TrimPrefix(path, dir)] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// A start that cannot listen (the port taken, a typo) stops before the
// data dir is touched: a clean shutdown's snapshot is still there for the
// next start, which holds the same keys.
func TestAStartThatCannotListenLeavesTheDataDir(t *testing.T) {
	dir := t.TempDir()
	s := startServer(t, 1024, "--data-dir", dir)
	if a, err := acquire(s.lock, "kept"); err != nil || !strings.HasPrefix(a, "A ") {
		t.Fatalf("acquire: %q, %v", a, err)
	}
	s.stop(t, 30*time.Second)
	before := dirFiles(t, dir)

	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	for _, addr := range []string{taken.Addr().String(), "999.1.1.1:1"} {
		code, out := runTicketd(t, 1024, "--listen", addr, "--data-dir", dir)
		if code != 1 || !strings.Contains(out, "cannot listen on --listen") {
			t.Fatalf("--listen %s: exit %d, want 1 naming --listen; output:\n%s", addr, code, out)
		}
		if after := dirFiles(t, dir); !maps.Equal(before, after) {
			t.Fatalf("--listen %s changed the data dir: %d files before, %d after", addr, len(before), len(after))
		}
	}

	s = startServer(t, 1024, "--data-dir", dir)
	if !strings.Contains(s.log.String(), "restored locks from clean shutdown") {
		t.Errorf("the next start did not restore the snapshot:\n%s", s.log.String())
	}
	if a, err := acquire(s.lock, "kept"); err != nil || !strings.HasPrefix(a, "T") {
		t.Errorf("acquire of the key held before: %q, %v; want T (still held)", a, err)
	}
}

// Under a descriptor limit too small for the reserve, --max-conns takes
// the same floor as its default: an explicit value under it starts, one
// above it is refused with a bound that makes sense.
func TestMaxConnsUnderASmallDescriptorLimit(t *testing.T) {
	s := startServer(t, 100, "--max-conns", "10")
	if !strings.Contains(s.log.String(), `"max_conns":10`) {
		t.Errorf("want max_conns 10 in the listening line:\n%s", s.log.String())
	}
	s.stop(t, 30*time.Second)
	code, out := runTicketd(t, 100, "--listen", "127.0.0.1:0", "--data-dir", t.TempDir(), "--max-conns", "17")
	if code != 2 || !strings.Contains(out, "at most 16;") {
		t.Errorf("--max-conns 17 under 100 descriptors: exit %d, want 2 and \"at most 16\"; output:\n%s", code, out)
	}
}
