package main

import (
	"bytes"
	"strings"
	"testing"
)

// A negative --kill-grace is a usage error (exit 2) before anything is
// dialled or acquired: it sent SIGKILL right after SIGTERM.
func TestNegativeKillGraceIsAUsageError(t *testing.T) {
	var out, errb bytes.Buffer
	code := ctl([]string{"--addr", "127.0.0.1:7411", "run", "k", "--kill-on-expiry", "--kill-grace", "-1s", "--", "true"}, &out, &errb)
	if code != exitUsage {
		t.Fatalf("--kill-grace -1s: exit %d (%s), want %d (usage)", code, strings.TrimSpace(errb.String()), exitUsage)
	}
}

// --kill-grace without --kill-on-expiry is a usage error: accepted, it did
// nothing, and the command ran on past the lease's end.
func TestKillGraceWithoutKillOnExpiryIsAUsageError(t *testing.T) {
	var out, errb bytes.Buffer
	code := ctl([]string{"--addr", "127.0.0.1:7411", "run", "k", "--kill-grace", "2s", "--", "true"}, &out, &errb)
	if code != exitUsage || !strings.Contains(errb.String(), "--kill-on-expiry") {
		t.Fatalf("--kill-grace 2s alone: exit %d (%s), want %d (usage) naming --kill-on-expiry", code, strings.TrimSpace(errb.String()), exitUsage)
	}
}
