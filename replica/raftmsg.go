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
// TestTuningReachesDragonboat fails if the name stops being the
// variable Dragonboat reads.
//
//go:linkname dragonboatMaxEntrySize github.com/lni/dragonboat/v4/internal/raft.maxEntrySize
var dragonboatMaxEntrySize uint64

// dragonboatStreamConnections is how many TCP connections a NodeHost keeps
// to each peer for raft messages, shards spread over them by id (its soft
// setting StreamConnections, default 4, read from the same file). ticketd
// uses one. A connection learns that its peer restarted only when a write
// fails, and every failure opens Dragonboat's circuit breaker to that peer,
// dropping every message to it for 0.25-1 s. With four, a connection whose
// shards had sent nothing to the peer since it restarted fails the first
// time one of them does: in hand-run restarts that came 2.6-5.7 s later,
// when the restarted node had just been handed shards, and the dropped
// heartbeats, replies and forwarded proposals stalled shards for up to
// 2.2 s (bench/results/stream-connections.txt). One connection carries
// every shard's heartbeats, so it fails at once, while the peer is down or
// starting; and on two cores it carried more (51-61k lock pairs/s at depth
// 64 against 44-51k with four).
//
//go:linkname dragonboatStreamConnections github.com/lni/dragonboat/v4.streamConnections
var dragonboatStreamConnections uint64

const streamConnections = 1

var (
	tuneOnce          sync.Once
	capDragonboat     uint64 // maxEntrySize before tuneDragonboat
	streamsDragonboat uint64 // streamConnections before tuneDragonboat
)

// tuneDragonboat sets both once per process, before the first NodeHost
// starts: no Dragonboat goroutine reads them while they change. Smaller
// values from Dragonboat's settings file stay.
func tuneDragonboat() {
	tuneOnce.Do(func() {
		capDragonboat, streamsDragonboat = dragonboatMaxEntrySize, dragonboatStreamConnections
		dragonboatMaxEntrySize = min(dragonboatMaxEntrySize, replicateBytes)
		dragonboatStreamConnections = min(dragonboatStreamConnections, streamConnections)
	})
}
