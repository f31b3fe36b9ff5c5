// Package pprof provides ticketd's admin listener: runtime profiles under
// /debug/pprof/, Prometheus metrics under /metrics, and the probes /healthz and
// /readyz.
//
// The listener is bounded so that it cannot take what the lock port needs:
// at most Options.MaxConns connections at once (more wait in the kernel's
// accept backlog, holding no descriptor of the process), timeouts on every
// phase of a request and on idle keep-alive connections, and profiles and
// traces of at most Options.MaxProfile that Shutdown cuts short.
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
	"fmt"
	"log"
	"math"
	"net"
	"net/http"
	httppprof "net/http/pprof"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/netutil"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// LatencyBuckets (seconds) span 10µs to about 1.3s in powers of two: a
// loopback request answered at once falls in the first buckets, a waiter that
// queued behind several leases in the last.
var LatencyBuckets = prometheus.ExponentialBuckets(10e-6, 2, 18)

// Defaults for the zero fields of Options.
const (
	// DefaultMaxConns is far above what scrapes, probes and a profile
	// need, and small next to the descriptors a server keeps free of lock
	// clients for everything that is not a lock client.
	DefaultMaxConns          = 64
	DefaultReadHeaderTimeout = 5 * time.Second
	DefaultReadTimeout       = 10 * time.Second
	// DefaultWriteTimeout is counted from the end of the request's
	// headers; profile and trace handlers add their seconds to it.
	DefaultWriteTimeout = 30 * time.Second
	DefaultIdleTimeout  = 30 * time.Second
	DefaultMaxProfile   = 60 * time.Second
)

// Options bound the admin listener; a zero field takes its default.
type Options struct {
	// MaxConns is how many connections are open at once. Beyond it the
	// listener stops accepting: new connections wait in the kernel's
	// accept backlog, which costs the process no descriptor, and are
	// served as slots free up (idle ones close after IdleTimeout).
	MaxConns          int
	ReadHeaderTimeout time.Duration
	ReadTimeout       time.Duration
	WriteTimeout      time.Duration
	// IdleTimeout closes a keep-alive connection that sent no new request.
	IdleTimeout time.Duration
	// MaxProfile is the largest ?seconds= of a profile, trace or delta
	// profile; a larger one is answered 400.
	MaxProfile time.Duration
	// ErrorLog receives net/http's own error lines (nil: the standard
	// logger) and the metrics handler's (nil: none).
	ErrorLog *log.Logger
}

func (o Options) withDefaults() Options {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	if o.MaxConns <= 0 {
		o.MaxConns = DefaultMaxConns
	}
	def(&o.ReadHeaderTimeout, DefaultReadHeaderTimeout)
	def(&o.ReadTimeout, DefaultReadTimeout)
	def(&o.WriteTimeout, DefaultWriteTimeout)
	def(&o.IdleTimeout, DefaultIdleTimeout)
	def(&o.MaxProfile, DefaultMaxProfile)
	return o
}

// Admin is the admin listener. Register metrics before Serve; registration
// methods are not safe for use concurrently with each other, everything else is.
type Admin struct {
	reg  *prometheus.Registry
	mux  *http.ServeMux
	opts Options

	mu     sync.Mutex
	srv    *http.Server
	cancel context.CancelFunc // ends every request's context: Shutdown's first step
	closed bool               // Shutdown was called: a later Serve returns at once
	ready  func() bool
	why    func() string // why not ready (SetWhyNot)
}

// New returns an Admin with the default Options.
func New() *Admin { return NewWith(Options{}) }

// NewWith returns an Admin whose registry already holds the Go runtime and
// process collectors (goroutines, GC, resident memory, open descriptors).
func NewWith(o Options) *Admin {
	a := &Admin{reg: prometheus.NewRegistry(), mux: http.NewServeMux(), opts: o.withDefaults()}
	a.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)

	bounded := func(h http.HandlerFunc) http.Handler { return a.boundSeconds(h) }
	a.mux.Handle("/debug/pprof/", bounded(httppprof.Index)) // named profiles too: heap, allocs, goroutine, ...; ?seconds= gives a delta
	a.mux.HandleFunc("/debug/pprof/cmdline", httppprof.Cmdline)
	a.mux.Handle("/debug/pprof/profile", bounded(httppprof.Profile))
	a.mux.HandleFunc("/debug/pprof/symbol", httppprof.Symbol)
	a.mux.Handle("/debug/pprof/trace", bounded(httppprof.Trace))
	ho := promhttp.HandlerOpts{
		ErrorHandling: promhttp.ContinueOnError, // one failing collector must not hide the rest
	}
	if a.opts.ErrorLog != nil { // a nil *log.Logger would be a non-nil promhttp.Logger
		ho.ErrorLog = a.opts.ErrorLog
	}
	a.mux.Handle("/metrics", promhttp.HandlerFor(a.reg, ho))
	a.mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		plain(w, http.StatusOK, "ok\n")
	})
	a.mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if a.isReady() {
			plain(w, http.StatusOK, "ready\n")
			return
		}
		msg := "not ready\n"
		if why := a.whyNot(); why != "" {
			msg = "not ready: " + why + "\n"
		}
		plain(w, http.StatusServiceUnavailable, msg)
	})
	return a
}

// boundSeconds answers 400 to a ?seconds= that is not a number, is above
// MaxProfile, or is one the handler would put its own default in place of
// (0 or less; a fraction but for a trace: the others parse whole seconds),
// which ran a 30 s profile for a 0.5 asked; below the limit, the handler
// sleeps that long holding a connection (and, for a CPU profile, the
// process's only profiler).
func (a *Admin) boundSeconds(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v := r.FormValue("seconds") // what the pprof handlers read
		if v != "" {
			sec, err := strconv.ParseFloat(v, 64)
			limit := a.opts.MaxProfile.Seconds()
			whole := strings.HasSuffix(r.URL.Path, "/trace") || sec == math.Trunc(sec)
			if err != nil || math.IsNaN(sec) || sec <= 0 || sec > limit || !whole {
				plain(w, http.StatusBadRequest, fmt.Sprintf(
					"seconds=%.40q is not allowed: profiles and traces run for at most %gs on this server, at least 1s (a trace, any time above 0)\n", v, limit))
				return
			}
		}
		h.ServeHTTP(w, r)
	})
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

// SetWhyNot sets the function /readyz asks for the reason it gives with a
// 503 ("": none given).
func (a *Admin) SetWhyNot(why func() string) {
	a.mu.Lock()
	a.why = why
	a.mu.Unlock()
}

func (a *Admin) whyNot() string {
	a.mu.Lock()
	why := a.why
	a.mu.Unlock()
	if why == nil {
		return ""
	}
	return why()
}

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
	base, cancel := context.WithCancel(context.Background())
	srv := &http.Server{
		Handler:           a.mux,
		ReadHeaderTimeout: a.opts.ReadHeaderTimeout,
		ReadTimeout:       a.opts.ReadTimeout,
		WriteTimeout:      a.opts.WriteTimeout,
		IdleTimeout:       a.opts.IdleTimeout,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          a.opts.ErrorLog,
		BaseContext:       func(net.Listener) context.Context { return base },
	}
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		cancel()
		ln.Close()
		return nil
	}
	if a.srv != nil {
		a.mu.Unlock()
		cancel()
		ln.Close()
		return ErrServing
	}
	a.srv, a.cancel, a.ready = srv, cancel, ready
	a.mu.Unlock()

	err := srv.Serve(netutil.LimitListener(ln, a.opts.MaxConns))
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Shutdown stops Serve: it closes the listener at once, ends the context of
// every request in progress (a running profile or trace stops and writes
// what it has), and waits for their answers until ctx ends, then cuts
// those still open. After Shutdown, Serve returns at once; a second Shutdown
// does nothing.
func (a *Admin) Shutdown(ctx context.Context) error {
	a.mu.Lock()
	srv, cancel := a.srv, a.cancel
	a.closed = true
	a.mu.Unlock()
	if srv == nil {
		return nil
	}
	cancel()
	err := srv.Shutdown(ctx)
	if err != nil {
		srv.Close()
	}
	return err
}
