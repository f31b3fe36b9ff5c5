package serverproc

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestMain(m *testing.M) { os.Exit(Main(m.Run)) }

func TestListeningAddr(t *testing.T) {
	for line, want := range map[string]string{
		`{"level":"info","msg":"listening","addr":"127.0.0.1:4000"}`: "127.0.0.1:4000",
		`{"msg":"listening"}`:                        "",
		`{"msg":"starting","addr":"127.0.0.1:4000"}`: "",
		`listening 127.0.0.1:4000`:                   "",
	} {
		addr, ok := ListeningAddr([]byte(line))
		if addr != want || ok != (want != "") {
			t.Errorf("ListeningAddr(%s) = %q, %v; want %q", line, addr, ok, want)
		}
	}
}

func TestLogTail(t *testing.T) {
	var l Log
	for i := range 5 {
		fmt.Fprintf(&l, "line %d\n", i)
	}
	if got, want := l.Tail(2), "... (3 earlier lines)\nline 3\nline 4"; got != want {
		t.Errorf("Tail(2) = %q, want %q", got, want)
	}
	if got, want := l.Tail(10), "line 0\nline 1\nline 2\nline 3\nline 4"; got != want {
		t.Errorf("Tail(10) = %q, want %q", got, want)
	}
	// Past the bound the oldest lines go, and are counted.
	long := strings.Repeat("x", 1023) + "\n"
	for range 2 * maxLog / len(long) {
		l.Write([]byte(long))
	}
	if n := len(l.String()); n > maxLog {
		t.Errorf("log keeps %d bytes, more than %d", n, maxLog)
	}
	total := 5 + 2*maxLog/len(long)
	if got, want := l.Tail(1), fmt.Sprintf("... (%d earlier lines)\n%s", total-1, long[:1023]); got != want {
		t.Errorf("Tail(1) = %.60q..., want %.60q...", got, want)
	}
}

func TestExitBeforeReady(t *testing.T) {
	p, err := Start(exec.Command("sh", "-c", "echo out; echo err >&2; exit 3"), ListeningAddr)
	if err != nil {
		t.Fatal(err)
	}
	err = p.WaitReady(10 * time.Second)
	if err == nil || !strings.Contains(err.Error(), "exited before it was ready") ||
		!strings.Contains(err.Error(), "out") || !strings.Contains(err.Error(), "err") {
		t.Errorf("WaitReady: want an exit error with the output; got %v", err)
	}
	if code := p.ExitCode(); code != 3 {
		t.Errorf("exit code %d, want 3", code)
	}
}

// The ignored SIGTERM carries over the exec, and sleep is the pid Stop signals.
func TestStopKillsAfterGrace(t *testing.T) {
	p, err := Start(exec.Command("sh", "-c", `trap "" TERM; echo ready; exec sleep 30`), func(line []byte) (string, bool) {
		return "", string(line) == "ready"
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.WaitReady(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := p.Stop(200 * time.Millisecond); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Errorf("Stop of a process ignoring SIGTERM: want a kill; got %v", err)
	}
	if !p.Exited() || p.ExitCode() != -1 {
		t.Errorf("want a death by signal; exited %v, code %d", p.Exited(), p.ExitCode())
	}
}

// Pause returns once the process is stopped, and it runs on after SIGCONT.
func TestPauseReturnsWithTheProcessStopped(t *testing.T) {
	p, err := Start(exec.Command("sh", "-c", "echo ready; exec sleep 30"), func(line []byte) (string, bool) {
		return "", string(line) == "ready"
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Kill()
	if err := p.WaitReady(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := p.Pause(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if !allStopped(p.Pid()) {
		t.Fatal("Pause returned with a thread running")
	}
	if err := p.Cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); allStopped(p.Pid()); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("still stopped 10s after SIGCONT")
		}
	}
}

func TestStartTicketd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds ticketd")
	}
	p, err := StartTicketd("", t.TempDir(), 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.DialTimeout("tcp", p.Addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", p.Addr, err)
	}
	c.Close()
	// ticketd handles SIGTERM before it logs "listening": even this early,
	// the stop is a clean shutdown.
	if err := p.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if code := p.ExitCode(); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0 (clean shutdown)", code)
	}
}
