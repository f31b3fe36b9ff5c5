package replica

import "testing"

// The linknames must name the variables Dragonboat initialised from its
// soft settings (64 MiB and 4 by default), and tuneDragonboat must have
// replaced them.
func TestTuningReachesDragonboat(t *testing.T) {
	tuneDragonboat()
	if capDragonboat != 64<<20 {
		t.Errorf("Dragonboat's cap read as %d before tuneDragonboat, want its default 64 MiB: the linkname does not reach maxEntrySize", capDragonboat)
	}
	if dragonboatMaxEntrySize != replicateBytes {
		t.Errorf("cap %d after tuneDragonboat, want %d", dragonboatMaxEntrySize, replicateBytes)
	}
	if streamsDragonboat != 4 {
		t.Errorf("Dragonboat's stream connections read as %d before tuneDragonboat, want its default 4: the linkname does not reach streamConnections", streamsDragonboat)
	}
	if dragonboatStreamConnections != streamConnections {
		t.Errorf("stream connections %d after tuneDragonboat, want %d", dragonboatStreamConnections, streamConnections)
	}
}
