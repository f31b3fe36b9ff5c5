package replica

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// snapshotCluster is a one-shard cluster whose node 3 is stopped with a
// snapshot of more than one block (12,000 held keys of 200 bytes): it
// returns the cluster and node 3's latest snapshot file.
func snapshotCluster(t *testing.T) (*testCluster, string) {
	t.Helper()
	c := newTestClusterWith(t, 1, func(o *Options) { o.SnapshotEntries = 50 })
	a := c.dial(0)
	const keys = 12000
	var b strings.Builder
	for i := range keys {
		fmt.Fprintf(&b, "A %0120d %0200d 600000 0\n", i, i)
	}
	if _, err := a.c.Write([]byte(b.String())); err != nil {
		t.Fatal(err)
	}
	for range keys {
		if s, err := a.r.ReadString('\n'); err != nil || s[0] != 'A' {
			t.Fatalf("acquire answered %q, %v", s, err)
		}
	}
	// More entries than SnapshotEntries after the keys, so that the
	// latest snapshot holds them all.
	for i := range 120 {
		a.send(fmt.Sprintf("A o%d small%d 600000 0", i, i))
		if _, err := a.r.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	c.stop(2)
	path, err := latestSnapshot(filepath.Join(c.dirs[2], "raft"), 1, 3)
	if err != nil || path == "" {
		t.Fatalf("node 3 has no snapshot (%q, %v)", path, err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() < snapshotHeaderSize+snapshotBlock+snapshotTail {
		t.Fatalf("the snapshot has %d bytes, one block: the test does not test more", fi.Size())
	}
	return c, path
}

// TestSnapshotCheckReadsDragonboatsFiles holds checkSnapshotFile to the
// files Dragonboat writes: a whole one passes, and each kind of damage is
// named, while a byte in the header's padding, which Dragonboat never
// reads, is not.
func TestSnapshotCheckReadsDragonboatsFiles(t *testing.T) {
	_, path := snapshotCluster(t)
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkSnapshotFile(path); err != nil {
		t.Fatalf("a whole snapshot fails the check: %v", err)
	}
	flip := func(at int) func([]byte) []byte {
		return func(b []byte) []byte { b[at] ^= 0x10; return b }
	}
	end := len(good)
	for _, tc := range []struct {
		name   string
		damage func([]byte) []byte
		want   string // "" for a file that must pass
	}{
		{"a byte of the header", flip(12), "header"},
		{"the header's length", flip(1), "header"},
		{"a byte of the first block", flip(snapshotHeaderSize + 100), "block 0"},
		{"a byte of the second block", flip(snapshotHeaderSize + snapshotBlock + 4 + 10), "block 1"},
		{"a block's checksum", flip(snapshotHeaderSize + snapshotBlock + 1), "block 0"},
		{"the tail's magic", flip(end - 1), "tail"},
		{"the tail's length", flip(end - 16), "tail"},
		{"a byte cut off", func(b []byte) []byte { return b[:len(b)-1] }, "block"},
		{"the last block cut off", func(b []byte) []byte { return b[:snapshotHeaderSize+snapshotBlock+4] }, "block"},
		{"a byte added", func(b []byte) []byte { return append(b, 0) }, "block"},
		{"only a header", func(b []byte) []byte { return b[:snapshotHeaderSize] }, "shorter"},
		{"zeroed", func(b []byte) []byte { return make([]byte, len(b)) }, "header"},
		{"a byte of the header's padding", flip(snapshotHeaderSize - 2), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "s.gbsnap")
			if err := os.WriteFile(p, tc.damage(bytes.Clone(good)), 0o644); err != nil {
				t.Fatal(err)
			}
			err := checkSnapshotFile(p)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("a harmless change fails the check: %v", err)
			case tc.want != "" && err == nil:
				t.Fatal("the damage passes the check")
			case tc.want != "" && !strings.Contains(err.Error(), tc.want):
				t.Fatalf("the check says %q, not where (%q)", err, tc.want)
			}
		})
	}
}

// A node whose latest snapshot is damaged is refused at its start, naming
// the file and the remedy, instead of starting and ending in Dragonboat's
// panic as its replica restores; put right, the same data dir starts.
func TestClusterRefusesADamagedSnapshot(t *testing.T) {
	c, path := snapshotCluster(t)
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	bad := bytes.Clone(good)
	bad[snapshotHeaderSize+snapshotBlock/2] ^= 0x01
	if err := os.WriteFile(path, bad, 0o644); err != nil {
		t.Fatal(err)
	}
	n, err := Start(c.options(3, c.dirs[2]))
	if err == nil {
		n.Close()
		t.Fatal("a node with a damaged snapshot started")
	}
	for _, want := range []string{"damaged", path, "replacement"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
	if err := os.WriteFile(path, good, 0o644); err != nil {
		t.Fatal(err)
	}
	c.start(2)
	c.waitReady()
	c.checkReplicasAgree()
}
