package replica

import "testing"

// The linkname must name the variable Dragonboat initialised from its soft
// settings (64 MiB by default), and capReplicate must have replaced it.
func TestReplicateCapReachesDragonboat(t *testing.T) {
	capReplicate()
	if capDragonboat != 64<<20 {
		t.Fatalf("Dragonboat's cap read as %d before capReplicate, want its default 64 MiB: the linkname does not reach maxEntrySize", capDragonboat)
	}
	if dragonboatMaxEntrySize != replicateBytes {
		t.Fatalf("cap %d after capReplicate, want %d", dragonboatMaxEntrySize, replicateBytes)
	}
}
