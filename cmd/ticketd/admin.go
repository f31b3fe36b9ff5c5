package main

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/ticketd/ticketd/netloop"
	"github.com/ticketd/ticketd/pprof"
	"github.com/ticketd/ticketd/shard"
	"github.com/ticketd/ticketd/single"
)

// admin is the optional admin listener; a nil *admin is off and every
// method is a no-op.
type admin struct {
	a     *pprof.Admin
	ln    net.Listener
	lat   netloop.Observer
	sweep netloop.Observer
	log   *zap.Logger

	mu      sync.Mutex
	readyOK bool
}

func startAdmin(cfg *config, log *zap.Logger) (*admin, error) {
	if cfg.admin == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", cfg.admin)
	if err != nil {
		return nil, fmt.Errorf("cannot listen on --admin %s: %w", cfg.admin, err)
	}
	a := &admin{a: pprof.New(), ln: ln, log: log}
	a.lat = a.a.Histogram("ticketd_batch_latency_seconds",
		"Time from reading a batch of frames to writing its answers.", nil)
	a.sweep = a.a.Histogram("ticketd_sweep_duration_seconds",
		"Time one sweep of every shard took.", nil)
	go func() {
		if err := a.a.Serve(ln, a.isReady); err != nil {
			log.Warn("admin listener stopped", zap.Error(err))
		}
	}()
	log.Info("admin listening", zap.String("addr", ln.Addr().String()))
	return a, nil
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
	defer a.mu.Unlock()
	return a.readyOK
}

// ready registers the gauges and counters, read at scrape time from what the
// server keeps anyway, and marks the server ready.
func (a *admin) ready(srv *netloop.Server, r *single.Runner) {
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
	c("ticketd_requests_total", "Frames read.", net(func(s netloop.Stats) int64 { return s.Acquires }), "kind", "acquire")
	c("ticketd_requests_total", "Frames read.", net(func(s netloop.Stats) int64 { return s.Releases }), "kind", "release")
	c("ticketd_answers_total", "Answers by kind.", net(func(s netloop.Stats) int64 { return s.BadFrames }), "kind", "E")
	c("ticketd_answers_total", "Answers by kind.", tab(func(s shard.Stats) uint64 { return s.Grants }), "kind", "A")
	c("ticketd_answers_total", "Answers by kind.", tab(func(s shard.Stats) uint64 { return s.TimedOut }), "kind", "T")
	c("ticketd_answers_total", "Answers by kind.", tab(func(s shard.Stats) uint64 { return s.Busy }), "kind", "B")
	c("ticketd_answers_total", "Answers by kind.", tab(func(s shard.Stats) uint64 { return s.Released }), "kind", "R")
	c("ticketd_answers_total", "Answers by kind.", tab(func(s shard.Stats) uint64 { return s.NotReleased }), "kind", "N")
	c("ticketd_late_answers_total", "Answers written through a connection's mailbox (decided off its loop).", net(func(s netloop.Stats) int64 { return s.LateAnswers }))
	c("ticketd_orphaned_grants_total", "Grants released because their connection had closed.", net(func(s netloop.Stats) int64 { return s.Orphans }))
	g("ticketd_keys", "Registered keys.", tab(func(s shard.Stats) uint64 { return uint64(s.Keys) }))
	g("ticketd_waiters", "Queued acquires.", tab(func(s shard.Stats) uint64 { return uint64(s.Waiters) }))
	c("ticketd_grants_total", "Keys granted.", tab(func(s shard.Stats) uint64 { return s.Grants }))
	c("ticketd_handovers_total", "Grants to a queued acquire, on release or lease end.", tab(func(s shard.Stats) uint64 { return s.HandOvers }))
	c("ticketd_expiries_total", "Leases that ended without a release.", tab(func(s shard.Stats) uint64 { return s.Expiries }))
	c("ticketd_swept_total", "Expired keys deleted by the sweep.", tab(func(s shard.Stats) uint64 { return s.Swept }))
	a.mu.Lock()
	a.readyOK = true
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
