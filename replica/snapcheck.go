package replica

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"

	pb "github.com/lni/dragonboat/v4/raftpb"
)

// Dragonboat restores a replica from its latest snapshot on every start,
// on one of its own goroutines, and panics there on a block whose checksum
// fails ("corrupted block"): the process ends with a stack trace that names
// no file and no remedy, at every start. A replica cannot be rebuilt from
// such a node's own files (its log before the snapshot is compacted away),
// so Start reads each shard's latest snapshot first and refuses, saying
// which file and what to do.
//
// The format is Dragonboat's snapshot file, version 2, as the pinned
// module writes it (internal/rsm: snapshotio.go, rwv.go): a 1 KiB header
// (its length, then the SnapshotHeader, which carries a CRC-32 of itself),
// the payload in blocks of snapshotBlock bytes each followed by its CRC-32
// (IEEE, big-endian; the header holds the CRC-32 of those), and a tail of the blocks' total length and a magic
// number. TestSnapshotCheckReadsDragonboatsFiles holds the two to the
// same files.
const (
	snapshotHeaderSize = 1024
	snapshotBlock      = 2 << 20
	snapshotTail       = 16
	snapshotVersion    = 2
)

var snapshotMagic = []byte{0x3F, 0x5B, 0xCB, 0xF1, 0xFA, 0xBA, 0x81, 0x9F}

var snapshotDirName = regexp.MustCompile(`^snapshot-([0-9A-F]{16})$`)

// latestSnapshot returns the file of the replica's snapshot with the
// highest index under the node host dir, or "" if it has none. Dragonboat
// writes a snapshot in a directory of another name and renames it into
// place once it is whole; it keeps the directory with the highest index.
func latestSnapshot(nodeHostDir string, shardID, replicaID uint64) (string, error) {
	dirs, err := filepath.Glob(filepath.Join(nodeHostDir, "*", "*", "snapshot-part-*",
		fmt.Sprintf("snapshot-%d-%d", shardID, replicaID), "snapshot-*"))
	if err != nil {
		return "", err
	}
	best, bestIdx := "", uint64(0)
	for _, d := range dirs {
		m := snapshotDirName.FindStringSubmatch(filepath.Base(d))
		if m == nil {
			continue
		}
		idx, err := strconv.ParseUint(m[1], 16, 64)
		if err != nil || idx < bestIdx || best != "" && idx == bestIdx {
			continue
		}
		if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
			continue
		}
		best, bestIdx = filepath.Join(d, filepath.Base(d)+".gbsnap"), idx
	}
	return best, nil
}

// checkSnapshotFile reads a snapshot file whole and reports the first thing
// in it that does not hold.
func checkSnapshotFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	size := fi.Size()
	if size < snapshotHeaderSize+snapshotTail {
		return fmt.Errorf("%d bytes, shorter than a snapshot's header and tail", size)
	}
	r := bufio.NewReaderSize(f, 64<<10)
	head := make([]byte, snapshotHeaderSize)
	if _, err := io.ReadFull(r, head); err != nil {
		return err
	}
	n := binary.LittleEndian.Uint64(head)
	if n > snapshotHeaderSize-8 {
		return fmt.Errorf("header length %d does not fit the header", n)
	}
	var h pb.SnapshotHeader
	if err := h.Unmarshal(head[8 : 8+n]); err != nil {
		return fmt.Errorf("header does not decode: %w", err)
	}
	if len(h.HeaderChecksum) > 0 {
		sum := h.HeaderChecksum
		h.HeaderChecksum = nil
		b, err := h.Marshal()
		if err != nil {
			return err
		}
		if !bytes.Equal(sum, binary.BigEndian.AppendUint32(nil, crc32.ChecksumIEEE(b))) {
			return errors.New("header checksum fails")
		}
	}
	if h.Version != snapshotVersion || h.ChecksumType != pb.CRC32IEEE {
		return fmt.Errorf("header names format version %d, checksum type %d: not a format this ticketd writes", h.Version, h.ChecksumType)
	}
	payload := size - snapshotHeaderSize - snapshotTail
	block := make([]byte, snapshotBlock+4)
	sums := crc32.NewIEEE() // of the blocks' checksums: the header's PayloadChecksum
	for off, i := int64(0), 0; off < payload; i++ {
		b := block[:min(int64(len(block)), payload-off)]
		if _, err := io.ReadFull(r, b); err != nil {
			return err
		}
		if len(b) <= 4 || binary.BigEndian.Uint32(b[len(b)-4:]) != crc32.ChecksumIEEE(b[:len(b)-4]) {
			return fmt.Errorf("block %d (at byte %d) fails its checksum", i, snapshotHeaderSize+off)
		}
		sums.Write(b[len(b)-4:])
		off += int64(len(b))
	}
	if !bytes.Equal(sums.Sum(nil), h.PayloadChecksum) {
		return errors.New("the blocks' checksums do not sum to the header's")
	}
	tail := make([]byte, snapshotTail)
	if _, err := io.ReadFull(r, tail); err != nil {
		return err
	}
	if total := binary.LittleEndian.Uint64(tail); total != uint64(payload) || !bytes.Equal(tail[8:], snapshotMagic) {
		return fmt.Errorf("tail does not match the file (blocks of %d bytes, the tail says %d)", payload, total)
	}
	return nil
}

// checkSnapshots checks the latest snapshot of each of the node's shards
// that has one.
func checkSnapshots(nodeHostDir string, replicaID uint64, shards int) error {
	for i := range shards {
		path, err := latestSnapshot(nodeHostDir, uint64(i+1), replicaID)
		if err != nil {
			return err
		}
		if path == "" {
			continue
		}
		if err := checkSnapshotFile(path); err != nil {
			return fmt.Errorf("shard %d's latest raft snapshot %s is damaged: %w", i, path, err)
		}
	}
	return nil
}
