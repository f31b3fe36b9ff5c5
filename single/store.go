package single

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/cockroachdb/pebble"
)

// store is single mode's small durable state in --data-dir: token ceilings
// per shard, the lease ceiling, and on clean shutdown a snapshot of the
// table. Writes are synced; there are few of them (one per token block, one
// per lease step, one snapshot).
type store struct {
	db   *pebble.DB
	dir  string
	lock *os.File
}

var (
	keyShards   = []byte("meta/shards")
	keyLease    = []byte("meta/lease-ceiling")
	keySnapshot = []byte("snapshot")
)

func tokenKey(shard int) []byte { return []byte(fmt.Sprintf("token/%06d", shard)) }

// ErrDataDirInUse is returned when another process holds the data dir.
var ErrDataDirInUse = errors.New("data dir is in use by another ticketd")

func openStore(dir string) (*store, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("cannot create data dir %q: %w", dir, err)
	}
	// Our own lock, taken before pebble's: pebble's error path when its lock
	// is held panics in this version instead of returning the error.
	lock, err := os.OpenFile(filepath.Join(dir, "ticketd.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("cannot open data dir %q: %w", dir, err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = lock.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %q (stop the other ticketd or use another --data-dir)", ErrDataDirInUse, dir)
		}
		return nil, fmt.Errorf("cannot lock data dir %q: %w", dir, err)
	}
	opts := &pebble.Options{
		MemTableSize:                1 << 20,
		MemTableStopWritesThreshold: 2,
		Logger:                      quietLogger{},
	}
	db, err := pebble.Open(dir, opts)
	if err != nil {
		_ = lock.Close()
		return nil, fmt.Errorf("cannot open data dir %q (corrupt, or not a ticketd data dir?): %w", dir, err)
	}
	return &store{db: db, dir: dir, lock: lock}, nil
}

func (s *store) close() error {
	err := s.db.Close()
	_ = s.lock.Close()
	return err
}

func (s *store) getUint(key []byte) (uint64, bool, error) {
	v, closer, err := s.db.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	defer closer.Close()
	if len(v) != 8 {
		return 0, false, fmt.Errorf("data dir %q: corrupt value under %q", s.dir, key)
	}
	return binary.BigEndian.Uint64(v), true, nil
}

func (s *store) setUint(key []byte, v uint64) error {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], v)
	return s.db.Set(key, b[:], pebble.Sync)
}

// snapshot returns the blob written at the last clean shutdown, or nil.
func (s *store) snapshot() ([]byte, error) {
	v, closer, err := s.db.Get(keySnapshot)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer closer.Close()
	return append([]byte(nil), v...), nil
}

func (s *store) putSnapshot(b []byte) error { return s.db.Set(keySnapshot, b, pebble.Sync) }

// dropSnapshot makes sure that a crash after this start is seen as a
// crash, not as a clean shutdown with a stale table.
func (s *store) dropSnapshot() error { return s.db.Delete(keySnapshot, pebble.Sync) }

type quietLogger struct{}

func (quietLogger) Infof(string, ...interface{}) {}
func (quietLogger) Fatalf(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "pebble: "+format+"\n", args...)
	os.Exit(1)
}
