package serverproc

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
)

// maxLog bounds what a Log keeps; past it the older half goes. A test's
// server rarely writes that much, so in practice its whole log is kept.
const maxLog = 1 << 20

// Log keeps the last output of a process, for failure messages. It is safe
// for concurrent use.
type Log struct {
	mu      sync.Mutex
	b       []byte
	dropped int // whole lines cut from the front
}

// Write appends p; a Log can be a process's Stdout or Stderr.
func (l *Log) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.write(p)
	return len(p), nil
}

// writeLine appends line and a newline at once, so that lines of the two
// pipes do not interleave.
func (l *Log) writeLine(line []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.write(line)
	l.write([]byte{'\n'})
}

func (l *Log) write(p []byte) {
	l.b = append(l.b, p...)
	if len(l.b) > maxLog {
		cut := len(l.b) - maxLog/2
		if i := bytes.IndexByte(l.b[cut:], '\n'); i >= 0 {
			cut += i + 1
		}
		l.dropped += bytes.Count(l.b[:cut], []byte{'\n'})
		l.b = append(l.b[:0], l.b[cut:]...)
	}
}

// String is all that is kept.
func (l *Log) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.b)
}

// Tail is the last n lines, after a note of how many came before.
func (l *Log) Tail(n int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	lines := strings.Split(strings.TrimRight(string(l.b), "\n"), "\n")
	earlier := l.dropped
	if len(lines) > n {
		earlier += len(lines) - n
		lines = lines[len(lines)-n:]
	}
	if earlier > 0 {
		lines = append([]string{fmt.Sprintf("... (%d earlier lines)", earlier)}, lines...)
	}
	return strings.Join(lines, "\n")
}
