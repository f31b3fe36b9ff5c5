package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ticketd/ticketd/codec"
	"github.com/ticketd/ticketd/internal/serverproc"
)

// Hold opens n connections to the ticketd at addr and leaves them idle. With
// touch, each first does one lock pair, as a client that went quiet after
// some work would have (a server may set up per-connection state lazily).
func Hold(ctx context.Context, addr string, n int, sources []string, touch bool, keyPrefix string) ([]net.Conn, error) {
	conns, err := DialMany(ctx, addr, n, sources)
	if err != nil || !touch {
		return conns, err
	}
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	const workers = 64
	for w := range workers {
		wg.Go(func() {
			buf := make([]byte, 0, 512)
			rd := make([]byte, 512)
			for i := w; i < len(conns); i += workers {
				if err := touchConn(conns[i], keyPrefix+strconv.Itoa(i), buf, rd); err != nil {
					select {
					case errs <- fmt.Errorf("bench: idle connection %d: %w", i, err):
					default:
					}
					return
				}
			}
		})
	}
	wg.Wait()
	select {
	case err := <-errs:
		for _, c := range conns {
			c.Close()
		}
		return nil, err
	default:
	}
	return conns, nil
}

func touchConn(nc net.Conn, key string, buf, rd []byte) error {
	nc.SetDeadline(time.Now().Add(30 * time.Second))
	defer nc.SetDeadline(time.Time{})
	var a codec.Answer
	ask := func(req []byte) error {
		if _, err := nc.Write(req); err != nil {
			return err
		}
		got := 0
		for {
			m, err := nc.Read(rd[got:])
			got += m
			if n, perr := codec.ParseAnswer(rd[:got], &a); perr != nil {
				return perr
			} else if n > 0 {
				return nil
			}
			if err != nil {
				return err
			}
			if got == len(rd) {
				return errors.New("answer too long")
			}
		}
	}
	if err := ask(codec.AppendAcquire(buf[:0], []byte("idle"), []byte(key), 60000, 0)); err != nil {
		return err
	}
	if a.Kind != 'A' {
		return fmt.Errorf("touch acquire of %s answered %c", key, a.Kind)
	}
	if err := ask(codec.AppendRelease(buf[:0], a.Token, []byte(key))); err != nil {
		return err
	}
	if a.Kind != 'R' {
		return fmt.Errorf("touch release of %s answered %c", key, a.Kind)
	}
	return nil
}

// holdMain is the `hold` subcommand: a client process that keeps idle
// connections (a process may have only so many descriptors), prints
// "ready <n>" once they are open, and closes them when stdin closes.
func holdMain(args []string, stdin io.Reader, stdout io.Writer) error {
	fs := newFlagSet("hold")
	addr := fs.String("addr", "", "ticketd address")
	n := fs.Int("conns", 1000, "connections to hold")
	sources := fs.String("sources", "", "comma-separated local addresses to dial from")
	touch := fs.Bool("touch", true, "do one lock pair on each connection first")
	prefix := fs.String("key-prefix", "idle:", "key prefix for the touch")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var src []string
	if *sources != "" {
		src = strings.Split(*sources, ",")
	}
	conns, err := Hold(context.Background(), *addr, *n, src, *touch, *prefix)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "ready %d\n", len(conns))
	io.Copy(io.Discard, stdin)
	for _, c := range conns {
		c.Close()
	}
	return nil
}

// Holders are the hold processes a scenario started.
type Holders struct {
	procs []*holdProc
	Conns int
}

type holdProc struct {
	p     *serverproc.Proc
	stdin io.WriteCloser
}

// holdReady takes the count from the "ready <n>" line holdMain prints.
func holdReady(line []byte) (string, bool) {
	n, ok := bytes.CutPrefix(line, []byte("ready "))
	return string(n), ok
}

// Add starts processes of self (argv of a program whose first
// argument "hold" runs holdMain; env is added to its environment) holding n
// more idle connections to addr, at most perProc each, the k-th process
// dialing from 127.0.0.<firstSource+k>.
func (h *Holders) Add(self, env []string, addr string, n, perProc, firstSource int, touch bool) error {
	type started struct {
		hp *holdProc
		m  int
	}
	var batch []started
	total := n
	for n > 0 {
		m := min(n, perProc)
		n -= m
		src := fmt.Sprintf("127.0.0.%d", firstSource+len(h.procs))
		args := append(append([]string{}, self[1:]...), "hold", "-addr", addr, "-conns", strconv.Itoa(m),
			"-sources", src, "-touch="+strconv.FormatBool(touch),
			"-key-prefix", fmt.Sprintf("idle%d:", len(h.procs)))
		cmd := exec.Command(self[0], args...)
		cmd.Env = append(os.Environ(), env...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return err
		}
		p, err := serverproc.Start(cmd, holdReady)
		if err != nil {
			return fmt.Errorf("start hold process: %w", err)
		}
		hp := &holdProc{p: p, stdin: stdin}
		h.procs = append(h.procs, hp)
		batch = append(batch, started{hp, m})
	}
	var firstErr error
	for _, s := range batch {
		err := s.hp.p.WaitReady(120 * time.Second) // kills a process that is not ready in time
		if err == nil && s.hp.p.Addr != strconv.Itoa(s.m) {
			err = fmt.Errorf("hold process opened %s of %d\n%s", s.hp.p.Addr, s.m, s.hp.p.Log().Tail(logLines))
		}
		if err != nil && firstErr == nil {
			firstErr = fmt.Errorf("hold process: %w", err)
		}
	}
	if firstErr != nil {
		return firstErr
	}
	h.Conns += total
	return nil
}

// Stop closes every hold process's stdin, so it closes its connections and
// exits; one that does not within 10s is killed.
func (h *Holders) Stop() {
	for _, hp := range h.procs {
		hp.stdin.Close()
	}
	for _, hp := range h.procs {
		select {
		case <-hp.p.Done():
		case <-time.After(10 * time.Second):
			hp.p.Kill()
		}
	}
	h.procs, h.Conns = nil, 0
}
