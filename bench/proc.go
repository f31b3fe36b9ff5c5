package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Proc is a server process the bench started; Stop ends it, and only it.
type Proc struct {
	Name string
	Addr string // where it accepts clients
	Cmd  *exec.Cmd
	Dir  string // scratch directory (data dir, logs), removed by Stop

	log    *tailBuffer
	waited chan struct{}
	err    error // from Wait, after waited is closed
}

// Pid is the process id.
func (p *Proc) Pid() int { return p.Cmd.Process.Pid }

// Stop sends SIGTERM, waits up to 10s, then SIGKILL; it removes Dir.
func (p *Proc) Stop() error {
	if p == nil {
		return nil
	}
	defer os.RemoveAll(p.Dir)
	select {
	case <-p.waited:
		return fmt.Errorf("%s had already exited: %v\n%s", p.Name, p.err, p.log.String())
	default:
	}
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.waited:
	case <-time.After(10 * time.Second):
		_ = p.Cmd.Process.Kill()
		<-p.waited
		return fmt.Errorf("%s did not stop within 10s of SIGTERM; killed", p.Name)
	}
	var ee *exec.ExitError
	if p.err != nil && !(errors.As(p.err, &ee) && ee.Sys().(syscall.WaitStatus).Signaled()) {
		return fmt.Errorf("%s: %v\n%s", p.Name, p.err, p.log.String())
	}
	return nil
}

// Exited reports whether the process ended by itself.
func (p *Proc) Exited() bool {
	select {
	case <-p.waited:
		return true
	default:
		return false
	}
}

// Log returns the tail of what the process wrote.
func (p *Proc) Log() string { return p.log.String() }

// RSS is the process's resident memory (VmRSS) in bytes.
func (p *Proc) RSS() (int64, error) { return procStatusKB(p.Pid(), "VmRSS:") }

// FDLimit is the process's soft limit of open files.
func (p *Proc) FDLimit() (int64, error) { return procFDLimit(p.Pid()) }

// CPU is the CPU time the process has used so far (user and system).
func (p *Proc) CPU() (time.Duration, error) { return procCPU(p.Pid()) }

func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command name, which is in parentheses and may hold spaces.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	const clkTck = 100 // USER_HZ: fixed at 100 on Linux for /proc
	return time.Duration(utime+stime) * time.Second / clkTck, nil
}

// machineCPU is the CPU time every core of the machine has spent busy so
// far (not idle, not waiting for I/O).
func machineCPU() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 6 || f[0] != "cpu" {
		return 0
	}
	var busy int64
	for i, v := range f[1:] {
		n, _ := strconv.ParseInt(v, 10, 64)
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	const clkTck = 100
	return time.Duration(busy) * time.Second / clkTck
}

// selfCPU is this process's CPU time so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func procStatusKB(pid int, field string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb * 1024, err
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", field, pid)
}

func procFDLimit(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "Max open files") {
			f := strings.Fields(line)
			if len(f) >= 5 {
				return strconv.ParseInt(f[3], 10, 64)
			}
		}
	}
	return 0, fmt.Errorf("no open-files limit in /proc/%d/limits", pid)
}

// tailBuffer keeps the last 64 KiB written to it, for error messages.
type tailBuffer struct {
	mu sync.Mutex
	b  []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	t.b = append(t.b, p...)
	if len(t.b) > 64<<10 {
		t.b = append(t.b[:0], t.b[len(t.b)-32<<10:]...)
	}
	t.mu.Unlock()
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}

// start runs bin with args; every line of its stdout and stderr goes to
// watch (until watch returns true once) and to the log tail.
func start(name, bin string, args []string, dir string, watch func(line []byte) bool) (*Proc, <-chan struct{}, error) {
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	// A bench killed outright must not leave its servers behind.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p := &Proc{Name: name, Cmd: cmd, Dir: dir, log: &tailBuffer{}, waited: make(chan struct{})}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("start %s: %w", name, err)
	}
	seen := make(chan struct{})
	var once sync.Once
	var mu sync.Mutex
	watching := true
	scan := func(r io.Reader, wg *sync.WaitGroup) {
		defer wg.Done()
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Bytes()
			p.log.Write(line)
			p.log.Write([]byte{'\n'})
			mu.Lock()
			if watching && watch(line) {
				watching = false
				once.Do(func() { close(seen) })
			}
			mu.Unlock()
		}
		io.Copy(io.Discard, r)
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go scan(stdout, &wg)
	go scan(stderr, &wg)
	go func() {
		wg.Wait() // pipes first: Wait closes them
		p.err = cmd.Wait()
		close(p.waited)
	}()
	return p, seen, nil
}

// waitReady waits for seen, the process's exit, or the timeout.
func (p *Proc) waitReady(seen <-chan struct{}, timeout time.Duration) error {
	select {
	case <-seen:
		return nil
	case <-p.waited:
		os.RemoveAll(p.Dir)
		return fmt.Errorf("%s exited before it was ready: %v\n%s", p.Name, p.err, p.log.String())
	case <-time.After(timeout):
		p.Stop()
		return fmt.Errorf("%s not ready within %s\n%s", p.Name, timeout, p.log.String())
	}
}

// StartTicketd starts bin on a free loopback port with a fresh data
// directory, and returns once it logged "listening".
func StartTicketd(bin string, extra ...string) (*Proc, error) {
	dir, err := os.MkdirTemp("", "ticketd-bench-")
	if err != nil {
		return nil, err
	}
	args := append([]string{"--listen", "127.0.0.1:0", "--log-format", "json",
		"--data-dir", filepath.Join(dir, "data")}, extra...)
	var addr string
	p, seen, err := start("ticketd", bin, args, dir, func(line []byte) bool {
		var m struct {
			Msg  string `json:"msg"`
			Addr string `json:"addr"`
		}
		if json.Unmarshal(line, &m) == nil && m.Msg == "listening" && m.Addr != "" {
			addr = m.Addr
			return true
		}
		return false
	})
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := p.waitReady(seen, 30*time.Second); err != nil {
		return nil, err
	}
	p.Addr = addr // written before seen was closed
	return p, nil
}

// StartEcho starts the echo server bin on a free loopback port.
func StartEcho(bin string) (*Proc, error) {
	dir, err := os.MkdirTemp("", "echo-bench-")
	if err != nil {
		return nil, err
	}
	var addr string
	p, seen, err := start("echo", bin, []string{"--listen", "127.0.0.1:0"}, dir, func(line []byte) bool {
		if a, ok := bytes.CutPrefix(line, []byte("listening ")); ok {
			addr = string(a)
			return true
		}
		return false
	})
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := p.waitReady(seen, 30*time.Second); err != nil {
		return nil, err
	}
	p.Addr = addr
	return p, nil
}

// RedisInstall is what to run where redis-server is missing.
const RedisInstall = "apt-get install redis-server"

// FindRedis returns the path of redis-server, or an error naming the
// command that installs it.
func FindRedis() (string, error) {
	p, err := exec.LookPath("redis-server")
	if err != nil {
		return "", fmt.Errorf("redis-server not installed (%s)", RedisInstall)
	}
	return p, nil
}

// StartRedis starts redis-server on a free loopback port with no
// persistence, and loads the release script.
func StartRedis(bin string, maxClients int) (*Proc, error) {
	var lastErr error
	for range 5 { // the free port may be taken between probe and bind
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		dir, err := os.MkdirTemp("", "redis-bench-")
		if err != nil {
			return nil, err
		}
		args := []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--protected-mode", "no", "--daemonize", "no",
			"--dir", dir, "--loglevel", "warning", "--maxclients", strconv.Itoa(maxClients)}
		p, seen, err := start("redis-server", bin, args, dir, func([]byte) bool { return false })
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		_ = seen
		p.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		deadline := time.Now().Add(10 * time.Second)
		for {
			if err = redisSetup(p.Addr); err == nil {
				return p, nil
			}
			if p.Exited() || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		lastErr = fmt.Errorf("redis-server on port %d: %v\n%s", port, err, p.Log())
		p.Stop()
	}
	return nil, lastErr
}

// redisSetup loads the release script, so EVALSHA finds it.
func redisSetup(addr string) error {
	nc, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(5 * time.Second))
	var req []byte
	req = append(req, "*3\r\n$6\r\nSCRIPT\r\n$4\r\nLOAD\r\n"...)
	req = appendBulk(req, []byte(releaseScript))
	if _, err := nc.Write(req); err != nil {
		return err
	}
	line, err := bufio.NewReader(nc).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "$40\r\n" { // a bulk string of the 40 hex digits of the SHA1 follows
		return fmt.Errorf("SCRIPT LOAD answered %q", line)
	}
	return nil
}

// RedisVersion returns the first line of `redis-server --version`.
func RedisVersion(bin string) string {
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// Build compiles the package pkg (e.g. "./cmd/ticketd") of the module in
// root into dir and returns the binary's path.
func Build(ctx context.Context, root, pkg, dir string) (string, error) {
	out := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, pkg)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %v\n%s", pkg, err, b)
	}
	return out, nil
}

// ModuleRoot finds the directory of the enclosing go.mod.
func ModuleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("not inside a Go module")
	}
	return filepath.Dir(gomod), nil
}
