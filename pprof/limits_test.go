package pprof

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"
)

// serve runs a on a fresh loopback listener until the test ends.
func serve(t *testing.T, a *Admin) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Serve(ln, nil) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = a.Shutdown(ctx)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("Serve did not return after Shutdown")
		}
	})
	return ln.Addr().String()
}

// conn is a raw keep-alive HTTP/1.1 client connection.
type conn struct {
	net.Conn
	r *bufio.Reader
}

func dial(t *testing.T, addr string) *conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &conn{c, bufio.NewReader(c)}
}

func (c *conn) send(t *testing.T, path string) {
	t.Helper()
	if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: admin\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
}

// answer reads one response, waiting at most d.
func (c *conn) answer(d time.Duration) (int, error) {
	_ = c.SetReadDeadline(time.Now().Add(d))
	return c.read()
}

// read reads one response by the deadline already set.
func (c *conn) read() (int, error) {
	resp, err := http.ReadResponse(c.r, nil)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, err
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// openFDs counts this process's descriptors (-1 where /proc is missing).
func openFDs() int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	return len(ents)
}

// Connections beyond MaxConns are not accepted: they hold no descriptor of
// the server and are served once a slot frees.
func TestConnLimitLeavesTheRestInTheBacklog(t *testing.T) {
	const limit, extra = 3, 5
	addr := serve(t, NewWith(Options{MaxConns: limit, IdleTimeout: time.Minute}))
	fd0 := openFDs()

	var kept []*conn
	for range limit {
		c := dial(t, addr)
		c.send(t, "/healthz")
		if code, err := c.answer(10 * time.Second); code != http.StatusOK {
			t.Fatalf("kept connection: %d, %v", code, err)
		}
		kept = append(kept, c) // stays open, idle
	}
	var waiting []*conn
	for range extra {
		c := dial(t, addr)
		c.send(t, "/healthz")
		waiting = append(waiting, c)
	}
	// None of them may be answered while the slots are taken; all wait
	// together, so this costs one short wait.
	var wg sync.WaitGroup
	errs := make([]error, extra)
	for i, c := range waiting {
		wg.Go(func() { _, errs[i] = c.answer(300 * time.Millisecond) })
	}
	wg.Wait()
	for i, err := range errs {
		if !isTimeout(err) {
			t.Fatalf("connection %d beyond the limit of %d was served (%v)", limit+i+1, limit, err)
		}
	}
	if fd0 >= 0 {
		// This process holds both ends: every client end, and at most
		// limit server ends (one spare for the runtime's own use).
		if n := openFDs() - fd0; n > limit+extra+limit+1 {
			t.Errorf("%d new descriptors for %d client connections; the server holds more than its limit of %d", n, limit+extra, limit)
		}
	}

	// Freeing one slot lets exactly one waiting connection in.
	kept[0].Close()
	served := make(chan int, extra)
	for i, c := range waiting {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		wg.Go(func() {
			if code, err := c.read(); err == nil && code == http.StatusOK {
				served <- i
			}
		})
	}
	select {
	case <-served:
	case <-time.After(10 * time.Second):
		t.Fatal("no waiting connection was served after a slot freed")
	}
	for _, c := range waiting {
		_ = c.SetReadDeadline(time.Now()) // end the other reads
	}
	wg.Wait()
	if n := 1 + len(served); n != 1 {
		t.Errorf("%d waiting connections served after one slot freed", n)
	}
}

// Idle keep-alive connections are closed after IdleTimeout, which frees
// their slots for new clients.
func TestIdleConnectionsFreeTheirSlots(t *testing.T) {
	addr := serve(t, NewWith(Options{MaxConns: 2, IdleTimeout: 200 * time.Millisecond}))
	var kept []*conn
	for range 2 {
		c := dial(t, addr)
		c.send(t, "/healthz")
		if code, err := c.answer(10 * time.Second); code != http.StatusOK {
			t.Fatalf("kept connection: %d, %v", code, err)
		}
		kept = append(kept, c)
	}
	late := dial(t, addr)
	late.send(t, "/healthz")
	if code, err := late.answer(10 * time.Second); code != http.StatusOK {
		t.Fatalf("a new connection was not served after the idle ones timed out: %d, %v", code, err)
	}
	for i, c := range kept {
		if _, err := c.answer(10 * time.Second); !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("idle connection %d: %v, want closed by the server", i, err)
		}
	}
}

func TestProfileSecondsAreBounded(t *testing.T) {
	srv := serve(t, New())
	client := &http.Client{Timeout: 20 * time.Second} // the unbounded handlers would sleep for days
	for _, path := range []string{
		"/debug/pprof/profile?seconds=100000",
		"/debug/pprof/trace?seconds=100000",
		"/debug/pprof/trace?seconds=60.5",
		"/debug/pprof/heap?seconds=100000",
		"/debug/pprof/goroutine?seconds=61",
		"/debug/pprof/profile?seconds=NaN",
		"/debug/pprof/profile?seconds=1e9",
		"/debug/pprof/profile?seconds=x",
		// What the handlers would run their own default for (30 s).
		"/debug/pprof/profile?seconds=0.5",
		"/debug/pprof/profile?seconds=-5",
		"/debug/pprof/profile?seconds=0",
		"/debug/pprof/profile?seconds=%201",
		"/debug/pprof/trace?seconds=-1",
	} {
		resp, err := client.Get("http://" + srv + path)
		if err != nil {
			t.Errorf("%s: %v", path, err)
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "at most 60s") {
			t.Errorf("%s = %d %.100q, want 400 naming the limit", path, resp.StatusCode, body)
		}
	}
	// Within the limit they still run.
	resp, err := client.Get("http://" + srv + "/debug/pprof/trace?seconds=0.05")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("trace?seconds=0.05 = %d", resp.StatusCode)
	}
}

// WriteTimeout bounds an answer's writing, not a profile's seconds: the
// pprof handlers move the deadline by them.
func TestProfileOutlastsWriteTimeout(t *testing.T) {
	srv := serve(t, NewWith(Options{WriteTimeout: 300 * time.Millisecond}))
	client := &http.Client{Timeout: 20 * time.Second}
	for _, path := range []string{"/debug/pprof/profile?seconds=1", "/debug/pprof/trace?seconds=1"} {
		resp, err := client.Get("http://" + srv + path)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || len(body) == 0 {
			t.Errorf("%s = %d, %d bytes, %v; want a whole profile", path, resp.StatusCode, len(body), err)
		}
	}
}

// A running CPU profile ends when the listener shuts down: it does not hold
// the process for its seconds.
func TestShutdownCutsARunningProfile(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := New()
	served := make(chan error, 1)
	go func() { served <- a.Serve(ln, nil) }()

	type result struct {
		code int
		body int
		err  error
	}
	got := make(chan result, 1)
	go func() {
		client := &http.Client{Timeout: 60 * time.Second}
		resp, err := client.Get("http://" + ln.Addr().String() + "/debug/pprof/profile?seconds=50")
		if err != nil {
			got <- result{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		got <- result{resp.StatusCode, len(b), err}
	}()
	waitForGoroutine(t, "net/http/pprof.Profile(")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	if err := a.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	took := time.Since(start)
	t.Logf("Shutdown with a profile running took %v", took)
	if took > 3*time.Second {
		t.Errorf("Shutdown took %v with a profile running, want about a second at most", took)
	}
	r := <-got
	if r.err != nil || r.code != http.StatusOK || r.body == 0 {
		t.Errorf("the cut profile: %d, %d bytes, %v; want 200 with what was sampled", r.code, r.body, r.err)
	}
	if err := <-served; err != nil {
		t.Errorf("Serve = %v", err)
	}
}

// waitForGoroutine waits until some goroutine's stack holds fn.
func waitForGoroutine(t *testing.T, fn string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var b bytes.Buffer
		_ = pprof.Lookup("goroutine").WriteTo(&b, 2)
		if strings.Contains(b.String(), fn) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no goroutine in %s after 10s", fn)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// net/http's own error lines go to Options.ErrorLog, not to the standard
// logger.
func TestErrorLogGetsServerErrors(t *testing.T) {
	var buf syncBuffer
	a := NewWith(Options{ErrorLog: log.New(&buf, "", 0)})
	a.Handle("/boom", http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("boom") }))
	addr := serve(t, a)
	c := dial(t, addr)
	c.send(t, "/boom")
	_, _ = c.answer(10 * time.Second) // the server drops the connection
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(buf.String(), "panic serving") {
		if time.Now().After(deadline) {
			t.Fatalf("ErrorLog got %q, want the handler's panic", buf.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
