package client_test

import (
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ticketd/ticketd/internal/serverproc"
)

const (
	startTimeout = 20 * time.Second // opening the store, not the build (done before the timer starts)
	stopTimeout  = 10 * time.Second // SIGTERM to exit, then SIGKILL
)

// TestMain removes the ticketd binary the first startServer built; a failed
// build fails only the tests that need a server.
func TestMain(m *testing.M) { os.Exit(serverproc.Main(m.Run)) }

// server is a ticketd process started by a test.
type server struct {
	tb   testing.TB
	p    *serverproc.Proc
	addr string
	once sync.Once
}

// startServer starts ticketd on listen ("" for a free loopback port) with
// its data in dataDir ("" for a fresh one), and stops it at cleanup.
func startServer(tb testing.TB, dataDir, listen string, flags ...string) *server {
	tb.Helper()
	if dataDir == "" {
		dataDir = tb.TempDir()
	}
	p, err := serverproc.StartTicketd(listen, dataDir, startTimeout, flags...)
	if err != nil {
		tb.Fatalf("ticketd %s: %v", strings.Join(serverproc.TicketdArgs(listen, dataDir, flags...), " "), err)
	}
	s := &server{tb: tb, p: p, addr: p.Addr}
	tb.Cleanup(s.stop)
	return s
}

func (s *server) logTail() string { return s.p.Log().Tail(50) }

// stop sends SIGTERM to this server's pid and waits; SIGKILL after stopTimeout.
func (s *server) stop() {
	s.once.Do(func() {
		if s.p.Exited() {
			return
		}
		if err := s.p.Stop(stopTimeout); err != nil {
			s.tb.Errorf("ticketd: %v\n%s", err, s.logTail())
		} else if !s.p.Cmd.ProcessState.Success() {
			s.tb.Errorf("ticketd exited with %v after SIGTERM\n%s", s.p.Cmd.ProcessState, s.logTail())
		}
	})
}
