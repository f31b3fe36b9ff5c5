//go:build linux

package netloop

import (
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ticketd/ticketd/codec"
)

// tidBackend is fakeBackend that counts the OS threads its batches ran on.
type tidBackend struct {
	fakeBackend
	mu   sync.Mutex
	tids map[int]int
}

func (b *tidBackend) Handle(c *Conn, reqs []codec.Request, out []byte) ([]byte, int, bool) {
	tid := unix.Gettid()
	b.mu.Lock()
	b.tids[tid]++
	b.mu.Unlock()
	return b.fakeBackend.Handle(c, reqs, out)
}

// TestLockThreadsKeepsTheLoopOnOneThread: with LockThreads every batch runs
// on one OS thread, however often the loop blocks in epoll_wait in between.
// With one P, as single mode runs by default, the scheduler hands the P of a
// thread that blocks in a system call to another thread; an unlocked loop
// then goes on wherever the P went (in this test, on two threads in three
// runs of five; not asserted, as it need not happen).
func TestLockThreadsKeepsTheLoopOnOneThread(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	b := &tidBackend{tids: map[int]int{}}
	_, addr := startServer(t, Config{Backend: b, Loops: 1, LockThreads: true})
	nc, r := dial(t, addr)
	for i := range 300 {
		fmt.Fprintf(nc, "A o k%d 1000 0\n", i)
		if got, want := readLine(t, r), fmt.Sprintf("A 1 o k%d", i); got != want {
			t.Fatalf("answer %q, want %q", got, want)
		}
		time.Sleep(200 * time.Microsecond) // the loop blocks in epoll_wait
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.tids) != 1 {
		t.Fatalf("batches ran on %d threads (%v), want 1", len(b.tids), b.tids)
	}
}
