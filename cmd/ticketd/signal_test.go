package main

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// holdKeys acquires n keys (k0, k1, ...) with 10-minute leases over one
// pipelined connection.
func holdKeys(t *testing.T, addr string, n int) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	go func() {
		w := bufio.NewWriter(c)
		for i := range n {
			fmt.Fprintf(w, "A holder k%d 600000 0\n", i)
		}
		_ = w.Flush()
	}()
	r := bufio.NewReader(c)
	for i := range n {
		line, err := r.ReadString('\n')
		if err != nil || !strings.HasPrefix(line, "A ") {
			t.Fatalf("acquire %d: %q, %v", i, line, err)
		}
	}
}

// startHelperProcess starts ticketd with args, its output in log.
func startHelperProcess(t *testing.T, log *lockedBuffer, args ...string) *exec.Cmd {
	t.Helper()
	cmd := helperCommand(4096, args...)
	cmd.Stderr = log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd
}

// exitedBySignal tells whether err, from Wait, says a signal ended the
// process (rather than the process exiting).
func exitedBySignal(err error) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled()
}

// A SIGTERM that comes while the start opens the data dir (after it took
// a clean shutdown's snapshot in) ends the process as a clean shutdown
// does: the snapshot is written back, and the next start holds the keys.
// With the signal's default action the process died there, and the next
// start forgot every held key and granted nothing for --max-lease.
func TestASignalDuringTheStartStillSavesTheLocks(t *testing.T) {
	const keys = 20000
	dir := t.TempDir()
	s := startServer(t, 4096, "--data-dir", dir)
	holdKeys(t, s.lock, keys)
	s.stop(t, 30*time.Second)
	snap := filepath.Join(dir, "ticketd.snapshot")

	for rep := range 3 {
		if _, err := os.Stat(snap); err != nil {
			t.Fatalf("round %d: no snapshot to start from: %v", rep, err)
		}
		var log lockedBuffer
		cmd := startHelperProcess(t, &log, "--listen", "127.0.0.1:0", "--data-dir", dir, "--log-format", "json")
		// The open takes the snapshot in: signal as soon as it is gone.
		deadline := time.Now().Add(20 * time.Second)
		for {
			if _, err := os.Stat(snap); errors.Is(err, os.ErrNotExist) {
				break
			}
			if time.Now().After(deadline) {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
				t.Fatalf("round %d: the snapshot was not taken in within 20s:\n%s", rep, log.String())
			}
			time.Sleep(20 * time.Microsecond)
		}
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		err := cmd.Wait()
		if exitedBySignal(err) {
			t.Fatalf("round %d: SIGTERM during the start ended the process (%v) after it took the snapshot in:\n%s", rep, err, log.String())
		}
		if err != nil {
			t.Fatalf("round %d: exit %v:\n%s", rep, err, log.String())
		}
		if _, err := os.Stat(snap); err != nil {
			t.Fatalf("round %d: no snapshot after the shutdown (%v):\n%s", rep, err, log.String())
		}
	}

	s = startServer(t, 4096, "--data-dir", dir)
	if !strings.Contains(s.log.String(), fmt.Sprintf(`"keys": %d`, keys)) && !strings.Contains(s.log.String(), fmt.Sprintf(`"keys":%d`, keys)) {
		t.Errorf("the last start did not restore %d keys:\n%s", keys, s.log.String())
	}
	if a, err := acquire(s.lock, "k0"); err != nil || !strings.HasPrefix(a, "T") {
		t.Errorf("acquire of a key held before: %q, %v; want T (still held)", a, err)
	}
}

// A second SIGTERM while the server shuts down does not end it before the
// lock table is saved: it is logged, and the shutdown goes on.
func TestASecondSignalDuringShutdownWaitsForTheSave(t *testing.T) {
	dir := t.TempDir()
	s := startServer(t, 4096, "--data-dir", dir)
	holdKeys(t, s.lock, 1)
	// A client that stays connected and reads nothing keeps the shutdown
	// waiting for a while: the window for the second signal.
	c, err := net.Dial("tcp", s.lock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := fmt.Fprintf(c, "A waiter k0 1000 60000\n"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // queued behind the holder

	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	if err := s.cmd.Process.Signal(syscall.SIGINT); err != nil && !errors.Is(err, os.ErrProcessDone) {
		t.Fatal(err)
	}
	select {
	case <-s.exited:
	case <-time.After(30 * time.Second):
		t.Fatal("still running 30s after SIGTERM")
	}
	if exitedBySignal(s.err) {
		t.Fatalf("the second signal ended the process (%v):\n%s", s.err, s.log.String())
	}
	if s.err != nil {
		t.Fatalf("exit: %v\n%s", s.err, s.log.String())
	}
	if _, err := os.Stat(filepath.Join(dir, "ticketd.snapshot")); err != nil {
		t.Fatalf("no snapshot after the shutdown: %v\n%s", err, s.log.String())
	}
	if !strings.Contains(s.log.String(), "already shutting down") {
		t.Errorf("the second signal was not logged:\n%s", s.log.String())
	}
}
