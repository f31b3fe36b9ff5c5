package netloop

import (
	"context"
	"errors"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"
	"go.uber.org/zap"

	"github.com/ticketd/ticketd/codec"
)

// Backend carries out requests. Single mode applies them to the lock table
// in place; cluster mode proposes them through Raft. Both answer what is
// known at once into out and everything else later through Conn.Post.
type Backend interface {
	// Handle carries out reqs, parsed in this order from one read of c. It
	// appends the answers known now to out and returns how many of reqs (or
	// of c's earlier requests) those answers settle. It runs on c's event
	// loop; reqs die when it returns. If it returns close, c is closed after
	// out is written and nothing more is read from it.
	Handle(c *Conn, reqs []codec.Request, out []byte) (_ []byte, answered int, close bool)
	// Closed tells that c is gone: its queued acquires must be withdrawn.
	Closed(c *Conn)
	// Orphaned releases a grant that was decided for a connection that
	// closed before the answer could be written, so that no lock leaks.
	Orphaned(token uint64, key []byte)
	// Queued tells how many of c's unanswered requests are acquires waiting
	// in their key's queue. They do not count against MaxInflight: the lock
	// table bounds them (B), and a connection left unread for them could
	// not send the release that ends their wait. Asked on c's loop, only
	// while c is at MaxInflight.
	Queued(c *Conn) int
}

// LateRenewer is a Backend whose hand-overs' leases count from when they
// were decided, while their holders may count from the send of a request
// answered before them on the connection (client.Lock.Deadline), which can
// be later: an answer that leaves behind other connections' work or a
// synced write on the loop would leave its holder believing in its lease
// past the time the Backend gives the key to the next. RenewLate is called
// on c's loop right before answers holding gs are written to c, and moves
// their leases on by the time that passed; false means they must not be
// written (the Backend has failed, or a lease ended before its answer
// could leave), and c is closed instead, its grants given back through
// Orphaned. gs die when it returns.
type LateRenewer interface {
	RenewLate(c *Conn, gs []Grant) bool
}

// Crowder is a Backend that can hold more requests than it wants to
// (cluster mode: commands waiting on the replicated log). Admit is asked
// for each frame parsed from c before it is handed to Handle: true counts
// it in (the Backend's count, not Handle, takes it), false leaves it and
// what follows unread. Crowded is asked before c is read again: true
// stops reading c until a later ask says false. c is asked again when an
// answer reaches it, and on the parked connections' timer.
type Crowder interface {
	Admit(c *Conn) bool
	Crowded(c *Conn) bool
}

// Observer takes one observation, in seconds; prometheus.Histogram is one.
type Observer interface{ Observe(float64) }

// Config is the network side's configuration. Validate fills defaults.
type Config struct {
	Backend     Backend
	Limits      codec.Limits
	MaxConns    int // open connections; more are accepted and closed at once
	MaxInflight int // unanswered requests per connection, not counting queued acquires, before it stops being read
	MaxOutbound int // unsent answer bytes per connection before it stops being read
	Loops       int // event loops; 0: one per core
	// SendBuffer is SO_SNDBUF for accepted connections; 0 keeps the
	// kernel's autotuned size (megabytes on Linux). A small one bounds the
	// kernel memory a slow reader holds, at the cost of more writes.
	SendBuffer int
	// LockThreads keeps each event loop on one OS thread. Unlocked, a loop
	// that blocked in epoll_wait often came back on another thread (the
	// scheduler had handed its P on meanwhile), a hand-off that queues it
	// behind whatever runs there: on 2 cores shared with the clients that
	// was a fifth to a quarter of the depth-1 p99
	// (bench/results/lock-threads.txt).
	LockThreads bool
	Logger      *zap.Logger
	Latency     Observer // optional: time from read to write of each batch

	// IdleTimeout closes a connection that has had nothing pending (no
	// unanswered request or queued acquire, nothing unsent) and has sent
	// nothing for this long. FrameTimeout closes a connection whose
	// unfinished last frame (bytes without a line end) has waited this long
	// for its end, however slowly it trickles in. 0 turns either off; see
	// DefaultIdleTimeout and DefaultFrameTimeout. Such a close writes no E
	// line, as no code fits: answers already decided are written, queued
	// acquires are withdrawn, and the client takes anything unanswered as
	// failed, as after E.
	IdleTimeout  time.Duration
	FrameTimeout time.Duration
}

// Defaults, chosen so that one connection costs bounded memory: 4,096
// unanswered requests (acquires queued for their key aside: the lock
// table's --max-waiters bounds those) and 1 MiB of unsent answers before it
// stops being read. Late answers (to queued acquires) are written past
// that; a connection whose unsent output reaches hardOutbound times the
// limit is closed as one that does not read.
const (
	DefaultMaxInflight = 4096
	DefaultMaxOutbound = 1 << 20
	maxBatch           = 256 // frames handed to the Backend at once
	hardOutbound       = 16
)

// Suggested timeouts; a zero Config field is off.
//
// Idle connections are not closed by default: the protocol does not tell
// clients that an idle connection may go away, a lock holder may well keep
// one quiet for the whole of a long lease, and --max-conns already bounds
// what idle connections cost. Operators whose clients reconnect (ticketd's
// own do) or whose port is open to untrusted peers should set one.
//
// A frame is at most 1,024 bytes, which any live client sends at once, so a
// line left unfinished for 30 seconds comes from a broken or hostile peer.
// Closing it loses nothing that was ever a request.
const (
	DefaultIdleTimeout  time.Duration = 0
	DefaultFrameTimeout               = 30 * time.Second
)

func (c *Config) validate() error {
	if c.Backend == nil {
		return errors.New("netloop: no backend")
	}
	if c.MaxConns <= 0 {
		return errors.New("netloop: MaxConns must be positive")
	}
	if c.MaxInflight <= 0 {
		c.MaxInflight = DefaultMaxInflight
	}
	if c.MaxOutbound <= 0 {
		c.MaxOutbound = DefaultMaxOutbound
	}
	if c.IdleTimeout < 0 || c.FrameTimeout < 0 {
		return errors.New("netloop: negative timeout")
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	return nil
}

// Stats are cumulative counters and gauges of the network side; they are
// read without stopping it.
type Stats struct {
	Conns       int64 // open now
	Accepted    int64
	Refused     int64 // closed at once: MaxConns reached or out of descriptors
	Acquires    int64
	Releases    int64
	BadFrames   int64
	Paused      int64 // times a connection stopped being read
	LateAnswers int64 // answers written through a mailbox
	Orphans     int64 // grants released because their connection had gone
	IdleClosed  int64 // connections closed by IdleTimeout
	FrameClosed int64 // connections closed by FrameTimeout
	// UnreadClosed counts connections closed with hardOutbound times
	// MaxOutbound unsent: late answers kept coming to a client not reading.
	UnreadClosed int64
	// FloodClosed counts connections closed with hardInbound of requests
	// read and not carried out: a client that kept sending past the
	// backpressure (see Server.hardInbound).
	FloodClosed int64
}

// hardInbound is how much a connection's requests read and not yet carried
// out may hold before it is closed: the most that MaxInflight requests of
// the longest line take, or MaxOutbound if more. A connection over a limit
// is not read, but gnet reads it again, a buffer at a time, whenever its
// unsent output drains (it turns reading back on by itself), while the
// parse takes only as many requests as answers came: a client that sends
// without end and reads in bursts (cluster mode, answers after their
// commits) would grow it for ever.
func (s *Server) hardInbound() int {
	return max(s.cfg.MaxInflight*codec.MaxLine, s.cfg.MaxOutbound)
}

// Server is the network side of one ticketd process.
type Server struct {
	cfg    Config
	log    *zap.Logger
	cli    *gnet.Client
	ln     net.Listener
	reg    registry
	nextID atomic.Uint64

	conns, accepted, refused      atomic.Int64
	acquires, releases, badFrames atomic.Int64
	paused, late, orphans         atomic.Int64
	idleClosed, frameClosed       atomic.Int64
	unreadClosed, floodClosed     atomic.Int64
	parkedWakes                   atomic.Int64 // by parkedLoop (tests)

	timeouts bool      // IdleTimeout or FrameTimeout is set
	epoch    time.Time // origin of the timeout stamps; see timeout.go

	outPool  sync.Pool   // *[]byte answer buffers for one OnTraffic
	latePool sync.Pool   // *lateSet
	renewer  LateRenewer // the Backend, if it is one
	crowd    Crowder     // likewise
	reqPool  sync.Pool   // *[]codec.Request

	parked     parkedSet
	stopOnce   sync.Once
	done       chan struct{}
	cut        chan struct{} // closed when Stop stops waiting for the writers after EOF (unsent.go)
	stopping   atomic.Bool   // Stop has begun: every connection lingers
	unsentBusy atomic.Int64  // closed connections whose unsent output is being written or released (unsent.go)
	acceptWG   sync.WaitGroup

	enrollWarned atomic.Int64 // unix ns of the last failed enroll's warning
}

// New prepares a server; Serve starts it.
func New(cfg Config) (*Server, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: cfg.Logger, done: make(chan struct{}), cut: make(chan struct{})}
	s.timeouts = cfg.IdleTimeout > 0 || cfg.FrameTimeout > 0
	s.epoch = time.Now()
	s.reg.init()
	s.parked.init()
	s.outPool.New = func() any { b := make([]byte, 0, 16<<10); return &b }
	s.reqPool.New = func() any { r := make([]codec.Request, 0, maxBatch); return &r }
	s.latePool.New = func() any { return new(lateSet) }
	s.renewer, _ = cfg.Backend.(LateRenewer)
	s.crowd, _ = cfg.Backend.(Crowder)
	opts := []gnet.Option{
		gnet.WithTCPNoDelay(gnet.TCPNoDelay),
		gnet.WithLogger(cfg.Logger.Sugar()),
		gnet.WithTCPKeepAlive(time.Minute),
	}
	if cfg.SendBuffer > 0 {
		opts = append(opts, gnet.WithSocketSendBuffer(cfg.SendBuffer))
	}
	if cfg.LockThreads {
		opts = append(opts, gnet.WithLockOSThread(true))
	}
	if cfg.Loops > 0 {
		opts = append(opts, gnet.WithNumEventLoop(cfg.Loops))
	} else {
		opts = append(opts, gnet.WithMulticore(true))
	}
	cli, err := gnet.NewClient(&handler{s: s}, opts...)
	if err != nil {
		return nil, err
	}
	s.cli = cli
	return s, nil
}

// Serve starts the event loops and accepts connections from ln until Stop.
// It returns once the loops run; accepting goes on in the background.
func (s *Server) Serve(ln net.Listener) error {
	if err := s.cli.Start(); err != nil {
		return err
	}
	s.ln = ln
	s.acceptWG.Add(2)
	go s.acceptLoop()
	go s.parkedLoop()
	if s.timeouts {
		s.acceptWG.Add(1)
		go s.timeoutLoop()
	}
	return nil
}

// StopAccepting closes the listener; open connections keep being served.
func (s *Server) StopAccepting() {
	if s.ln != nil {
		_ = s.ln.Close()
	}
}

// Stop closes the listener and every connection, after writing what their
// mailboxes hold and letting each linger until its client has what it was
// written (lingerFor at most). It waits at most until ctx ends, then for
// the grants that did not get out to be given back.
func (s *Server) Stop(ctx context.Context) error {
	var err error
	s.stopOnce.Do(func() {
		s.StopAccepting()
		close(s.done)
		s.acceptWG.Wait()
		s.drainMailboxes(ctx)
		s.lingerAll(ctx)
		// Writers after EOF still running give up now, their unwritten
		// grants given back: after Stop returns, a release would come
		// after single mode's snapshot, which would keep the grants.
		close(s.cut)
		err = s.cli.Stop()
		for s.unsentBusy.Load() > 0 { // quick once cut: releases only
			time.Sleep(time.Millisecond)
		}
	})
	return err
}

// lingerAll has every connection linger (see handler.linger), and waits
// until all have closed, lingerFor has passed or ctx ends. Closed at once,
// a connection whose client read slowly lost what gnet had not written
// yet, and one with input unread (paused for its unsent output) was reset,
// its client losing what its own kernel had not sent either: among it the
// T of its queued acquires, which the protocol promises at shutdown.
func (s *Server) lingerAll(ctx context.Context) {
	s.stopping.Store(true)
	end := time.Now().Add(lingerFor)
	for {
		open := 0
		s.reg.each(func(c *Conn) {
			open++
			// The parked loop has stopped: look again, one wake in
			// flight per connection (gnet's task queue has no bound).
			if c.woken.CompareAndSwap(false, true) {
				c.wake()
			}
		})
		if open == 0 && s.unsentBusy.Load() == 0 || time.Now().After(end) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(parkedEvery):
		}
	}
}

// drainMailboxes gives late answers already posted (the T of waiters
// answered at shutdown) a chance to reach their sockets before close.
func (s *Server) drainMailboxes(ctx context.Context) {
	for {
		pending := false
		s.reg.each(func(c *Conn) {
			c.mu.Lock()
			if len(c.mail) > 0 {
				pending = true
			}
			c.mu.Unlock()
		})
		if !pending {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// Loops is the number of event loops.
func (s *Server) Loops() int {
	if s.cfg.Loops > 0 {
		return s.cfg.Loops
	}
	return runtime.NumCPU() // gnet's multicore count
}

// Conn returns the open connection with that id, or nil.
func (s *Server) Conn(id uint64) *Conn { return s.reg.get(id) }

// Open is how many connections are open now.
func (s *Server) Open() int64 { return s.conns.Load() }

// Stats reads the counters.
func (s *Server) Stats() Stats {
	return Stats{
		Conns:        s.conns.Load(),
		Accepted:     s.accepted.Load(),
		Refused:      s.refused.Load(),
		Acquires:     s.acquires.Load(),
		Releases:     s.releases.Load(),
		BadFrames:    s.badFrames.Load(),
		Paused:       s.paused.Load(),
		LateAnswers:  s.late.Load(),
		Orphans:      s.orphans.Load(),
		IdleClosed:   s.idleClosed.Load(),
		FrameClosed:  s.frameClosed.Load(),
		UnreadClosed: s.unreadClosed.Load(),
		FloodClosed:  s.floodClosed.Load(),
	}
}
