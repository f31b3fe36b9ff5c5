package chaos

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ticketd/ticketd/codec"
	"github.com/ticketd/ticketd/internal/serverproc"
)

// node is one ticketd process the campaign runs, restartable on its data dir.
type node struct {
	id      int
	listen  string // client address (fixed, so restarts keep it)
	admin   string
	dataDir string
	clock   string // offset file
	args    []string
	proc    *serverproc.Proc
	paused  bool
	cmd     func() *exec.Cmd
}

// target is the system under test: one single-mode process or a cluster.
type target struct {
	mode  string
	bin   string
	dir   string
	nodes []*node
	net   *netTopo // nil: loopback, no partitions
	flags []string
	log   func(format string, args ...any)
}

const (
	campaignShards     = 8
	clusterSkew        = 500 * time.Millisecond
	clusterUnavailable = 5 * time.Second
	// clusterPropose is one proposal attempt's timeout: two election
	// timeouts at the default --raft-rtt (10 ms, 30 ticks).
	clusterPropose = 600 * time.Millisecond
)

func newSingle(bin, dir string, logf func(string, ...any)) (*target, error) {
	addr, err := serverproc.FreeAddr()
	if err != nil {
		return nil, err
	}
	t := &target{mode: "single", bin: bin, dir: dir, log: logf}
	n := &node{id: 1, listen: addr, dataDir: filepath.Join(dir, "n1"), clock: filepath.Join(dir, "clock1")}
	if err := os.WriteFile(n.clock, nil, 0o644); err != nil {
		return nil, err
	}
	n.args = serverproc.TicketdArgs(addr, n.dataDir, "--shards", strconv.Itoa(campaignShards), "--sweep-interval", "1s",
		"--unsafe-test-clock-offset-file", n.clock)
	n.cmd = func() *exec.Cmd { return exec.Command(bin, n.args...) }
	t.nodes = []*node{n}
	return t, t.start(n)
}

// newCluster starts 3 nodes. With useNetns each runs in its own network
// namespace (partitions possible); otherwise all on 127.0.0.1. With require,
// a cluster that cannot have its partitions is not started.
func newCluster(bin, dir string, useNetns, require bool, logf func(string, ...any)) (*target, string, error) {
	t := &target{mode: "cluster", bin: bin, dir: dir, log: logf}
	var why string
	if useNetns {
		nt, err := newNetTopo(3)
		if err != nil {
			why = "partitions skipped: " + err.Error()
		} else {
			t.net = nt
		}
	} else {
		why = "partitions skipped: network namespaces not requested"
	}
	if why != "" && require {
		return nil, "", fmt.Errorf("%s (partitions were required)", why)
	}
	var peers []string
	for i := 1; i <= 3; i++ {
		n := &node{id: i, dataDir: filepath.Join(dir, fmt.Sprintf("n%d", i)), clock: filepath.Join(dir, fmt.Sprintf("clock%d", i))}
		var raft string
		if t.net != nil {
			ip := t.net.nodeIP(i)
			n.listen, n.admin, raft = ip+":7411", ip+":7491", ip+":7421"
		} else {
			var addrs [3]string
			for k := range addrs {
				a, err := serverproc.FreeAddr()
				if err != nil {
					t.close()
					return nil, "", err
				}
				addrs[k] = a
			}
			n.listen, n.admin, raft = addrs[0], addrs[1], addrs[2]
		}
		if err := os.WriteFile(n.clock, nil, 0o644); err != nil {
			t.close()
			return nil, "", err
		}
		peers = append(peers, fmt.Sprintf("%d=%s", i, raft))
		t.nodes = append(t.nodes, n)
	}
	for _, n := range t.nodes {
		n.args = serverproc.TicketdArgs(n.listen, n.dataDir, "--node-id", strconv.Itoa(n.id), "--peers", strings.Join(peers, ","), "--bootstrap",
			"--admin", n.admin, "--shards", strconv.Itoa(campaignShards), "--max-clock-skew", clusterSkew.String(),
			"--unavailable-timeout", clusterUnavailable.String(), "--unsafe-test-clock-offset-file", n.clock)
		if t.net != nil {
			n.cmd = func() *exec.Cmd { return t.net.command(n.id, bin, n.args...) }
		} else {
			n.cmd = func() *exec.Cmd { return exec.Command(bin, n.args...) }
		}
	}
	for _, n := range t.nodes {
		if err := t.launch(n); err != nil {
			t.close()
			return nil, "", err
		}
	}
	for _, n := range t.nodes {
		if err := t.waitListening(n, 60*time.Second); err != nil {
			t.close()
			return nil, "", err
		}
	}
	if err := t.waitReady(60 * time.Second); err != nil {
		t.close()
		return nil, "", err
	}
	return t, why, nil
}

func (t *target) launch(n *node) error {
	cmd := n.cmd()
	// A campaign killed outright must not leave servers behind.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p, err := serverproc.Start(cmd, serverproc.ListeningAddr)
	if err != nil {
		return fmt.Errorf("node %d: %w", n.id, err)
	}
	n.proc, n.paused = p, false
	return nil
}

func (t *target) waitListening(n *node, timeout time.Duration) error {
	if err := n.proc.WaitReady(timeout); err != nil {
		return fmt.Errorf("node %d: %w", n.id, err)
	}
	return nil
}

func (t *target) start(n *node) error {
	if err := t.launch(n); err != nil {
		return err
	}
	return t.waitListening(n, 60*time.Second)
}

func (t *target) node(id int) *node { return t.nodes[id-1] }

func (t *target) ids() []int {
	var ids []int
	for _, n := range t.nodes {
		ids = append(ids, n.id)
	}
	return ids
}

// kill sends SIGKILL to the node's pid (a paused one dies too) and waits.
func (t *target) kill(id int) {
	n := t.node(id)
	n.proc.Kill()
	n.paused = false
}

// term stops the node cleanly (SIGTERM); a stop that takes longer than 20s
// ends in SIGKILL and is reported.
func (t *target) term(id int) error {
	n := t.node(id)
	if n.paused {
		t.resume(id)
	}
	err := n.proc.Stop(20 * time.Second)
	if err == nil && n.proc.ExitCode() != 0 {
		err = fmt.Errorf("node %d: clean shutdown ended in %s: %s", id, n.proc.ExitState(), n.proc.Log().Tail(5))
	}
	return err
}

func (t *target) pause(id int) error {
	n := t.node(id)
	n.paused = true
	// The pause's length counts from when every thread is stopped, not
	// from when the signal was sent (a thread can run on for milliseconds).
	return n.proc.Pause(5 * time.Second)
}

func (t *target) resume(id int) error {
	n := t.node(id)
	n.paused = false
	if n.proc.Exited() {
		// Only SIGKILL ends a stopped process: say so, not just ESRCH.
		return fmt.Errorf("node %d ended while stopped (%s)", id, n.proc.ExitState())
	}
	return syscall.Kill(n.proc.Pid(), syscall.SIGCONT)
}

// slowFsync makes every fsync of the node take delay more, through strace
// (which stops the process only around its syscalls), until stop, which
// detaches and waits for strace to exit. An error means no fault was made.
func (t *target) slowFsync(id int, delay time.Duration) (stop func(), err error) {
	if _, err := exec.LookPath("strace"); err != nil {
		return nil, fmt.Errorf("nemesis %s skipped: no strace", NemSlowFsync)
	}
	n := t.node(id)
	cmd := exec.Command("strace", "-f", "-p", strconv.Itoa(n.proc.Pid()), "-e", "trace=fsync",
		"-e", fmt.Sprintf("inject=fsync:delay_enter=%d", delay.Microseconds()), "-o", os.DevNull)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p, err := serverproc.Start(cmd, func(line []byte) (string, bool) {
		return "", strings.Contains(string(line), "attached")
	})
	if err == nil {
		err = p.WaitReady(10 * time.Second)
	}
	if err != nil {
		return nil, fmt.Errorf("nemesis %s skipped: strace could not attach: %v", NemSlowFsync, err)
	}
	time.Sleep(200 * time.Millisecond) // the other threads' attach
	return func() {
		if err := p.Stop(5 * time.Second); err != nil {
			t.log("strace: %v", err)
		}
	}, nil
}

// setClock writes the node's clock offset; a cluster node reads it within
// 50 ms, single mode at its next start.
func (t *target) setClock(id int, off time.Duration) error {
	n := t.node(id)
	tmp := n.clock + ".tmp"
	if err := os.WriteFile(tmp, []byte(off.String()), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, n.clock)
}

type shardStatus struct {
	Shard  int    `json:"shard"`
	Leader uint64 `json:"leader"`
	Term   uint64 `json:"term"`
}

var httpc = &http.Client{Timeout: time.Second}

// leaders maps shard to leader node as the first live node that answers
// sees it.
func (t *target) leaders() map[int]int {
	for _, n := range t.nodes {
		if n.proc.Exited() || n.paused || n.admin == "" {
			continue
		}
		resp, err := httpc.Get("http://" + n.admin + "/debug/cluster")
		if err != nil {
			continue
		}
		var st []shardStatus
		err = json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
		if err != nil {
			continue
		}
		out := map[int]int{}
		for _, s := range st {
			if s.Leader != 0 {
				out[s.Shard] = int(s.Leader)
			}
		}
		return out
	}
	return nil
}

// granting waits until single mode grants a key of its own (the grace of an
// earlier crash is over, so the workers hold leases again), up to timeout;
// false if it did not.
func (t *target) granting(timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", t.nodes[0].listen, time.Second)
		if err == nil {
			_ = c.SetDeadline(time.Now().Add(time.Second))
			var line []byte
			_, err = c.Write(codec.AppendAcquire(nil, []byte("chaos-probe"), []byte("chaos-probe"), 1, 0))
			if err == nil {
				line, err = bufio.NewReader(c).ReadSlice('\n')
			}
			var a codec.Answer
			if err == nil {
				_, err = codec.ParseAnswer(line, &a)
			}
			c.Close()
			if err == nil && a.Kind == 'A' {
				return true
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return false
}

// waitReady waits until every live, running node's /readyz is 200 (cluster
// mode; single mode is ready once it listens).
func (t *target) waitReady(timeout time.Duration) error {
	if t.mode != "cluster" {
		return nil
	}
	deadline := time.Now().Add(timeout)
	for _, n := range t.nodes {
		if n.proc.Exited() || n.paused {
			continue
		}
		for {
			resp, err := httpc.Get("http://" + n.admin + "/readyz")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("node %d not ready within %v", n.id, timeout)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nil
}

// close stops every node (resuming paused ones first), heals and removes the
// network namespaces. Data dirs are the caller's to remove.
func (t *target) close() {
	for _, n := range t.nodes {
		if n.proc == nil || n.proc.Exited() {
			continue
		}
		if n.paused {
			t.resume(n.id)
		}
		n.proc.Stop(10 * time.Second)
	}
	if t.net != nil {
		t.net.remove()
	}
}
