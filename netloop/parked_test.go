package netloop

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/panjf2000/gnet/v2"
)

// wakeConn counts the wake-ups the parked loop asks for.
type wakeConn struct {
	gnet.Conn
	n atomic.Int32
}

func (w *wakeConn) Wake(gnet.AsyncCallback) error { w.n.Add(1); return nil }

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
		w := &wakeConn{}
		c := &Conn{gc: w}
		s.parked.add(c)
		waitFor(t, func() bool { return w.n.Load() >= 2 })
		s.parked.del(c)
	}
}
