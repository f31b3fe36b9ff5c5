package netloop

import (
	"slices"
	"testing"
	"time"
)

// The parked loop sleeps while nothing is parked; a connection parked
// then must still be woken, and again every period while it stays, each
// time the set fills up anew.
func TestParkedLoopWakesWhatIsParkedWhileItSleeps(t *testing.T) {
	s := &Server{done: make(chan struct{})}
	s.parked.init()
	s.acceptWG.Add(1)
	go s.parkedLoop()
	defer func() { close(s.done); s.acceptWG.Wait() }()
	for range 3 {
		time.Sleep(3 * parkedEvery) // time to find the set empty and sleep
		gc := &stubConn{}
		c := &Conn{gc: gc}
		s.parked.add(c)
		waitFor(t, func() bool { return gc.wakes.Load() >= 2 })
		s.parked.del(c)
	}
}

// A paused connection whose unsent output does not shrink (its client reads
// nothing) is looked at less and less often, down to parkedMax; once the
// output shrinks, again every parkedEvery. The parked loop wakes none
// before its time.
func TestPausedConnectionWithoutProgressIsWokenLessOften(t *testing.T) {
	s := &Server{done: make(chan struct{}), epoch: time.Now()}
	s.parked.init()
	gc := &stubConn{out: 1 << 20}
	c := &Conn{gc: gc, s: s, epfd: -1}
	var waits []time.Duration
	for range 7 {
		c.pause()
		waits = append(waits, time.Duration(c.parkWait))
	}
	want := []time.Duration{parkedEvery, 2 * parkedEvery, 4 * parkedEvery, 8 * parkedEvery, 16 * parkedEvery, parkedMax, parkedMax}
	if !slices.Equal(waits, want) {
		t.Fatalf("waits %v, want %v", waits, want)
	}
	gc.out--
	if c.pause(); time.Duration(c.parkWait) != parkedEvery {
		t.Fatalf("after the output shrank: wait %v, want %v", time.Duration(c.parkWait), parkedEvery)
	}

	for range 6 {
		c.pause() // back to the longest wait
	}
	s.acceptWG.Add(1)
	go s.parkedLoop()
	defer func() { close(s.done); s.acceptWG.Wait() }()
	time.Sleep(parkedMax / 2)
	if n := gc.wakes.Load(); n != 0 {
		t.Fatalf("woken %d times within %v of a wait of %v", n, parkedMax/2, parkedMax)
	}
	waitFor(t, func() bool { return gc.wakes.Load() >= 1 })
}
