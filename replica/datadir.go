package replica

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/ticketd/ticketd/internal/atomicfile"
)

// dataDir is a cluster node's directory: our lock on it, who this node is
// (checked at every start: a data dir moved to another node id, peer list or
// shard count would split the cluster's state), and the incarnation counter
// that keeps connection ids unique across restarts. Dragonboat's own files
// live under raft/.
type dataDir struct {
	path        string
	lock        *os.File
	incarnation uint64
	fresh       bool       // no raft state yet: this start bootstraps (or joins)
	mu          sync.Mutex // id's writes: a start's, the apply goroutine's (adopt), Dragonboat's (lostEntries)
	id          identity
}

type identity struct {
	Node        uint32            `json:"node"`
	Peers       map[uint32]string `json:"peers"`
	Shards      int               `json:"shards"`
	Incarnation uint64            `json:"incarnation"`
	// RaftMade: the raft state under raft/ was made (a start got as far
	// as its node host); from then on a start without it is refused.
	RaftMade bool `json:"raft_made,omitempty"`
	// ShardsMade: every shard's replica was started once; from then on a
	// start that finds none of them in raft/ (emptied: a mount that failed
	// and left its mountpoint, files deleted) is refused.
	ShardsMade bool `json:"shards_made,omitempty"`
	// Join: the node's first start joined existing shards (--join). A
	// start after one that stopped before it had started every shard joins
	// the rest too, with or without the flag: bootstrapping them would
	// make this node a founder of shards that exist without it.
	Join bool `json:"join,omitempty"`
	// The limits are not here: the shards' logs hold them (see fsm.adopt),
	// and they may change while the cluster runs. Limits, kept as found, are
	// those an earlier ticketd pinned here at the node's first start: the
	// entries its logs hold before the first settings notice were applied
	// under them, so a replay applies them so too (see Start). New data dirs
	// have none.
	Limits *limits `json:"limits,omitempty"`
	// LostEntries: a run found that the raft log had lost entries this
	// node acknowledged (a torn or damaged write-ahead log, a restore from
	// a copy), and why; every later start is refused.
	LostEntries string `json:"lost_entries,omitempty"`
	// Checksum is the CRC-32C of the file as written with this field
	// empty (sealIdentity): a flipped digit that still parses, an
	// incarnation one lower above all, would hand out the connection
	// numbers of an earlier run again. A file without it is an earlier
	// ticketd's, taken as it is if it holds only fields this one knows
	// (sealed), and sealed when next written.
	Checksum string `json:"checksum"`
}

type limits struct {
	MaxKeys          int `json:"max_keys"`
	MaxWaiters       int `json:"max_waiters"`
	MaxWaitersPerKey int `json:"max_waiters_per_key"`
}

const identityFile = "cluster.json"

// ErrDataDirInUse is returned when another process holds the data dir.
var ErrDataDirInUse = errors.New("data dir is in use by another ticketd")

func openDataDir(path string, node uint32, peers map[uint32]string, shards int, join, bootstrap bool) (*dataDir, error) {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) && !join && !bootstrap {
		// Refused below as holding no cluster state; refused here, before
		// it is made, so that a typo leaves no directory behind.
		return nil, fmt.Errorf("data dir %q does not exist, so it holds no cluster state: %s", path, noStateAdvice)
	}
	if err := atomicfile.MkdirAll(path, 0o755); err != nil {
		return nil, fmt.Errorf("cannot create data dir %q: %w", path, err)
	}
	for _, f := range []string{"CURRENT", "ticketd.state", "ticketd.id", "ticketd.snapshot"} {
		if _, err := os.Stat(filepath.Join(path, f)); err == nil {
			return nil, fmt.Errorf("data dir %q holds single-mode state; give cluster mode a data dir of its own", path)
		}
	}
	lock, err := os.OpenFile(filepath.Join(path, "ticketd.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("cannot open data dir %q: %w", path, err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = lock.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %q (stop the other ticketd or use another --data-dir)", ErrDataDirInUse, path)
		}
		return nil, fmt.Errorf("cannot lock data dir %q: %w", path, err)
	}
	d := &dataDir{path: path, lock: lock}
	id := identity{Node: node, Peers: peers, Shards: shards}
	b, err := os.ReadFile(filepath.Join(path, identityFile))
	switch {
	case err == nil:
		var old identity
		if err := json.Unmarshal(b, &old); err != nil {
			d.close()
			return nil, fmt.Errorf("data dir %q: %s is corrupt: %v", path, identityFile, err)
		}
		if !old.sealed(b) {
			d.close()
			return nil, fmt.Errorf("data dir %q: %s fails its checksum: it was damaged (or edited by hand), and what it says of this node cannot be trusted; "+
				"put back a good copy of the file if you have one, or bring the node back as a replacement under a new id, on an empty data dir (README: replacing a node)", path, identityFile)
		}
		if old.LostEntries != "" {
			d.close()
			return nil, fmt.Errorf("data dir %q: a run of node %d found that its raft log had lost entries it acknowledged (%s): "+
				"it must not run again, as it would vote and answer having forgotten them; bring the node back as a replacement under a new id, on an empty data dir (README: replacing a node)",
				path, old.Node, old.LostEntries)
		}
		if msg := old.differs(&id); msg != "" {
			d.close()
			return nil, fmt.Errorf("data dir %q belongs to %s; start with the flags it was made with, or bring this node back as a replacement under a new id, on an empty data dir (README: replacing a node)", path, msg)
		}
		if _, err := os.Stat(filepath.Join(path, "raft")); errors.Is(err, os.ErrNotExist) && old.RaftMade {
			// Without its raft state the node would bootstrap again,
			// having forgotten its votes and the entries it acknowledged:
			// a committed grant could be lost and its token given again.
			d.close()
			return nil, fmt.Errorf("data dir %q belongs to node %d, whose raft state (raft/) is gone: "+
				"starting would forget what it acknowledged; bring the node back as a replacement with an empty data dir (README: replacing a node)",
				path, old.Node)
		}
		id.Incarnation, id.RaftMade, id.ShardsMade, id.Limits, id.Join = old.Incarnation, old.RaftMade, old.ShardsMade, old.Limits, old.Join
		// A start before this one got no raft state made: it acknowledged
		// nothing, and was started as a founder or a joiner.
		bootstrap = bootstrap || !old.RaftMade
	case errors.Is(err, os.ErrNotExist):
		if _, err := os.Stat(filepath.Join(path, "raft")); err == nil {
			d.close()
			return nil, fmt.Errorf("data dir %q has raft state but no %s: it cannot be told apart from another node's; bring this node back as a replacement under a new id, on an empty data dir (README: replacing a node)", path, identityFile)
		}
		if n := atomicfile.LostFound(path); n > 0 {
			// Bootstrapping under an id that has voted and acknowledged
			// entries could lose committed grants.
			d.close()
			return nil, fmt.Errorf("data dir %q looks new, but its lost+found holds %d entries: a file system check may have moved this node's files there; "+
				"if the file system is new, empty lost+found; if the node's state is lost, bring it back as a replacement (README: replacing a node)", path, n)
		}
	default:
		d.close()
		return nil, fmt.Errorf("cannot read data dir %q: %w", path, err)
	}
	_, err = os.Stat(filepath.Join(path, "raft"))
	fresh := errors.Is(err, os.ErrNotExist)
	if fresh && join {
		id.Join = true
	}
	if fresh && !join && !id.Join && !bootstrap {
		d.close()
		return nil, fmt.Errorf("data dir %q holds no cluster state: %s", path, noStateAdvice)
	}
	id.Incarnation++
	if id.Incarnation >= 1<<(64-connBits) {
		d.close()
		return nil, fmt.Errorf("data dir %q: incarnation counter exhausted", path)
	}
	if err := writeIdentity(filepath.Join(path, identityFile), &id); err != nil {
		d.close()
		return nil, fmt.Errorf("cannot write to data dir %q: %w", path, err)
	}
	d.incarnation = id.Incarnation
	d.id = id
	d.fresh = fresh
	return d, nil
}

// noStateAdvice ends the refusal of a data dir without cluster state.
const noStateAdvice = "give every node --bootstrap on a new cluster's first start, or --join to a node that replaces a lost one, under a new --node-id after POST /cluster/replace on a live node (README: replacing a node); " +
	"a node that ran before must find its own data dir (a typo in --data-dir, a disk that did not mount?): started afresh it would forget what it acknowledged"

// raftMade records that the raft state exists, once the node host that
// keeps it has started.
func (d *dataDir) raftMade() error { return d.mark(&d.id.RaftMade) }

// shardsMade records that every shard's replica has started once.
func (d *dataDir) shardsMade() error { return d.mark(&d.id.ShardsMade) }

// mark sets one of the identity's flags, durably, if it is not set yet.
func (d *dataDir) mark(flag *bool) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if *flag {
		return nil
	}
	*flag = true
	if err := writeIdentity(filepath.Join(d.path, identityFile), &d.id); err != nil {
		return fmt.Errorf("cannot write to data dir %q: %w", d.path, err)
	}
	return nil
}

// adopt records the cluster's shard count, found to differ from this run's,
// as the one the next start must be given.
func (d *dataDir) adopt(shards int) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.id.Shards = shards
	return writeIdentity(filepath.Join(d.path, identityFile), &d.id)
}

// lostEntries records, durably, that the raft log has lost entries this
// node acknowledged, so that no later start runs on it.
func (d *dataDir) lostEntries(why string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.id.LostEntries = time.Now().UTC().Format(time.RFC3339) + ": " + why
	return writeIdentity(filepath.Join(d.path, identityFile), &d.id)
}

func (old *identity) differs(id *identity) string {
	if old.Node != id.Node {
		return fmt.Sprintf("node %d (this is --node-id %d)", old.Node, id.Node)
	}
	if old.Shards != id.Shards {
		return fmt.Sprintf("a cluster of %d shards (--shards %d given)", old.Shards, id.Shards)
	}
	// The peers may differ: a replaced node changes them (README).
	return ""
}

// writeIdentity replaces file with id's JSON, sealed with its checksum, so
// that a crash leaves the old or the new contents, never a torn one.
func writeIdentity(file string, id *identity) error {
	b, err := sealIdentity(id)
	if err != nil {
		return err
	}
	return atomicfile.Write(file, b, []byte("\n"))
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// sealIdentity is id's JSON with its checksum, taken over the same JSON
// with the checksum empty.
func sealIdentity(id *identity) ([]byte, error) {
	c := *id
	c.Checksum = ""
	b, err := json.MarshalIndent(&c, "", "  ")
	if err != nil {
		return nil, err
	}
	c.Checksum = fmt.Sprintf("%08x", crc32.Checksum(b, castagnoli))
	return json.MarshalIndent(&c, "", "  ")
}

// sealed tells whether b, the file id was read from, matches its checksum:
// b as it is, with the checksum's value emptied, so that a field this
// version does not know (a later ticketd's) counts as written, and the
// layout must be sealIdentity's (a file re-indented by hand fails). A
// file without a checksum is an earlier ticketd's, which wrote no other
// field than this one knows and no checksum key: one that has either
// lost its checksum to damage (the key's name, or its value).
func (id *identity) sealed(b []byte) bool {
	if id.Checksum == "" {
		if bytes.Contains(b, []byte(`"checksum"`)) {
			return false
		}
		d := json.NewDecoder(bytes.NewReader(b))
		d.DisallowUnknownFields()
		var strict identity
		return d.Decode(&strict) == nil
	}
	field := []byte(`"checksum": "` + id.Checksum + `"`)
	if bytes.Count(b, field) != 1 {
		return false
	}
	b = bytes.Replace(bytes.TrimRight(b, "\n"), field, []byte(`"checksum": ""`), 1)
	return fmt.Sprintf("%08x", crc32.Checksum(b, castagnoli)) == id.Checksum
}

func (d *dataDir) close() { _ = d.lock.Close() }
