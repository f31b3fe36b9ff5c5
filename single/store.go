package single

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ticketd/ticketd/internal/atomicfile"
)

// The data dir holds two files of ours, and the directory itself is
// flocked so that one server at a time uses it:
//
//   - ticketd.state: the durable facts, one checksummed record of stateSize
//     bytes, overwritten in place and synced for every change. Overwriting
//     allocated blocks needs no free space, so a full disk does not stop a
//     running server from raising its ceilings, and a record within one
//     sector is written whole or not at all.
//   - ticketd.snapshot: the table at the last clean shutdown, checksummed,
//     written beside and renamed into place; removed once loaded.
//   - ticketd.id: written after each state file begun anew (a new dir's, a
//     recovery's), naming the dir's first use as that state's Created does:
//     it keeps the dir recognisable as used when ticketd.state is lost, and
//     a ticketd.state of another dir copied in is told by it.
//
// A dir that holds anything but no readable ticketd.state was used before
// (or is not ours): it is refused, never written into, unless the operator
// asks for recovery (Options.RecoverDamaged).
const (
	stateName = "ticketd.state"
	idName    = "ticketd.id"
	snapName  = "ticketd.snapshot"
	tmpSuffix = ".tmp"

	stateMagic  = "TICKETD\x01"
	snapMagic   = "TKTSNAP\x03"
	snapMagic2  = "TKTSNAP\x02" // before snapshots named their data dir
	snapMagic1  = "TKTSNAP\x01" // before snapshots named their state's Seq
	stateSize   = 64
	snapHeader  = 8 + 8 + 4 + 8 + 8 // magic, length, checksum, state Seq, dir's Created
	snapHeader2 = 8 + 8 + 4 + 8
	snapHeader1 = 8 + 8 + 4
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// state is what a crash must not lose. Every grant's token is at most
// TokenCeil and every granted lease ends by LeaseCeil, and both were
// durable before the grant's answer left the process.
type state struct {
	Seq       uint64 // writes so far
	Created   int64  // unix ns when the dir was first used
	TokenCeil uint64 // no token above this was granted, on any shard
	LeaseCeil int64  // no lease granted ends after this (unix ns)
	Shards    uint32 // --shards of the run that wrote it (for the snapshot)
	// MaxLease bounds every lease granted in the dir since it was first
	// kept (ns; 0: unknown, a dir of an earlier version): the longest one
	// granted, written before its answer left (earlier versions wrote each
	// run's --max-lease), or on a dir recovered or of an earlier version,
	// how long its lease ceiling had to run.
	MaxLease int64
	// SeqSnaps: a run of a version whose snapshots name their state's Seq
	// wrote this state, so a snapshot of the earlier format found beside it
	// is older than that run (put back, or a removal that did not last).
	SeqSnaps bool
	// Written is when the run that wrote this state wrote it, on its clock
	// (unix ns, kept in ms, rounded down; 0: unknown, an earlier version):
	// with LeaseCeil, of the same clock, it bounds how long a lease could
	// still run then, whatever the next run's clock reads (crashGrace).
	Written int64
}

func (s *state) encode() []byte {
	b := make([]byte, stateSize)
	copy(b, stateMagic)
	binary.BigEndian.PutUint64(b[8:], s.Seq)
	binary.BigEndian.PutUint64(b[16:], uint64(s.Created))
	binary.BigEndian.PutUint64(b[24:], s.TokenCeil)
	binary.BigEndian.PutUint64(b[32:], uint64(s.LeaseCeil))
	binary.BigEndian.PutUint32(b[40:], s.Shards)
	binary.BigEndian.PutUint64(b[44:], uint64(s.MaxLease))
	if s.SeqSnaps {
		b[52] = 1
	}
	putUint48(b[54:], uint64(max(s.Written, 0)/int64(time.Millisecond)))
	binary.BigEndian.PutUint32(b[stateSize-4:], crc32.Checksum(b[:stateSize-4], castagnoli))
	return b
}

func decodeState(b []byte) (state, error) {
	switch {
	case len(b) != stateSize:
		return state{}, fmt.Errorf("%d bytes, want %d", len(b), stateSize)
	case string(b[:8]) != stateMagic:
		return state{}, errors.New("not a ticketd state record")
	case crc32.Checksum(b[:stateSize-4], castagnoli) != binary.BigEndian.Uint32(b[stateSize-4:]):
		return state{}, errors.New("checksum mismatch")
	}
	return state{
		Seq:       binary.BigEndian.Uint64(b[8:]),
		Created:   int64(binary.BigEndian.Uint64(b[16:])),
		TokenCeil: binary.BigEndian.Uint64(b[24:]),
		LeaseCeil: int64(binary.BigEndian.Uint64(b[32:])),
		Shards:    binary.BigEndian.Uint32(b[40:]),
		MaxLease:  int64(binary.BigEndian.Uint64(b[44:])),
		SeqSnaps:  b[52] == 1,
		Written:   int64(uint48(b[54:])) * int64(time.Millisecond),
	}, nil
}

// putUint48 and uint48 keep a 48-bit value big-endian (ms since 1970 fit
// for 8,900 years).
func putUint48(b []byte, v uint64) {
	_ = b[5]
	b[0], b[1], b[2], b[3], b[4], b[5] = byte(v>>40), byte(v>>32), byte(v>>24), byte(v>>16), byte(v>>8), byte(v)
}

func uint48(b []byte) uint64 {
	_ = b[5]
	return uint64(b[0])<<40 | uint64(b[1])<<32 | uint64(b[2])<<24 | uint64(b[3])<<16 | uint64(b[4])<<8 | uint64(b[5])
}

// durable is what the runner needs from its data dir. Tests wrap it to
// slow writes down or make them fail.
type durable interface {
	// save makes s the durable state; it returns once s is synced.
	save(s state) error
	// putSnapshot writes the clean-shutdown table, synced, bound to the
	// state written last (its Seq) and to the dir (the state's Created):
	// see decodeSnapshot.
	putSnapshot(seq uint64, created int64, b []byte) error
	// dropSnapshot removes it, synced, so a later crash looks like one.
	dropSnapshot() error
	// setAsideSnapshot renames one that does not load out of the way,
	// synced, and returns where it went.
	setAsideSnapshot(now int64) (string, error)
	close() error
	path() string
}

// ErrDataDirInUse is returned when another process holds the data dir.
var ErrDataDirInUse = errors.New("data dir is in use by another ticketd")

// ErrDamaged is returned (wrapped, with what is wrong) for a data dir that
// was used before but whose state cannot be read back whole.
var ErrDamaged = errors.New("data dir damaged")

// store is the data dir on a file system.
type store struct {
	dir  string
	lock *os.File // the dir, flocked
	f    *os.File // ticketd.state, open for in-place writes
}

// loaded is what openStore found.
type loaded struct {
	fresh     bool   // nothing of ours was there: a new data dir
	made      bool   // the dir did not exist: this start made it
	st        state  // valid unless fresh or damaged
	stOK      bool   // st was read back whole
	snap      []byte // the clean-shutdown table; nil if none
	staleSnap string // why a snapshot older than the state is dropped as if none ("": none was)
	snapV1    bool   // snap is of the earlier format, which names no Seq
	// untrusted is a snapshot that decoded whole in a recovered dir: its
	// table is not loaded, but its leases tell how long the grace must be.
	untrusted []byte
	damage    []string
	movedTo   []string // damaged files set aside (recovery)
	recovered bool
	lastUse   int64  // the latest time, in unix ns, the dir shows it was used
	lastUseBy string // what shows it
}

// ignorable entries do not make a dir "used before": a file system's
// lost+found (unless it holds something: atomicfile.LostFound), and what a
// first start that crashed before its state file was in place can leave.
func ignorable(name string) bool {
	return name == "lost+found" || name == stateName+tmpSuffix || name == idName+tmpSuffix
}

// openStore locks dir and reads what the last run left. It writes nothing
// into a dir it refuses. With recoverDamaged, damaged files are renamed
// aside (name.damaged-<unix ns>) and what could be read is returned; a
// state file written anew then holds the recovery's ceilings (tokens above
// RecoveryFloor, leases up to maxLease from now).
func openStore(dir string, recoverDamaged bool, maxLease time.Duration, now int64) (*store, loaded, error) {
	var ld loaded
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		ld.made = true
	}
	if err := atomicfile.MkdirAll(dir, 0o755); err != nil {
		return nil, ld, fmt.Errorf("cannot create data dir %q: %w", dir, ioErr(dir, err))
	}
	lock, err := os.Open(dir)
	if err != nil {
		return nil, ld, fmt.Errorf("cannot open data dir %q: %w", dir, err)
	}
	if fi, err := lock.Stat(); err != nil || !fi.IsDir() {
		_ = lock.Close()
		return nil, ld, fmt.Errorf("data dir %q is not a directory", dir)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = lock.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, ld, fmt.Errorf("%w: %q (stop the other ticketd or use another --data-dir)", ErrDataDirInUse, dir)
		}
		return nil, ld, fmt.Errorf("cannot lock data dir %q: %w", dir, err)
	}
	s := &store{dir: dir, lock: lock}
	fail := func(err error) (*store, loaded, error) {
		_ = s.close()
		return nil, ld, err
	}
	names, err := lock.Readdirnames(-1)
	if err != nil {
		return fail(fmt.Errorf("cannot list data dir %q: %w", dir, err))
	}
	slices.Sort(names)
	if slices.Contains(names, "cluster.json") {
		// Never "recovered": setting a cluster node's raft log aside would
		// lose acknowledged grants of its shards.
		return fail(fmt.Errorf("data dir %q holds a cluster node's state (cluster.json): start it in cluster mode (--peers, --node-id), or give single mode a data dir of its own", dir))
	}

	b, err := os.ReadFile(filepath.Join(dir, stateName))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		var other []string
		for _, n := range names {
			if !ignorable(n) {
				other = append(other, n)
			}
		}
		if n := atomicfile.LostFound(dir); n > 0 {
			other = append(other, fmt.Sprintf("lost+found with %d entries (a file system check may have moved this dir's files there; if the file system is new, empty it)", n))
		}
		if len(other) == 0 {
			ld.fresh = true
		} else {
			ld.damage = append(ld.damage, fmt.Sprintf("%s is missing, but the dir holds %s", stateName, list(other)))
		}
	case err != nil:
		return fail(fmt.Errorf("cannot read %s in data dir %q: %w", stateName, dir, ioErr(dir, err)))
	default:
		if ld.st, err = decodeState(b); err != nil {
			ld.damage = append(ld.damage, fmt.Sprintf("%s is damaged (%v)", stateName, err))
		} else {
			ld.stOK = true
		}
	}

	if idAt, ok := readID(dir, names); ok && ld.stOK && ld.st.Created != idAt && !(begunByRecovery(ld.st) && ld.st.Created > idAt) {
		// Another dir's state file copied in (a mix-up while moving files,
		// a sync tool): its ceilings are not this dir's, and a start on
		// them could grant held keys again and repeat tokens.
		ld.damage = append(ld.damage, fmt.Sprintf("%s was written in another data dir: it records a first use at unix ns %d, and %s one at %d (a file copied in?)",
			stateName, ld.st.Created, idName, idAt))
		ld.stOK = false
	}

	b, err = os.ReadFile(filepath.Join(dir, snapName))
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return fail(fmt.Errorf("cannot read %s in data dir %q: %w", snapName, dir, ioErr(dir, err)))
	default:
		var seq uint64
		var created int64
		if ld.snap, seq, created, err = decodeSnapshot(b); err != nil {
			ld.damage = append(ld.damage, fmt.Sprintf("%s is damaged (%v)", snapName, err))
		} else if created != 0 && ld.stOK && created != ld.st.Created {
			// One of the two is another dir's (a mix-up while moving files,
			// a sync tool), and which cannot be told: ticketd.id may have
			// come with the state. A foreign snapshot loaded would forget
			// this dir's holders and take its tokens back, as would a
			// crash's restart on a foreign state's ceilings.
			ld.damage = append(ld.damage, fmt.Sprintf("%s and %s were written in different data dirs (first used at unix ns %d and %d): one of them was copied in, and which cannot be told",
				snapName, stateName, created, ld.st.Created))
			ld.stOK = false
		} else if seq != 0 && ld.stOK && seq > ld.st.Seq {
			// Every write of the state raises its Seq, and the snapshot
			// names the one it was written with: a state below it went
			// back (a write lost, a file put back from a copy), and its
			// ceilings are below tokens and leases already given.
			ld.damage = append(ld.damage, fmt.Sprintf("%s went back: its write %d is older than %s's %d", stateName, ld.st.Seq, snapName, seq))
			ld.stOK = false
		} else if seq != 0 && ld.stOK && seq != ld.st.Seq {
			// A crash's restart, and the file goes.
			ld.snap, ld.staleSnap = nil, fmt.Sprintf("it belongs to write %d of %s, and the last one is %d: a start after it did not remove it (a power loss), or it was put back", seq, stateName, ld.st.Seq)
		} else if seq == 0 && ld.stOK && ld.st.SeqSnaps {
			// Every clean shutdown since the state's run wrote the newer
			// format: this one is older than that run, and its table
			// lacks the keys granted since; loaded, it would grant them
			// again and repeat their tokens.
			ld.snap, ld.staleSnap = nil, "it is of the earlier format, older than this version's last run on the dir (put back, or a removal that did not last)"
		} else if seq == 0 {
			ld.snapV1 = true
		}
	}

	ld.lastUse, ld.lastUseBy = lastUse(dir, names)
	if ld.stOK && ld.st.Created > ld.lastUse {
		ld.lastUse, ld.lastUseBy = ld.st.Created, "the creation time that "+stateName+" records"
	}
	if recoverDamaged && len(ld.damage) == 0 {
		// A whole dir can still be an older copy put back, or one emptied,
		// its ceilings behind tokens and leases already given: nothing in
		// it tells. Asked to recover, the start is a recovery whatever the
		// dir shows.
		ld.damage = append(ld.damage, "none found, but --recover-damaged-data-dir was given: the dir may be an older copy put back, or emptied")
		ld.fresh = false
	}
	if len(ld.damage) > 0 {
		if !recoverDamaged {
			return fail(fmt.Errorf("%w: %q: %s", ErrDamaged, dir, strings.Join(ld.damage, "; ")))
		}
		if err := clockPastUse(dir, now, ld.lastUse, ld.lastUseBy); err != nil {
			return fail(err)
		}
		ld.recovered = true
		ld.snap, ld.untrusted = nil, ld.snap // a clean-shutdown table is trusted only with its state
		for _, n := range []string{stateName, snapName} {
			if ld.stOK && n == stateName {
				continue
			}
			to, err := s.setAside(n, now)
			if err != nil {
				return fail(err)
			}
			if to != "" {
				ld.movedTo = append(ld.movedTo, to)
			}
		}
		if err := s.syncDir(); err != nil {
			return fail(err)
		}
	}

	// A dir this process cannot write in fails here, before the start
	// writes its state: a state written and then a snapshot that could
	// not be removed turned a clean restart into a crash's.
	probe := filepath.Join(dir, stateName+tmpSuffix)
	if err := os.WriteFile(probe, nil, 0o644); err != nil {
		return fail(fmt.Errorf("cannot write in data dir %q: %w", dir, ioErr(dir, err)))
	}
	if err := os.Remove(probe); err != nil {
		return fail(fmt.Errorf("cannot write in data dir %q: %w", dir, ioErr(dir, err)))
	}

	begun := !ld.stOK
	if begun {
		// A new dir, or a recovered one: the state file is written whole
		// beside and renamed into place, so it never exists half-written.
		ld.st = state{Created: now}
		if ld.recovered {
			// In this same write: a state of zero ceilings left by a
			// recovery stopped before load raises them would pass at the
			// next start for an ordinary crash's, and tokens would start
			// again at 1 with no grace.
			ld.st.TokenCeil = RecoveryFloor(now)
			ld.st.LeaseCeil = satAdd(satAdd(now, int64(maxLease)), leaseStep)
		}
		if err := s.create(ld.st); err != nil {
			return fail(err)
		}
	}
	if begun || !slices.Contains(names, idName) {
		id := fmt.Sprintf(idFormat+"\n", ld.st.Created)
		if err := s.writeFile(idName, []byte(id)); err != nil {
			return fail(fmt.Errorf("cannot create %s in data dir %q: %w", idName, dir, err))
		}
	}
	if s.f, err = os.OpenFile(filepath.Join(dir, stateName), os.O_RDWR, 0); err != nil {
		return fail(fmt.Errorf("cannot open %s in data dir %q: %w", stateName, dir, ioErr(dir, err)))
	}
	return s, ld, nil
}

// idFormat is ticketd.id's one line.
const idFormat = "ticketd data dir, first used at unix ns %d"

// readID returns the first use that ticketd.id names, if the dir holds one
// that reads as written; one unreadable says nothing (it is only a mark).
func readID(dir string, names []string) (int64, bool) {
	if !slices.Contains(names, idName) {
		return 0, false
	}
	b, err := os.ReadFile(filepath.Join(dir, idName))
	if err != nil {
		return 0, false
	}
	var at int64
	if n, err := fmt.Sscanf(string(b), idFormat+"\n", &at); n != 1 || err != nil {
		return 0, false
	}
	return at, true
}

// begunByRecovery tells whether st was begun by a recovery (its tokens
// started above its Created in ns). Recoveries of earlier versions left
// ticketd.id as it was, so such a state may name a first use later than
// the id's.
func begunByRecovery(st state) bool { return st.TokenCeil >= RecoveryFloor(st.Created) }

// lastUse is the latest time the dir's files show, in unix ns: their
// modification times and the times in the names of files an earlier
// recovery set aside; and what shows it.
func lastUse(dir string, names []string) (last int64, by string) {
	for _, n := range names {
		if fi, err := os.Lstat(filepath.Join(dir, n)); err == nil && fi.ModTime().UnixNano() > last {
			last, by = fi.ModTime().UnixNano(), "the modification time of "+n
		}
		if _, at, ok := strings.Cut(n, ".damaged-"); ok {
			if ns, err := strconv.ParseInt(at, 10, 64); err == nil && ns > last {
				last, by = ns, "the time in the name of "+n
			}
		}
	}
	return last, by
}

// clockPastUse refuses a recovery while the wall clock is behind the dir's
// last use: tokens restart at RecoveryFloor, the wall clock in ns, which
// lies above every token granted before only if the clock has not gone
// back (a host that boots with a wrong clock before it syncs).
func clockPastUse(dir string, now, last int64, by string) error {
	if now >= last {
		return nil
	}
	return fmt.Errorf("data dir %q was last used at %s (%s), after the wall clock's %s: a recovery now could give tokens again; "+
		"if the clock is behind, set the clock right and start again; if it is right, that time is ahead of it (a file copied from a host whose clock was fast?): "+
		"start again once the clock has passed it",
		dir, time.Unix(0, last).UTC().Format(time.RFC3339Nano), by, time.Unix(0, now).UTC().Format(time.RFC3339Nano))
}

// setAside renames the damaged file name to name.damaged-<now> ("" if
// there is none); the caller syncs the dir.
func (s *store) setAside(name string, now int64) (string, error) {
	from := filepath.Join(s.dir, name)
	if _, err := os.Lstat(from); err != nil {
		return "", nil
	}
	to := fmt.Sprintf("%s.damaged-%d", from, now)
	if err := os.Rename(from, to); err != nil {
		return "", fmt.Errorf("cannot set aside %s in data dir %q: %w", name, s.dir, ioErr(s.dir, err))
	}
	return to, nil
}

func (s *store) setAsideSnapshot(now int64) (string, error) {
	to, err := s.setAside(snapName, now)
	if err != nil {
		return "", err
	}
	return to, s.syncDir()
}

func list(names []string) string {
	const most = 5
	if len(names) > most {
		return strings.Join(names[:most], ", ") + fmt.Sprintf(" and %d more", len(names)-most)
	}
	return strings.Join(names, ", ")
}

func (s *store) create(st state) error {
	if err := s.writeFile(stateName, st.encode()); err != nil {
		return fmt.Errorf("cannot create %s in data dir %q: %w", stateName, s.dir, err)
	}
	return nil
}

// writeFile writes name whole (atomicfile.Write; the dir is synced through
// the descriptor we hold). A failure leaves no partial file behind.
func (s *store) writeFile(name string, parts ...[]byte) error {
	if err := atomicfile.Write(filepath.Join(s.dir, name), parts...); err != nil {
		return ioErr(s.dir, err)
	}
	return nil
}

func (s *store) syncDir() error {
	if err := s.lock.Sync(); err != nil {
		return fmt.Errorf("cannot sync data dir %q: %w", s.dir, ioErr(s.dir, err))
	}
	return nil
}

func (s *store) save(st state) error {
	if _, err := s.f.WriteAt(st.encode(), 0); err != nil {
		return ioErr(s.dir, err)
	}
	if err := s.f.Sync(); err != nil {
		return ioErr(s.dir, err)
	}
	return nil
}

// The snapshot file: snapMagic, the blob's length, the CRC-32C of what
// follows it, the Seq of the state written last before it, the Created of
// the dir's state, the blob.
func (s *store) putSnapshot(seq uint64, created int64, b []byte) error {
	var h [snapHeader]byte
	copy(h[:], snapMagic)
	binary.BigEndian.PutUint64(h[8:], uint64(len(b)))
	binary.BigEndian.PutUint64(h[20:], seq)
	binary.BigEndian.PutUint64(h[28:], uint64(created))
	binary.BigEndian.PutUint32(h[16:], crc32.Update(crc32.Checksum(h[20:], castagnoli), castagnoli, b))
	return s.writeFile(snapName, h[:], b)
}

// decodeSnapshot returns the blob, the Seq of the state it belongs to (0
// for a snapshot of the first format, which named none) and the Created of
// its dir (0 for the formats before, which named none). A start that loads
// a snapshot writes the state (a higher Seq) before it removes the file: a
// snapshot whose Seq is not the state's is one whose removal did not last
// (a power loss after a directory sync that failed), and loading it would
// take tokens back; one whose Created is not the state's is another dir's.
func decodeSnapshot(b []byte) (blob []byte, seq uint64, created int64, err error) {
	var hdr int
	switch {
	case len(b) < 8:
	case string(b[:8]) == snapMagic:
		hdr = snapHeader
	case string(b[:8]) == snapMagic2:
		hdr = snapHeader2
	case string(b[:8]) == snapMagic1:
		hdr = snapHeader1
	}
	if hdr == 0 || len(b) < hdr {
		return nil, 0, 0, errors.New("not a ticketd snapshot")
	}
	if n := binary.BigEndian.Uint64(b[8:]); n != uint64(len(b)-hdr) {
		return nil, 0, 0, fmt.Errorf("%d bytes, the header says %d", len(b)-hdr, n)
	}
	sum := crc32.Checksum(b[hdr:], castagnoli)
	if hdr > snapHeader1 {
		seq = binary.BigEndian.Uint64(b[20:])
		sum = crc32.Update(crc32.Checksum(b[20:hdr], castagnoli), castagnoli, b[hdr:])
	}
	if hdr == snapHeader {
		created = int64(binary.BigEndian.Uint64(b[28:]))
	}
	if sum != binary.BigEndian.Uint32(b[16:]) {
		return nil, 0, 0, errors.New("checksum mismatch")
	}
	return b[hdr:], seq, created, nil
}

func (s *store) dropSnapshot() error {
	if err := os.Remove(filepath.Join(s.dir, snapName)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("cannot remove %s in data dir %q: %w", snapName, s.dir, ioErr(s.dir, err))
	}
	return s.syncDir()
}

func (s *store) path() string { return s.dir }

func (s *store) close() error {
	var err error
	if s.f != nil {
		err = s.f.Close()
	}
	_ = s.lock.Close() // drops the flock
	return err
}

// ioErr says "no space left on device in <dir>" for a full disk (or quota),
// so that an operator is not sent looking for corruption.
func ioErr(dir string, err error) error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return fmt.Errorf("no space left on device in %s: %w", dir, err)
	}
	return err
}
