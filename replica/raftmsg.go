package replica

import (
	"sync"
	_ "unsafe" // for go:linkname
)

// replicateBytes caps the log bytes of one replicate message. Dragonboat
// reads the entries a lagging node missed inside the leader's raft step,
// which here is one goroutine for every shard on the node (one exec
// shard), and puts up to 64 MB into one message. A node back from a 12 s
// outage under load held the leaders' steps for up to 0.7 s while they
// read its catch-up; the ticks queued meanwhile then counted as an election
// timeout passed, and shards held elections. Capped, the catch-up goes out
// a piece per step, between the other shards' work. Messages of new
// entries under load are a few KB, far under the cap.
const replicateBytes = 256 << 10

// dragonboatMaxEntrySize is Dragonboat's own cap (its soft setting
// MaxEntrySize), which it reads otherwise only from a file in the process's
// working directory, at init. The module version is pinned in go.mod;
// TestReplicateCapReachesDragonboat fails if the name stops being the
// variable Dragonboat reads.
//
//go:linkname dragonboatMaxEntrySize github.com/lni/dragonboat/v4/internal/raft.maxEntrySize
var dragonboatMaxEntrySize uint64

var (
	capOnce       sync.Once
	capDragonboat uint64 // its value before capReplicate
)

// capReplicate sets the cap once per process, before the first NodeHost
// starts: no raft goroutine reads it while it changes. A smaller value from
// Dragonboat's settings file stays.
func capReplicate() {
	capOnce.Do(func() {
		capDragonboat = dragonboatMaxEntrySize
		dragonboatMaxEntrySize = min(dragonboatMaxEntrySize, replicateBytes)
	})
}
