package main

import (
	"bytes"
	"compress/gzip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ticketd/ticketd/chaos"
)

// A recheck whose report cannot be written still prints the violations it
// found, and fails.
func TestRecheckPrintsViolationsWhenReportFails(t *testing.T) {
	dir := t.TempDir()
	h := &chaos.History{Ops: []*chaos.Op{
		{ID: 1, Worker: 1, Kind: 'A', Owner: "a", Key: "k", LeaseMs: 1000, Invoke: 0, Complete: 1e6, Result: chaos.ResGranted, Token: 1},
		{ID: 2, Worker: 2, Kind: 'A', Owner: "b", Key: "k", LeaseMs: 1000, Invoke: 100e6, Complete: 101e6, Result: chaos.ResGranted, Token: 2},
	}}
	path := filepath.Join(dir, "double.history.jsonl.gz")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	zw := gzip.NewWriter(f)
	if err := h.WriteJSON(zw); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	notDir := filepath.Join(dir, "file")
	if err := os.WriteFile(notDir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	code := recheckFile(&out, path, chaos.Config{Mode: "cluster", Out: notDir})
	if code == 0 {
		t.Fatal("exit code 0")
	}
	if !strings.Contains(out.String(), "VIOLATION ["+chaos.CheckExclusion+"]") {
		t.Fatalf("violations not printed:\n%s", out.String())
	}
}
