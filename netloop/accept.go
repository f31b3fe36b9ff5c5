package netloop

import (
	"errors"
	"net"
	"os"
	"runtime"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// enrollers is how many accepted connections are being enrolled into the
// loops at once. Enrolling one waits until its OnOpen has run on its loop, a
// hand-off to the loop's thread and back; one at a time, a burst of 5,000
// connections outran that (about 10,000 a second) and filled the listen
// backlog, and the dials beyond it waited out a SYN retransmit (1 s, then
// 3 s). The loop registers all that were queued for it in one wake-up.
const enrollers = 32

// EnrollDescriptors is how many descriptors the accept loop may hold beyond
// the connections it counts: an enroll in flight holds the accepted socket
// and gnet's duplicate of it for a moment.
const EnrollDescriptors = enrollers

// acceptLoop accepts connections and enrolls them into the gnet engine.
//
// Beyond MaxConns a connection is accepted and closed at once, so that the
// client learns it now instead of waiting in the backlog. When the process
// runs out of descriptors anyway (EMFILE, ENFILE), one spare descriptor held
// for the purpose is given up to accept and close the waiting connection,
// then taken again, and accepting backs off briefly; serving goes on.
func (s *Server) acceptLoop() {
	defer s.acceptWG.Done()
	spare, _ := os.Open(os.DevNull)
	defer func() {
		if spare != nil {
			_ = spare.Close()
		}
	}()
	var backoff time.Duration
	var lastWarn, lastRefusedWarn time.Time
	var refusedSince int64
	type job struct {
		c  *Conn
		nc net.Conn
	}
	jobs := make(chan job, enrollers)
	var enrolling sync.WaitGroup
	for range enrollers {
		enrolling.Go(func() {
			for j := range jobs {
				s.enroll(j.c, j.nc)
			}
		})
	}
	defer func() {
		close(jobs)
		enrolling.Wait()
	}()
	for {
		nc, err := s.ln.Accept()
		if err != nil {
			select {
			case <-s.done:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
				if spare != nil {
					_ = spare.Close()
					if nc2, err2 := s.ln.Accept(); err2 == nil {
						_ = nc2.Close()
						s.refused.Add(1)
					}
					spare, _ = os.Open(os.DevNull)
				}
			}
			if time.Since(lastWarn) > time.Second {
				s.log.Warn("accept failed; backing off", zap.Error(err))
				lastWarn = time.Now()
			}
			if backoff == 0 {
				backoff = 5 * time.Millisecond
			} else if backoff < time.Second {
				backoff *= 2
			}
			select {
			case <-s.done:
				return
			case <-time.After(backoff):
			}
			continue
		}
		backoff = 0
		if spare == nil {
			// Lost when the descriptors it freed were taken (an enroll's
			// dup) before it was opened again: back as soon as one is free.
			spare, _ = os.Open(os.DevNull)
		}
		if s.conns.Load() >= int64(s.cfg.MaxConns) {
			s.refused.Add(1)
			_ = nc.Close()
			// Said, once every 10 s at most with the count since: clients
			// cut off at the door are otherwise only a counter.
			refusedSince++
			if time.Since(lastRefusedWarn) >= 10*time.Second {
				s.log.Warn("connections refused: --max-conns open already", zap.Int("max_conns", s.cfg.MaxConns),
					zap.Int64("refused_since_last_said", refusedSince))
				lastRefusedWarn, refusedSince = time.Now(), 0
			}
			continue
		}
		s.conns.Add(1)
		jobs <- job{&Conn{id: s.nextID.Add(1), s: s, epfd: -1}, nc}
	}
}

// enroll hands c's accepted socket nc to an event loop.
func (s *Server) enroll(c *Conn, nc net.Conn) {
	// Enroll duplicates the descriptor, closes nc and returns once OnOpen
	// has run on the connection's loop, or once the loop failed to add it
	// to its poller: gnet reports no error then (epoll_ctl's ENOSPC at
	// fs.epoll.max_user_watches), and OnOpen, which sets gc, never ran.
	if _, err := s.cli.EnrollContext(nc, c); err != nil || c.gc == nil {
		if err == nil {
			err = errors.New("the event loop could not poll the connection")
		}
		s.conns.Add(-1)
		s.refused.Add(1)
		now := time.Now().UnixNano()
		if last := s.enrollWarned.Load(); now-last > int64(time.Second) && s.enrollWarned.CompareAndSwap(last, now) {
			s.log.Warn("cannot register connection", zap.Error(err))
		}
		return
	}
	s.accepted.Add(1)
}

// registry finds a connection by id for answers decided elsewhere.
type registry struct {
	shards [64]struct {
		mu sync.RWMutex
		m  map[uint64]*Conn
	}
}

func (r *registry) init() {
	for i := range r.shards {
		r.shards[i].m = make(map[uint64]*Conn)
	}
}

func (r *registry) put(c *Conn) {
	sh := &r.shards[c.id%uint64(len(r.shards))]
	sh.mu.Lock()
	sh.m[c.id] = c
	sh.mu.Unlock()
}

func (r *registry) del(id uint64) {
	sh := &r.shards[id%uint64(len(r.shards))]
	sh.mu.Lock()
	delete(sh.m, id)
	sh.mu.Unlock()
}

func (r *registry) get(id uint64) *Conn {
	sh := &r.shards[id%uint64(len(r.shards))]
	sh.mu.RLock()
	c := sh.m[id]
	sh.mu.RUnlock()
	return c
}

// each calls fn for every connection, from a background goroutine. It
// yields the P after every eachYield connections: with one P (single
// mode's default) a walk over tens of thousands of connections would
// otherwise hold it from the event loop for milliseconds at a time. Not
// more often: with the loop locked to its thread, each yield passes the P
// to another thread and back, each hand-off waiting for a core. Yielding
// after each of the 64 registry shards, a sweep of 50 connections at
// pipeline depth 1 took about 100 ms of such hand-offs (the sweep's
// scheduler latency in a runtime trace), once a second.
func (r *registry) each(fn func(*Conn)) {
	seen := 0
	for i := range r.shards {
		sh := &r.shards[i]
		sh.mu.RLock()
		for _, c := range sh.m {
			fn(c)
		}
		seen += len(sh.m)
		sh.mu.RUnlock()
		if seen >= eachYield {
			seen = 0
			runtime.Gosched()
		}
	}
}

// eachYield is how many connections each visits between yields: some tens
// of microseconds of the sweep's work.
const eachYield = 2048
