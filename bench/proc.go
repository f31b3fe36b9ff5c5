package bench

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ticketd/ticketd/internal/serverproc"
)

// Proc is a server process the bench started; Stop ends it, and only it.
type Proc struct {
	Name string
	Addr string // where it accepts clients
	Cmd  *exec.Cmd
	Dir  string // scratch directory (data dir, logs), removed by Stop

	p *serverproc.Proc
}

// Pid is the process id.
func (p *Proc) Pid() int { return p.Cmd.Process.Pid }

// Stop sends SIGTERM, waits up to 10s, then SIGKILL; it removes Dir.
func (p *Proc) Stop() error {
	if p == nil {
		return nil
	}
	defer os.RemoveAll(p.Dir)
	if p.Exited() {
		return fmt.Errorf("%s had already exited: %v\n%s", p.Name, p.p.Err(), p.Log())
	}
	if err := p.p.Stop(10 * time.Second); err != nil {
		return fmt.Errorf("%s: %w", p.Name, err)
	}
	var ee *exec.ExitError
	if err := p.p.Err(); err != nil && !(errors.As(err, &ee) && ee.Sys().(syscall.WaitStatus).Signaled()) {
		return fmt.Errorf("%s: %v\n%s", p.Name, err, p.Log())
	}
	return nil
}

// Exited reports whether the process ended by itself.
func (p *Proc) Exited() bool { return p.p.Exited() }

// Log returns the tail of what the process wrote.
func (p *Proc) Log() string { return p.p.Log().Tail(logLines) }

// logLines is how much of a process's output an error shows.
const logLines = 200

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
	const clkTck = 100
	return time.Duration(busyTicks(line)) * time.Second / clkTck
}

// busyTicks reads /proc/stat's "cpu" line: user, nice, system, irq and
// softirq; not idle and iowait, not steal (another guest's), not guest and
// guest_nice (counted in user and nice already).
func busyTicks(line string) int64 {
	f := strings.Fields(line)
	if len(f) < 6 || f[0] != "cpu" {
		return 0
	}
	var busy int64
	for i, v := range f[1:min(len(f), 8)] {
		n, _ := strconv.ParseInt(v, 10, 64)
		if i != 3 && i != 4 {
			busy += n
		}
	}
	return busy
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

// start makes a scratch directory from pattern and runs bin in it with
// args(dir); its output goes to ready (see serverproc.Start) and to the log.
func start(name, pattern, bin string, args func(dir string) []string, ready func(line []byte) (string, bool), env ...string) (*Proc, error) {
	dir, err := os.MkdirTemp("", pattern)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args(dir)...)
	cmd.Dir = dir
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	// A bench killed outright must not leave its servers behind.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	sp, err := serverproc.Start(cmd, ready)
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	return &Proc{Name: name, Cmd: cmd, Dir: dir, p: sp}, nil
}

// startReady is start, then a wait for the ready line, which gives Addr.
func startReady(name, pattern, bin string, args func(dir string) []string, ready func(line []byte) (string, bool), env ...string) (*Proc, error) {
	p, err := start(name, pattern, bin, args, ready, env...)
	if err != nil {
		return nil, err
	}
	if err := p.p.WaitReady(30 * time.Second); err != nil {
		os.RemoveAll(p.Dir)
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	p.Addr = p.p.Addr
	return p, nil
}

// StartTicketd starts bin on a free loopback port with a fresh data
// directory, and returns once it logged "listening".
func StartTicketd(bin string, extra ...string) (*Proc, error) {
	return StartTicketdEnv(bin, nil, extra...)
}

// StartTicketdEnv is StartTicketd with environment variables (NAME=value)
// added to this process's.
func StartTicketdEnv(bin string, env []string, extra ...string) (*Proc, error) {
	return startReady("ticketd", "ticketd-bench-", bin, func(dir string) []string {
		return serverproc.TicketdArgs("", filepath.Join(dir, "data"), extra...)
	}, serverproc.ListeningAddr, env...)
}

// StartEcho starts the echo server bin on a free loopback port, with
// extra flags and environment variables (NAME=value) if given.
func StartEcho(bin string, extra, env []string) (*Proc, error) {
	return startReady("echo", "echo-bench-", bin, func(string) []string {
		return append([]string{"--listen", "127.0.0.1:0"}, extra...)
	}, func(line []byte) (string, bool) {
		a, ok := bytes.CutPrefix(line, []byte("listening "))
		return string(a), ok
	}, env...)
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
		p, err := start("redis-server", "redis-bench-", bin, func(dir string) []string {
			return []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
				"--save", "", "--appendonly", "no", "--protected-mode", "no", "--daemonize", "no",
				"--dir", dir, "--loglevel", "warning", "--maxclients", strconv.Itoa(maxClients)}
		}, nil) // ready once it answers, below
		if err != nil {
			return nil, err
		}
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

// versionOf is what bin --version prints (redis-server, ticketd), or
// "unknown".
func versionOf(bin string) string {
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
