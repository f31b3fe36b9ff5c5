package serverproc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// ModuleRoot finds the directory of the enclosing go.mod.
func ModuleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("not inside a Go module")
	}
	return filepath.Dir(gomod), nil
}

// Build compiles the package pkg (e.g. "./cmd/ticketd") of the module in
// root into dir, with extra build flags, and returns the binary's path.
func Build(ctx context.Context, root, pkg, dir string, flags ...string) (string, error) {
	out := filepath.Join(dir, filepath.Base(pkg))
	args := append(append([]string{"build", "-o", out}, flags...), pkg)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, b)
	}
	return out, nil
}

var built struct {
	once     sync.Once
	dir, bin string
	err      error
}

// Ticketd builds ./cmd/ticketd of the enclosing module on its first call,
// into a temporary directory that Main removes, and returns the binary's
// path (or the build's error) on every call: one build per test binary.
func Ticketd() (string, error) {
	built.once.Do(func() {
		root, err := ModuleRoot()
		if err != nil {
			built.err = err
			return
		}
		if built.dir, err = os.MkdirTemp("", "ticketd-bin-"); err != nil {
			built.err = err
			return
		}
		built.bin, built.err = Build(context.Background(), root, "./cmd/ticketd", built.dir)
	})
	return built.bin, built.err
}

// Main runs the tests (m.Run) and then removes what Ticketd built. For
// TestMain: os.Exit(serverproc.Main(m.Run)).
func Main(run func() int) int {
	defer func() {
		if built.dir != "" {
			os.RemoveAll(built.dir)
		}
	}()
	return run()
}

// TicketdArgs is ticketd's command line for a test or bench server: on
// listen ("" for a free loopback port), logging JSON (for ListeningAddr),
// with its data in dataDir, then flags.
func TicketdArgs(listen, dataDir string, flags ...string) []string {
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	return append([]string{"--listen", listen, "--log-format", "json", "--data-dir", dataDir}, flags...)
}

// ListeningAddr reads the address from ticketd's JSON log line
// {"msg":"listening","addr":...}; a ready func for Start.
func ListeningAddr(line []byte) (string, bool) {
	var rec struct {
		Msg  string `json:"msg"`
		Addr string `json:"addr"`
	}
	if json.Unmarshal(line, &rec) == nil && rec.Msg == "listening" && rec.Addr != "" {
		return rec.Addr, true
	}
	return "", false
}

// StartListening starts cmd, a ticketd run with TicketdArgs (maybe through
// a wrapper that execs it, so the pid stays ticketd's), and returns once it
// logged "listening", with Addr set. On an error nothing is left running.
func StartListening(cmd *exec.Cmd, timeout time.Duration) (*Proc, error) {
	p, err := Start(cmd, ListeningAddr)
	if err != nil {
		return nil, err
	}
	if err := p.WaitReady(timeout); err != nil {
		return nil, err
	}
	return p, nil
}

// StartTicketd starts the binary Ticketd built with TicketdArgs(listen,
// dataDir, flags...) and returns once it listens.
func StartTicketd(listen, dataDir string, timeout time.Duration, flags ...string) (*Proc, error) {
	bin, err := Ticketd()
	if err != nil {
		return nil, err
	}
	return StartListening(exec.Command(bin, TicketdArgs(listen, dataDir, flags...)...), timeout)
}
