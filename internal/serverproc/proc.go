// Package serverproc runs server binaries (ticketd above all) as child
// processes for tests and the bench: it builds ticketd, starts a process,
// learns its address from the line it logs when ready, keeps its output for
// failure messages, and stops it by its own pid.
//
// It does not import "testing": bench uses it outside tests.
package serverproc

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// Proc is a started process whose stdout and stderr are read line by line.
type Proc struct {
	Cmd  *exec.Cmd
	Addr string // from the ready line; valid once Ready is closed

	log   *Log
	ready chan struct{}
	done  chan struct{}
	err   error // from Wait; valid once done is closed
}

// Start starts cmd. Each line of its stdout and stderr (those the caller
// left nil) goes to the log, and to ready until ready first returns true,
// with the address Addr takes. A nil ready is never satisfied.
func Start(cmd *exec.Cmd, ready func(line []byte) (addr string, ok bool)) (*Proc, error) {
	p := &Proc{Cmd: cmd, log: &Log{}, ready: make(chan struct{}), done: make(chan struct{})}
	var pipes []io.Reader
	if cmd.Stdout == nil {
		r, err := cmd.StdoutPipe()
		if err != nil {
			return nil, err
		}
		pipes = append(pipes, r)
	}
	if cmd.Stderr == nil {
		r, err := cmd.StderrPipe()
		if err != nil {
			return nil, err
		}
		pipes = append(pipes, r)
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	var mu sync.Mutex // one ready call at a time; the two pipes race
	watching := ready != nil
	var wg sync.WaitGroup
	for _, r := range pipes {
		wg.Go(func() {
			sc := bufio.NewScanner(r)
			sc.Buffer(make([]byte, 64<<10), 1<<20)
			for sc.Scan() {
				line := sc.Bytes()
				p.log.writeLine(line)
				mu.Lock()
				if watching {
					if addr, ok := ready(line); ok {
						watching = false
						p.Addr = addr
						close(p.ready)
					}
				}
				mu.Unlock()
			}
			// A line past the scanner's limit ends the scan: drain the rest so
			// the process never blocks on a full pipe.
			io.Copy(io.Discard, r)
		})
	}
	go func() {
		wg.Wait() // Wait closes the pipes: read them to the end first
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// WaitReady waits up to timeout for the ready line. If the process exits
// first, or the time passes (it is then killed), the error carries the tail
// of its output.
func (p *Proc) WaitReady(timeout time.Duration) error {
	select {
	case <-p.ready:
		return nil
	case <-p.done:
		return fmt.Errorf("pid %d exited before it was ready (%v); output:\n%s", p.Pid(), p.err, p.log.Tail(40))
	case <-time.After(timeout):
		p.Kill()
		return fmt.Errorf("pid %d not ready within %v; killed; output:\n%s", p.Pid(), timeout, p.log.Tail(40))
	}
}

// Pid is the process id.
func (p *Proc) Pid() int { return p.Cmd.Process.Pid }

// Ready is closed once the ready line was seen.
func (p *Proc) Ready() <-chan struct{} { return p.ready }

// Done is closed once the process has exited and its output is all read.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has exited.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Err is Wait's error; call it only after Done.
func (p *Proc) Err() error {
	<-p.done
	return p.err
}

// ExitCode is the exit code, -1 for a death by signal; it waits for the exit.
func (p *Proc) ExitCode() int {
	<-p.done
	return p.Cmd.ProcessState.ExitCode()
}

// ExitState says how the process ended ("exit status 1", "signal:
// killed"); it waits for the exit.
func (p *Proc) ExitState() string {
	<-p.done
	return p.Cmd.ProcessState.String()
}

// Log is what the process wrote to the pipes Start read.
func (p *Proc) Log() *Log { return p.log }

// Stop sends SIGTERM to the process's pid and waits up to grace for its
// exit, then sends SIGKILL. The error says why the exit was not clean in
// time; an exit code is the caller's to judge.
func (p *Proc) Stop(grace time.Duration) error {
	if p.Exited() {
		return nil
	}
	var sigErr error
	if err := p.Cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		sigErr = fmt.Errorf("SIGTERM pid %d: %w", p.Pid(), err)
	}
	select {
	case <-p.done:
		return sigErr
	case <-time.After(grace):
		p.Kill()
		return errors.Join(sigErr, fmt.Errorf("pid %d did not exit within %v of SIGTERM; killed", p.Pid(), grace))
	}
}

// Pause sends SIGSTOP and returns once every thread of the process has
// stopped, or an error after timeout. kill returns when one thread has the
// signal; that thread stops the others only once it runs, and on a loaded
// machine they can go on for milliseconds meanwhile (long enough for a
// cluster node to ack a proposal sent after kill).
func (p *Proc) Pause(timeout time.Duration) error {
	if err := p.Cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return fmt.Errorf("SIGSTOP pid %d: %w", p.Pid(), err)
	}
	deadline := time.Now().Add(timeout)
	for !allStopped(p.Pid()) {
		if time.Now().After(deadline) {
			return fmt.Errorf("pid %d not stopped %v after SIGSTOP", p.Pid(), timeout)
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

// allStopped reports whether every thread of process pid is stopped
// (state T in its stat, after the command's closing parenthesis).
func allStopped(pid int) bool {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil || len(tasks) == 0 {
		return false
	}
	for _, task := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
		i := bytes.LastIndexByte(b, ')')
		if err != nil || i < 0 || i+2 >= len(b) || b[i+2] != 'T' {
			return false
		}
	}
	return true
}

// Kill sends SIGKILL to the process's pid and waits for the exit.
func (p *Proc) Kill() {
	if p.Exited() {
		return
	}
	_ = p.Cmd.Process.Kill()
	<-p.done
}
