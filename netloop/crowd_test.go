package netloop

import (
	"sync/atomic"
	"testing"
	"time"
)

// crowdBackend is fakeBackend that is crowded, while crowded is set, for
// connections with two or more requests unanswered.
type crowdBackend struct {
	fakeBackend
	crowded atomic.Bool
}

func (b *crowdBackend) Crowded(c *Conn) bool { return b.crowded.Load() && c.Pending() >= 2 }
func (b *crowdBackend) Admit(c *Conn) bool   { return !b.Crowded(c) }

// A crowded Backend stops the reading of the connections it names, and of
// no other, and they go on once it is not crowded and an answer wakes them.
func TestCrowdedConnectionIsNotReadUntilItDrains(t *testing.T) {
	b := &crowdBackend{}
	b.crowded.Store(true)
	s, addr := startServer(t, Config{Backend: b})
	busy, busyR := dial(t, addr)
	if _, err := busy.Write([]byte("A w1 later 1000 5000\nA w2 later 1000 5000\nA w3 later 1000 5000\nA o now 1000 0\n")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return b.handled.Load() == 2 })

	// Another connection, with nothing unanswered, is read and answered.
	light, lightR := dial(t, addr)
	if _, err := light.Write([]byte("A o2 other 1000 0\n")); err != nil {
		t.Fatal(err)
	}
	if got := readLine(t, lightR); got != "A 1 o2 other" {
		t.Fatalf("light connection: %q", got)
	}
	time.Sleep(50 * time.Millisecond) // a wrong read of the crowded one would land meanwhile
	if n := b.handled.Load(); n != 3 {
		t.Fatalf("%d requests handled while the busy connection was crowded, want 3 (two of it, one of the other)", n)
	}
	if s.Stats().Paused == 0 {
		t.Fatal("the crowded connection was not paused")
	}

	b.crowded.Store(false)
	b.mu.Lock()
	parked := b.parked[0]
	b.mu.Unlock()
	go parked.Post([]byte("T w1 later\n"), 1)
	if got := readLine(t, busyR); got != "T w1 later" {
		t.Fatalf("late answer: %q", got)
	}
	if got := readLine(t, busyR); got != "A 1 o now" {
		t.Fatalf("after the crowd: %q, want the request read once it ended", got)
	}
	if n := b.handled.Load(); n != 5 {
		t.Fatalf("%d requests handled, want all 5", n)
	}
}
