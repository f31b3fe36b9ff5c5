package replica

import (
	"testing"

	"github.com/lni/dragonboat/v4/logger"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// A peer's connection failing (a rolling restart) is a warning, said once
// every transportEvery per kind; the transport's other errors stay errors.
func TestTransportLinesOfAPeerDownAreWarnings(t *testing.T) {
	core, logs := observer.New(zap.DebugLevel)
	prev := logTo.Swap(zap.New(core))
	defer logTo.Store(prev)
	transportLines.reset() // other tests' clusters said some already
	defer transportLines.reset()
	l := &dbLogger{pkg: "transport"}
	l.SetLevel(logger.ERROR)
	for range 3 {
		l.Errorf("send batch failed, target %s (%v), %d", "127.0.0.1:1", "connection reset by peer", 1)
		l.Errorf("Nodehost %s failed to get a connection to %s, %v", "n", "127.0.0.1:1", "refused")
	}
	l.Errorf("invalid payload checksum")
	var got []string
	for _, e := range logs.All() {
		got = append(got, e.Level.String()+" "+e.Message)
	}
	want := []string{
		"warn send batch failed, target 127.0.0.1:1 (connection reset by peer), 1",
		"warn Nodehost n failed to get a connection to 127.0.0.1:1, refused",
		"error invalid payload checksum",
	}
	if len(got) != len(want) {
		t.Fatalf("logged %q, want %q", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("logged %q, want %q", got, want)
		}
	}
}

// Dragonboat's panic at two addresses for one node (--peers that differ
// between nodes) is said first in words that name the cause and the way out.
func TestTwoAddressesForANodeAreExplained(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	prev := logTo.Swap(zap.New(core))
	defer logTo.Store(prev)
	l := &dbLogger{pkg: "registry"}
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("no panic")
			}
		}()
		l.Panicf("inconsistent target for %s, %s:%s", "[00004:00002]", "127.0.0.1:19439", "127.0.0.1:19432")
	}()
	if got := logs.FilterMessageSnippet("the nodes were given different --peers"); got.Len() != 1 {
		t.Fatalf("logged %v, want the cause said once", logs.All())
	}
}

// A node that the cluster lists under another id at its address gets
// Dragonboat's line once per raft message: said once every transportEvery,
// with what to do.
func TestMessagesForAnotherNodeIdAreSaidOnce(t *testing.T) {
	core, logs := observer.New(zap.DebugLevel)
	prev := logTo.Swap(zap.New(core))
	defer logTo.Store(prev)
	transportLines.reset()
	defer transportLines.reset()
	l := &dbLogger{pkg: "dragonboat"}
	l.SetLevel(logger.WARNING)
	for range 1000 {
		l.Warningf("ignored a %s message sent to %s but received by %s", "Replicate", "[00010:00009]", "[00010:00010]")
	}
	if logs.Len() != 1 || logs.FilterMessageSnippet("run the replace").Len() != 1 {
		t.Fatalf("logged %d lines (%v), want one that says what to do", logs.Len(), logs.All()[:min(logs.Len(), 3)])
	}
}
