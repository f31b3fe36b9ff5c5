package e2e

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A cluster node whose disk fills ends, while the other two go on
// answering; once space is freed it starts again on its data dir, catches
// up and agrees with them, and no key was granted twice meanwhile.
// /metrics shows the free space that ran out.
//
// "under its reserve": the filesystem is filled to 2 MiB free, under the
// node's reserve (a twentieth of 96 MiB), before any load: the node stops
// cleanly within its check's second, saying why, no raft write having met
// the full disk, and a start while the disk stays so full is refused.
// "at once": filled to the last byte while load runs: the node ends
// either way, by its check or by Dragonboat's panic at a write.
func TestClusterNodeOnAFullDisk(t *testing.T) {
	for _, tc := range []struct {
		name    string
		leave   int64 // bytes left free
		atOnce  bool  // fill while the pairs run
		reserve bool  // the node must stop by its reserve
	}{
		{"under its reserve", 2 << 20, false, true},
		{"at once", 0, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			fullDisk(t, tc.leave, tc.atOnce, tc.reserve)
		})
	}
}

func fullDisk(t *testing.T, leave int64, atOnce, reserve bool) {
	mnt := mountTmpfs(t, "96m")
	c := newCluster(t)
	c.dirs[2] = filepath.Join(mnt, "n3")
	for i := range 3 {
		c.start(i)
	}
	c.waitReady()
	a := c.dial(0)
	held := a.acquire("o", "held", 600_000, 0)

	var st unix.Statfs_t
	if err := unix.Statfs(mnt, &st); err != nil {
		t.Fatal(err)
	}
	free := int64(st.Bavail) * int64(st.Bsize)
	if v, err := c.nodes[2].metric("ticketd_data_dir_free_bytes"); err != nil || v <= 0 || v > 96<<20 {
		t.Fatalf("ticketd_data_dir_free_bytes %v (%v) on a 96 MiB filesystem", v, err)
	}
	filler := filepath.Join(mnt, "filler")
	fill := func() {
		f, err := os.Create(filler)
		if err != nil {
			t.Error(err)
			return
		}
		chunk := make([]byte, 1<<20)
		for left := free - leave; left > 0; left -= int64(len(chunk)) {
			if _, err := f.Write(chunk[:min(int64(len(chunk)), left)]); err != nil {
				break
			}
		}
		f.Close()
	}
	if !atOnce {
		fill()
	}

	// Pairs through node 1 until node 3 has ended: every shard's log, and
	// so node 3's disk, takes each of them. Then more of them: the other
	// two go on (after an election for the shards node 3 led, if it did
	// not hand them over).
	var stop atomic.Bool
	var rounds atomic.Int64
	done := make(chan error, 1)
	go func() { done <- pairs(c.listen[0], &stop, &rounds) }()
	// Beside them, the Go client on hot keys over all three nodes: its
	// history must hold no double grant through node 3's end and return.
	w := startWorkload(t, c.addrs(), 6)
	if atOnce {
		time.Sleep(200 * time.Millisecond)
		fill()
	}
	select {
	case <-c.nodes[2].p.Done():
	case err := <-done:
		t.Fatalf("pairs through node 1 failed while node 3 ran: %v", err)
	case <-time.After(60 * time.Second):
		stop.Store(true)
		_ = unix.Statfs(mnt, &st)
		t.Fatalf("node 3 still runs 60s after its disk filled (%d bytes free)", int64(st.Bavail)*int64(st.Bsize))
	}
	log := c.nodes[2].p.Log().String()
	t.Logf("node 3 ended: %s", c.nodes[2].p.ExitState())
	byReserve := strings.Contains(log, "keeps in reserve")
	switch {
	case reserve && !byReserve:
		t.Errorf("node 3 ended (%s) without saying it stopped under its reserve", c.nodes[2].p.ExitState())
	case reserve && (c.nodes[2].exitCode() != 1 || !strings.Contains(log, "stopped cleanly") ||
		strings.Contains(log, "no space left on device") || strings.Contains(log, "panic")):
		t.Errorf("node 3 did not stop cleanly with exit status 1 before a write met the full disk (%s)", c.nodes[2].p.ExitState())
	case !byReserve && !strings.Contains(log, "no space left on device"):
		t.Errorf("node 3 ended (%s) without saying its disk was full", c.nodes[2].p.ExitState())
	}
	at := rounds.Load()
	for deadline := time.Now().Add(30 * time.Second); rounds.Load() < at+5; {
		if time.Now().After(deadline) {
			t.Fatalf("nodes 1 and 2 carried out %d rounds of pairs in 30s after node 3 ended", rounds.Load()-at)
		}
		select {
		case err := <-done:
			t.Fatalf("pairs through node 1 failed once node 3 ended: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	stop.Store(true)
	if err := <-done; err != nil {
		t.Fatalf("nodes 1 and 2, once node 3 ended: %v", err)
	}

	if reserve {
		s, err := launch(t, c.dirs[2], c.args(2)...)
		if err == nil {
			s.stop()
			t.Fatal("node 3 started on a disk under its reserve")
		}
		if !strings.Contains(err.Error(), "keeps in reserve") || !strings.Contains(err.Error(), "free space") {
			t.Errorf("node 3's start on a full disk failed without saying why: %v", err)
		}
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	c.start(2)
	c.waitReady()
	n3 := c.dial(2)
	n3.send(acq("p", "held", 1000, 0))
	n3.expect(timedOut("p", "held"))
	a.release(held, "held")
	t.Logf("%d grants of the hot keys", w.check(t))
	c.agree()
}

// pairs acquires and releases batch keys at a time on addr until stop,
// counting the rounds done. A connection closed after E unavailable (a
// shard that had no leader for too long) is dialled again.
func pairs(addr string, stop *atomic.Bool, rounds *atomic.Int64) error {
	const batch = 100
	var nc net.Conn
	defer func() {
		if nc != nil {
			nc.Close()
		}
	}()
	var r *bufio.Reader
	for n := 0; !stop.Load(); n++ {
		if nc == nil {
			var err error
			if nc, err = net.DialTimeout("tcp", addr, readTimeout); err != nil {
				return err
			}
			r = bufio.NewReader(nc)
		}
		err := pairRound(nc, r, n, batch)
		if errors.Is(err, errUnavailable) {
			nc.Close()
			nc = nil
			continue
		}
		if err != nil {
			return err
		}
		rounds.Add(1)
	}
	return nil
}

var errUnavailable = errors.New("E unavailable")

// pairRound acquires batch keys, reads their grants (answers of different
// shards come in any order) and releases them.
func pairRound(nc net.Conn, r *bufio.Reader, n, batch int) error {
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	read := func() ([]string, error) {
		line, err := r.ReadString('\n')
		if err != nil {
			return nil, err
		}
		if strings.HasPrefix(line, "E unavailable") {
			return nil, errUnavailable
		}
		return strings.Fields(line), nil
	}
	var b strings.Builder
	for i := range batch {
		fmt.Fprintf(&b, "A o k%d-%d 60000 0\n", n, i)
	}
	if _, err := nc.Write([]byte(b.String())); err != nil {
		return err
	}
	b.Reset()
	for range batch {
		f, err := read()
		if err != nil {
			return err
		}
		if len(f) != 4 || f[0] != "A" {
			return fmt.Errorf("got %q to an acquire of a free key", strings.Join(f, " "))
		}
		fmt.Fprintf(&b, "R %s %s\n", f[1], f[3])
	}
	if _, err := nc.Write([]byte(b.String())); err != nil {
		return err
	}
	for range batch {
		f, err := read()
		if err != nil {
			return err
		}
		if len(f) == 0 || f[0] != "R" {
			return fmt.Errorf("got %q to a release", strings.Join(f, " "))
		}
	}
	return nil
}
