package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ticketd/ticketd/internal/serverproc"
	"github.com/ticketd/ticketd/shard"
)

const stateFile = "ticketd.state"

// slowFsync makes every fsync of pid take delay, through strace (the
// process is stopped only at fsync). It returns false if strace cannot
// attach here; the caller's checks then still run, on an ordinary disk.
func slowFsync(t *testing.T, pid int, delay time.Duration) bool {
	t.Helper()
	if _, err := exec.LookPath("strace"); err != nil {
		t.Logf("no strace: fsync is not slowed down (%v)", err)
		return false
	}
	cmd := exec.Command("strace", "-f", "-p", strconv.Itoa(pid), "-e", "trace=fsync",
		"-e", fmt.Sprintf("inject=fsync:delay_enter=%d", delay.Microseconds()), "-o", os.DevNull)
	p, err := serverproc.Start(cmd, func(line []byte) (string, bool) {
		return "", bytes.Contains(line, []byte("attached"))
	})
	if err != nil {
		t.Logf("strace: %v", err)
		return false
	}
	t.Cleanup(p.Kill)
	if err := p.WaitReady(10 * time.Second); err != nil {
		t.Logf("strace did not attach: %v", err)
		return false
	}
	time.Sleep(200 * time.Millisecond) // the other threads' "attached" lines
	return true
}

// A hand-over's answer leaves only once the lease ceiling that covers it
// is on disk: with every fsync slowed down, the waiter gets its A, the
// server is killed at once, and after the restart nobody else gets the key.
func TestHandOverSurvivesCrash(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s1 := startServerDir(t, dir)
	h, w := s1.dial(t), s1.dial(t)
	tok := h.acquire("h", "K", 1500, 0)
	w.send(acq("w", "K", 3600000, 60000))
	w.sync("K")
	slowFsync(t, s1.pid(), 1500*time.Millisecond)

	h.send(rel(tok, "K"))
	line, err := w.readLine(15 * time.Second)
	if err != nil {
		t.Fatalf("waiter: %v", err)
	}
	s1.kill()
	if _, ok := parseAcquired(line, "w", "K"); !ok {
		t.Fatalf("waiter: %q, want A <token> w K", line)
	}

	s2 := startServerDir(t, dir)
	i := s2.dial(t)
	// The ceiling before the hand-over ended about 3.5s after H's grant.
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		i.send(acq("intruder", "K", 1000, 0))
		if got := i.next(); got != timedOut("intruder", "K") {
			t.Fatalf("after the crash, K (held by w for an hour) answered %q", got)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// usedDir is a data dir left by a kill -9 while 40 keys were held for 10
// minutes and tokens had reached at least 16.
func crashedDir(t *testing.T) string {
	dir := t.TempDir()
	s := startServerDir(t, dir)
	c := s.dial(t)
	for i := range 40 {
		c.acquire("o", fmt.Sprintf("key%d", i), 600000, 0)
	}
	s.kill()
	return dir
}

func readDir(t *testing.T, dir string) map[string]string {
	t.Helper()
	m := map[string]string{}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		m[e.Name()] = string(b)
	}
	return m
}

// logField finds the JSON log line with msg and returns it decoded.
func logField(t *testing.T, log, msg string) map[string]any {
	t.Helper()
	for _, line := range strings.Split(log, "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == msg {
			return rec
		}
	}
	t.Fatalf("no %q line in the log:\n%s", msg, log)
	return nil
}

// A data dir whose state cannot be read back whole is refused, with a
// message naming the dir, what is wrong and what to do, and left as it
// was (also on a second try). --recover-damaged-data-dir starts on it with
// no grant for --max-lease and tokens above the wall clock in ns.
func TestDamagedDataDir(t *testing.T) {
	t.Parallel()
	base := crashedDir(t)
	damage := map[string]func(p string) error{
		"emptied": func(p string) error { return os.Truncate(p, 0) },
		"deleted": os.Remove,
		"flipped": func(p string) error {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			at := len(b) / 10
			for i := at; i < at+4; i++ {
				b[i] ^= 0xff
			}
			return os.WriteFile(p, b, 0o644)
		},
	}
	for name, f := range damage {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			dir := filepath.Join(t.TempDir(), "data")
			if out, err := exec.Command("cp", "-a", base, dir).CombinedOutput(); err != nil {
				t.Fatalf("cp: %v %s", err, out)
			}
			if err := f(filepath.Join(dir, stateFile)); err != nil {
				t.Fatal(err)
			}
			before := readDir(t, dir)
			for range 2 {
				code, out, listening := runOnce(t, 15*time.Second, serverproc.TicketdArgs("", dir)...)
				if listening || code == 0 {
					t.Fatalf("started on a damaged data dir (exit %d):\n%s", code, out)
				}
				for _, want := range []string{dir, stateFile, "--recover-damaged-data-dir"} {
					if !strings.Contains(out, want) {
						t.Errorf("message does not say %q:\n%s", want, out)
					}
				}
				if after := readDir(t, dir); !maps.Equal(before, after) {
					t.Fatalf("the refused data dir was written to")
				}
			}

			start := time.Now()
			s := startServerDir(t, dir, "--recover-damaged-data-dir", "--max-lease", "10m")
			c := s.dial(t)
			c.send(acq("probe", "key0", 1000, 0), acq("probe", "new", 1000, 0))
			c.expect(timedOut("probe", "key0"), timedOut("probe", "new"))
			rec := logField(t, s.p.Log().String(), "recovered a damaged data dir")
			floor, _ := rec["tokens_above"].(float64)
			if floor < float64(start.UnixNano()) {
				t.Errorf("tokens restart above %v, below the wall clock %d", rec["tokens_above"], start.UnixNano())
			}
			grace, err := time.Parse("2006-01-02T15:04:05.000Z0700", fmt.Sprint(rec["no_grants_before"]))
			if err != nil || grace.Before(start.Add(10*time.Minute)) {
				t.Errorf("no grants before %v (%v), want at least %v", rec["no_grants_before"], err, start.Add(10*time.Minute))
			}
		})
	}
}

// Tokens keep growing after a crash restart with fewer shards, even when
// only a shard above the new count had granted.
func TestTokensAfterFewerShards(t *testing.T) {
	t.Parallel()
	key := ""
	for i := 0; key == ""; i++ {
		if k := fmt.Sprintf("k%d", i); shard.Index([]byte(k), 16) == 9 {
			key = k
		}
	}
	dir := t.TempDir()
	s1 := startServerDir(t, dir, "--shards", "16")
	c := s1.dial(t)
	var tok uint64
	for range 42 {
		tok = c.acquire("o", key, 500, 0)
		c.release(tok, key)
	}
	s1.kill()
	s2 := startServerDir(t, dir, "--shards", "4")
	c2 := s2.dial(t)
	c2.send(acq("p", key, 1000, 10000))
	got := c2.expectAcquired("p", key) // after the grace
	if got <= tok {
		t.Fatalf("token %d after a restart with fewer shards, not above %d", got, tok)
	}
}

// The longest lease --max-lease allows survives a crash: its deadline and
// the ceiling above it are far from overflowing.
func TestLongestLeaseSurvivesCrash(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s1 := startServerDir(t, dir, "--max-lease", "720h")
	c := s1.dial(t)
	c.acquire("o", "forever", 720*3600*1000, 0)
	c.send(acq("o", "beyond", 720*3600*1000+1, 0))
	c.expectError("range")
	s1.kill()
	s2 := startServerDir(t, dir, "--max-lease", "720h")
	c2 := s2.dial(t)
	c2.send(acq("x", "forever", 1000, 0), acq("x", "other", 1000, 0))
	c2.expect(timedOut("x", "forever"), timedOut("x", "other"))
}

// A full disk: SIGTERM with a table too large for the disk exits 1 within
// the shutdown timeout, says "no space left on device in <dir>" in the
// log's own format, answers the waiters T and leaves no partial snapshot;
// a restart on the still-full disk starts (as after a crash), and a new
// data dir on it is refused for lack of space, not as corrupt.
func TestFullDisk(t *testing.T) {
	t.Parallel()
	mnt := mountTmpfs(t, "2m")
	dir := filepath.Join(mnt, "data")

	s1 := startServerDir(t, dir, "--shutdown-timeout", "5s")
	c := s1.dial(t)
	const keys, batch = 100_000, 1000
	for i := 0; i < keys; i += batch {
		var lines []string
		for j := i; j < i+batch; j++ {
			lines = append(lines, acq("owner-with-a-long-name", fmt.Sprintf("key-%08d", j), 600000, 0))
		}
		c.send(lines...)
		for j := i; j < i+batch; j++ {
			c.expectAcquired("owner-with-a-long-name", fmt.Sprintf("key-%08d", j))
		}
	}
	w := s1.dial(t)
	w.send(acq("w", "key-00000000", 1000, 60000))
	w.sync("key-00000000")

	start := time.Now()
	if err := s1.p.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	w.expect(timedOut("w", "key-00000000"))
	select {
	case <-s1.p.Done():
	case <-time.After(15 * time.Second):
		t.Fatalf("no exit %v after SIGTERM with a full disk", time.Since(start))
	}
	if code := s1.exitCode(); code != 1 {
		t.Errorf("exit code %d, want 1", code)
	}
	log := s1.p.Log().String()
	want := "no space left on device in " + dir
	found := false
	for _, line := range strings.Split(strings.TrimSpace(log), "\n") {
		if !json.Valid([]byte(line)) {
			t.Errorf("a line not in the log's JSON format: %q", line)
		}
		found = found || strings.Contains(line, want)
	}
	if !found {
		t.Errorf("the log does not say %q:\n%s", want, log)
	}
	for _, n := range []string{"ticketd.snapshot", "ticketd.snapshot.tmp"} {
		if _, err := os.Stat(filepath.Join(dir, n)); err == nil {
			t.Errorf("%s left on the full disk", n)
		}
	}

	// Fill what is left, then start again on the same dir.
	f, err := os.Create(filepath.Join(mnt, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := f.Write(make([]byte, 4096)); err != nil {
			break
		}
	}
	f.Close()
	s2 := startServerDir(t, dir)
	c2 := s2.dial(t)
	c2.send(acq("x", "key-00000001", 1000, 0))
	c2.expect(timedOut("x", "key-00000001"))
	if strings.Contains(s2.p.Log().String(), "corrupt") {
		t.Errorf("restart on a full disk speaks of corruption:\n%s", s2.p.Log())
	}
	s2.kill()

	fresh := filepath.Join(mnt, "fresh")
	code, out, listening := runOnce(t, 15*time.Second, serverproc.TicketdArgs("", fresh)...)
	if listening || code == 0 || !strings.Contains(out, "no space left on device in "+fresh) || strings.Contains(out, "corrupt") {
		t.Errorf("new data dir on a full disk: exit %d, listening %v:\n%s", code, listening, out)
	}
}

// A lease longer than any granted before lies past the durable lease
// ceiling, so its grant waits for a synced write on the request path;
// ticketd_ceiling_sync_writes_total shows operators how often answers paid
// that. Short leases after it are covered by the raised ceiling.
func TestLongLeaseCountsASyncWrite(t *testing.T) {
	t.Parallel()
	s := startServer(t, "--admin", "127.0.0.1:0")
	c := s.dial(t)
	base, err := s.metric("ticketd_ceiling_sync_writes_total")
	if err != nil {
		t.Fatal(err)
	}
	c.acquire("o", "long", 3600*1000, 0)
	v, err := s.metric("ticketd_ceiling_sync_writes_total")
	if err != nil || v < base+1 {
		t.Fatalf("ticketd_ceiling_sync_writes_total = %v (error %v) after an hour-long lease, want at least %v", v, err, base+1)
	}
	c.acquire("o", "short", 1000, 0)
	if w, err := s.metric("ticketd_ceiling_sync_writes_total"); err != nil || w != v {
		t.Fatalf("ticketd_ceiling_sync_writes_total = %v (error %v) after a short lease, want %v", w, err, v)
	}
}

// An operator sees a crash grace on /metrics: ticketd_crash_grace_seconds
// tells how long every acquire of a key not restored still answers T (the
// server stays ready meanwhile: releases, and those T answers, are its
// service). 0 after a first start.
func TestCrashGraceOnMetrics(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := startServerDir(t, dir, "--admin", "127.0.0.1:0")
	if v, err := s.metric("ticketd_crash_grace_seconds"); err != nil || v != 0 {
		t.Fatalf("first start: ticketd_crash_grace_seconds %v, %v; want 0", v, err)
	}
	s.dial(t).acquire("o", "K", 600000, 0) // 10-minute lease
	s.kill()
	s = startServerDir(t, dir, "--admin", "127.0.0.1:0")
	v, err := s.metric("ticketd_crash_grace_seconds")
	if err != nil || v < 590 || v > 700 {
		t.Fatalf("after a kill -9 with a 10-minute lease held: ticketd_crash_grace_seconds %v, %v; want about 600", v, err)
	}
	c := s.dial(t)
	c.send(acq("o", "other", 1000, 0))
	if got := c.next(); got != timedOut("o", "other") {
		t.Fatalf("acquire within the grace: %q, want %q", got, timedOut("o", "other"))
	}
}

// A long lease released before the last sweep no longer sets the grace of
// a crash restart; one still held does.
func TestCrashGraceAfterALongLeaseReleased(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := startServerDir(t, dir, "--admin", "127.0.0.1:0", "--sweep-interval", "100ms")
	c := s.dial(t)
	c.release(c.acquire("o", "hour", 3_600_000, 0), "hour")
	c.acquire("o", "held", 30_000, 0)
	time.Sleep(time.Second) // sweeps
	s.kill()
	s = startServerDir(t, dir, "--admin", "127.0.0.1:0", "--sweep-interval", "100ms")
	v, err := s.metric("ticketd_crash_grace_seconds")
	if err != nil || v < 25 || v > 40 {
		t.Fatalf("after a kill -9 with an hour's lease released and a 30 s one held: ticketd_crash_grace_seconds %v, %v; want about 30", v, err)
	}
}

// mountTmpfs mounts a tmpfs of size (mount's -o size=) on a new temporary
// dir and returns it; it is unmounted at the test's end. Skipped without
// the right to mount (not root, or a container without CAP_SYS_ADMIN),
// unless TICKETD_TEST_REQUIRE_MOUNT=1 (CI as root sets it), which makes
// that a failure: the full-disk claims must not go unchecked unseen.
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	skip := t.Skipf
	if os.Getenv("TICKETD_TEST_REQUIRE_MOUNT") == "1" {
		skip = t.Fatalf
	}
	if os.Geteuid() != 0 {
		skip("mounts a small tmpfs, which needs root")
	}
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", mnt).CombinedOutput(); err != nil {
		skip("cannot mount a tmpfs here: %v %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", mnt).Run() })
	return mnt
}
