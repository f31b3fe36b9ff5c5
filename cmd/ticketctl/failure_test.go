package main

// Tests of ticketctl against servers that fail: addresses that do not
// answer a connection attempt, nodes that answer E or nothing, connections
// that break while a lock is held, and outputs that cannot be written.

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ticketd/ticketd/internal/serverproc"
)

// fake is a ticketd stand-in on loopback: answer gives the line to send for
// each request line read (split into fields), "" for none. After an E line
// it closes the connection, as ticketd does.
type fake struct {
	t      *testing.T
	addr   string
	answer func(req []string) string

	mu    sync.Mutex
	ln    net.Listener
	conns []net.Conn
	reqs  []string
}

func newFake(t *testing.T, answer func(req []string) string) *fake {
	t.Helper()
	f := &fake{t: t, addr: "127.0.0.1:0", answer: answer}
	f.listen()
	t.Cleanup(f.cut)
	return f
}

// grant answers as a server on which every key is free: A grants with token
// 5, R releases.
func grant(req []string) string {
	switch {
	case req[0] == "A" && len(req) == 5:
		return fmt.Sprintf("A 5 %s %s", req[1], req[2])
	case req[0] == "R" && len(req) == 3:
		return fmt.Sprintf("R %s %s", req[1], req[2])
	}
	return "E syntax bad request"
}

// listen starts (or, after cut, starts again) to accept on f.addr.
func (f *fake) listen() {
	f.t.Helper()
	ln, err := net.Listen("tcp", f.addr)
	if err != nil {
		f.t.Fatal(err)
	}
	f.mu.Lock()
	f.ln, f.addr = ln, ln.Addr().String()
	f.mu.Unlock()
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			f.mu.Lock()
			f.conns = append(f.conns, nc)
			f.mu.Unlock()
			go f.serve(nc)
		}
	}()
}

func (f *fake) serve(nc net.Conn) {
	defer nc.Close()
	rd := bufio.NewReader(nc)
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			return
		}
		line = strings.TrimRight(line, "\r\n")
		f.mu.Lock()
		f.reqs = append(f.reqs, line)
		f.mu.Unlock()
		ans := f.answer(strings.Fields(line))
		if ans == "" {
			continue
		}
		if _, err := fmt.Fprintf(nc, "%s\n", ans); err != nil || ans[0] == 'E' {
			return
		}
	}
}

// cut closes the listener and every connection: the server is gone.
func (f *fake) cut() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ln.Close()
	for _, nc := range f.conns {
		nc.Close()
	}
	f.conns = nil
}

func (f *fake) requests() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.reqs...)
}

// blackhole is serverproc.BlackHole for t.
func blackhole(t *testing.T) string {
	t.Helper()
	addr, release, err := serverproc.BlackHole()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	return addr
}

// A first address that lets connection attempts time out (no reset) does
// not use up the whole dial: the next one is tried in time.
func TestFailoverPastSilentAddress(t *testing.T) {
	real := startServer(t)
	addrs := blackhole(t) + "," + real
	r := runCtl(t, nil, "--addr", addrs, "acquire", "k", "--lease", "1m")
	tok, err := strconv.ParseUint(strings.TrimSpace(r.stdout), 10, 64)
	if r.code != 0 || err != nil || r.took > 4500*time.Millisecond {
		t.Fatalf("acquire with the first address silent: want a token from the second within 4.5s; got %v", r)
	}
	r = runCtl(t, nil, "--addr", addrs, "release", "k", strconv.FormatUint(tok, 10))
	if r.code != 0 || r.took > 4500*time.Millisecond {
		t.Errorf("release with the first address silent: want exit 0 within 4.5s; got %v", r)
	}
}

// A node without quorum answers E unavailable: that is no bad --lease or
// --wait, and the outcome is unknown. A release goes on to the next address.
func TestUnavailableNode(t *testing.T) {
	f := newFake(t, func(req []string) string { return "E unavailable shard 3 has no quorum" })
	r := runCtl(t, nil, "--addr", f.addr, "acquire", "k")
	if r.code != exitError || !strings.Contains(r.stderr, "ticketd at "+f.addr+" has no quorum") ||
		!strings.Contains(r.stderr, "k may or may not have been acquired") || strings.Contains(r.stderr, "--max-lease") {
		t.Errorf("acquire from a node without quorum: want exit 1, the node named, the outcome unknown; got %v", r)
	}
	if !strings.Contains(r.stderr, "point --addr at other nodes too") {
		t.Errorf("one address given: want the advice to give others; got %v", r)
	}

	real := startServer(t)
	// With several given, the advice is to put another first, not to give
	// others (a new ticketctl starts on the first address again).
	r = runCtl(t, nil, "--addr", f.addr+","+real, "acquire", "other")
	if r.code != exitError || strings.Contains(r.stderr, "point --addr at other nodes too") || !strings.Contains(r.stderr, "another node first in --addr") {
		t.Errorf("acquire from a node without quorum, several addresses: want the advice to list another first; got %v", r)
	}
	r = runCtl(t, nil, "--addr", real, "acquire", "k", "--lease", "1m")
	if r.code != 0 {
		t.Fatalf("acquire: %v", r)
	}
	tok := strings.TrimSpace(r.stdout)
	r = runCtl(t, nil, "--addr", f.addr+","+real, "release", "k", tok)
	if r.code != 0 {
		t.Errorf("release with the first node without quorum: want exit 0 from the second; got %v", r)
	}
	if !slices.Contains(f.requests(), "R "+tok+" k") {
		t.Errorf("the node without quorum was not asked first: %q", f.requests())
	}
	if r := runCtl(t, nil, "--addr", real, "acquire", "k"); r.code != 0 {
		t.Errorf("k still held after the release: %v", r)
	}
}

// A node that takes the release and never answers is given up as silent in
// time for the release to go to the next address.
func TestReleasePastHungNode(t *testing.T) {
	hung := newFake(t, func(req []string) string { return "" })
	real := startServer(t)
	r := runCtl(t, nil, "--addr", real, "acquire", "k", "--lease", "1m")
	if r.code != 0 {
		t.Fatalf("acquire: %v", r)
	}
	tok := strings.TrimSpace(r.stdout)
	r = runCtl(t, nil, "--addr", hung.addr+","+real, "release", "k", tok)
	if r.code != 0 {
		t.Errorf("release with the first node hung: want exit 0 from the second; got %v", r)
	}
	if len(hung.requests()) == 0 {
		t.Errorf("the hung node was not asked first")
	}
	if r := runCtl(t, nil, "--addr", real, "acquire", "k"); r.code != 0 {
		t.Errorf("k still held after the release: %v", r)
	}
}

// The connection breaks while run's command holds the lock, and the server
// is back only after the command ended: the release waits for it rather
// than fail at once and leave the lock held to the end of its lease. So
// too for a grant that waited queued longer than its lease: its Deadline
// has passed when it arrives, while the server's lease has just begun, and
// the release gave up at that Deadline.
func TestRunReleaseWaitsForReconnect(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer func(req []string) string
		lease  []string
	}{
		{"at once", grant, []string{"--lease", "1m"}},
		{"queued past its lease", func(req []string) string {
			if req[0] == "A" {
				time.Sleep(700 * time.Millisecond) // handed over only now
			}
			return grant(req)
		}, []string{"--lease", "500ms", "--wait", "5s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t, tc.answer)
			file := filepath.Join(t.TempDir(), "go")
			args := append(append([]string{"--addr", f.addr, "run", "k"}, tc.lease...), "--")
			r := start(t, append(args, childCmd("waitfile", file)...)...)
			waitOutput(t, r.stdout, "ready")
			f.cut()
			if err := os.WriteFile(file, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			time.Sleep(700 * time.Millisecond) // the command ends, ticketctl releases with no connection up
			f.listen()
			res := r.wait(t)
			if res.code != 0 || strings.Contains(res.stderr, "could not release") {
				t.Errorf("run: want exit 0 and the lock released once the server is back; got %v", res)
			}
			if reqs := f.requests(); reqs[len(reqs)-1] != "R 5 k" {
				t.Errorf("no release reached the server: %q", reqs)
			}
		})
	}
}

// The server is gone for good when run's command ends: the release fails
// with the words acquire and release use for it, not the client's own
// error text.
func TestRunReleaseThatFailsSaysWhy(t *testing.T) {
	f := newFake(t, grant)
	r := start(t, append([]string{"--addr", f.addr, "run", "k", "--lease", "1m", "--"}, childCmd("waitfile", filepath.Join(t.TempDir(), "go"))...)...)
	waitOutput(t, r.stdout, "ready")
	f.cut()
	r.cmd.Process.Signal(syscall.SIGTERM) // passed on: the command ends
	res := r.wait(t)
	if !strings.Contains(res.stderr, "could not release k (token 5): cannot reach ticketd at "+f.addr+": connection refused") ||
		strings.Contains(res.stderr, "dial tcp") {
		t.Errorf("run's failed release: %v", res)
	}
}

// openPTY opens a pseudo-terminal: master for the test to type on, slave
// for ticketctl's controlling terminal.
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminal: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	fd := int(m.Fd())
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	s, err := os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return m, s
}

// Ctrl-C and Ctrl-\ on the terminal reach run's command once: the terminal
// sends them to the foreground process group, which holds the command, and
// ticketctl does not send them again.
func TestRunTerminalSignalsReachCommandOnce(t *testing.T) {
	if ctlBuildErr != nil {
		t.Fatal(ctlBuildErr)
	}
	addr := startServer(t)
	master, slave := openPTY(t)
	go func() { // drain the echo, so that the terminal never blocks
		b := make([]byte, 256)
		for {
			if _, err := master.Read(b); err != nil {
				return
			}
		}
	}()
	r := &running{stdout: &lockedBuffer{}, stderr: &lockedBuffer{}, done: make(chan struct{})}
	r.cmd = exec.Command(ticketctlBin, append([]string{"--addr", addr, "run", "tty", "--"}, childCmd("sigcount")...)...)
	r.cmd.Stdin, r.cmd.Stdout, r.cmd.Stderr = slave, r.stdout, r.stderr
	// A session of its own on the terminal: its process group is the
	// terminal's foreground group, as for a command typed at a shell.
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	r.t0 = time.Now()
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { r.cmd.Wait(); close(r.done) }()
	t.Cleanup(func() {
		select {
		case <-r.done:
		default:
			syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL) // the whole group: ticketctl and its command
			<-r.done
		}
	})
	waitOutput(t, r.stdout, "ready")
	if _, err := master.Write([]byte{0x03}); err != nil { // Ctrl-C
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if _, err := master.Write([]byte{0x1c}); err != nil { // Ctrl-\
		t.Fatal(err)
	}
	res := r.wait(t)
	if res.code != 0 || !strings.Contains(res.stdout, "INT=1 QUIT=1") {
		t.Errorf("Ctrl-C and Ctrl-\\ at the terminal: want each to reach the command once; got %v", res)
	}
	if r := runCtl(t, nil, "--addr", addr, "acquire", "tty"); r.code != 0 {
		t.Errorf("lock not released after the command ended: %v", r)
	}
}

// Without a terminal, a SIGINT or SIGQUIT reached ticketctl alone (kill):
// it passes each on, once.
func TestRunForwardsInterruptWithoutTerminal(t *testing.T) {
	addr := startServer(t)
	r := start(t, append([]string{"--addr", addr, "run", "int", "--"}, childCmd("sigcount")...)...)
	waitOutput(t, r.stdout, "ready")
	r.cmd.Process.Signal(syscall.SIGINT)
	time.Sleep(100 * time.Millisecond)
	r.cmd.Process.Signal(syscall.SIGQUIT)
	res := r.wait(t)
	if res.code != 0 || !strings.Contains(res.stdout, "INT=1 QUIT=1") {
		t.Errorf("kill -INT and -QUIT to ticketctl run: want each passed on once; got %v", res)
	}
}

// A token that cannot be printed (a closed pipe, a full disk) is given back:
// nobody could release it, and it would block the key for its whole lease.
func TestAcquireUnprintedTokenReleased(t *testing.T) {
	if ctlBuildErr != nil {
		t.Fatal(ctlBuildErr)
	}
	addr := startServer(t)
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	pr.Close()
	defer pw.Close()
	full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer full.Close()
	for name, out := range map[string]*os.File{"closed pipe": pw, "/dev/full": full} {
		var errb lockedBuffer
		cmd := exec.Command(ticketctlBin, "--addr", addr, "acquire", "k", "--lease", "1m")
		cmd.Stdout, cmd.Stderr = out, &errb
		cmd.SysProcAttr = noTerminal()
		cmd.Run()
		ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
		if ws.Signaled() || ws.ExitStatus() != exitError || !strings.Contains(errb.String(), "cannot print the token of k") {
			t.Errorf("acquire with stdout a %s: want exit 1 saying so; got %v, stderr %q", name, cmd.ProcessState, errb.String())
		}
		if r := runCtl(t, nil, "--addr", addr, "acquire", "k", "--lease", "100ms"); r.code != 0 {
			t.Fatalf("acquire with stdout a %s: the lock was not given back: %v", name, r)
		}
		time.Sleep(150 * time.Millisecond) // that lease ends
	}
}

// Started with its standard output closed (`>&-`, as from a service with
// no stdout), acquire takes no lock: the runtime puts /dev/null in its
// place, where the token would be printed without an error and lost, the
// key blocked for the lease. Sent to /dev/null on purpose, it is printed
// there, as asked.
func TestAcquireWithStdoutClosedTakesNoLock(t *testing.T) {
	if ctlBuildErr != nil {
		t.Fatal(ctlBuildErr)
	}
	addr := startServer(t)
	var errb lockedBuffer
	cmd := exec.Command("sh", "-c", `exec "$0" --addr "$1" acquire k --lease 1m >&-`, ticketctlBin, addr)
	cmd.Stderr = &errb
	cmd.SysProcAttr = noTerminal()
	_ = cmd.Run()
	if ws := cmd.ProcessState.Sys().(syscall.WaitStatus); ws.ExitStatus() != exitError || !strings.Contains(errb.String(), "standard output is closed") {
		t.Fatalf("acquire with stdout closed: want exit 1 saying so; got %v, stderr %q", cmd.ProcessState, errb.String())
	}
	if r := runCtl(t, nil, "--addr", addr, "acquire", "k", "--lease", "100ms"); r.code != 0 {
		t.Fatalf("after acquire with stdout closed, the key is held: %v", r)
	}
	time.Sleep(150 * time.Millisecond) // that lease ends
	cmd = exec.Command("sh", "-c", `exec "$0" --addr "$1" acquire k --lease 1m >/dev/null`, ticketctlBin, addr)
	cmd.SysProcAttr = noTerminal()
	if err := cmd.Run(); err != nil {
		t.Fatalf("acquire with stdout /dev/null: %v", err)
	}
}

// An N at release does not only mean that the lease ended: a single-mode
// ticketd that restarted after a crash forgot the holder.
func TestNotHeldMentionsCrashRestart(t *testing.T) {
	f := newFake(t, func(req []string) string {
		if req[0] == "R" {
			return fmt.Sprintf("N %s %s", req[1], req[2])
		}
		return grant(req)
	})
	r := runCtl(t, nil, "--addr", f.addr, "run", "k", "--lease", "1m", "--", "true")
	if r.code != 0 || !strings.Contains(r.stderr, "k was no longer held with token 5 at release: its lease had ended, or ticketd restarted after a crash") {
		t.Errorf("run answered N at release: want the crash restart among the causes; got %v", r)
	}
	r = runCtl(t, nil, "--addr", f.addr, "release", "k", "5")
	if r.code != exitNotHeld || !strings.Contains(r.stderr, "or ticketd restarted after a crash") {
		t.Errorf("release answered N: want exit 5 with the crash restart among the causes; got %v", r)
	}
}

// A lease or wait that no server takes is a usage error (exit 2), and so is
// one beyond this server's --max-lease, which only the server knows.
func TestLeaseOutOfRange(t *testing.T) {
	addr := startServer(t, "--max-lease", "1h")
	r := runCtl(t, nil, "--addr", addr, "acquire", "k", "--lease", "2h")
	if r.code != exitUsage || !strings.Contains(r.stderr, "beyond the server's --max-lease/--max-wait") {
		t.Errorf("acquire --lease 2h against --max-lease 1h: want exit 2 naming the limits; got %v", r)
	}
	for _, args := range [][]string{
		{"acquire", "k", "--lease", "0"},
		{"acquire", "k", "--wait", "-1s"},
		{"run", "k", "--lease", "0", "--", "true"},
	} {
		r := runCtl(t, nil, append([]string{"--addr", addr}, args...)...)
		if r.code != exitUsage || !strings.Contains(r.stderr, "want ") || strings.Contains(r.stderr, "2562047h") {
			t.Errorf("ticketctl %s: want exit 2 with a sensible bound; got %v", strings.Join(args, " "), r)
		}
	}
}

// A malformed address is a bad argument, exit 2, whether in --addr or in
// $TICKETD_ADDR, and no server is needed to say so.
func TestMalformedAddressIsAUsageError(t *testing.T) {
	for _, c := range []struct {
		env  []string
		args []string
	}{
		{nil, []string{"--addr", "foo", "acquire", "k"}},
		{nil, []string{"--addr", "127.0.0.1:1,foo:bar:9", "release", "k", "1"}},
		{[]string{"TICKETD_ADDR=x"}, []string{"acquire", "k"}},
	} {
		r := runCtl(t, c.env, c.args...)
		if r.code != exitUsage || !strings.Contains(r.stderr, "want HOST:PORT") {
			t.Errorf("ticketctl %s (env %v): want exit 2 naming HOST:PORT; got %v", strings.Join(c.args, " "), c.env, r)
		}
	}
}

// A signal while ticketctl closes its connection, after acquire printed its
// token or release was answered, does not end it with 128+N: a script
// would take the acquire for failed and drop the token of a lock it holds.
// The server here answers, then keeps its side open after the client's end,
// so that Close waits (up to 5 s) for it.
func TestSignalWhileClosingAfterTheAnswerIsIgnored(t *testing.T) {
	if ctlBuildErr != nil {
		t.Fatal(ctlBuildErr)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hold := make(chan struct{})
	answered := make(chan struct{}, 4)
	t.Cleanup(func() { close(hold); ln.Close() })
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer nc.Close()
				rd := bufio.NewReader(nc)
				for {
					line, err := rd.ReadString('\n')
					if err != nil {
						<-hold // the client's end: keep this side open
						return
					}
					if ans := grant(strings.Fields(line)); ans[0] != 'E' {
						fmt.Fprintf(nc, "%s\n", ans)
						answered <- struct{}{}
					}
				}
			}()
		}
	}()
	addr := ln.Addr().String()
	for _, tc := range []struct {
		args []string
		out  string
	}{
		{[]string{"acquire", "k", "--lease", "1m"}, "5\n"},
		{[]string{"release", "k", "5"}, ""},
	} {
		r := start(t, append([]string{"--addr", addr}, tc.args...)...)
		select {
		case <-answered:
		case <-time.After(20 * time.Second):
			t.Fatalf("%s: no request answered within 20s", tc.args[0])
		}
		waitOutput(t, r.stdout, tc.out)
		time.Sleep(300 * time.Millisecond) // in Close, waiting for the server's end
		r.cmd.Process.Signal(syscall.SIGINT)
		res := r.wait(t)
		if ws := r.cmd.ProcessState.Sys().(syscall.WaitStatus); ws.Signaled() || res.code != exitOK {
			t.Errorf("%s answered, then SIGINT while closing: %v, want exit 0", tc.args[0], r.cmd.ProcessState)
		}
	}
}

// --addr at a port where something else answers (ticketd's own --admin, an
// HTTP server) is named as such, not as a ticketd whose connection broke.
func TestAddressOfAnotherServiceIsNamed(t *testing.T) {
	f := newFake(t, func([]string) string { return "HTTP/1.1 400 Bad Request" })
	r := runCtl(t, nil, "--addr", f.addr, "acquire", "k")
	if r.code != exitError || !strings.Contains(r.stderr, "does not speak ticketd's protocol") {
		t.Errorf("acquire at an HTTP port: %v", r)
	}
}

// A server at its --max-conns takes the connection and closes it at once:
// ticketctl says so, rather than ask whether ticketd is running.
func TestServerAtItsConnectionLimitIsNamed(t *testing.T) {
	addr := startServer(t, "--max-conns", "1")
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	fmt.Fprintf(nc, "A holder other 60000 0\n") // answered: the server's one connection is this one
	if _, err := bufio.NewReader(nc).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	r := runCtl(t, nil, "--addr", addr, "acquire", "k")
	if r.code != exitError || strings.Contains(r.stderr, "is it running") ||
		!strings.Contains(r.stderr, "before answering anything") && !strings.Contains(r.stderr, "before it answered anything") {
		t.Errorf("acquire at a server over its --max-conns: %v", r)
	}
}
