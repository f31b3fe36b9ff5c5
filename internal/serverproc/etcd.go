package serverproc

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// EtcdInstall is what to run where the etcd binary is missing.
const EtcdInstall = "apt-get install etcd-server"

// FindEtcd returns the path of the etcd server binary, or an error naming
// the command that installs it.
func FindEtcd() (string, error) {
	p, err := exec.LookPath("etcd")
	if err != nil {
		return "", fmt.Errorf("etcd not installed (%s)", EtcdInstall)
	}
	return p, nil
}

// EtcdVersion is the first line of `etcd --version`.
func EtcdVersion(bin string) string {
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return "etcd (version unknown)"
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return strings.Replace(line, "etcd Version: ", "etcd ", 1)
}

// EtcdMember is one process of an Etcd cluster.
type EtcdMember struct {
	Name    string
	Client  string // http://127.0.0.1:port
	Peer    string
	DataDir string
	Proc    *Proc
}

// Etcd is an etcd cluster on loopback that this process started, with its
// data under one scratch directory that Stop removes.
type Etcd struct {
	Members []*EtcdMember
	Dir     string
}

// StartEtcd starts an n-member etcd cluster of bin on free loopback ports
// and returns once every member reports itself healthy. As with
// StartCluster, a port taken between probe and bind retries the start.
func StartEtcd(bin string, n int, timeout time.Duration) (*Etcd, error) {
	var errs []error
	for range 3 {
		e, err := startEtcd(bin, n, timeout)
		if err == nil {
			return e, nil
		}
		errs = append(errs, err)
		if !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	return nil, errors.Join(errs...)
}

func startEtcd(bin string, n int, timeout time.Duration) (*Etcd, error) {
	dir, err := os.MkdirTemp("", "etcd-bench-")
	if err != nil {
		return nil, err
	}
	e := &Etcd{Dir: dir}
	ports, err := FreePorts(2 * n)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	var initial []string
	for i := range n {
		m := &EtcdMember{Name: fmt.Sprintf("e%d", i+1),
			Client:  fmt.Sprintf("http://127.0.0.1:%d", ports[2*i]),
			Peer:    fmt.Sprintf("http://127.0.0.1:%d", ports[2*i+1]),
			DataDir: filepath.Join(dir, fmt.Sprintf("e%d", i+1))}
		e.Members = append(e.Members, m)
		initial = append(initial, m.Name+"="+m.Peer)
	}
	token := filepath.Base(dir) // no two clusters of one machine share it
	for _, m := range e.Members {
		cmd := exec.Command(bin,
			"--name", m.Name, "--data-dir", m.DataDir,
			"--listen-client-urls", m.Client, "--advertise-client-urls", m.Client,
			"--listen-peer-urls", m.Peer, "--initial-advertise-peer-urls", m.Peer,
			"--initial-cluster", strings.Join(initial, ","),
			"--initial-cluster-state", "new", "--initial-cluster-token", token,
			"--logger", "zap", "--log-level", "warn")
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if m.Proc, err = Start(cmd, nil); err != nil {
			e.Stop(time.Second)
			return nil, fmt.Errorf("etcd %s: %w", m.Name, err)
		}
	}
	if err := e.waitHealthy(timeout); err != nil {
		e.Stop(time.Second)
		return nil, err
	}
	return e, nil
}

// waitHealthy polls each member's /health until it says true: the member
// has joined a cluster with a leader.
func (e *Etcd) waitHealthy(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	cl := &http.Client{Timeout: time.Second}
	for _, m := range e.Members {
		for {
			resp, err := cl.Get(m.Client + "/health")
			if err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK && strings.Contains(string(b), `"health":"true"`) {
					break
				}
			}
			if m.Proc.Exited() {
				return fmt.Errorf("etcd %s exited (%v); output:\n%s", m.Name, m.Proc.Err(), m.Proc.Log().Tail(40))
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("etcd %s not healthy within %v; output:\n%s", m.Name, timeout, m.Proc.Log().Tail(40))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nil
}

// Endpoints are the members' client URLs.
func (e *Etcd) Endpoints() []string {
	var out []string
	for _, m := range e.Members {
		out = append(out, m.Client)
	}
	return out
}

// Pids are the members' process ids.
func (e *Etcd) Pids() []int {
	var out []int
	for _, m := range e.Members {
		out = append(out, m.Proc.Pid())
	}
	return out
}

// Stop stops every member (SIGTERM, then SIGKILL after grace) and removes
// the data directories.
func (e *Etcd) Stop(grace time.Duration) error {
	if e == nil {
		return nil
	}
	defer os.RemoveAll(e.Dir)
	var errs []error
	for _, m := range e.Members {
		if m.Proc == nil {
			continue
		}
		if err := m.Proc.Stop(grace); err != nil {
			errs = append(errs, fmt.Errorf("etcd %s: %w", m.Name, err))
		}
	}
	return errors.Join(errs...)
}
