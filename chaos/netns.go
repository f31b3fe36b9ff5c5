package chaos

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// netTopo puts each cluster node in its own network namespace, joined to
// every other node by its own veth pair and to the campaign (in the root
// namespace) by one more. Taking a pair's link down cuts exactly those two
// nodes apart, which is enough for every partition shape (majority/minority,
// bridge, isolated node) without a packet filter. Clients keep reaching every
// node, as clients of a real cluster would from outside the cut.
type netTopo struct {
	prefix string // namespace name prefix, unique per campaign
	n      int
	subnet int // 10.<subnet>.0.i are the nodes
	down   map[[2]int]bool
}

func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// newNetTopo builds the namespaces and links; on an error it removes what it
// made. It needs root (CAP_NET_ADMIN) and iproute2.
func newNetTopo(n int) (*netTopo, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, fmt.Errorf("no ip command (iproute2): %v", err)
	}
	pid := os.Getpid()
	t := &netTopo{prefix: fmt.Sprintf("tkc%d-", pid), n: n, subnet: 200 + pid%50, down: map[[2]int]bool{}}
	if err := t.build(); err != nil {
		t.remove()
		return nil, err
	}
	return t, nil
}

func (t *netTopo) ns(i int) string       { return fmt.Sprintf("%sn%d", t.prefix, i) }
func (t *netTopo) nodeIP(i int) string   { return fmt.Sprintf("10.%d.0.%d", t.subnet, i) }
func (t *netTopo) hostIP() string        { return fmt.Sprintf("10.%d.255.1", t.subnet) }
func (t *netTopo) hostLink(i int) string { return fmt.Sprintf("%sh%d", t.prefix, i) }

func (t *netTopo) build() error {
	for i := 1; i <= t.n; i++ {
		if err := ipCmd("netns", "add", t.ns(i)); err != nil {
			return err
		}
		if err := ipCmd("-n", t.ns(i), "link", "set", "lo", "up"); err != nil {
			return err
		}
		h := t.hostLink(i)
		steps := [][]string{
			{"link", "add", h, "type", "veth", "peer", "name", "c0", "netns", t.ns(i)},
			{"addr", "add", t.hostIP(), "peer", t.nodeIP(i) + "/32", "dev", h},
			{"link", "set", h, "up"},
			{"-n", t.ns(i), "addr", "add", t.nodeIP(i), "peer", t.hostIP() + "/32", "dev", "c0"},
			{"-n", t.ns(i), "link", "set", "c0", "up"},
		}
		for _, s := range steps {
			if err := ipCmd(s...); err != nil {
				return err
			}
		}
	}
	for i := 1; i <= t.n; i++ {
		for j := i + 1; j <= t.n; j++ {
			a, b := fmt.Sprintf("p%d", j), fmt.Sprintf("p%d", i) // in ns i: the link to j
			steps := [][]string{
				{"link", "add", a, "netns", t.ns(i), "type", "veth", "peer", "name", b, "netns", t.ns(j)},
				{"-n", t.ns(i), "addr", "add", t.nodeIP(i), "peer", t.nodeIP(j) + "/32", "dev", a},
				{"-n", t.ns(j), "addr", "add", t.nodeIP(j), "peer", t.nodeIP(i) + "/32", "dev", b},
				{"-n", t.ns(i), "link", "set", a, "up"},
				{"-n", t.ns(j), "link", "set", b, "up"},
			}
			for _, s := range steps {
				if err := ipCmd(s...); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// cut takes the links between every node of a and every node of b down.
func (t *netTopo) cut(a, b []int) error {
	for _, i := range a {
		for _, j := range b {
			if i == j {
				continue
			}
			lo, hi := min(i, j), max(i, j)
			if err := t.setLink(lo, hi, false); err != nil {
				return err
			}
		}
	}
	return nil
}

// heal brings every link back up.
func (t *netTopo) heal() error {
	var first error
	for p := range t.down {
		if err := t.setLink(p[0], p[1], true); err != nil && first == nil {
			first = err
		}
	}
	return first
}

func (t *netTopo) setLink(i, j int, up bool) error {
	state := "down"
	if up {
		state = "up"
	}
	// Both ends: a veth end whose peer is down has no carrier, but setting
	// both keeps the state plain to anyone who looks.
	err1 := ipCmd("-n", t.ns(i), "link", "set", fmt.Sprintf("p%d", j), state)
	err2 := ipCmd("-n", t.ns(j), "link", "set", fmt.Sprintf("p%d", i), state)
	if up {
		delete(t.down, [2]int{i, j})
	} else {
		t.down[[2]int{i, j}] = true
	}
	if err1 != nil {
		return err1
	}
	return err2
}

// remove deletes the namespaces (their links go with them) and the root
// side of each node's link, whatever state the campaign left.
func (t *netTopo) remove() {
	for i := 1; i <= t.n; i++ {
		_ = ipCmd("link", "del", t.hostLink(i))
		_ = ipCmd("netns", "del", t.ns(i))
	}
}

// command runs bin with args inside node i's namespace. ip netns exec execs
// the binary in place, so the pid is the server's own.
func (t *netTopo) command(i int, bin string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", t.ns(i), bin}, args...)...)
}
