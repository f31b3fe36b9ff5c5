package replica

import (
	"bytes"
	"math/rand"
	"testing"

	sm "github.com/lni/dragonboat/v4/statemachine"

	"github.com/ticketd/ticketd/shard"
)

// Replicas of a shard apply the same log on different nodes: each with its
// own node id, clock, local limits, split of the log into Updates, and
// moments at which it is replaced by a replica restored from its snapshot.
// Whatever of that is local may change their answers, never their state:
// at every index two of them share, their digests are equal.
func TestFSMReplicasAgreeOnARandomLog(t *testing.T) {
	for seed := int64(1); seed <= 200; seed++ {
		log := randomLog(t, rand.New(rand.NewSource(seed)))
		rng := rand.New(rand.NewSource(-seed))
		var at []map[uint64][32]byte
		for node, cfg := range []shard.Config{{}, {MaxKeys: 1}, {MaxWaiters: 1}} {
			at = append(at, replay(t, rng, uint32(node+1), cfg, log))
		}
		for idx, want := range at[0] {
			for r, sums := range at[1:] {
				if got, ok := sums[idx]; ok && got != want {
					t.Fatalf("seed %d: at index %d, replica %d differs from replica 1", seed, idx, r+2)
				}
			}
		}
	}
}

// replay applies log to a replica of node with local limits cfg, in
// Updates of random sizes, now and then moving to a replica restored from
// its snapshot, and returns its digest after each Update by index.
func replay(t *testing.T, rng *rand.Rand, node uint32, cfg shard.Config, log [][]byte) map[uint64][32]byte {
	t.Helper()
	mk := func(cfg shard.Config) *fsm {
		f := newFSM(0, node, cfg, &recorder{})
		var local int64
		f.skew, f.inc = 500e6, 1
		f.clock = func() int64 { local += 7e6; return local }
		return f
	}
	f := mk(cfg)
	sums := make(map[uint64][32]byte)
	for i := 0; i < len(log); {
		n := min(1+rng.Intn(4), len(log)-i)
		ents := make([]sm.Entry, n)
		for j := range ents {
			ents[j] = sm.Entry{Index: uint64(i + j + 1), Cmd: bytes.Clone(log[i+j])}
		}
		if _, err := f.Update(ents); err != nil {
			t.Fatal(err)
		}
		i += n
		if rng.Intn(5) == 0 {
			g := mk(shard.Config{MaxKeys: rng.Intn(3)})
			restore(t, g, snapshot(t, f))
			g.recovered(f.applied)
			f = g
		}
		_, sum, err := f.digest()
		if err != nil {
			t.Fatal(err)
		}
		sums[uint64(i)] = sum
	}
	return sums
}

// randomLog is a shard's log as three nodes could have committed it:
// settings notices, restarts, changes of limits (some stamped behind the
// replicated clock), the leader's timers (some with a deadline no longer
// in force), batches of an earlier run, retried batches committing again,
// and batches of acquires, releases, renewals and withdrawals on three
// keys.
func randomLog(t *testing.T, rng *rand.Rand) [][]byte {
	t.Helper()
	keys := []string{"a", "b", "c"}
	ref := newFSM(0, 9, shard.Config{}, nil) // what is due, and the tokens
	var log, sent [][]byte
	add := func(b []byte) {
		log = append(log, b)
		if _, err := ref.Update([]sm.Entry{{Index: uint64(len(log)), Cmd: b}}); err != nil {
			t.Fatal(err)
		}
	}
	set := func(maxKeys, maxWaiters int) settings {
		return settings{shards: 1, limits: limits{MaxKeys: maxKeys, MaxWaiters: maxWaiters, MaxWaitersPerKey: 2}, skew: 500e6}
	}
	stamp := int64(1e9)
	inc := map[uint32]uint64{1: 1, 2: 1, 3: 1}
	next := map[uint32]uint64{}
	first := set(2+rng.Intn(2), 0)
	for node := uint32(1); node <= 3; node++ {
		add(appendSettings(appendHeader(nil, header{node: node, inc: 1, floor: noticeSettings, stamp: stamp}), first))
	}
	for range 120 {
		stamp += int64(rng.Intn(400)) * 1e6
		node := uint32(1 + rng.Intn(3))
		switch r := rng.Intn(20); {
		case r < 2 && len(sent) > 0:
			add(sent[rng.Intn(len(sent))])
			continue
		case r == 2:
			inc[node]++
			next[node] = 0
			add(appendSettings(appendHeader(nil, header{node: node, inc: inc[node], floor: noticeSettings, stamp: stamp}), first))
			continue
		case r == 3:
			h := header{node: node, inc: inc[node], floor: noticeLimits, stamp: stamp - int64(rng.Intn(3))*1e9}
			add(appendSettings(appendHeader(nil, h), set(1+rng.Intn(3), rng.Intn(3))))
			continue
		case r == 4:
			due := ref.t.Due(ref.now+int64(rng.Intn(3000))*1e6, nil)
			if len(due) == 0 {
				continue
			}
			var body []byte
			for i := range due {
				if rng.Intn(4) == 0 {
					due[i].Deadline = 0
				}
				body = appendCommand(body, &due[i])
			}
			add(append(appendHeader(nil, header{node: node, inc: inc[node], stamp: stamp, count: uint64(len(due))}), body...))
			continue
		case r == 5:
			if inc[node] > 1 {
				c := acquire(requesterConn(inc[node]-1, 1), 1, "old", keys[rng.Intn(3)], 1000, 1000)
				add(batch{h: header{node: node, inc: inc[node] - 1, batch: 99, stamp: stamp}, cmds: []shard.Command{c}}.bytes())
			}
			continue
		}
		next[node]++
		var cmds []shard.Command
		for n := 1 + rng.Intn(3); n > 0; n-- {
			conn := requesterConn(inc[node], uint64(1+rng.Intn(3)))
			key := []byte(keys[rng.Intn(len(keys))])
			token := uint64(rng.Intn(int(ref.t.LastToken()) + 2))
			switch rng.Intn(6) {
			case 0, 1:
				cmds = append(cmds, acquire(conn, uint64(rng.Intn(1000)), "o", string(key), uint64(100+rng.Intn(2000)), uint64(rng.Intn(3)*500)))
			case 2:
				cmds = append(cmds, shard.Command{Op: shard.OpRelease, From: shard.Requester{Conn: conn, Seq: 1}, Key: key, Token: token})
			case 3:
				cmds = append(cmds, shard.Command{Op: shard.OpWithdraw, From: shard.Requester{Conn: conn}})
			case 4:
				cmds = append(cmds, shard.Command{Op: shard.OpRenew, From: shard.Requester{Conn: conn, Seq: 2}, Owner: []byte("o"), Key: key, Token: token, LeaseMs: 500, WaitMs: 100})
			case 5:
				other := uint32(1 + rng.Intn(3))
				cmds = append(cmds, shard.Command{Op: shard.OpWithdrawBelow, From: shard.Requester{Node: other, Conn: requesterConn(inc[other], uint64(rng.Intn(4)))}})
			}
		}
		floor := next[node]
		if floor > 1 && rng.Intn(2) == 0 {
			floor -= uint64(rng.Intn(int(floor)))
		}
		b := batch{h: header{node: node, inc: inc[node], batch: next[node], floor: floor, stamp: stamp}, cmds: cmds}.bytes()
		sent = append(sent, b)
		add(b)
	}
	return log
}
