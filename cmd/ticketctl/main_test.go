package main

// These tests run the built ticketctl as a user would, against a ticketd
// started on loopback, with the test binary itself as the command of run.

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ticketd/ticketd/internal/serverproc"
)

var (
	ticketctlBin string
	ctlBuildErr  error // tests that need the binary fail with it; the others still run
)

const childEnv = "TICKETCTL_TEST_CHILD" // set: the test binary plays a command for run

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(child(mode, os.Args[1:]))
	}
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "ticketctl-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	var flags []string
	if raceEnabled {
		flags = append(flags, "-race")
	}
	root, err := serverproc.ModuleRoot()
	if err == nil {
		ticketctlBin, err = serverproc.Build(context.Background(), root, "./cmd/ticketctl", dir, flags...)
	}
	ctlBuildErr = err
	// ticketd is built by the first startServer; Main removes it.
	return serverproc.Main(m.Run)
}

// child is a command for run to hold the lock around.
func child(mode string, args []string) int {
	switch mode {
	case "env": // print the lock, exit with args[0]
		fmt.Printf("key=%s token=%s deadline=%s addr=%s\n", os.Getenv("TICKETD_KEY"), os.Getenv("TICKETD_TOKEN"),
			os.Getenv("TICKETD_DEADLINE"), os.Getenv("TICKETD_ADDR"))
		code, _ := strconv.Atoi(args[0])
		return code
	case "critical": // append start and end of a critical section to args[0]
		d, _ := time.ParseDuration(args[1])
		f, err := os.OpenFile(args[0], os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer f.Close()
		tok := os.Getenv("TICKETD_TOKEN")
		fmt.Fprintf(f, "start %d %s\n", time.Now().UnixNano(), tok)
		time.Sleep(d)
		fmt.Fprintf(f, "end %d %s\n", time.Now().UnixNano(), tok)
		return 0
	case "trap": // say ready, exit 42 on SIGTERM
		sigc := make(chan os.Signal, 1)
		signal.Notify(sigc, syscall.SIGTERM)
		fmt.Println("ready")
		select {
		case <-sigc:
			fmt.Println("got SIGTERM")
			return 42
		case <-time.After(30 * time.Second):
			return 0
		}
	case "hupquit": // say ready with the pid, note SIGHUP and go on, exit 43 on SIGQUIT
		sigc := make(chan os.Signal, 2)
		signal.Notify(sigc, syscall.SIGHUP, syscall.SIGQUIT)
		fmt.Printf("ready pid=%d\n", os.Getpid())
		timeout := time.After(30 * time.Second)
		for {
			select {
			case s := <-sigc:
				if s == syscall.SIGQUIT {
					fmt.Println("got SIGQUIT; bye")
					return 43
				}
				fmt.Println("got SIGHUP")
			case <-timeout:
				fmt.Println("no SIGQUIT; bye")
				return 0
			}
		}
	case "sigcount": // say ready, count SIGINT and SIGQUIT until 1s after the first, say how many
		sigc := make(chan os.Signal, 16)
		signal.Notify(sigc, syscall.SIGINT, syscall.SIGQUIT)
		fmt.Println("ready")
		counts := map[os.Signal]int{}
		var end <-chan time.Time
		timeout := time.After(30 * time.Second)
		for {
			select {
			case s := <-sigc:
				counts[s]++
				if end == nil {
					end = time.After(time.Second)
				}
				continue
			case <-end:
			case <-timeout:
			}
			fmt.Printf("INT=%d QUIT=%d\n", counts[syscall.SIGINT], counts[syscall.SIGQUIT])
			return 0
		}
	case "waitfile": // say ready, exit 0 once the file args[0] exists
		fmt.Println("ready")
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if _, err := os.Stat(args[0]); err == nil {
				return 0
			}
		}
		return 1
	case "stubborn": // ignore SIGTERM, sleep args[0]
		signal.Ignore(syscall.SIGTERM)
		d, _ := time.ParseDuration(args[0])
		fmt.Println("ready")
		time.Sleep(d)
		return 0
	}
	fmt.Fprintln(os.Stderr, "unknown child mode", mode)
	return 1
}

// childCmd is the argv of run's command for a child mode.
func childCmd(mode string, args ...string) []string {
	return append([]string{"env", childEnv + "=" + mode, os.Args[0]}, args...)
}

type result struct {
	code           int
	stdout, stderr string
	took           time.Duration
}

func (r result) String() string {
	return fmt.Sprintf("exit %d after %v\nstdout: %s\nstderr: %s", r.code, r.took.Round(time.Millisecond), r.stdout, r.stderr)
}

// runCtl runs ticketctl with args and extra environment to its end.
func runCtl(t *testing.T, env []string, args ...string) result {
	t.Helper()
	if ctlBuildErr != nil {
		t.Fatal(ctlBuildErr)
	}
	cmd := exec.Command(ticketctlBin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = noTerminal()
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	t0 := time.Now()
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("ticketctl %s: no exit within 60s", strings.Join(args, " "))
	}
	return result{cmd.ProcessState.ExitCode(), out.String(), errb.String(), time.Since(t0)}
}

// noTerminal starts ticketctl in a session of its own, without a
// controlling terminal, even when the tests run in one: as a service or cron
// job would, so that run passes every signal sent to it on (see passOn).
func noTerminal() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setsid: true} }

// lockedBuffer is written by a process and read by the test meanwhile.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

type running struct {
	cmd            *exec.Cmd
	stdout, stderr *lockedBuffer
	t0             time.Time
	done           chan struct{}
}

// start runs ticketctl in the background; wait collects it.
func start(t *testing.T, args ...string) *running {
	t.Helper()
	if ctlBuildErr != nil {
		t.Fatal(ctlBuildErr)
	}
	r := &running{cmd: exec.Command(ticketctlBin, args...), stdout: &lockedBuffer{}, stderr: &lockedBuffer{}, done: make(chan struct{})}
	r.cmd.Stdout, r.cmd.Stderr = r.stdout, r.stderr
	r.cmd.SysProcAttr = noTerminal()
	r.t0 = time.Now()
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { r.cmd.Wait(); close(r.done) }()
	t.Cleanup(func() {
		select {
		case <-r.done:
		default:
			r.cmd.Process.Kill()
			<-r.done
		}
	})
	return r
}

func (r *running) wait(t *testing.T) result {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("ticketctl %s: no exit within 60s\nstderr: %s", strings.Join(r.cmd.Args[1:], " "), r.stderr)
	}
	return result{r.cmd.ProcessState.ExitCode(), r.stdout.String(), r.stderr.String(), time.Since(r.t0)}
}

func waitOutput(t *testing.T, b *lockedBuffer, want string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(b.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q in output within 20s; have %q", want, b.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// startServer starts a ticketd on a free loopback port and stops it (SIGTERM
// to its pid) at cleanup.
func startServer(t *testing.T, flags ...string) string {
	t.Helper()
	p, err := serverproc.StartTicketd("", t.TempDir(), 20*time.Second, flags...)
	if err != nil {
		t.Fatalf("ticketd: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Stop(10 * time.Second); err != nil {
			t.Errorf("ticketd: %v\n%s", err, p.Log())
		}
	})
	return p.Addr
}

func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"help"}, {"acquire", "--help"}, {"release", "-h"}, {"run", "--help"}, {"help", "run"}} {
		r := runCtl(t, nil, args...)
		if r.code != 0 || !strings.Contains(r.stdout, "Usage: ticketctl") || !strings.Contains(r.stdout, "3  held") {
			t.Errorf("ticketctl %s: want usage with the exit codes on stdout, exit 0; got %v", strings.Join(args, " "), r)
		}
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "Usage: ticketctl"},
		{[]string{"frob"}, `unknown command "frob"`},
		{[]string{"acquire"}, "want one KEY"},
		{[]string{"acquire", "k", "--lease", "soon"}, "invalid value"},
		{[]string{"release", "k"}, "want KEY and TOKEN"},
		{[]string{"release", "k", "0"}, "TOKEN"},
		{[]string{"release", "k", "-3"}, "flag provided but not defined"},
		{[]string{"run", "k"}, "no COMMAND given"},
		// Checked before any dial: usage errors whether or not a server is up.
		{[]string{"--addr", "127.0.0.1:1", "acquire", "a b"}, `key "a b"`},
		{[]string{"--addr", "127.0.0.1:1", "release", "a b", "1"}, `key "a b"`},
		{[]string{"--addr", "127.0.0.1:1", "run", "a b", "--", "true"}, `key "a b"`},
		{[]string{"--addr", "127.0.0.1:1", "acquire", "k", "--owner", "x y"}, `--owner "x y"`},
		{[]string{"--addr", "127.0.0.1:1", "acquire", "k", "--wait", "500us"}, "--wait 500µs"},
		// Not the command `false`, which would run with the lock held.
		{[]string{"--addr", "127.0.0.1:1", "run", "k", "--kill-on-expiry", "false", "--", "sh"}, "write --kill-on-expiry=false"},
		{[]string{"--addr", "127.0.0.1:1", "run", "k", "--kill-on-expiry", "true"}, "write --kill-on-expiry=true"},
	} {
		r := runCtl(t, nil, c.args...)
		if r.code != exitUsage || !strings.Contains(r.stderr, c.want) {
			t.Errorf("ticketctl %s: want exit 2 and %q on stderr; got %v", strings.Join(c.args, " "), c.want, r)
		}
	}
}

func TestUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	for _, r := range []result{
		runCtl(t, nil, "acquire", "k", "--addr", addr),
		runCtl(t, []string{"TICKETD_ADDR=" + addr}, "release", "k", "7"),
		runCtl(t, nil, "--addr", addr, "run", "k", "--", "true"),
	} {
		want := "cannot reach ticketd at " + addr + ": connection refused; is it running? start it with `ticketd`"
		if r.code != exitError || !strings.Contains(r.stderr, want) {
			t.Errorf("want exit 1 and %q; got %v", want, r)
		}
	}
}

func TestAcquireRelease(t *testing.T) {
	addr := startServer(t)
	env := []string{"TICKETD_ADDR=" + addr}
	r := runCtl(t, env, "acquire", "invoices", "--lease", "30s")
	tok, err := strconv.ParseUint(strings.TrimSpace(r.stdout), 10, 64)
	if r.code != 0 || err != nil || tok == 0 {
		t.Fatalf("acquire: want a token and exit 0; got %v", r)
	}
	r = runCtl(t, env, "acquire", "invoices")
	if r.code != exitHeld || !strings.Contains(r.stderr, "invoices is held by someone else") || r.stdout != "" {
		t.Errorf("acquire of a held key: want exit 3; got %v", r)
	}
	r = runCtl(t, env, "acquire", "invoices", "--wait", "200ms", "--owner", "cron-7")
	if r.code != exitHeld || r.took < 200*time.Millisecond {
		t.Errorf("acquire --wait 200ms of a held key: want exit 3 after 200ms; got %v", r)
	}
	r = runCtl(t, env, "release", "invoices", strconv.FormatUint(tok, 10))
	if r.code != 0 {
		t.Errorf("release: want exit 0; got %v", r)
	}
	r = runCtl(t, env, "release", "invoices", strconv.FormatUint(tok, 10))
	if r.code != exitNotHeld || !strings.Contains(r.stderr, "does not hold invoices") {
		t.Errorf("second release: want exit 5; got %v", r)
	}
	r = runCtl(t, nil, "--addr", addr, "acquire", "--owner", "cron-7", "invoices", "--lease", "1s")
	if tok2, _ := strconv.ParseUint(strings.TrimSpace(r.stdout), 10, 64); r.code != 0 || tok2 <= tok {
		t.Errorf("acquire after release: want a token above %d; got %v", tok, r)
	}
	r = runCtl(t, env, "acquire", "bad\x01key")
	if r.code != exitUsage || !strings.Contains(r.stderr, "key") {
		t.Errorf("acquire of a bad key: want exit 2; got %v", r)
	}
}

func TestBusy(t *testing.T) {
	addr := startServer(t, "--max-waiters-per-key", "1")
	env := []string{"TICKETD_ADDR=" + addr}
	r := runCtl(t, env, "acquire", "k")
	if r.code != 0 {
		t.Fatalf("acquire: %v", r)
	}
	holder := strings.TrimSpace(r.stdout)
	// The one place in the queue goes to whoever comes first: poll with a
	// short wait until the background waiter has it and the poll gets B.
	waiter := start(t, "--addr", addr, "acquire", "k", "--wait", "30s")
	deadline := time.Now().Add(20 * time.Second)
	for {
		r = runCtl(t, env, "acquire", "k", "--wait", "20ms")
		if r.code == exitBusy {
			break
		}
		if r.code != exitHeld || time.Now().After(deadline) {
			t.Fatalf("second waiter: want exit 4; got %v", r)
		}
		select {
		case <-waiter.done: // it lost the place to a poll: again
			if w := waiter.wait(t); w.code != exitBusy {
				t.Fatalf("first waiter: %v", w)
			}
			waiter = start(t, "--addr", addr, "acquire", "k", "--wait", "30s")
		default:
		}
	}
	if !strings.Contains(r.stderr, "at capacity") {
		t.Errorf("busy message: %v", r)
	}
	if r := runCtl(t, env, "release", "k", holder); r.code != 0 {
		t.Fatalf("release: %v", r)
	}
	if w := waiter.wait(t); w.code != 0 || strings.TrimSpace(w.stdout) == "" {
		t.Errorf("queued acquire: want a token once released; got %v", w)
	}
}

func TestRunEnvAndStatus(t *testing.T) {
	addr := startServer(t)
	r := runCtl(t, nil, append([]string{"--addr", addr, "run", "job", "--lease", "1m", "--"}, childCmd("env", "7")...)...)
	if r.code != 7 {
		t.Fatalf("run: want the command's exit 7; got %v", r)
	}
	if !strings.Contains(r.stdout, "key=job token=") || strings.Contains(r.stdout, "token= ") ||
		!strings.Contains(r.stdout, "addr="+addr) || strings.Contains(r.stdout, "deadline= ") {
		t.Errorf("run: the command did not see its lock: %v", r)
	}
	i := strings.Index(r.stdout, "deadline=")
	if i < 0 {
		t.Fatalf("run: the command saw no TICKETD_DEADLINE: %v", r)
	}
	var dl string
	fmt.Sscanf(r.stdout[i:], "deadline=%s", &dl)
	if d, err := time.Parse(time.RFC3339Nano, dl); err != nil || time.Until(d) < 50*time.Second || time.Until(d) > time.Minute {
		t.Errorf("TICKETD_DEADLINE %q: want about a minute from now", dl)
	}
	// The lock was released: the key is free at once.
	if r := runCtl(t, nil, "--addr", addr, "acquire", "job"); r.code != 0 {
		t.Errorf("acquire after run: %v", r)
	}
	// Held: the command does not run.
	r = runCtl(t, nil, append([]string{"--addr", addr, "run", "job", "--wait", "0", "--"}, childCmd("env", "0")...)...)
	if r.code != exitHeld || strings.Contains(r.stdout, "key=") {
		t.Errorf("run on a held key: want exit 3 and no command; got %v", r)
	}
	// Flags after KEY, no "--": the command starts at the first word after KEY.
	r = runCtl(t, nil, "--addr", addr, "run", "other", "--lease", "5s", "sh", "-c", "exit 3")
	if r.code != 3 {
		t.Errorf("run without --: want the command's exit 3; got %v", r)
	}
	r = runCtl(t, nil, "--addr", addr, "run", "other", "--", "no-such-command-here")
	if r.code != exitNotFound || !strings.Contains(r.stderr, "cannot run") {
		t.Errorf("run of a missing command: want exit 127; got %v", r)
	}
	if r := runCtl(t, nil, "--addr", addr, "acquire", "other"); r.code != 0 {
		t.Errorf("the lock of a command that failed to start was not released: %v", r)
	}
}

// Two runs on one key take turns: their critical sections do not overlap,
// and the later one has the larger token.
func TestRunSerialises(t *testing.T) {
	addr := startServer(t)
	file := filepath.Join(t.TempDir(), "sections")
	var runs []*running
	for range 3 {
		runs = append(runs, start(t, append([]string{"--addr", addr, "run", "shared", "--wait", "30s", "--"},
			childCmd("critical", file, "300ms")...)...))
	}
	for _, r := range runs {
		if res := r.wait(t); res.code != 0 {
			t.Fatalf("run: %v", res)
		}
	}
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) != 6 {
		t.Fatalf("want 3 sections, got:\n%s", data)
	}
	var tokens []uint64
	for i := 0; i < len(lines); i += 2 {
		var s, e string
		var ts, te int64
		var tk1, tk2 uint64
		fmt.Sscanf(lines[i], "%s %d %d", &s, &ts, &tk1)
		fmt.Sscanf(lines[i+1], "%s %d %d", &e, &te, &tk2)
		if s != "start" || e != "end" || tk1 != tk2 {
			t.Fatalf("sections overlap or interleave:\n%s", data)
		}
		tokens = append(tokens, tk1)
	}
	if !slices.IsSorted(tokens) || tokens[0] == tokens[1] || tokens[1] == tokens[2] {
		t.Errorf("tokens %v do not increase with time", tokens)
	}
}

func TestRunLeaseExpiry(t *testing.T) {
	addr := startServer(t)
	// Without --kill-on-expiry the command goes on and ticketctl says so.
	r := runCtl(t, nil, "--addr", addr, "run", "slow", "--lease", "200ms", "--", "sleep", "0.6")
	if r.code != 0 || !strings.Contains(r.stderr, "the lease on slow") || !strings.Contains(r.stderr, "ended while the command was still running") {
		t.Errorf("lease ended during run: want a note and exit 0; got %v", r)
	}
	// With it, SIGTERM stops the command.
	r = runCtl(t, nil, "--addr", addr, "run", "slow", "--lease", "200ms", "--kill-on-expiry", "--", "sleep", "10")
	if r.code != exitSignal+int(syscall.SIGTERM) || r.took > 5*time.Second || !strings.Contains(r.stderr, "SIGTERM") {
		t.Errorf("--kill-on-expiry: want exit 143 soon after 200ms; got %v", r)
	}
	// A command that ignores SIGTERM gets SIGKILL after the grace. It says
	// "ready" once it ignores SIGTERM; a machine so busy that it had not by
	// the end of the lease killed it with the SIGTERM (exit 143 and no
	// "ready"), so that case runs again with a longer lease.
	for lease := 200 * time.Millisecond; ; lease *= 4 {
		r = runCtl(t, nil, append([]string{"--addr", addr, "run", "slow", "--lease", lease.String(), "--kill-on-expiry", "--kill-grace", "300ms", "--"},
			childCmd("stubborn", "20s")...)...)
		if !strings.Contains(r.stdout, "ready") && lease < 3*time.Second {
			continue
		}
		if r.code != exitSignal+int(syscall.SIGKILL) || r.took > 5*time.Second || !strings.Contains(r.stderr, "SIGKILL") {
			t.Errorf("--kill-grace: want exit 137 after %v; got %v", lease+300*time.Millisecond, r)
		}
		break
	}
}

func TestRunForwardsSignals(t *testing.T) {
	addr := startServer(t)
	r := start(t, append([]string{"--addr", addr, "run", "sig", "--"}, childCmd("trap")...)...)
	waitOutput(t, r.stdout, "ready")
	r.cmd.Process.Signal(syscall.SIGTERM)
	res := r.wait(t)
	if res.code != 42 || !strings.Contains(res.stdout, "got SIGTERM") {
		t.Fatalf("SIGTERM to ticketctl run: want the command's exit 42; got %v", res)
	}
	if r := runCtl(t, nil, "--addr", addr, "acquire", "sig"); r.code != 0 {
		t.Errorf("lock not released after the command ended by a signal: %v", r)
	}
	// Interrupted while waiting for the lock: the command never runs.
	w := start(t, append([]string{"--addr", addr, "run", "sig", "--wait", "30s", "--"}, childCmd("env", "0")...)...)
	time.Sleep(300 * time.Millisecond)
	w.cmd.Process.Signal(os.Interrupt)
	res = w.wait(t)
	if res.code != exitSignal+int(syscall.SIGINT) || strings.Contains(res.stdout, "key=") {
		t.Errorf("SIGINT while waiting: want exit 130 and no command; got %v", res)
	}
}

// SIGHUP and SIGQUIT reach the command as SIGTERM does; ticketctl stays,
// holding the lock, until the command ends, and then releases it.
func TestRunForwardsHangupAndQuit(t *testing.T) {
	addr := startServer(t)
	r := start(t, append([]string{"--addr", addr, "run", "hup", "--lease", "1m", "--"}, childCmd("hupquit")...)...)
	waitOutput(t, r.stdout, "ready pid=")
	var pid int
	fmt.Sscanf(r.stdout.String(), "ready pid=%d", &pid)
	t.Cleanup(func() {
		// A ticketctl that died of the signal leaves the command running.
		select {
		case <-r.done:
		default:
			if pid > 0 && !strings.Contains(r.stdout.String(), "bye") {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	r.cmd.Process.Signal(syscall.SIGHUP)
	waitOutput(t, r.stdout, "got SIGHUP")
	if res := runCtl(t, nil, "--addr", addr, "acquire", "hup"); res.code != exitHeld {
		t.Errorf("after SIGHUP the command runs on: want its key held (exit 3); got %v", res)
	}
	select {
	case <-r.done:
		t.Fatalf("ticketctl exited at SIGHUP with the command still running: %v", r.wait(t))
	default:
	}
	r.cmd.Process.Signal(syscall.SIGQUIT)
	res := r.wait(t)
	if res.code != 43 || !strings.Contains(res.stdout, "got SIGQUIT") {
		t.Fatalf("SIGQUIT to ticketctl run: want the command's exit 43; got %v", res)
	}
	if r := runCtl(t, nil, "--addr", addr, "acquire", "hup"); r.code != 0 {
		t.Errorf("lock not released after the command ended: %v", r)
	}
}

// A stderr whose reader is gone does not kill ticketctl run (SIGPIPE): it
// still waits for the command and releases the lock.
func TestRunSurvivesClosedStderr(t *testing.T) {
	addr := startServer(t)
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	pr.Close()
	defer pw.Close()
	// The lease ends during the command: ticketctl writes its note to the
	// broken stderr.
	cmd := exec.Command(ticketctlBin, "--addr", addr, "run", "pipe", "--lease", "300ms", "--", "sleep", "1")
	cmd.Stderr = pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatal("ticketctl run: no exit within 30s")
	}
	if ws := cmd.ProcessState.Sys().(syscall.WaitStatus); ws.Signaled() || ws.ExitStatus() != 0 {
		t.Errorf("ticketctl run with a closed stderr: want the command's exit 0; got %v", cmd.ProcessState)
	}
}

// ticketdProc starts a ticketd on dataDir (t.TempDir() if "") and stops it
// at cleanup, unless the test stopped or killed it.
func ticketdProc(t *testing.T, dataDir string, flags ...string) *serverproc.Proc {
	t.Helper()
	if dataDir == "" {
		dataDir = t.TempDir()
	}
	p, err := serverproc.StartTicketd("", dataDir, 20*time.Second, flags...)
	if err != nil {
		t.Fatalf("ticketd: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Stop(10 * time.Second); err != nil {
			t.Errorf("ticketd: %v\n%s", err, p.Log())
		}
	})
	return p
}

// queued starts a waiter (startWaiter) for key, held by someone, on a server
// with --max-waiters-per-key 1, and returns once it is queued: a waiting
// acquire of the test's own then gets B. If that poll took the one place
// first, the waiter got B: it is started again.
func queued(t *testing.T, addr, key string, startWaiter func() *running) *running {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	rd := bufio.NewReader(nc)
	w := startWaiter()
	deadline := time.Now().Add(20 * time.Second)
	for {
		nc.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintf(nc, "A poll %s 1000 1\n", key)
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatalf("poll for %s: %v", key, err)
		}
		switch strings.Fields(line)[0] {
		case "B":
			return w
		case "T":
		default:
			t.Fatalf("poll for %s: %q; want the key held", key, line)
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiter for %s not queued within 20s: %s", key, w.stderr)
		}
		select {
		case <-w.done:
			if res := w.wait(t); res.code != exitBusy {
				t.Fatalf("waiter for %s: %v", key, res)
			}
			w = startWaiter()
		default:
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A server that shuts down answers every queued acquire T at once: that is
// the wait ended, not a held key.
func TestWaitEndedByShutdown(t *testing.T) {
	p := ticketdProc(t, "", "--max-waiters-per-key", "1")
	addr := p.Addr
	for _, key := range []string{"a", "r"} {
		if r := runCtl(t, nil, "--addr", addr, "acquire", key, "--lease", "1m"); r.code != 0 {
			t.Fatalf("acquire %s: %v", key, r)
		}
	}
	acq := queued(t, addr, "a", func() *running { return start(t, "--addr", addr, "acquire", "a", "--wait", "50s") })
	run := queued(t, addr, "r", func() *running {
		return start(t, append([]string{"--addr", addr, "run", "r", "--wait", "50s", "--"}, childCmd("env", "0")...)...)
	})
	if err := p.Stop(10 * time.Second); err != nil {
		t.Fatalf("ticketd: %v\n%s", err, p.Log())
	}
	for _, w := range []*running{acq, run} {
		res := w.wait(t)
		if res.code != exitEnded || !strings.Contains(res.stderr, "ended the wait for") ||
			!strings.Contains(res.stderr, "it is shutting down or restarting") || strings.Contains(res.stderr, "held by") ||
			res.took > 45*time.Second || res.stdout != "" {
			t.Errorf("%s: want exit 6 saying the server ended the wait, nothing on stdout; got %v", strings.Join(w.cmd.Args[1:], " "), res)
		}
	}
}

// After a crash every key reads as held until the leases from before it
// could have ended: ticketctl says that, not "held by someone else".
func TestCrashGrace(t *testing.T) {
	dir := t.TempDir()
	p := ticketdProc(t, dir)
	if r := runCtl(t, nil, "--addr", p.Addr, "acquire", "before", "--lease", "40s"); r.code != 0 {
		t.Fatalf("acquire: %v", r)
	}
	p.Kill()
	addr := ticketdProc(t, dir).Addr
	for _, args := range [][]string{
		{"acquire", "before"},
		{"acquire", "never-held"},
		append([]string{"run", "never-held", "--wait", "100ms", "--"}, childCmd("env", "0")...),
	} {
		r := runCtl(t, nil, append([]string{"--addr", addr}, args...)...)
		if r.code != exitHeld || !strings.Contains(r.stderr, "grace period after a crash") ||
			strings.Contains(r.stderr, "held by someone else") || r.stdout != "" {
			t.Errorf("ticketctl %s during the crash grace: want exit 3 naming the grace period; got %v", strings.Join(args, " "), r)
		}
	}
}

// Without a grace period a held key says so; the probe that tells them apart
// leaves no key behind, and if it cannot tell, the message says both.
func TestHeldProbe(t *testing.T) {
	addr := startServer(t, "--max-keys", "2")
	if r := runCtl(t, nil, "--addr", addr, "acquire", "k1", "--lease", "1m"); r.code != 0 {
		t.Fatalf("acquire: %v", r)
	}
	r := runCtl(t, nil, "--addr", addr, "acquire", "k1")
	if r.code != exitHeld || !strings.Contains(r.stderr, "k1 is held by someone else; use --wait") || strings.Contains(r.stderr, "grace") {
		t.Errorf("acquire of a held key: want exit 3, held by someone else; got %v", r)
	}
	// The probe's key is gone: k2 has room under --max-keys 2.
	if r := runCtl(t, nil, "--addr", addr, "acquire", "k2", "--lease", "1m"); r.code != 0 {
		t.Fatalf("acquire k2 after the probe: %v", r)
	}
	// Now the probe gets B (no room for its key): cannot tell.
	r = runCtl(t, nil, "--addr", addr, "acquire", "k1", "--wait", "100ms")
	if r.code != exitHeld || !strings.Contains(r.stderr, "k1 is held by someone else, or ticketd is in its grace period after a crash") ||
		!strings.Contains(r.stderr, "(waited 100ms)") {
		t.Errorf("acquire of a held key, probe refused: want exit 3 naming both causes; got %v", r)
	}
}

// alive tells whether process pid runs (a zombie does not).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i > 0 && i+2 < len(b) && b[i+2] != 'Z'
}

// --kill-on-expiry stops what the command started too: a script's
// background job would otherwise go on working after the lease has passed
// to someone else. Without it, ticketctl says what the command left
// running when it ended.
func TestRunStopsWhatTheCommandStarted(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("finds descendants in /proc")
	}
	addr := startServer(t)
	pidFile := filepath.Join(t.TempDir(), "pid")
	script := "sleep 30 >/dev/null 2>&1 & echo $! > " + pidFile + "; wait"
	r := runCtl(t, nil, "--addr", addr, "run", "tree", "--lease", "300ms", "--kill-on-expiry", "--kill-grace", "300ms", "--", "sh", "-c", script)
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatalf("%v; ticketctl: %v", err, r)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if pid > 0 && alive(pid) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		t.Fatalf("the command's background job (pid %d) still runs after the lease ended with --kill-on-expiry; ticketctl: %v", pid, r)
	}

	script = "sleep 30 >/dev/null 2>&1 & echo $! > " + pidFile
	r = runCtl(t, nil, "--addr", addr, "run", "tree", "--", "sh", "-c", script)
	b, _ = os.ReadFile(pidFile)
	pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	if pid > 0 {
		defer syscall.Kill(pid, syscall.SIGKILL)
	}
	if r.code != 0 || !strings.Contains(r.stderr, "the command left a process running") || !strings.Contains(r.stderr, strconv.Itoa(pid)) {
		t.Errorf("a command that left a process running: want exit 0 and a note naming pid %d; got %v", pid, r)
	}
}

// Signals ignored when ticketctl starts (nohup) stay ignored for run's
// command: caught by ticketctl, they came back to the default at exec,
// and a nohup'd job died with the terminal.
func TestRunKeepsSignalsIgnoredAtStart(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc/self/status")
	}
	if ctlBuildErr != nil {
		t.Fatal(ctlBuildErr)
	}
	addr := startServer(t)
	cmd := exec.Command("sh", "-c", `trap "" HUP; exec "$0" "$@"`, ticketctlBin,
		"--addr", addr, "run", "nohup", "--", "sh", "-c", "grep SigIgn /proc/self/status")
	cmd.SysProcAttr = noTerminal()
	out, err := cmd.Output()
	var mask uint64
	if _, serr := fmt.Sscanf(strings.TrimSpace(string(out)), "SigIgn: %x", &mask); serr != nil || err != nil {
		t.Fatalf("%q: %v, %v", out, err, serr)
	}
	if mask&(1<<(syscall.SIGHUP-1)) == 0 {
		t.Errorf("the command's ignored signals %#x lack SIGHUP, which ticketctl was started ignoring", mask)
	}
}

// A signal while run releases the lock (ticketd not answering) ends the
// release: ticketctl says so and exits 128+N rather than hold on for the
// release's timeout with the signal swallowed.
func TestRunInterruptedWhileReleasing(t *testing.T) {
	p, err := serverproc.StartTicketd("", t.TempDir(), 20*time.Second)
	if err != nil {
		t.Fatalf("ticketd: %v", err)
	}
	t.Cleanup(func() {
		_ = p.Cmd.Process.Signal(syscall.SIGCONT)
		if err := p.Stop(10 * time.Second); err != nil {
			t.Errorf("ticketd: %v\n%s", err, p.Log())
		}
	})
	// The command stops the server, so that the release gets no answer.
	r := start(t, "--addr", p.Addr, "run", "rel", "--", "sh", "-c", fmt.Sprintf("kill -STOP %d; echo stopped", p.Pid()))
	waitOutput(t, r.stdout, "stopped")
	time.Sleep(300 * time.Millisecond) // in the release now
	sent := time.Now()
	if err := r.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-r.done:
	case <-time.After(20 * time.Second):
		t.Fatal("ticketctl still runs 20s after SIGTERM")
	}
	code := r.cmd.ProcessState.ExitCode()
	if code != exitSignal+int(syscall.SIGTERM) || !strings.Contains(r.stderr.String(), "interrupted (terminated) while releasing rel") {
		t.Errorf("SIGTERM during the release, %v before the exit: exit %d, stderr %q; want 143 and a note", time.Since(sent).Round(time.Millisecond), code, r.stderr.String())
	}
}
