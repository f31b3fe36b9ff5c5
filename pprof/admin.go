// Package pprof provides ticketd's admin listener: runtime profiles under
// /debug/pprof/, Prometheus metrics under /metrics, and the probes /healthz and
// /readyz.
//
// It imports nothing of ticketd. The server registers its figures at start as
// functions the scrape calls (CounterFunc, GaugeFunc), reading values it already
// keeps, and observes into histograms (Histogram), which are lock-free; so the
// request path pays no lock and no allocation for being measured. Everything is
// served from the Admin's own mux and registry: nothing of it goes through
// http.DefaultServeMux or prometheus.DefaultRegisterer.
package pprof

import (
	"context"
	"errors"
	"net"
	"net/http"
	httppprof "net/http/pprof"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// LatencyBuckets (seconds) span 10µs to about 1.3s in powers of two: a
// loopback request answered at once falls in the first buckets, a waiter that
// queued behind several leases in the last.
var LatencyBuckets = prometheus.ExponentialBuckets(10e-6, 2, 18)

// Admin is the admin listener. Register metrics before Serve; registration
// methods are not safe for use concurrently with each other, everything else is.
type Admin struct {
	reg *prometheus.Registry
	mux *http.ServeMux

	mu     sync.Mutex
	srv    *http.Server
	closed bool // Shutdown was called: a later Serve returns at once
	ready  func() bool
}

// New returns an Admin whose registry already holds the Go runtime and
// process collectors (goroutines, GC, resident memory, open descriptors).
func New() *Admin {
	a := &Admin{reg: prometheus.NewRegistry(), mux: http.NewServeMux()}
	a.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)

	a.mux.HandleFunc("/debug/pprof/", httppprof.Index) // named profiles too: heap, allocs, goroutine, ...
	a.mux.HandleFunc("/debug/pprof/cmdline", httppprof.Cmdline)
	a.mux.HandleFunc("/debug/pprof/profile", httppprof.Profile)
	a.mux.HandleFunc("/debug/pprof/symbol", httppprof.Symbol)
	a.mux.HandleFunc("/debug/pprof/trace", httppprof.Trace)
	a.mux.Handle("/metrics", promhttp.HandlerFor(a.reg, promhttp.HandlerOpts{
		ErrorHandling: promhttp.ContinueOnError, // one failing collector must not hide the rest
	}))
	a.mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		plain(w, http.StatusOK, "ok\n")
	})
	a.mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if a.isReady() {
			plain(w, http.StatusOK, "ready\n")
			return
		}
		plain(w, http.StatusServiceUnavailable, "not ready\n")
	})
	return a
}

func plain(w http.ResponseWriter, code int, body string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write([]byte(body))
}

// CounterFunc registers a counter whose value is fn(), called at each scrape,
// from the scrape's goroutine: fn must read what it returns safely (an atomic
// load) and must only ever grow. labels are constant name, value pairs, e.g.
// "kind", "A"; one name may be registered several times with different label
// values (requests by kind). It panics on an invalid or duplicate
// registration, which is a mistake in the program, not in its input.
func (a *Admin) CounterFunc(name, help string, fn func() float64, labels ...string) {
	a.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: name, Help: help, ConstLabels: constLabels(labels),
	}, fn))
}

// GaugeFunc registers a gauge whose value is fn(), called at each scrape;
// otherwise as CounterFunc.
func (a *Admin) GaugeFunc(name, help string, fn func() float64, labels ...string) {
	a.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: name, Help: help, ConstLabels: constLabels(labels),
	}, fn))
}

// Histogram registers and returns a histogram with the given upper bounds
// (nil: LatencyBuckets). Its Observe is safe from any goroutine and takes no
// lock and allocates nothing; still, observe once per batch of requests, not
// once per request. It panics as CounterFunc does.
func (a *Admin) Histogram(name, help string, buckets []float64, labels ...string) prometheus.Histogram {
	if buckets == nil {
		buckets = LatencyBuckets
	}
	h := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: name, Help: help, Buckets: buckets, ConstLabels: constLabels(labels),
	})
	a.reg.MustRegister(h)
	return h
}

// Register adds any other collector to the Admin's registry.
func (a *Admin) Register(c prometheus.Collector) error { return a.reg.Register(c) }

func constLabels(kv []string) prometheus.Labels {
	if len(kv) == 0 {
		return nil
	}
	if len(kv)%2 != 0 {
		panic("pprof: labels must be name, value pairs")
	}
	l := make(prometheus.Labels, len(kv)/2)
	for i := 0; i < len(kv); i += 2 {
		l[kv[i]] = kv[i+1]
	}
	return l
}

// Handle adds an endpoint of the server's own (such as a mode's status page)
// to the admin mux. Call it before Serve.
func (a *Admin) Handle(pattern string, h http.Handler) { a.mux.Handle(pattern, h) }

// Handler serves every endpoint; Serve uses it, tests and embedders may too.
func (a *Admin) Handler() http.Handler { return a.mux }

func (a *Admin) isReady() bool {
	a.mu.Lock()
	ready := a.ready
	a.mu.Unlock()
	return ready == nil || ready()
}

// SetReady sets the function /readyz asks (nil: always ready). Serve sets it
// too; SetReady is for a Handler served some other way.
func (a *Admin) SetReady(ready func() bool) {
	a.mu.Lock()
	a.ready = ready
	a.mu.Unlock()
}

// ErrServing is returned by a second Serve on the same Admin.
var ErrServing = errors.New("pprof: admin listener already serving")

// Serve answers on ln until Shutdown, and then returns nil; any other return
// is the listener's error. /readyz answers 200 only while ready returns true
// (nil: always); ready is called once per probe, from the probe's goroutine.
// Serve takes ownership of ln.
func (a *Admin) Serve(ln net.Listener, ready func() bool) error {
	srv := &http.Server{
		Handler:           a.mux,
		ReadHeaderTimeout: 10 * time.Second,
		// No WriteTimeout: /debug/pprof/profile?seconds=N writes after N seconds.
	}
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		ln.Close()
		return nil
	}
	if a.srv != nil {
		a.mu.Unlock()
		ln.Close()
		return ErrServing
	}
	a.srv, a.ready = srv, ready
	a.mu.Unlock()

	err := srv.Serve(ln)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Shutdown stops Serve: it closes the listener at once and waits for requests
// in progress until ctx ends (a CPU profile may be one of them), then cuts
// those still open. After Shutdown, Serve returns at once; a second Shutdown
// does nothing.
func (a *Admin) Shutdown(ctx context.Context) error {
	a.mu.Lock()
	srv := a.srv
	a.closed = true
	a.mu.Unlock()
	if srv == nil {
		return nil
	}
	err := srv.Shutdown(ctx)
	if err != nil {
		srv.Close()
	}
	return err
}
