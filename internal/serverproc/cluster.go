package serverproc

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ClusterNode is one ticketd process of a Cluster.
type ClusterNode struct {
	ID      int
	Addr    string // client listener, from its "listening" line
	Admin   string // admin listener, from its "admin listening" line
	Raft    string // its entry in --peers
	DataDir string
	Proc    *Proc
	bin     string
	args    []string
}

// Cluster is ticketd nodes in cluster mode on loopback, each with its own
// data directory under one scratch directory that Stop removes.
type Cluster struct {
	Nodes []*ClusterNode
	Dir   string
}

// SupportsCluster reports whether the ticketd binary bin has cluster mode
// (its help lists --peers).
func SupportsCluster(bin string) bool {
	out, _ := exec.Command(bin, "--help").CombinedOutput()
	return bytes.Contains(out, []byte("-peers"))
}

// ClusterArgs is the command line of node id of a cluster whose raft
// addresses are peers (id=host:port,...): logging JSON, a free client port,
// an admin listener on a free port, --bootstrap (a start on the data dir
// of an earlier one ignores it), then flags.
func ClusterArgs(id int, peers, dataDir string, flags ...string) []string {
	args := TicketdArgs("", dataDir, "--node-id", strconv.Itoa(id), "--peers", peers, "--admin", "127.0.0.1:0", "--bootstrap")
	return append(args, flags...)
}

// StartCluster starts n ticketd nodes of bin ("": the one Ticketd builds) in
// cluster mode and returns once each listens and knows a leader for every
// shard. The raft ports are probed free first, so another process may take
// one meanwhile: the whole start is retried a few times. On an error nothing
// is left running.
func StartCluster(bin string, n int, timeout time.Duration, flags ...string) (*Cluster, error) {
	if bin == "" {
		var err error
		if bin, err = Ticketd(); err != nil {
			return nil, err
		}
	}
	var errs []error
	for range 3 {
		c, err := startCluster(bin, n, timeout, flags)
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
		if !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	return nil, errors.Join(errs...)
}

func startCluster(bin string, n int, timeout time.Duration, flags []string) (*Cluster, error) {
	dir, err := os.MkdirTemp("", "ticketd-cluster-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{Dir: dir}
	ports, err := FreePorts(n)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	var peers []string
	for i, p := range ports {
		peers = append(peers, fmt.Sprintf("%d=127.0.0.1:%d", i+1, p))
	}
	for i := range n {
		nd := &ClusterNode{ID: i + 1, Raft: fmt.Sprintf("127.0.0.1:%d", ports[i]),
			DataDir: filepath.Join(dir, fmt.Sprintf("n%d", i+1)), bin: bin}
		nd.args = ClusterArgs(nd.ID, strings.Join(peers, ","), nd.DataDir, flags...)
		if err := nd.start(); err != nil {
			c.Stop(time.Second)
			return nil, fmt.Errorf("node %d: %w", nd.ID, err)
		}
		c.Nodes = append(c.Nodes, nd)
	}
	// Every node first: none knows a leader before a quorum runs.
	for _, nd := range c.Nodes {
		if err := nd.Proc.WaitReady(timeout); err != nil {
			c.Stop(time.Second)
			return nil, fmt.Errorf("node %d: %w", nd.ID, err)
		}
		nd.Addr = nd.Proc.Addr
	}
	if err := c.WaitReady(timeout); err != nil {
		c.Stop(time.Second)
		return nil, err
	}
	return c, nil
}

func (nd *ClusterNode) start() error {
	cmd := exec.Command(nd.bin, nd.args...)
	// A parent killed outright must not leave its servers behind.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var err error
	nd.Proc, err = Start(cmd, func(line []byte) (string, bool) {
		if a, ok := logAddr(line, "admin listening"); ok {
			nd.Admin = a
			return "", false
		}
		return ListeningAddr(line)
	})
	return err
}

// Restart starts node id again, on its data dir, once its process has
// exited, and returns when it listens and every node knows a leader for
// every shard.
func (c *Cluster) Restart(id int, timeout time.Duration) error {
	nd := c.Node(id)
	if nd == nil {
		return fmt.Errorf("no node %d", id)
	}
	if !nd.Proc.Exited() {
		return fmt.Errorf("node %d is still running", id)
	}
	if err := nd.start(); err != nil {
		return fmt.Errorf("node %d: %w", id, err)
	}
	if err := nd.Proc.WaitReady(timeout); err != nil {
		return fmt.Errorf("node %d: %w", id, err)
	}
	nd.Addr = nd.Proc.Addr
	return c.WaitReady(timeout)
}

// logAddr reads addr from a JSON log line whose msg is msg.
func logAddr(line []byte, msg string) (string, bool) {
	var rec struct {
		Msg  string `json:"msg"`
		Addr string `json:"addr"`
	}
	if json.Unmarshal(line, &rec) == nil && rec.Msg == msg && rec.Addr != "" {
		return rec.Addr, true
	}
	return "", false
}

// WaitReady waits until the admin /readyz of every live node answers 200
// (the node knows a leader for every shard).
func (c *Cluster) WaitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	cl := &http.Client{Timeout: time.Second}
	for _, nd := range c.Nodes {
		if nd.Proc.Exited() {
			continue
		}
		if nd.Admin == "" {
			return fmt.Errorf("node %d logged no admin address", nd.ID)
		}
		for {
			resp, err := cl.Get("http://" + nd.Admin + "/readyz")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
			}
			if nd.Proc.Exited() {
				return fmt.Errorf("node %d exited (%v); output:\n%s", nd.ID, nd.Proc.Err(), nd.Proc.Log().Tail(40))
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("node %d not ready within %v; output:\n%s", nd.ID, timeout, nd.Proc.Log().Tail(40))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nil
}

// Addrs are the client listeners of the live nodes.
func (c *Cluster) Addrs() []string {
	var a []string
	for _, nd := range c.Nodes {
		if !nd.Proc.Exited() {
			a = append(a, nd.Addr)
		}
	}
	return a
}

// Node is the node with id, or nil.
func (c *Cluster) Node(id int) *ClusterNode {
	for _, nd := range c.Nodes {
		if nd.ID == id {
			return nd
		}
	}
	return nil
}

// LeaderChange is one "shard leader changed" line a node logged.
type LeaderChange struct {
	Shard  int    `json:"shard"`
	Term   uint64 `json:"term"`
	Leader int    `json:"leader"` // node id; 0: none known
	Node   int    `json:"node"`   // the node that logged it
	TS     any    `json:"ts"`     // as the logger writes it
}

// LeaderChanges are every node's "shard leader changed" lines so far, in
// each node's order, node by node.
func (c *Cluster) LeaderChanges() []LeaderChange {
	var out []LeaderChange
	for _, nd := range c.Nodes {
		for _, line := range strings.Split(nd.Proc.Log().String(), "\n") {
			if !strings.Contains(line, `"shard leader changed"`) {
				continue
			}
			var lc struct {
				Msg string `json:"msg"`
				LeaderChange
			}
			if json.Unmarshal([]byte(line), &lc) == nil && lc.Msg == "shard leader changed" {
				out = append(out, lc.LeaderChange)
			}
		}
	}
	return out
}

// Leaders maps each shard to its leader as the logs tell it: per shard, the
// leader of the highest term any node logged (leader 0 lines skipped).
func (c *Cluster) Leaders() map[int]int {
	best := map[int]LeaderChange{}
	for _, lc := range c.LeaderChanges() {
		if lc.Leader == 0 {
			continue
		}
		if b, ok := best[lc.Shard]; !ok || lc.Term > b.Term {
			best[lc.Shard] = lc
		}
	}
	out := make(map[int]int, len(best))
	for s, lc := range best {
		out[s] = lc.Leader
	}
	return out
}

// DiskUse is the disk space (allocated blocks) under each node's data
// directory, by node id.
func (c *Cluster) DiskUse() map[int]int64 {
	out := map[int]int64{}
	for _, nd := range c.Nodes {
		out[nd.ID] = DiskUse(nd.DataDir)
	}
	return out
}

// DiskUse is the space the files under dir take on disk, as du counts it
// (preallocated space included).
func DiskUse(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if fi, err := d.Info(); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512
			}
		}
		return nil
	})
	return n
}

// Stop stops every node still running (SIGTERM, then SIGKILL after grace)
// and removes the scratch directory.
func (c *Cluster) Stop(grace time.Duration) error {
	if c == nil {
		return nil
	}
	defer os.RemoveAll(c.Dir)
	var errs []error
	for _, nd := range c.Nodes {
		if nd.Proc == nil {
			continue
		}
		if err := nd.Proc.Stop(grace); err != nil {
			errs = append(errs, fmt.Errorf("node %d: %w", nd.ID, err))
		}
	}
	return errors.Join(errs...)
}

// FreePorts returns n distinct loopback ports that were free a moment ago:
// all are held open until every one is chosen.
func FreePorts(n int) ([]int, error) {
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	var ports []int
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
