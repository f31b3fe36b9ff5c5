package main

import (
	"context"
	"fmt"
	stdlog "log"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/ticketd/ticketd/netloop"
	"github.com/ticketd/ticketd/pprof"
	"github.com/ticketd/ticketd/replica"
	"github.com/ticketd/ticketd/shard"
)

// admin is the optional admin listener; a nil *admin is off and every
// method is a no-op.
type admin struct {
	a     *pprof.Admin
	ln    net.Listener
	lat   netloop.Observer
	sweep netloop.Observer
	log   *zap.Logger

	node atomic.Pointer[replica.Node] // cluster mode, once started

	mu       sync.Mutex
	readyOK  bool
	stopping bool          // readyOK false: shutting down, not starting
	readyFn  func() bool   // the mode's own readiness (cluster: a leader known for every shard)
	whyFn    func() string // why the mode is not ready
}

// The admin listener's connections (and its listener) come out of
// descriptorReserve: keep most of the reserve for the data dir, the event
// loops' pollers and the lock listener. This fails to compile otherwise.
const _ = uint(descriptorReserve/2 - pprof.DefaultMaxConns - 1)

func startAdmin(cfg *config, log *zap.Logger) (*admin, error) {
	if cfg.admin == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", cfg.admin)
	if err != nil {
		return nil, fmt.Errorf("cannot listen on --admin %s: %w", cfg.admin, err)
	}
	warnIfExposed(log, ln.Addr())
	a := &admin{a: pprof.NewWith(pprof.Options{ErrorLog: httpErrorLog(log)}), ln: ln, log: log}
	a.lat = a.a.Histogram("ticketd_batch_latency_seconds",
		"Time from reading a batch of frames to writing its answers.", nil)
	if !cfg.cluster.enabled() { // a cluster has no sweep: its figures would stay 0
		a.sweep = a.a.Histogram("ticketd_sweep_duration_seconds",
			"Time one sweep of every shard took.", nil)
	}
	dir := cfg.dataDir
	a.a.GaugeFunc("ticketd_data_dir_free_bytes",
		"Free space on the data dir's filesystem, for an unprivileged writer. A full disk ends a cluster node at its next raft log write, and stops single mode's grants.",
		func() float64 {
			free, total, err := freeSpace(dir)
			if err != nil || total == 0 { // no figure, not "none free"
				return math.NaN()
			}
			return float64(free)
		})
	if cfg.cluster.enabled() {
		a.clusterPages()
	}
	go func() {
		a.a.SetWhyNot(a.whyNot)
		if err := a.a.Serve(ln, a.isReady); err != nil {
			log.Warn("admin listener stopped", zap.Error(err))
		}
	}()
	log.Info("admin listening", zap.String("addr", ln.Addr().String()))
	return a, nil
}

// warnIfExposed warns when the admin listener is reachable from other
// hosts: it serves profiles, the command line and the mode's status pages
// to anyone, without authentication.
func warnIfExposed(log *zap.Logger, addr net.Addr) {
	tcp, ok := addr.(*net.TCPAddr)
	if !ok || tcp.IP.IsLoopback() {
		return
	}
	where := "an address other hosts may reach"
	if tcp.IP.IsUnspecified() {
		where = "every interface"
	}
	log.Warn("the admin listener is on "+where+"; it serves profiles and the command line without authentication: bind --admin to 127.0.0.1 or firewall it",
		zap.String("addr", addr.String()))
}

// httpErrorLog is net/http's error log for the admin listener (accept
// errors, a handler's panic, malformed requests), through the logger so
// that --log-format json holds for these lines too.
func httpErrorLog(log *zap.Logger) *stdlog.Logger {
	l := log.Named("admin")
	if std, err := zap.NewStdLogAt(l, zapcore.WarnLevel); err == nil {
		return std
	}
	return zap.NewStdLog(l)
}

func (a *admin) latency() netloop.Observer {
	if a == nil {
		return nil
	}
	return a.lat
}

func (a *admin) sweeps() netloop.Observer {
	if a == nil {
		return nil
	}
	return a.sweep
}

func (a *admin) isReady() bool {
	a.mu.Lock()
	ok, fn := a.readyOK, a.readyFn
	a.mu.Unlock()
	return ok && (fn == nil || fn())
}

// whyNot is what /readyz says with its 503.
func (a *admin) whyNot() string {
	a.mu.Lock()
	ok, stopping, why := a.readyOK, a.stopping, a.whyFn
	a.mu.Unlock()
	switch {
	case stopping:
		return "shutting down"
	case !ok:
		return "starting"
	case why != nil:
		return why()
	}
	return ""
}

// tableSource is what the admin side reads of a mode.
type tableSource interface{ Stats() shard.Stats }

// ready registers the gauges and counters, read at scrape time from what the
// server keeps anyway, and marks the server ready.
func (a *admin) ready(srv *netloop.Server, r tableSource) {
	if a == nil {
		return
	}
	var (
		mu   sync.Mutex
		at   time.Time
		last shard.Stats
	)
	// One scrape reads many table figures; take them under the shard locks
	// once per scrape, not once per figure.
	table := func() shard.Stats {
		mu.Lock()
		defer mu.Unlock()
		if time.Since(at) > 100*time.Millisecond {
			last, at = r.Stats(), time.Now()
		}
		return last
	}
	net := func(f func(netloop.Stats) int64) func() float64 {
		return func() float64 { return float64(f(srv.Stats())) }
	}
	tab := func(f func(shard.Stats) uint64) func() float64 {
		return func() float64 { return float64(f(table())) }
	}
	g, c := a.a.GaugeFunc, a.a.CounterFunc
	g("ticketd_connections", "Open client connections.", net(func(s netloop.Stats) int64 { return s.Conns }))
	c("ticketd_connections_accepted_total", "Connections accepted.", net(func(s netloop.Stats) int64 { return s.Accepted }))
	c("ticketd_connections_refused_total", "Connections closed at once: --max-conns reached or out of descriptors.", net(func(s netloop.Stats) int64 { return s.Refused }))
	c("ticketd_connections_paused_total", "Times a connection stopped being read (backpressure).", net(func(s netloop.Stats) int64 { return s.Paused }))
	c("ticketd_connections_closed_total", "Connections the server closed: idle, unfinished frame, late answers left unread, or requests sent past the backpressure.", net(func(s netloop.Stats) int64 { return s.IdleClosed }), "why", "idle")
	c("ticketd_connections_closed_total", "Connections the server closed: idle, unfinished frame, late answers left unread, or requests sent past the backpressure.", net(func(s netloop.Stats) int64 { return s.FrameClosed }), "why", "frame")
	c("ticketd_connections_closed_total", "Connections the server closed: idle, unfinished frame, late answers left unread, or requests sent past the backpressure.", net(func(s netloop.Stats) int64 { return s.UnreadClosed }), "why", "unread")
	c("ticketd_connections_closed_total", "Connections the server closed: idle, unfinished frame, late answers left unread, or requests sent past the backpressure.", net(func(s netloop.Stats) int64 { return s.FloodClosed }), "why", "flood")
	c("ticketd_requests_total", "Requests read that were well formed, by kind (a frame answered E counts in ticketd_answers_total only).", net(func(s netloop.Stats) int64 { return s.Acquires }), "kind", "acquire")
	c("ticketd_requests_total", "Requests read that were well formed, by kind (a frame answered E counts in ticketd_answers_total only).", net(func(s netloop.Stats) int64 { return s.Releases }), "kind", "release")
	c("ticketd_answers_total", "Answers by kind. Cluster mode: A, T, B, R and N count what the shards applied, alike on every node (the cluster's answers, not this node's); E counts bad frames (not E unavailable).", net(func(s netloop.Stats) int64 { return s.BadFrames }), "kind", "E")
	c("ticketd_answers_total", "Answers by kind. Cluster mode: A, T, B, R and N count what the shards applied, alike on every node (the cluster's answers, not this node's); E counts bad frames (not E unavailable).", tab(func(s shard.Stats) uint64 { return s.Grants }), "kind", "A")
	c("ticketd_answers_total", "Answers by kind. Cluster mode: A, T, B, R and N count what the shards applied, alike on every node (the cluster's answers, not this node's); E counts bad frames (not E unavailable).", tab(func(s shard.Stats) uint64 { return s.TimedOut }), "kind", "T")
	c("ticketd_answers_total", "Answers by kind. Cluster mode: A, T, B, R and N count what the shards applied, alike on every node (the cluster's answers, not this node's); E counts bad frames (not E unavailable).", tab(func(s shard.Stats) uint64 { return s.Busy }), "kind", "B")
	c("ticketd_answers_total", "Answers by kind. Cluster mode: A, T, B, R and N count what the shards applied, alike on every node (the cluster's answers, not this node's); E counts bad frames (not E unavailable).", tab(func(s shard.Stats) uint64 { return s.Released }), "kind", "R")
	c("ticketd_answers_total", "Answers by kind. Cluster mode: A, T, B, R and N count what the shards applied, alike on every node (the cluster's answers, not this node's); E counts bad frames (not E unavailable).", tab(func(s shard.Stats) uint64 { return s.NotReleased }), "kind", "N")
	c("ticketd_late_answers_total", "Answers written through a connection's mailbox (decided off its loop).", net(func(s netloop.Stats) int64 { return s.LateAnswers }))
	c("ticketd_orphaned_grants_total", "Grants released because their connection had closed.", net(func(s netloop.Stats) int64 { return s.Orphans }))
	g("ticketd_keys", "Registered keys.", tab(func(s shard.Stats) uint64 { return uint64(s.Keys) }))
	g("ticketd_waiters", "Queued acquires.", tab(func(s shard.Stats) uint64 { return uint64(s.Waiters) }))
	c("ticketd_grants_total", "Keys granted.", tab(func(s shard.Stats) uint64 { return s.Grants }))
	c("ticketd_handovers_total", "Grants to a queued acquire, on release or lease end.", tab(func(s shard.Stats) uint64 { return s.HandOvers }))
	c("ticketd_expiries_total", "Leases that ended without a release.", tab(func(s shard.Stats) uint64 { return s.Expiries }))
	if a.sweep != nil {
		c("ticketd_swept_total", "Expired keys deleted by the sweep.", tab(func(s shard.Stats) uint64 { return s.Swept }))
	}
	if sr, ok := r.(interface{ SyncReserves() int64 }); ok {
		c("ticketd_ceiling_sync_writes_total",
			"Durable token or lease ceilings written on the request path, because the background raise had fallen behind; answers waited for each write's fsync.",
			func() float64 { return float64(sr.SyncReserves()) })
	}
	if lr, ok := r.(interface{ LateRenewals() int64 }); ok {
		c("ticketd_late_grants_renewed_total",
			"Rounds in which hand-overs' leases were counted anew because their answer left late (a synced write, a wait for the shard lock, the loop's other connections).",
			func() float64 { return float64(lr.LateRenewals()) })
	}
	if ll, ok := r.(interface{ LostLateGrants() int64 }); ok {
		c("ticketd_late_grants_lost_total",
			"Hand-overs whose lease passed, and whose key was swept or taken over, before their answer could leave (a synced write longer than the lease): not answered, their connections closed instead.",
			func() float64 { return float64(ll.LostLateGrants()) })
	}
	if gl, ok := r.(interface{ GraceLeft() time.Duration }); ok {
		g("ticketd_crash_grace_seconds",
			"Time left of the grace after a crash restart, in which every acquire of a key not restored answers T (0: none). /readyz stays 200 meanwhile: releases and those T answers are the server's service.",
			func() float64 { return gl.GraceLeft().Seconds() })
	}
	if rd, ok := r.(interface{ Ready() bool }); ok {
		a.mu.Lock()
		a.readyFn = rd.Ready
		a.mu.Unlock()
	}
	if rd, ok := r.(interface{ NotReady() string }); ok {
		a.mu.Lock()
		a.whyFn = rd.NotReady
		a.mu.Unlock()
	}
	a.mu.Lock()
	a.readyOK = true
	a.mu.Unlock()
}

// unready marks the server not ready, as it starts to stop: load balancers
// that poll /readyz move clients away before the lock port closes.
func (a *admin) unready() {
	if a == nil {
		return
	}
	a.mu.Lock()
	a.readyOK, a.stopping = false, true
	a.mu.Unlock()
}

func (a *admin) stop(ctx context.Context) {
	if a == nil {
		return
	}
	if err := a.a.Shutdown(ctx); err != nil {
		a.log.Warn("stopping the admin listener", zap.Error(err))
	}
}
