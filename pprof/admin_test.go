package pprof

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func get(t *testing.T, url string) (int, string, http.Header) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: reading body: %v", url, err)
	}
	return resp.StatusCode, string(body), resp.Header
}

func TestHealthz(t *testing.T) {
	srv := httptest.NewServer(New().Handler())
	defer srv.Close()
	code, body, _ := get(t, srv.URL+"/healthz")
	if code != http.StatusOK || body != "ok\n" {
		t.Fatalf("/healthz = %d %q, want 200 \"ok\\n\"", code, body)
	}
}

func TestReadyzFollowsReadyFunc(t *testing.T) {
	a := New()
	var ready atomic.Bool
	a.SetReady(ready.Load)
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()

	if code, body, _ := get(t, srv.URL+"/readyz"); code != http.StatusServiceUnavailable || body != "not ready\n" {
		t.Fatalf("before ready: /readyz = %d %q, want 503", code, body)
	}
	ready.Store(true)
	if code, body, _ := get(t, srv.URL+"/readyz"); code != http.StatusOK || body != "ready\n" {
		t.Fatalf("after ready: /readyz = %d %q, want 200", code, body)
	}
	ready.Store(false) // e.g. draining for shutdown
	if code, _, _ := get(t, srv.URL+"/readyz"); code != http.StatusServiceUnavailable {
		t.Fatalf("after unready: /readyz = %d, want 503", code)
	}
	a.SetWhyNot(func() string { return "shutting down" })
	if code, body, _ := get(t, srv.URL+"/readyz"); code != http.StatusServiceUnavailable || body != "not ready: shutting down\n" {
		t.Fatalf("with a reason: /readyz = %d %q, want 503 saying it", code, body)
	}
}

func TestReadyzNilIsReady(t *testing.T) {
	srv := httptest.NewServer(New().Handler())
	defer srv.Close()
	if code, _, _ := get(t, srv.URL+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz with no ready func = %d, want 200", code)
	}
}

func TestMetrics(t *testing.T) {
	a := New()
	var conns, reqA, reqR atomic.Int64
	a.GaugeFunc("ticketd_connections", "Open client connections.", func() float64 { return float64(conns.Load()) })
	a.CounterFunc("ticketd_requests_total", "Requests by kind.", func() float64 { return float64(reqA.Load()) }, "kind", "A")
	a.CounterFunc("ticketd_requests_total", "Requests by kind.", func() float64 { return float64(reqR.Load()) }, "kind", "R")
	lat := a.Histogram("ticketd_request_seconds", "Time to answer one read batch.", nil)

	conns.Store(3)
	reqA.Store(42)
	reqR.Store(7)
	lat.Observe(25e-6)
	lat.Observe(0.5)

	srv := httptest.NewServer(a.Handler())
	defer srv.Close()
	code, body, hdr := get(t, srv.URL+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics = %d", code)
	}
	if ct := hdr.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("Content-Type %q, want the text exposition format", ct)
	}
	for _, want := range []string{
		"# TYPE ticketd_connections gauge",
		"ticketd_connections 3\n",
		"# TYPE ticketd_requests_total counter",
		`ticketd_requests_total{kind="A"} 42` + "\n",
		`ticketd_requests_total{kind="R"} 7` + "\n",
		"# TYPE ticketd_request_seconds histogram",
		`ticketd_request_seconds_bucket{le="4e-05"} 1` + "\n",
		`ticketd_request_seconds_bucket{le="+Inf"} 2` + "\n",
		"ticketd_request_seconds_count 2\n",
		"go_goroutines ",
		"process_resident_memory_bytes ",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", body)
	}

	// Values are read at scrape time, not at registration.
	conns.Store(9)
	if _, body, _ := get(t, srv.URL+"/metrics"); !strings.Contains(body, "ticketd_connections 9\n") {
		t.Errorf("second scrape does not show the new gauge value")
	}
}

func TestRegistrationMistakesPanic(t *testing.T) {
	a := New()
	a.GaugeFunc("x_keys", "Keys.", func() float64 { return 0 })
	for name, f := range map[string]func(){
		"duplicate":  func() { a.GaugeFunc("x_keys", "Keys.", func() float64 { return 0 }) },
		"odd labels": func() { a.CounterFunc("x_total", "X.", func() float64 { return 0 }, "kind") },
		"empty name": func() { a.CounterFunc("", "X.", func() float64 { return 0 }) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			f()
		}()
	}
}

// The metrics must stay off the process-wide default registry, which another
// library in the binary may also fill.
func TestOwnRegistryAndMux(t *testing.T) {
	a := New()
	a.GaugeFunc("only_here", "Private gauge.", func() float64 { return 1 })
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatalf("gathering the default registry: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "only_here" {
			t.Errorf("the default registry holds only_here")
		}
	}
	own := httptest.NewServer(a.Handler())
	defer own.Close()
	if _, body, _ := get(t, own.URL+"/metrics"); !strings.Contains(body, "only_here 1\n") {
		t.Errorf("the Admin's own /metrics lacks only_here")
	}
	def := httptest.NewServer(http.DefaultServeMux)
	defer def.Close()
	if code, _, _ := get(t, def.URL+"/metrics"); code != http.StatusNotFound {
		t.Errorf("DefaultServeMux serves /metrics (%d)", code)
	}
	if code, _, _ := get(t, def.URL+"/healthz"); code != http.StatusNotFound {
		t.Errorf("DefaultServeMux serves /healthz (%d)", code)
	}
}

func TestPprofEndpoints(t *testing.T) {
	srv := httptest.NewServer(New().Handler())
	defer srv.Close()
	cases := []struct {
		path string
		want string // in the body; "" for binary profiles
	}{
		{"/debug/pprof/", "goroutine"},
		{"/debug/pprof/cmdline", ""},
		{"/debug/pprof/symbol", "num_symbols"},
		{"/debug/pprof/goroutine?debug=1", "goroutine profile"},
		{"/debug/pprof/allocs", ""},
		{"/debug/pprof/heap", ""},
		{"/debug/pprof/profile?seconds=1", ""},
		{"/debug/pprof/trace?seconds=0.1", ""},
	}
	for _, c := range cases {
		code, body, _ := get(t, srv.URL+c.path)
		if code != http.StatusOK {
			t.Errorf("%s = %d: %.200s", c.path, code, body)
			continue
		}
		if c.want != "" && !strings.Contains(body, c.want) {
			t.Errorf("%s lacks %q", c.path, c.want)
		}
		if c.want == "" && c.path != "/debug/pprof/cmdline" && len(body) == 0 {
			t.Errorf("%s: empty profile", c.path)
		}
	}
}

func TestServeAndShutdown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := New()
	done := make(chan error, 1)
	go func() { done <- a.Serve(ln, func() bool { return true }) }()

	url := "http://" + ln.Addr().String()
	if code, _, _ := get(t, url+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz over Serve = %d", code)
	}
	ln2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Serve(ln2, nil); !errors.Is(err, ErrServing) {
		t.Fatalf("second Serve = %v, want ErrServing", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := a.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve after Shutdown = %v, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after Shutdown")
	}
	if _, err := http.Get(url + "/healthz"); err == nil {
		t.Fatal("listener still answers after Shutdown")
	}
	if err := a.Shutdown(ctx); err != nil {
		t.Fatalf("second Shutdown: %v", err)
	}
}

func TestServeAfterShutdownReturns(t *testing.T) {
	a := New()
	if err := a.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Serve(ln, nil); err != nil {
		t.Fatalf("Serve after Shutdown = %v, want nil", err)
	}
	if _, err := net.Dial("tcp", ln.Addr().String()); err == nil {
		t.Fatal("listener left open")
	}
}
