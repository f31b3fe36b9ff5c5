package client_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const (
	startTimeout = 20 * time.Second // opening the store, not the build (done once in TestMain)
	stopTimeout  = 10 * time.Second // SIGTERM to exit, then SIGKILL
)

var (
	ticketdBin string
	buildErr   error // tests that need a server fail with it; the others still run
)

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "ticketd-client-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	ticketdBin = filepath.Join(dir, "ticketd")
	cmd := exec.Command("go", "build", "-o", ticketdBin, "github.com/ticketd/ticketd/cmd/ticketd")
	if out, err := cmd.CombinedOutput(); err != nil {
		buildErr = fmt.Errorf("go build ./cmd/ticketd: %v\n%s", err, out)
	}
	return m.Run()
}

// server is a ticketd process started by a test.
type server struct {
	tb     testing.TB
	cmd    *exec.Cmd
	addr   string
	exited chan struct{}
	mu     sync.Mutex
	log    []string // last stderr lines, for failure messages
	once   sync.Once
}

// startServer starts ticketd on listen ("" for a free loopback port) with
// its data in dataDir ("" for a fresh one), and stops it at cleanup.
func startServer(tb testing.TB, dataDir, listen string, flags ...string) *server {
	tb.Helper()
	if buildErr != nil {
		tb.Fatal(buildErr)
	}
	if dataDir == "" {
		dataDir = tb.TempDir()
	}
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	args := append([]string{"--listen", listen, "--log-format", "json", "--data-dir", dataDir}, flags...)
	s := &server{tb: tb, cmd: exec.Command(ticketdBin, args...), exited: make(chan struct{})}
	stderr, err := s.cmd.StderrPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := s.cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.stop)
	addrc := make(chan string, 1)
	go s.readLog(stderr, addrc)
	go func() {
		s.cmd.Wait()
		close(s.exited)
	}()
	select {
	case s.addr = <-addrc:
	case <-s.exited:
		tb.Fatalf("ticketd %s exited before listening: %v\n%s", strings.Join(args, " "), s.cmd.ProcessState, s.logTail())
	case <-time.After(startTimeout):
		tb.Fatalf("ticketd did not log \"listening\" within %v\n%s", startTimeout, s.logTail())
	}
	return s
}

func (s *server) readLog(r io.Reader, addrc chan<- string) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	sent := false
	for sc.Scan() {
		line := sc.Text()
		s.mu.Lock()
		if len(s.log) == 50 {
			s.log = s.log[1:]
		}
		s.log = append(s.log, line)
		s.mu.Unlock()
		if sent {
			continue
		}
		var rec struct {
			Msg  string `json:"msg"`
			Addr string `json:"addr"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "listening" && rec.Addr != "" {
			addrc <- rec.Addr
			sent = true
		}
	}
}

func (s *server) logTail() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.log, "\n")
}

// stop sends SIGTERM to this server's pid and waits; SIGKILL after stopTimeout.
func (s *server) stop() {
	s.once.Do(func() {
		select {
		case <-s.exited:
			return
		default:
		}
		if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
			s.tb.Errorf("SIGTERM ticketd: %v", err)
		}
		select {
		case <-s.exited:
			if !s.cmd.ProcessState.Success() {
				s.tb.Errorf("ticketd exited with %v after SIGTERM\n%s", s.cmd.ProcessState, s.logTail())
			}
		case <-time.After(stopTimeout):
			s.cmd.Process.Kill()
			<-s.exited
			s.tb.Errorf("ticketd did not exit within %v of SIGTERM\n%s", stopTimeout, s.logTail())
		}
	})
}
