package single

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ticketd/ticketd/internal/fscktest"
	"github.com/ticketd/ticketd/shard"
)

// dirContents is every file of dir with its bytes.
func dirContents(t *testing.T, dir string) map[string]string {
	t.Helper()
	m := map[string]string{}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.IsDir() {
			for n, b := range dirContents(t, filepath.Join(dir, e.Name())) {
				m[e.Name()+"/"+n] = b
			}
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		m[e.Name()] = string(b)
	}
	return m
}

// usedDir is a data dir after a run that granted tokens and then crashed
// (closed without a snapshot), or shut down cleanly with clean set.
func usedDir(t *testing.T, clean bool) string {
	dir := t.TempDir()
	r, err := Open(Options{DataDir: dir, Shards: 2, SweepInterval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if clean {
		if err := r.Shutdown(t.Context()); err != nil {
			t.Fatal(err)
		}
	} else if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	return dir
}

// A data dir that was used before but whose state cannot be read back
// whole is refused with an error that names the dir and says what is
// wrong, and nothing in it is changed, however often it is tried. With
// RecoverDamaged it starts in crash grace for MaxLease with tokens above
// the wall clock in ns, and the damaged files are kept aside.
func TestDamagedDataDir(t *testing.T) {
	flip := func(name string) func(t *testing.T, dir string) {
		return func(t *testing.T, dir string) {
			p := filepath.Join(dir, name)
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			at := len(b) / 10
			for i := at; i < at+4 && i < len(b); i++ {
				b[i] ^= 0x5a
			}
			if err := os.WriteFile(p, b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	cases := []struct {
		name   string
		clean  bool
		damage func(t *testing.T, dir string)
		want   string
	}{
		{"state emptied", false, func(t *testing.T, dir string) {
			if err := os.Truncate(filepath.Join(dir, stateName), 0); err != nil {
				t.Fatal(err)
			}
		}, "ticketd.state is damaged"},
		{"state flipped", false, flip(stateName), "ticketd.state is damaged"},
		{"state deleted", false, func(t *testing.T, dir string) {
			if err := os.Remove(filepath.Join(dir, stateName)); err != nil {
				t.Fatal(err)
			}
		}, "ticketd.state is missing"},
		{"state deleted, snapshot left", true, func(t *testing.T, dir string) {
			if err := os.Remove(filepath.Join(dir, stateName)); err != nil {
				t.Fatal(err)
			}
		}, "ticketd.state is missing"},
		{"state deleted, other files left", false, func(t *testing.T, dir string) {
			if err := os.Remove(filepath.Join(dir, stateName)); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "CURRENT"), []byte("MANIFEST-000001\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, "ticketd.state is missing"},
		{"files moved into lost+found", true, func(t *testing.T, dir string) {
			if err := fscktest.IntoLostFound(dir); err != nil {
				t.Fatal(err)
			}
		}, "lost+found with 3 entries"},
		{"snapshot flipped", true, flip(snapName), "ticketd.snapshot is damaged"},
		{"snapshot truncated", true, func(t *testing.T, dir string) {
			if err := os.Truncate(filepath.Join(dir, snapName), 10); err != nil {
				t.Fatal(err)
			}
		}, "ticketd.snapshot is damaged"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := usedDir(t, tc.clean)
			tc.damage(t, dir)
			before := dirContents(t, dir)
			for range 2 {
				_, err := Open(Options{DataDir: dir, Shards: 2, SweepInterval: time.Second})
				if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("open: %v; want ErrDamaged naming %q and saying %q", err, dir, tc.want)
				}
				if after := dirContents(t, dir); !maps.Equal(before, after) {
					t.Fatalf("a refused data dir was written to:\nbefore %q\nafter  %q", keys(before), keys(after))
				}
			}

			start := time.Now()
			const maxLease = 10 * time.Minute
			r, err := Open(Options{DataDir: dir, Shards: 2, SweepInterval: time.Second, MaxLease: maxLease, RecoverDamaged: true})
			if err != nil {
				t.Fatal(err)
			}
			if !r.Crashed || len(r.Recovered) == 0 {
				t.Errorf("recovered: crashed=%v damage=%q", r.Crashed, r.Recovered)
			}
			if r.TokenFloor < uint64(start.UnixNano()) {
				t.Errorf("tokens restart above %d, below the wall clock %d", r.TokenFloor, start.UnixNano())
			}
			if r.GraceUntil < start.Add(maxLease).UnixNano() {
				t.Errorf("grace until %v, before start + max lease %v", time.Unix(0, r.GraceUntil), start.Add(maxLease))
			}
			for _, p := range r.SetAside {
				if _, err := os.Stat(p); err != nil {
					t.Errorf("damaged file set aside: %v", err)
				}
			}
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
			// The recovery's floor and grace are durable: the next start is
			// an ordinary crash restart with them.
			r2, err := Open(Options{DataDir: dir, Shards: 2, SweepInterval: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer r2.Close()
			if r2.TokenFloor < r.TokenFloor || r2.GraceUntil < r.GraceUntil {
				t.Errorf("after the recovery: floor %d grace %d, want at least %d %d", r2.TokenFloor, r2.GraceUntil, r.TokenFloor, r.GraceUntil)
			}
		})
	}
}

// A recovery restarts tokens at the wall clock in ns, above every token
// granted before only if the clock has not gone back: with the clock behind
// the dir's last use (a host that booted with a wrong clock) it is refused,
// and nothing in the dir changes; also behind a time an earlier recovery
// left in the name of a file it set aside.
func TestRecoveryRefusedWithTheClockBehind(t *testing.T) {
	for _, aside := range []bool{false, true} {
		t.Run(fmt.Sprintf("aside=%v", aside), func(t *testing.T) {
			dir := usedDir(t, false)
			if err := os.Truncate(filepath.Join(dir, stateName), 0); err != nil {
				t.Fatal(err)
			}
			behind := time.Now().Add(-24 * time.Hour).UnixNano()
			by := "the modification time of "
			if aside {
				// An earlier recovery, on a clock a day ahead of this one's.
				future := time.Now().Add(24 * time.Hour).UnixNano()
				name := fmt.Sprintf("%s.damaged-%d", snapName, future)
				if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
					t.Fatal(err)
				}
				behind = time.Now().UnixNano()
				by = "the time in the name of " + name
			}
			before := dirContents(t, dir)
			opt := Options{DataDir: dir, Shards: 2, SweepInterval: time.Second, MaxLease: time.Minute, RecoverDamaged: true}
			_, err := open(opt, env{clock: newFakeClock(behind)})
			if err == nil || !strings.Contains(err.Error(), "set the clock right") || !strings.Contains(err.Error(), dir) {
				t.Fatalf("recovery with the clock behind: %v", err)
			}
			if !strings.Contains(err.Error(), by) { // what to fix when the clock is right
				t.Errorf("the refusal does not say what shows the last use (%q): %v", by, err)
			}
			if after := dirContents(t, dir); !maps.Equal(before, after) {
				t.Fatalf("a refused data dir was written to:\nbefore %q\nafter  %q", keys(before), keys(after))
			}
		})
	}
}

// A snapshot whose checksum holds but whose table does not load (written
// by another version, or a writer's bug) is refused like any damage, and
// RecoverDamaged sets it aside and starts as after a crash: the state file
// is whole, and its ceilings cover the leases and tokens the snapshot held.
func TestSnapshotThatDoesNotLoad(t *testing.T) {
	dir := t.TempDir()
	g := startRig(t, dir, rigOpts{})
	tok := g.dial().acquire("h", "k", 600_000)
	if err := g.shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, snapName))
	if err != nil {
		t.Fatal(err)
	}
	blob, seq, created, err := decodeSnapshot(b)
	if err != nil {
		t.Fatal(err)
	}
	blob = append([]byte(nil), blob...)
	blob[0]++ // the shard count: one table too many
	if err := (&store{dir: dir}).putSnapshot(seq, created, blob); err != nil {
		t.Fatal(err)
	}
	opt := Options{DataDir: dir, Shards: 4, SweepInterval: time.Hour, MaxLease: time.Hour}
	e := env{clock: newFakeClock(testStart)}
	if _, err := open(opt, e); !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), "does not load") {
		t.Fatalf("open: %v; want ErrDamaged saying the table does not load", err)
	}
	opt.RecoverDamaged = true
	r, err := open(opt, e)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if !r.Crashed || len(r.Recovered) != 1 || len(r.SetAside) != 1 {
		t.Fatalf("recovered: crashed=%v damage=%q set aside %q", r.Crashed, r.Recovered, r.SetAside)
	}
	if _, err := os.Stat(r.SetAside[0]); err != nil {
		t.Errorf("the snapshot was not kept aside: %v", err)
	}
	if r.TokenFloor < tok || r.GraceUntil < testStart+int64(600*time.Second) {
		t.Errorf("floor %d grace until %d: want tokens above %d and grace past k's lease end %d", r.TokenFloor, r.GraceUntil, tok, testStart+int64(600*time.Second))
	}
}

// A recovery stopped right after it wrote the state file anew, before the
// start's first raise (killed, or that write failed), leaves the recovery's
// ceilings behind, not zeros: the next ordinary start is a crash restart
// with them, not one that starts tokens again at 1 and grants at once.
func TestRecoveryStoppedBeforeItsFirstRaise(t *testing.T) {
	dir := usedDir(t, false)
	if err := os.Truncate(filepath.Join(dir, stateName), 0); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	const maxLease = 10 * time.Minute
	killed := errors.New("killed before the first raise")
	_, err := open(Options{DataDir: dir, Shards: 2, SweepInterval: time.Second, MaxLease: maxLease, RecoverDamaged: true},
		env{wrapStore: func(d durable) durable {
			return &faultStore{durable: d, saveErr: func(state) error { return killed }}
		}})
	if !errors.Is(err, killed) {
		t.Fatalf("recovery with its first save failing: %v", err)
	}
	r, err := Open(Options{DataDir: dir, Shards: 2, SweepInterval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if !r.Crashed || r.TokenFloor < uint64(start.UnixNano()) || r.GraceUntil < start.Add(maxLease).UnixNano() {
		t.Errorf("after a recovery stopped early: crashed=%v, tokens above %d, grace until %v; want above %d and until %v",
			r.Crashed, r.TokenFloor, time.Unix(0, r.GraceUntil), start.UnixNano(), start.Add(maxLease))
	}
}

func keys(m map[string]string) []string {
	var k []string
	for n := range m {
		k = append(k, n)
	}
	return k
}

// A new dir, an empty one and one holding only lost+found are new.
func TestNewDataDir(t *testing.T) {
	for _, c := range []struct {
		prep func(dir string) error
		new  string // what the runner says of it, for the log
	}{
		{func(dir string) error { return os.Remove(dir) }, "made"},
		{func(dir string) error { return nil }, "empty"},
		{func(dir string) error { return os.Mkdir(filepath.Join(dir, "lost+found"), 0o700) }, "empty"},
	} {
		dir := t.TempDir()
		if err := c.prep(dir); err != nil {
			t.Fatal(err)
		}
		r, err := Open(Options{DataDir: dir, Shards: 2, SweepInterval: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if r.Crashed || r.GraceUntil != 0 {
			t.Errorf("a new dir starts as after a crash: %+v", r)
		}
		if r.NewDir != c.new {
			t.Errorf("NewDir %q, want %q", r.NewDir, c.new)
		}
		if err := r.Shutdown(t.Context()); err != nil {
			t.Fatal(err)
		}
		// Used now: the next start is a clean restart, not a new dir.
		r, err = Open(Options{DataDir: dir, Shards: 2, SweepInterval: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if r.NewDir != "" || !r.Clean {
			t.Errorf("the second start: NewDir %q, clean %v; want a clean restart", r.NewDir, r.Clean)
		}
		r.Close()
	}
}

func TestDataDirThatIsAFile(t *testing.T) {
	f := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(f, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(Options{DataDir: f, Shards: 1, SweepInterval: time.Second}); err == nil || !strings.Contains(err.Error(), f) {
		t.Fatalf("open of a file as data dir: %v; want an error naming it", err)
	}
}

// A cluster node's data dir is refused, recovery or not: nothing of it is
// set aside or written.
func TestClusterDataDirRefused(t *testing.T) {
	for _, recover := range []bool{false, true} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "cluster.json"), []byte("{}\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(filepath.Join(dir, "raft"), 0o755); err != nil {
			t.Fatal(err)
		}
		_, err := Open(Options{DataDir: dir, Shards: 1, SweepInterval: time.Second, MaxLease: time.Hour, RecoverDamaged: recover})
		if err == nil || !strings.Contains(err.Error(), "cluster node") {
			t.Fatalf("recover=%v: Open: %v", recover, err)
		}
		names, _ := os.ReadDir(dir)
		if len(names) != 2 {
			t.Fatalf("recover=%v: the dir changed: %v", recover, names)
		}
	}
}

// A clean-shutdown snapshot belongs to the state written last before it. A
// start that loads one writes the state before it removes the file; were
// the removal lost (a power loss after a directory sync that failed), the
// snapshot back in place must not be loaded again, which would take tokens
// back: the next start is a crash's restart.
func TestSnapshotBackAfterItsLoadIsNotLoaded(t *testing.T) {
	dir := usedDir(t, true)
	snap, err := os.ReadFile(filepath.Join(dir, snapName))
	if err != nil {
		t.Fatal(err)
	}
	r, err := Open(Options{DataDir: dir, Shards: 2, SweepInterval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if r.Crashed {
		t.Fatal("a clean shutdown's snapshot was not loaded")
	}
	floor := r.TokenFloor
	if err := r.Close(); err != nil { // a crash
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, snapName), snap, 0o644); err != nil {
		t.Fatal(err)
	}
	r2, err := Open(Options{DataDir: dir, Shards: 2, SweepInterval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	if !r2.Crashed || r2.TokenFloor <= floor {
		t.Errorf("the old snapshot back in place: crashed=%v, tokens above %d; want a crash restart above %d", r2.Crashed, r2.TokenFloor, floor)
	}
	if _, err := os.Stat(filepath.Join(dir, snapName)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the stale snapshot is still there: %v", err)
	}
}

// rewriteSnapshot puts dir's snapshot table back under the header that
// header makes of it (the table and the Seq it names).
func rewriteSnapshot(t *testing.T, dir string, header func(blob []byte, seq uint64) []byte) {
	t.Helper()
	p := filepath.Join(dir, snapName)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	blob, seq, _, err := decodeSnapshot(b)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, append(header(blob, seq), blob...), 0o644); err != nil {
		t.Fatal(err)
	}
}

// earlierFormat rewrites dir's snapshot in the format from before
// snapshots named their state's Seq, and, with earlierState, the state as
// a version of that time wrote it (without SeqSnaps).
func earlierFormat(t *testing.T, dir string, earlierState bool) state {
	t.Helper()
	rewriteSnapshot(t, dir, func(blob []byte, _ uint64) []byte {
		old := make([]byte, snapHeader1)
		copy(old, snapMagic1)
		binary.BigEndian.PutUint64(old[8:], uint64(len(blob)))
		binary.BigEndian.PutUint32(old[16:], crc32.Checksum(blob, castagnoli))
		return old
	})
	b, err := os.ReadFile(filepath.Join(dir, stateName))
	if err != nil {
		t.Fatal(err)
	}
	st, err := decodeState(b)
	if err != nil {
		t.Fatal(err)
	}
	if earlierState {
		st.SeqSnaps = false
		if err := os.WriteFile(filepath.Join(dir, stateName), st.encode(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return st
}

// A snapshot written before snapshots named their state's Seq, beside a
// state of the same time (an upgrade), still loads; as nothing tells it
// from one put back, tokens go on above every reservation made.
func TestSnapshotOfTheEarlierFormatLoads(t *testing.T) {
	dir := usedDir(t, true)
	st := earlierFormat(t, dir, true)
	r, err := Open(Options{DataDir: dir, Shards: 2, SweepInterval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.Crashed {
		t.Error("a snapshot of the earlier format was not loaded")
	}
	if r.TokenFloor < st.TokenCeil {
		t.Errorf("tokens start above %d after the earlier format's snapshot, want above the state's ceiling %d", r.TokenFloor, st.TokenCeil)
	}
}

// A snapshot of the earlier format beside a state that a run of this
// version wrote is older than that run (put back, or a removal that did not
// last): its table lacks the keys granted since, so it is not loaded, and
// the start is a crash restart that says why.
func TestSnapshotOfTheEarlierFormatAfterThisVersionRanIsNotLoaded(t *testing.T) {
	dir := usedDir(t, true)
	st := earlierFormat(t, dir, false)
	if !st.SeqSnaps {
		t.Fatal("this version's state does not say that its snapshots name their Seq")
	}
	r, err := Open(Options{DataDir: dir, Shards: 2, SweepInterval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if !r.Crashed || r.TokenFloor < st.TokenCeil {
		t.Errorf("crashed=%v, tokens above %d; want a crash restart above %d", r.Crashed, r.TokenFloor, st.TokenCeil)
	}
	if !strings.Contains(r.StaleSnapshot, "earlier format") {
		t.Errorf("the reason given: %q", r.StaleSnapshot)
	}
	if _, err := os.Stat(filepath.Join(dir, snapName)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the stale snapshot is still there: %v", err)
	}
}

// A state file older than the snapshot it was written with (a write lost,
// a file put back from a copy) holds ceilings below the tokens and leases
// already given: the dir is damaged, and its recovery does not trust them.
func TestStateBehindItsSnapshot(t *testing.T) {
	dir := t.TempDir()
	g := startRig(t, dir, rigOpts{tokenBlock: 16, shards: 1})
	old, err := os.ReadFile(filepath.Join(dir, stateName)) // tokens up to 16
	if err != nil {
		t.Fatal(err)
	}
	c := g.dial()
	var last uint64
	for i := range 40 {
		last = c.acquire("o", fmt.Sprintf("k%d", i), 600_000)
	}
	if err := g.shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, stateName), old, 0o644); err != nil {
		t.Fatal(err)
	}
	opt := Options{DataDir: dir, Shards: 1, SweepInterval: time.Hour, MaxLease: time.Hour}
	if _, err := open(opt, env{clock: g.clock}); !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), "went back") {
		t.Fatalf("open: %v; want ErrDamaged saying the state went back", err)
	}
	opt.RecoverDamaged = true
	r, err := open(opt, env{clock: g.clock})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.TokenFloor < last || r.GraceUntil < testStart+int64(600*time.Second) {
		t.Errorf("recovered with tokens above %d, grace until %d: want tokens above %d and grace past the leases' end %d",
			r.TokenFloor, r.GraceUntil, last, testStart+int64(600*time.Second))
	}
}

// A snapshot whose second table does not load is recovered onto empty
// tables, and the keys the first table's load counted against --max-keys
// are not counted any more: the recovered server takes new keys up to it.
func TestRecoveredSnapshotKeepsNoKeysOfItsTables(t *testing.T) {
	dir := t.TempDir()
	clk := newFakeClock(testStart)
	r0, err := open(Options{DataDir: dir, Shards: 2, SweepInterval: time.Hour, MaxLease: time.Second}, env{clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	_ = r0.Close()

	// A clean-shutdown snapshot bound to the state: shard 0 holds one
	// (expired) key, shard 1's table is garbage under a valid outer checksum.
	tb := shard.New(shard.Config{})
	tb.Apply(testStart, &shard.Command{Op: shard.OpAcquire, From: shard.Requester{Conn: 1, Seq: 1}, Owner: []byte("o"), Key: []byte("a"), LeaseMs: 1}, nil)
	var b0 bytesWriter
	if err := tb.WriteSnapshot(&b0); err != nil {
		t.Fatal(err)
	}
	blob := binary.AppendUvarint(nil, 2)
	blob = binary.AppendUvarint(blob, uint64(len(b0)))
	blob = append(blob, b0...)
	blob = binary.AppendUvarint(blob, 2)
	blob = append(blob, "xx"...)
	s, ld, err := openStore(dir, false, time.Second, clk.now())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.putSnapshot(ld.st.Seq, ld.st.Created, blob); err != nil {
		t.Fatal(err)
	}
	_ = s.close()

	r, err := open(Options{DataDir: dir, Shards: 2, MaxKeys: 1, SweepInterval: time.Hour, MaxLease: time.Second, RecoverDamaged: true}, env{clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.Recovered == nil {
		t.Fatal("not recovered")
	}
	if n := r.Stats().Keys; n != 0 {
		t.Fatalf("%d keys after recovery, want 0", n)
	}
	after := r.GraceUntil + 1
	p := r.parts[0]
	out := p.t.Apply(after, &shard.Command{Op: shard.OpAcquire, From: shard.Requester{Conn: 9, Seq: 1}, Owner: []byte("p"), Key: []byte("new"), LeaseMs: 1000}, nil)
	if len(out) != 1 || out[0].Result != shard.Acquired {
		t.Fatalf("an empty server with --max-keys 1 answered %c to a new key, want A", out[0].Result.Letter())
	}
}

// A whole older copy of a data dir, put back after the dir was lost, shows
// no damage, and its ceilings are behind tokens and leases given since: the
// flag the README names for that case must make the start a recovery.
func TestRecoverFlagTreatsAWholeDirAsAnOlderCopy(t *testing.T) {
	dir := t.TempDir()
	g := startRig(t, dir, rigOpts{tokenBlock: 16, shards: 1})
	c := g.dial()
	c.acquire("o", "early", 1000)
	backup := dirContents(t, dir) // the operator's copy
	var last uint64
	for i := range 40 {
		last = c.acquire("o", fmt.Sprintf("k%d", i), 600_000)
	}
	g.crash() // the dir is lost; the copy is all there is

	for n, b := range backup {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(b), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	g.clock.Advance(10 * time.Second)
	opt := Options{DataDir: dir, Shards: 1, SweepInterval: time.Hour, MaxLease: time.Hour, RecoverDamaged: true}
	r, err := open(opt, env{clock: g.clock, tokenBlock: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.Recovered == nil {
		t.Error("the start with the flag was not a recovery")
	}
	if r.TokenFloor < last {
		t.Errorf("tokens restart above %d: token %d was granted already", r.TokenFloor, last)
	}
	if end := testStart + int64(600*time.Second); r.GraceUntil < end {
		t.Errorf("grace until %v after the first start, before the leases of k0..k39 end (%v)",
			time.Duration(r.GraceUntil-testStart), time.Duration(end-testStart))
	}
}

// The state record round-trips every field; one written before MaxLease
// was kept (those bytes zero, under the same checksum) reads as unknown.
func TestStateRecordRoundTrip(t *testing.T) {
	st := state{Seq: 7, Created: 1, TokenCeil: 1 << 40, LeaseCeil: 1 << 61, Shards: 16, MaxLease: int64(time.Hour), SeqSnaps: true}
	got, err := decodeState(st.encode())
	if err != nil || got != st {
		t.Fatalf("decode(encode(%+v)) = %+v, %v", st, got, err)
	}
	st.MaxLease, st.SeqSnaps = 0, false
	if got, err := decodeState(st.encode()); err != nil || got.MaxLease != 0 || got.SeqSnaps {
		t.Fatalf("an earlier record: %+v, %v", got, err)
	}
}

// A dir of an earlier version, which kept no --max-lease, restarted after
// a crash with a shorter --max-lease than its leases: the grace covers
// them, and so does the grace of a second crash right after, which the
// first restart's record of --max-lease bounds.
func TestEarlierVersionsLeasesOutliveTwoCrashes(t *testing.T) {
	dir := usedDir(t, false)
	b, err := os.ReadFile(filepath.Join(dir, stateName))
	if err != nil {
		t.Fatal(err)
	}
	st, err := decodeState(b)
	if err != nil {
		t.Fatal(err)
	}
	leaseEnd := time.Now().Add(time.Minute).UnixNano() // a lease it granted
	st.MaxLease, st.SeqSnaps, st.LeaseCeil = 0, false, leaseEnd
	if err := os.WriteFile(filepath.Join(dir, stateName), st.encode(), 0o644); err != nil {
		t.Fatal(err)
	}
	for crash := 1; crash <= 2; crash++ {
		r, err := Open(Options{DataDir: dir, Shards: 2, SweepInterval: time.Second, MaxLease: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if r.GraceUntil < leaseEnd {
			t.Errorf("restart after crash %d: no grants before %v, but a lease runs until %v",
				crash, time.Unix(0, r.GraceUntil), time.Unix(0, leaseEnd))
		}
		if err := r.Close(); err != nil { // a crash
			t.Fatal(err)
		}
	}
}

// A recovery of a dir whose state is damaged but whose clean-shutdown
// snapshot decodes whole does not load the snapshot's table, but waits out
// its leases: a --max-lease shorter than they were (against the advice)
// must not end the grace while they run.
func TestRecoveryWaitsOutTheSnapshotsLeases(t *testing.T) {
	dir := t.TempDir()
	g := startRig(t, dir, rigOpts{shards: 2})
	c := g.dial()
	c.acquire("o", "k", 600_000)
	c.c.Close() // the shutdown need not wait for it
	if err := g.shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(dir, stateName), 32); err != nil {
		t.Fatal(err)
	}
	opt := Options{DataDir: dir, Shards: 2, SweepInterval: time.Hour, MaxLease: 5 * time.Second, RecoverDamaged: true}
	r, err := open(opt, env{clock: g.clock})
	if err != nil {
		t.Fatal(err)
	}
	if r.Recovered == nil {
		t.Fatal("not recovered")
	}
	end := testStart + int64(600*time.Second)
	if r.GraceUntil < end {
		t.Errorf("recovered with grace until %v; the snapshot's lease runs until %v",
			time.Unix(0, r.GraceUntil), time.Unix(0, end))
	}
	// And so does the grace of a crash right after, which the recorded
	// --max-lease bounds.
	_ = r.Close()
	opt.RecoverDamaged = false
	r, err = open(opt, env{clock: g.clock})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.GraceUntil < end {
		t.Errorf("a crash after the recovery: grace until %v; the snapshot's lease runs until %v",
			time.Unix(0, r.GraceUntil), time.Unix(0, end))
	}
}

// --shards changes on a start after a clean shutdown that held no key:
// nothing is carried over but the tokens, which go on above the earlier
// ones. One that held a key is refused with what to do.
func TestShardsChangeAfterACleanShutdownWithoutKeys(t *testing.T) {
	dir := t.TempDir()
	g := startRig(t, dir, rigOpts{shards: 2})
	c := g.dial()
	tok := c.acquire("o", "k", 600_000)
	c.c.Close()
	if err := g.shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	opt := Options{DataDir: dir, Shards: 4, SweepInterval: time.Hour, MaxLease: time.Hour}
	if _, err := open(opt, env{clock: g.clock}); err == nil || !strings.Contains(err.Error(), "with 1 keys in it; restart with --shards=2") {
		t.Fatalf("--shards 4 after a clean shutdown holding a key: %v", err)
	}

	g = startRig(t, dir, rigOpts{shards: 2, clock: g.clock})
	c = g.dial()
	c.send(fmt.Sprintf("R %d k", tok))
	c.expect(fmt.Sprintf("R %d k", tok))
	c.c.Close()
	if err := g.shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	r, err := open(opt, env{clock: g.clock})
	if err != nil {
		t.Fatalf("--shards 4 after a clean shutdown holding no key: %v", err)
	}
	defer r.Close()
	if !r.Clean || r.Crashed || r.GraceUntil != 0 {
		t.Errorf("clean %v, crashed %v, grace until %d: want a clean restart without grace", r.Clean, r.Crashed, r.GraceUntil)
	}
	if r.TokenFloor <= tok {
		t.Errorf("tokens start above %d, at or below the earlier token %d", r.TokenFloor, tok)
	}
}

// A crash grace still running at a clean shutdown goes on after a restart
// with other --shards on a wall clock that reads fast: what it had left at
// the stop, counted from the restart.
func TestGraceCarriedOverAShardsChangeOnAFastClock(t *testing.T) {
	dir := t.TempDir()
	g := startRig(t, dir, rigOpts{shards: 2})
	g.dial().acquire("o", "k", 600_000)
	g.crash()
	g2 := startRig(t, dir, rigOpts{shards: 2, clock: newFakeClock(g.clock.now() + int64(time.Second))})
	left := g2.r.GraceUntil - g2.clock.now()
	if left < int64(590*time.Second) {
		t.Fatalf("crash grace of %v, want the lease's 599s", time.Duration(left))
	}
	if err := g2.shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	now := g2.clock.now() + int64(5*time.Second) + int64(time.Hour)
	r, err := open(Options{DataDir: dir, Shards: 4, SweepInterval: time.Hour, MaxLease: time.Hour}, env{clock: newFakeClock(now)})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if got := r.GraceUntil - now; got < left {
		t.Errorf("grace of %v after the restart an hour fast, want the %v it had left at the stop", time.Duration(max(got, 0)), time.Duration(left))
	}
}

// A snapshot of another data dir (a mix-up while moving files, a sync
// tool), even at the same Seq as this dir's state, is not loaded as this
// dir's clean shutdown, which would forget its holders and take its tokens
// back; and as ticketd.state and ticketd.id may as well be the ones copied
// in, a crash's restart on the state's ceilings is no safer. The dir is
// refused as damaged, untouched; a recovery then starts above every token
// and past every lease of it.
func TestSnapshotOfAnotherDataDirIsRefused(t *testing.T) {
	dirA, dirB := t.TempDir(), t.TempDir()
	a := startRig(t, dirA, rigOpts{shards: 1})
	ca := a.dial()
	held := ca.acquire("a", "ka", 600_000)
	var last uint64
	for i := range 4 {
		last = ca.acquire("a", fmt.Sprintf("other%d", i), 600_000)
	}
	ca.c.Close() // or the shutdown lingers for it
	if err := a.shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	stA := a.store.state()
	b := startRig(t, dirB, rigOpts{shards: 1, clock: newFakeClock(testStart + int64(time.Second))}) // first used a second later
	cb := b.dial()
	cb.acquire("b", "kb", 600_000)
	cb.c.Close()
	if err := b.shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	stB := b.store.state()

	// B's snapshot in A's dir, at A's Seq: as if the two dirs had seen as
	// many writes.
	raw, err := os.ReadFile(filepath.Join(dirB, snapName))
	if err != nil {
		t.Fatal(err)
	}
	blob, _, created, err := decodeSnapshot(raw)
	if err != nil || created != stB.Created {
		t.Fatalf("B's snapshot: created %d (B's state: %d), %v", created, stB.Created, err)
	}
	if err := (&store{dir: dirA}).putSnapshot(stA.Seq, created, blob); err != nil {
		t.Fatal(err)
	}
	refusedUntouched(t, dirA, "different data dirs")

	opt := Options{DataDir: dirA, Shards: 1, SweepInterval: time.Hour, MaxLease: time.Hour, RecoverDamaged: true}
	r, err := open(opt, env{clock: newFakeClock(testStart)})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.Recovered == nil || r.TokenFloor < last || r.GraceLeft() < 600*time.Second {
		t.Errorf("recovered: %v, tokens above %d (ka's is %d, the last %d), grace %v; want a recovery above both and past ka's lease",
			r.Recovered, r.TokenFloor, held, last, r.GraceLeft())
	}
}

// A state file of another data dir copied in, this dir's ticketd.id left
// as it was, is refused as damaged, untouched: its ceilings are not this
// dir's, and a start on them granted held keys again and went back on
// tokens. With a snapshot of this dir beside it, and without.
func TestStateOfAnotherDataDirIsRefused(t *testing.T) {
	for _, clean := range []bool{true, false} {
		t.Run(fmt.Sprintf("clean=%v", clean), func(t *testing.T) {
			dirA, dirB := t.TempDir(), t.TempDir()
			b := startRig(t, dirB, rigOpts{shards: 1, clock: newFakeClock(testStart - int64(time.Hour))}) // used before A
			cb := b.dial()
			cb.acquire("b", "kb", 1000)
			cb.c.Close()
			b.crash()

			a := startRig(t, dirA, rigOpts{shards: 1})
			ca := a.dial()
			var last uint64
			for i := range 4 {
				last = ca.acquire("a", fmt.Sprintf("held%d", i), 600_000)
			}
			ca.c.Close()
			if clean {
				if err := a.shutdown(t.Context()); err != nil {
					t.Fatal(err)
				}
			} else {
				a.crash()
			}
			raw, err := os.ReadFile(filepath.Join(dirB, stateName))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dirA, stateName), raw, 0o644); err != nil {
				t.Fatal(err)
			}
			refusedUntouched(t, dirA, "another data dir")

			opt := Options{DataDir: dirA, Shards: 1, SweepInterval: time.Hour, MaxLease: time.Hour, RecoverDamaged: true}
			r, err := open(opt, env{clock: newFakeClock(testStart + int64(time.Second))})
			if err != nil {
				t.Fatal(err)
			}
			if r.Recovered == nil || r.TokenFloor < last || r.GraceLeft() < 599*time.Second {
				t.Errorf("recovered: %v, tokens above %d (A's last %d), grace %v; want a recovery above A's tokens and past its leases",
					r.Recovered, r.TokenFloor, last, r.GraceLeft())
			}
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
			// The recovery's new state and ticketd.id agree: the next
			// start is an ordinary one.
			r, err = open(Options{DataDir: dirA, Shards: 1, SweepInterval: time.Hour, MaxLease: time.Hour}, env{clock: newFakeClock(testStart + 2*int64(time.Second))})
			if err != nil {
				t.Fatalf("the start after the recovery: %v", err)
			}
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A dir that an earlier version recovered, which began a state of its own
// and left ticketd.id naming the dir's first use, still starts: a state
// begun by a recovery names a later first use than the id's, with tokens
// above it.
func TestDirRecoveredByAnEarlierVersionStarts(t *testing.T) {
	dir := usedDir(t, false)
	idBefore, err := os.ReadFile(filepath.Join(dir, idName))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, stateName), []byte("damaged"), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := Open(Options{DataDir: dir, Shards: 2, SweepInterval: time.Second, MaxLease: time.Minute, RecoverDamaged: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, idName), idBefore, 0o644); err != nil { // as an earlier version left it
		t.Fatal(err)
	}
	r, err = Open(Options{DataDir: dir, Shards: 2, SweepInterval: time.Second, MaxLease: time.Minute})
	if err != nil {
		t.Fatalf("a dir recovered by an earlier version: %v", err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
}

// refusedUntouched opens dir without recovery, wants it refused as damaged
// with an error that contains want, and nothing in it changed.
func refusedUntouched(t *testing.T, dir, want string) {
	t.Helper()
	before := dirContents(t, dir)
	_, err := open(Options{DataDir: dir, Shards: 1, SweepInterval: time.Hour, MaxLease: time.Hour}, env{clock: newFakeClock(testStart)})
	if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), want) {
		t.Fatalf("open: %v; want it refused as damaged, saying %q", err, want)
	}
	if after := dirContents(t, dir); !maps.Equal(before, after) {
		t.Fatalf("a refused data dir was written to:\nbefore %q\nafter  %q", keys(before), keys(after))
	}
}

// A snapshot of the format before snapshots named their dir, beside its
// state (an upgrade), still loads as a clean shutdown.
func TestSnapshotOfTheFormatBeforeDirsLoads(t *testing.T) {
	dir := usedDir(t, true)
	rewriteSnapshot(t, dir, func(blob []byte, seq uint64) []byte {
		old := make([]byte, snapHeader2)
		copy(old, snapMagic2)
		binary.BigEndian.PutUint64(old[8:], uint64(len(blob)))
		binary.BigEndian.PutUint64(old[20:], seq)
		binary.BigEndian.PutUint32(old[16:], crc32.Update(crc32.Checksum(old[20:], castagnoli), castagnoli, blob))
		return old
	})
	r, err := Open(Options{DataDir: dir, Shards: 2, SweepInterval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.Crashed || !r.Clean {
		t.Errorf("a snapshot of the format before dirs: crashed=%v clean=%v; want it loaded", r.Crashed, r.Clean)
	}
}
