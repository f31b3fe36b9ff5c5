package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Two nodes named with one raft address in --peers is a usage error:
// Dragonboat panics on it at the start, after the data dir has recorded
// the peers, so that later starts with the corrected flag panic too.
func TestDuplicatePeerAddressIsAUsageError(t *testing.T) {
	_, err := parseConfig([]string{"--node-id", "1", "--bootstrap",
		"--peers", "1=127.0.0.1:7421,2=127.0.0.1:7421,3=127.0.0.1:7423"}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "peers") {
		t.Fatalf("duplicate raft address in --peers: %v; want an error naming --peers", err)
	}
}

// README and --help list debug, info, warn and error; zap also takes
// dpanic, panic and fatal, under which the "ticketd stopped" error line is
// never written: a failed start would exit 1 without a word.
func TestLogLevelRefusesUndocumentedLevels(t *testing.T) {
	for _, lv := range []string{"dpanic", "panic", "fatal"} {
		if _, err := parseConfig([]string{"--log-level", lv}, io.Discard); err == nil {
			t.Errorf("--log-level %s accepted; want a usage error (debug, info, warn or error)", lv)
		}
	}
}

// --log-level error keeps every line JSON under --log-format json: zap
// prints "failed to IncreaseLevel ..." to stderr when a logger's level is
// raised to one below it (gnet's).
func TestErrorLevelKeepsEveryLineJSON(t *testing.T) {
	var log lockedBuffer
	cmd := startHelperProcess(t, &log, "--listen", "127.0.0.1:0", "--data-dir", t.TempDir(),
		"--log-format", "json", "--log-level", "error")
	time.Sleep(1500 * time.Millisecond)
	_ = cmd.Process.Signal(syscall.SIGTERM)
	_ = cmd.Wait()
	for _, line := range strings.Split(strings.TrimSpace(log.String()), "\n") {
		if line == "" {
			continue
		}
		var e map[string]any
		if json.Unmarshal([]byte(line), &e) != nil {
			t.Errorf("--log-format json --log-level error wrote a line that is not JSON: %q", line)
		}
	}
}

// SIGHUP (a terminal's hangup, an operator's habitual "reload") does not
// end ticketd: its default action would, at once and with no log line, and
// the next start would be a crash restart that grants nothing for up to
// the longest lease.
func TestSIGHUPIsNotACrash(t *testing.T) {
	s := startServer(t, 4096)
	holdKeys(t, s.lock, 1)
	if err := s.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.exited:
		if exitedBySignal(s.err) {
			t.Fatalf("SIGHUP killed ticketd (%v) without a clean shutdown; log:\n%s", s.err, s.log.String())
		}
	case <-time.After(2 * time.Second):
		// Still running: ignored or logged; fine.
		s.stop(t, 30*time.Second)
	}
}

// Single mode's /readyz goes 503 as the shutdown begins: it stayed 200
// through it (up to 5 s while a client keeps its connection open, more
// with a slow snapshot) while the lock port already refused connections.
func TestReadyzDuringShutdown(t *testing.T) {
	s := startServer(t, 4096)
	c, err := net.Dial("tcp", s.lock) // lingers: the shutdown waits for it
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	time.Sleep(100 * time.Millisecond)
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // the shutdown lingers for c meanwhile
	cl := &http.Client{Timeout: time.Second}
	resp, err := cl.Get("http://" + s.admin + "/readyz")
	if err != nil {
		t.Fatalf("/readyz during the shutdown: %v (the admin listener stays up while it lingers)", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		t.Fatalf("/readyz 200 during the shutdown")
	}
	if string(body) != "not ready: shutting down\n" {
		t.Errorf("/readyz during the shutdown said %q, not why", body)
	}
}

// A clean restart while a crash grace still runs keeps the grace (every
// key answered T), and its log line says until when.
func TestCleanRestartInGraceSaysSo(t *testing.T) {
	dir := t.TempDir()
	s := startServer(t, 4096, "--data-dir", dir)
	holdKeys(t, s.lock, 1) // 10-minute lease
	_ = s.cmd.Process.Kill()
	<-s.exited
	s = startServer(t, 4096, "--data-dir", dir) // crash restart: grace
	s.stop(t, 30*time.Second)
	s = startServer(t, 4096, "--data-dir", dir) // clean restart, grace still on
	if a, err := acquire(s.lock, "fresh-key"); err != nil || !strings.HasPrefix(a, "T") {
		t.Fatalf("a fresh key right after a clean restart within a crash grace: %q, %v; want T (the grace goes on)", a, err)
	}
	var restored map[string]any
	sc := bufio.NewScanner(strings.NewReader(s.log.String()))
	for sc.Scan() {
		var e map[string]any
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			continue
		}
		if msg, _ := e["msg"].(string); strings.HasPrefix(msg, "restored locks from clean shutdown") {
			restored = e
		}
	}
	if restored == nil {
		t.Fatalf("the clean restart logged no \"restored locks from clean shutdown\" line:\n%s", s.log.String())
	}
	if _, said := restored["no_grants_before"]; !said {
		t.Errorf("clean restart inside a crash grace logged %s without the grace; every key answers T", fmt.Sprint(restored))
	}
}
