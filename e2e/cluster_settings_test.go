package e2e

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// An operator raises --max-keys while the cluster runs (POST /cluster/limits
// on one node); a node restarted with the old flags exits 1 naming the
// cluster's, and started with the new ones it serves under them.
func TestClusterLimitsChangeOverTheAdminListener(t *testing.T) {
	c := startCluster(t, "--shards", "1", "--max-keys", "1")
	a := c.dial(0)
	a.acquire("o", "a", 60000, 0)
	a.send("A o b 60000 0")
	a.expect("B o b")

	if got, code := post(t, "http://"+c.nodes[1].adminAddr()+"/cluster/limits?max_keys=2"); code != http.StatusBadRequest {
		t.Fatalf("a change naming one limit: %d %q, want 400", code, got)
	}
	// No flag can give 0: every node restarted would stop.
	if got, code := post(t, "http://"+c.nodes[1].adminAddr()+"/cluster/limits?max_keys=0&max_waiters=1000000&max_waiters_per_key=100000"); code != http.StatusBadRequest {
		t.Fatalf("a change to a limit of 0: %d %q, want 400", code, got)
	}
	got, code := post(t, "http://"+c.nodes[1].adminAddr()+"/cluster/limits?max_keys=2&max_waiters=1000000&max_waiters_per_key=100000")
	if code != http.StatusOK || !strings.HasPrefix(got, "ok") {
		t.Fatalf("POST /cluster/limits: %d %q", code, got)
	}
	a.send("A o b 60000 0")
	a.expectAcquired("o", "b")
	a.send("A o c 60000 0")
	a.expect("B o c")
	c.agree()

	c.nodes[2].stop()
	c.start(2) // with --max-keys 1
	deadline := time.Now().Add(20 * time.Second)
	for !c.nodes[2].exited() {
		if time.Now().After(deadline) {
			t.Fatal("a node restarted with the limits from before the change is still running")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code, log := c.nodes[2].exitCode(), c.nodes[2].p.Log().String(); code != 1 || !strings.Contains(log, "the cluster runs with --shards 1 --max-keys 2") {
		t.Fatalf("exit %d; log:\n%s", code, log)
	}
	c.flags = append(c.flags, "--max-keys", "2")
	c.start(2)
	c.waitReady()
	r := c.dial(2)
	r.send("A x c 60000 0")
	r.expect("B x c")
	r.send("A x a 60000 0")
	r.expect("T x a")
	c.agree()
}

func post(t *testing.T, url string) (string, int) {
	t.Helper()
	resp, err := http.Post(url, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b), resp.StatusCode
}
