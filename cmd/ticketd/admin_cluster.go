package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/ticketd/ticketd/pprof"
	"github.com/ticketd/ticketd/replica"
)

// clusterObservers are the histograms of cluster mode's proposals.
func (a *admin) clusterObservers() (propose, batch replica.Observer) {
	if a == nil {
		return nil, nil
	}
	p := a.a.Histogram("ticketd_raft_propose_seconds",
		"Time from proposing a batch of commands to its commit and apply on this node.", nil)
	b := a.a.Histogram("ticketd_raft_batch_commands",
		"Commands per proposed batch.", []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096})
	return p, b
}

// cluster registers cluster mode's figures and makes its pages (clusterPages) serve n.
func (a *admin) cluster(n *replica.Node) {
	if a == nil {
		return
	}
	c := func(f func(replica.Counters) int64) func() float64 {
		return func() float64 { return float64(f(n.Counters())) }
	}
	a.a.CounterFunc("ticketd_raft_proposals_total", "Batches proposed.", c(func(s replica.Counters) int64 { return s.Proposals }))
	a.a.CounterFunc("ticketd_raft_proposal_retries_total", "Proposal attempts after a timeout or drop.", c(func(s replica.Counters) int64 { return s.Retries }))
	a.a.CounterFunc("ticketd_unavailable_total", "Connections closed with E unavailable.", c(func(s replica.Counters) int64 { return s.Unavailable }))
	a.a.CounterFunc("ticketd_batches_given_up_total", "Batches that could not commit within the unavailable timeout; their requests were answered E unavailable, their withdraws and orphans' releases queued again.", c(func(s replica.Counters) int64 { return s.GivenUp }))
	a.a.CounterFunc("ticketd_expiries_committed_total", "Expire and WaitTimeout commands this node proposed as a shard leader.", c(func(s replica.Counters) int64 { return s.TimerCommands }))
	a.a.CounterFunc("ticketd_raft_snapshots_received_total", "Snapshots this node caught up from (it had fallen behind the log a leader keeps).", c(func(s replica.Counters) int64 { return s.SnapshotsReceived }))
	a.a.CounterFunc("ticketd_orphaned_grants_released_total", "Grants proposed for release because their connection had gone.", c(func(s replica.Counters) int64 { return s.Orphans }))
	a.a.CounterFunc("ticketd_lost_node_withdrawals_total", "Withdraws of the queued acquires of a node out of reach (or replaced) that this node proposed as a shard's leader.", c(func(s replica.Counters) int64 { return s.LostNodeWithdrawals }))
	a.a.CounterFunc("ticketd_late_grants_renewed_total", "Grants this node applied too late to answer at once, renewed through the log before their answer.", c(func(s replica.Counters) int64 { return s.Renewals }))
	a.a.GaugeFunc("ticketd_raft_queued_commands", "Client requests this node holds on their way through the raft log (queued for a proposal, or proposed and not yet applied); at --max-queued, connections with many unanswered stop being read.", c(func(s replica.Counters) int64 { return s.Queued }))
	a.a.CounterFunc("ticketd_leader_changes_total", "Leadership changes seen, over all shards.", c(func(s replica.Counters) int64 { return s.LeaderChanges }))
	for i := range n.Status(false) {
		shard := strconv.Itoa(i)
		st := func(f func(replica.ShardStatus) uint64) func() float64 {
			return func() float64 { return float64(f(n.Status(false)[i])) }
		}
		a.a.GaugeFunc("ticketd_shard_leader", "Node id of the shard's leader as this node knows it (0: none).", st(func(s replica.ShardStatus) uint64 { return s.Leader }), "shard", shard)
		a.a.GaugeFunc("ticketd_shard_term", "Raft term of the shard.", st(func(s replica.ShardStatus) uint64 { return s.Term }), "shard", shard)
		a.a.GaugeFunc("ticketd_shard_applied_index", "Last log index of the shard applied on this node.", st(func(s replica.ShardStatus) uint64 { return s.Applied }), "shard", shard)
	}
	a.node.Store(n)
}

// clusterPages registers cluster mode's operator and status pages when the
// admin listener starts, before the node is up: until then they answer 503
// (starting), where a 404 would read as "no such page".
func (a *admin) clusterPages() {
	// Every replica's state digest at its applied index, for checks that
	// the replicas agree (it serialises each table: not for frequent use).
	// Replacing a node whose data dir was lost (README): POST on any live node.
	a.a.Handle("/cluster/replace", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := a.started(w)
		if n == nil {
			return
		}
		if r.Method != http.MethodPost {
			http.Error(w, "POST /cluster/replace?old=ID&new=ID&addr=HOST:PORT", http.StatusMethodNotAllowed)
			return
		}
		q := r.URL.Query()
		old, err1 := strconv.ParseUint(q.Get("old"), 10, 32)
		nw, err2 := strconv.ParseUint(q.Get("new"), 10, 32)
		if err1 != nil || err2 != nil || q.Get("addr") == "" {
			http.Error(w, "want old=ID&new=ID&addr=HOST:PORT (the new node's raft address)", http.StatusBadRequest)
			return
		}
		ctx, cancel := operatorContext(r)
		defer cancel()
		if err := n.Replace(ctx, uint32(old), uint32(nw), q.Get("addr")); err != nil {
			status := http.StatusServiceUnavailable // a shard without quorum, a node stopping: try again
			if errors.Is(err, replica.ErrRefused) {
				status = http.StatusConflict // as asked it cannot be: a script must not retry it
			}
			http.Error(w, err.Error(), status)
			return
		}
		a.log.Warn("node replaced in every shard", zap.Uint64("old", old), zap.Uint64("new", nw), zap.String("addr", q.Get("addr")))
		_, _ = w.Write([]byte("ok: start the new node with --join\n"))
	}))
	// Changing the limits while the cluster runs (README): POST on any live node.
	a.a.Handle("/cluster/limits", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// At least 1, as the flags must be: a limit no flag can give would
		// stop every node at its next start, leaving none to change it.
		const use = "POST /cluster/limits?max_keys=N&max_waiters=N&max_waiters_per_key=N (all three, each at least 1, as the flags)"
		n := a.started(w)
		if n == nil {
			return
		}
		if r.Method != http.MethodPost {
			http.Error(w, use, http.StatusMethodNotAllowed)
			return
		}
		var v [3]int
		for i, name := range []string{"max_keys", "max_waiters", "max_waiters_per_key"} {
			n, err := strconv.ParseUint(r.URL.Query().Get(name), 10, 63)
			if err != nil || n < 1 {
				http.Error(w, use, http.StatusBadRequest)
				return
			}
			v[i] = int(n)
		}
		ctx, cancel := operatorContext(r)
		defer cancel()
		if err := n.SetLimits(ctx, v[0], v[1], v[2]); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		a.log.Warn("the cluster's limits changed", zap.Int("max_keys", v[0]), zap.Int("max_waiters", v[1]), zap.Int("max_waiters_per_key", v[2]))
		_, _ = fmt.Fprintf(w, "ok: give every node --max-keys %d --max-waiters %d --max-waiters-per-key %d at its next start\n", v[0], v[1], v[2])
	}))
	a.a.Handle("/debug/cluster", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := a.started(w)
		if n == nil {
			return
		}
		st := n.Status(r.URL.Query().Get("digest") == "1")
		n.Members(st)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(st)
	}))
}

// started is the cluster node once it is up; before that it answers 503 on
// w and returns nil.
func (a *admin) started(w http.ResponseWriter) *replica.Node {
	n := a.node.Load()
	if n == nil {
		http.Error(w, "the cluster node is starting (its raft state is loading); try again in a moment", http.StatusServiceUnavailable)
	}
	return n
}

// operatorContext bounds an operator's call (a replace, a change of limits)
// within the admin server's write timeout, so that its outcome, an error
// naming where it stopped included, reaches the caller rather than being
// cut off while the call goes on.
func operatorContext(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), pprof.DefaultWriteTimeout-5*time.Second)
}
