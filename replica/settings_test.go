package replica

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A node started with other settings than the cluster's stops, whether they
// are limits (its replicas would answer B where the others grant) or the
// shard count (it would send a key to another shard than the others do,
// where a second holder could be granted). Its data dir takes the
// cluster's settings, and started again with them it joins as any node.
func TestClusterNodeWithOtherSettingsStops(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(*Options)
		flag string
	}{
		{"limits", func(o *Options) { o.MaxKeys = 1 }, "--max-keys 1"},
		{"shards", func(o *Options) { o.Shards = 1 }, "--shards 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newStoppedCluster(t, 2, func(o *Options) { o.MaxKeys = 100 })
			c.start(0)
			c.start(1)
			c.waitReady()
			a := c.dial(0)
			a.send("A h k 60000 0")
			a.expect("A 1 h k")

			cluster := c.opt
			tc.set(&c.opt)
			c.start(2)
			n := c.nodes[2]
			select {
			case <-n.Failed():
			case <-time.After(20 * time.Second):
				t.Fatal("a node with other settings than the cluster's did not stop")
			}
			err := n.Err()
			if err == nil || !strings.Contains(err.Error(), tc.flag) || !strings.Contains(err.Error(), "--shards 2 --max-keys 100") {
				t.Fatalf("Err() = %v: does not name both settings", err)
			}
			// Until the process exits, what it is sent is not carried out.
			x := c.dial(2)
			x.send("A y j 60000 0")
			x.expect("E unavailable a shard of this request has no quorum; outcome unknown, try another node")
			a.send("A z j 60000 0")
			a.expect("A 1 z j")
			c.stop(2)
			b, rerr := os.ReadFile(filepath.Join(c.dirs[2], identityFile))
			var id identity
			if rerr != nil || json.Unmarshal(b, &id) != nil {
				t.Fatalf("reading %s: %v", identityFile, rerr)
			}
			if id.Shards != 2 || id.Limits == nil || id.Limits.MaxKeys != 100 {
				t.Fatalf("the data dir did not take the cluster's settings: %s", b)
			}

			c.opt = cluster
			c.start(2)
			c.waitReady()
			r := c.dial(2)
			r.send("A x k 60000 0")
			r.expect("T x k")
			a.send("R 1 k")
			a.expect("R 1 k")
			r.send("A x k 60000 0")
			r.expect("A 2 x k")
			if err := c.nodes[2].Err(); err != nil {
				t.Fatalf("restarted with the cluster's settings, it failed: %v", err)
			}
			c.checkReplicasAgree()
		})
	}
}
