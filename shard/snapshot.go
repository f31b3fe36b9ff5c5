package shard

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"math"
	"slices"
)

// Snapshot format, version 1. Integers are uvarints, times (nanoseconds) zig-zag varints,
// byte strings a uvarint length then the bytes:
//
//	"TKTS" version(1 byte)
//	lastToken maxDeadline grace nextWaiterID keyCount
//	per key, in ascending byte order of the key:
//	    key token deadline waiterCount
//	    per waiter, head first: node conn seq owner leaseMs waitDeadline id
//	CRC-32C of everything before it (4 bytes, little endian)
//
// Sorting the keys makes the bytes a function of the state alone. Statistics
// and the reserved token ceiling are not state and are not written.
const (
	snapMagic   = "TKTS"
	snapVersion = 1
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrSnapshot reports a snapshot that cannot be read: wrong magic, unknown version, bad
// checksum, or contents that break the table's rules.
var ErrSnapshot = errors.New("shard: bad snapshot")

// errNotEmpty: ReadSnapshot needs a table without keys or waiters.
var errNotEmpty = errors.New("shard: ReadSnapshot into a table that is not empty")

// WriteSnapshot writes the table's state at this point (keys, holders, deadlines, waiters,
// counter) to w. The same state always gives the same bytes.
func (t *Table) WriteSnapshot(w io.Writer) error { return t.WriteSnapshotShifted(w, 0) }

// WriteSnapshotShifted is WriteSnapshot with every time in it (deadlines, wait ends, the
// grace) moved later by shift (>= 0): for a reader whose clock runs that much ahead of the
// one the table was kept on, so that each lease keeps the time it had left.
func (t *Table) WriteSnapshotShifted(w io.Writer, shift int64) error {
	at := func(v int64) int64 {
		if v == 0 || shift <= 0 {
			return v // 0: none
		}
		if v > math.MaxInt64-shift {
			return math.MaxInt64
		}
		return v + shift
	}
	ents := make([]*entry, 0, t.keys.len())
	t.keys.each(func(e *entry) {
		if e.live {
			ents = append(ents, e)
		}
	})
	slices.SortFunc(ents, func(a, b *entry) int { return bytes.Compare(a.key, b.key) })

	crc := crc32.New(castagnoli)
	mw := io.MultiWriter(w, crc)
	b := make([]byte, 0, 64<<10)
	b = append(b, snapMagic...)
	b = append(b, snapVersion)
	b = binary.AppendUvarint(b, t.last)
	b = binary.AppendVarint(b, at(t.maxDeadline))
	b = binary.AppendVarint(b, at(t.grace))
	b = binary.AppendUvarint(b, t.nextID)
	b = binary.AppendUvarint(b, uint64(len(ents)))
	for _, e := range ents {
		b = appendBytes(b, e.key)
		b = binary.AppendUvarint(b, e.token)
		b = binary.AppendVarint(b, at(e.deadline))
		b = binary.AppendUvarint(b, uint64(e.nwait))
		for w := e.head; w != nil; w = w.next {
			b = binary.AppendUvarint(b, uint64(w.from.Node))
			b = binary.AppendUvarint(b, w.from.Conn)
			b = binary.AppendUvarint(b, w.from.Seq)
			b = appendBytes(b, w.owner)
			b = binary.AppendUvarint(b, w.leaseMs)
			b = binary.AppendVarint(b, at(w.wait))
			b = binary.AppendUvarint(b, w.id)
		}
		if len(b) >= 60<<10 {
			if _, err := mw.Write(b); err != nil {
				return err
			}
			b = b[:0]
		}
	}
	if _, err := mw.Write(b); err != nil {
		return err
	}
	_, err := w.Write(binary.LittleEndian.AppendUint32(nil, crc.Sum32()))
	return err
}

func appendBytes(b, s []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// ReadSnapshot loads a snapshot into an empty table. On error the table
// is left empty. Capacity limits are not applied to what the snapshot holds: a restart must
// not lose locks (the keys still count against the limits and the budget). The token
// ceiling starts over, so ReserveTokens is called before the next grant.
func (t *Table) ReadSnapshot(r io.Reader) error {
	if t.keys.len() != 0 || t.nwait != 0 {
		return errNotEmpty
	}
	data, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	if len(data) < len(snapMagic)+1+4 || string(data[:len(snapMagic)]) != snapMagic {
		return ErrSnapshot
	}
	if data[len(snapMagic)] != snapVersion {
		return ErrSnapshot
	}
	body, sum := data[:len(data)-4], binary.LittleEndian.Uint32(data[len(data)-4:])
	if crc32.Checksum(body, castagnoli) != sum {
		return ErrSnapshot
	}
	t.reset() // the counters and the token ceiling start over
	if err := t.decode(body[len(snapMagic)+1:]); err != nil {
		t.reset()
		return err
	}
	return nil
}

// reset empties the table: before a load and after a failed one.
func (t *Table) reset() {
	var all []*entry
	t.keys.each(func(e *entry) { all = append(all, e) })
	for _, e := range all {
		for e.head != nil {
			t.removeWaiter(e.head)
		}
		t.drop(e)
		t.keys.del(e)
		t.freeEntry(e)
	}
	t.last, t.ceiling, t.maxDeadline, t.grace, t.nextID = 0, 0, 0, 0, 0
}

type decoder struct {
	b   []byte
	bad bool
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.bad, d.b = true, nil
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.bad, d.b = true, nil
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		d.bad, d.b = true, nil
		return nil
	}
	s := d.b[:n:n]
	d.b = d.b[n:]
	return s
}

func (t *Table) decode(b []byte) error {
	d := &decoder{b: b}
	last := d.uvarint()
	maxDeadline := d.varint()
	grace := d.varint()
	nextID := d.uvarint()
	nkeys := d.uvarint()
	var prev []byte
	for i := uint64(0); i < nkeys && !d.bad; i++ {
		key := d.bytes()
		token := d.uvarint()
		deadline := d.varint()
		nw := d.uvarint()
		if d.bad || len(key) == 0 || (i > 0 && bytes.Compare(prev, key) >= 0) ||
			token > last || (token == 0 && nw == 0) || nw > uint64(len(d.b)) {
			return ErrSnapshot
		}
		prev = key
		e := t.newEntry(key)
		t.keys.put(e)
		e.live, e.token, e.deadline = true, token, deadline
		if t.cfg.Keys != nil {
			t.cfg.Keys.force()
		}
		for j := uint64(0); j < nw && !d.bad; j++ {
			w := t.newWaiter()
			node := d.uvarint()
			w.from.Node = uint32(node)
			w.from.Conn = d.uvarint()
			w.from.Seq = d.uvarint()
			w.owner = append(w.owner[:0], d.bytes()...)
			w.leaseMs = d.uvarint()
			w.wait = d.varint()
			w.id = d.uvarint()
			t.link(e, w)
			if t.cfg.Waiters != nil {
				t.cfg.Waiters.force()
			}
			if w.id >= nextID || node > 1<<32-1 {
				d.bad = true
			}
		}
		t.syncLease(e)
	}
	if d.bad || len(d.b) != 0 {
		return ErrSnapshot
	}
	t.last, t.ceiling, t.maxDeadline, t.grace, t.nextID = last, 0, maxDeadline, grace, nextID
	return nil
}
