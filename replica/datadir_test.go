package replica

import (
	"bytes"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A cluster.json damaged so that it still parses (an incarnation a digit
// lower would hand out an earlier run's connection numbers again) is
// refused; one an earlier ticketd wrote, without a checksum, is taken and
// sealed; and one a later ticketd wrote, with fields this one does not
// know, still matches its checksum.
func TestClusterJSONIsChecked(t *testing.T) {
	peers := map[uint32]string{1: "127.0.0.1:1", 2: "127.0.0.1:2", 3: "127.0.0.1:3"}
	open := func(dir string) (*dataDir, error) {
		d, err := openDataDir(dir, 1, peers, 2, false, true)
		if err == nil {
			d.close()
		}
		return d, err
	}
	file := func(dir string) string { return filepath.Join(dir, identityFile) }

	dir := t.TempDir()
	for range 2 {
		if _, err := open(dir); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(file(dir))
	if err != nil || !bytes.Contains(b, []byte(`"incarnation": 2`)) {
		t.Fatalf("cluster.json after two starts: %s %v", b, err)
	}
	damaged := bytes.Replace(b, []byte(`"incarnation": 2`), []byte(`"incarnation": 1`), 1)
	if err := os.WriteFile(file(dir), damaged, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := open(dir); err == nil || !strings.Contains(err.Error(), "fails its checksum") {
		t.Fatalf("start on a cluster.json with its incarnation lowered: %v; want a refusal for its checksum", err)
	}

	// Damage that takes the checksum itself away reads as neither sealed
	// nor an earlier ticketd's file: a key renamed (then unknown), or a
	// value emptied.
	for _, c := range []struct{ from, to string }{
		{`"checksum"`, `"checksun"`},
		{`"checksum": "`, `"checksum": "",  "x": "`},
	} {
		lost := bytes.Replace(damaged, []byte(c.from), []byte(c.to), 1)
		if err := os.WriteFile(file(dir), lost, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := open(dir); err == nil || !strings.Contains(err.Error(), "fails its checksum") {
			t.Fatalf("start on a cluster.json whose checksum was lost (%s): %v; want a refusal", c.to, err)
		}
	}

	legacy := t.TempDir()
	id := identity{Node: 1, Peers: peers, Shards: 2, Incarnation: 5}
	if err := writeLegacyIdentity(file(legacy), &id); err != nil {
		t.Fatal(err)
	}
	d, err := open(legacy)
	if err != nil || d.incarnation != 6 {
		t.Fatalf("start on an earlier ticketd's cluster.json: %v, incarnation %d", err, d.incarnation)
	}
	if b, _ := os.ReadFile(file(legacy)); !bytes.Contains(b, []byte(`"checksum": "`)) || bytes.Contains(b, []byte(`"checksum": ""`)) {
		t.Fatalf("an earlier ticketd's cluster.json was not sealed when written again: %s", b)
	}

	later := t.TempDir()
	unsealed, err := json.MarshalIndent(&identity{Node: 1, Peers: peers, Shards: 2, Incarnation: 3}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	unsealed = bytes.Replace(unsealed, []byte(`"checksum": ""`), []byte("\"future\": 7,\n  \"checksum\": \"\""), 1)
	sum := fmt.Sprintf("%08x", crc32.Checksum(unsealed, crc32.MakeTable(crc32.Castagnoli)))
	sealed := bytes.Replace(unsealed, []byte(`"checksum": ""`), []byte(`"checksum": "`+sum+`"`), 1)
	if err := os.WriteFile(file(later), append(sealed, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := open(later); err != nil {
		t.Fatalf("start on a later ticketd's cluster.json: %v", err)
	}
}
