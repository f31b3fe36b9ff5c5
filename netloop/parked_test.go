package netloop

import (
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
