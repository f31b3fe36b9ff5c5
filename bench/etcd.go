package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
)

// Etcd is the lock recipe of etcd's own client: concurrency.Mutex Lock and
// Unlock, each client with its session (a lease kept alive) as an
// application would hold one.
const Etcd System = "etcd"

// RunEtcdMutex runs l.Conns clients against the etcd endpoints, each doing
// Lock then Unlock of a mutex on a key chosen as l.Keys says, one pair at a
// time (the Mutex API blocks, so depth is 1). Clients are spread over the
// endpoints, one gRPC connection per endpoint. Latency is per call (Lock,
// Unlock), counted like a request line.
func RunEtcdMutex(ctx context.Context, endpoints []string, l Load) (*Result, error) {
	l.System, l.Depth, l.Addr = Etcd, 1, endpoints[0]
	if err := l.validate(); err != nil {
		return nil, err
	}
	var clients []*clientv3.Client
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	for _, ep := range endpoints {
		c, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: 5 * time.Second,
			Logger: zap.NewNop()})
		if err != nil {
			return nil, fmt.Errorf("etcd client %s: %w", ep, err)
		}
		clients = append(clients, c)
	}
	ttl := max(1, int(l.LeaseMs/1000))
	sessions := make([]*concurrency.Session, l.Conns)
	defer func() {
		// Revoking a session's lease on a member that died waits up to the
		// lease's TTL: the sessions close together, and those still
		// waiting after a while end with their clients' Close.
		var wg sync.WaitGroup
		for _, s := range sessions {
			if s != nil {
				wg.Go(func() { s.Close() })
			}
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
		}
	}()
	for i := range sessions {
		s, err := concurrency.NewSession(clients[i%len(clients)], concurrency.WithTTL(ttl))
		if err != nil {
			return nil, fmt.Errorf("etcd session: %w", err)
		}
		sessions[i] = s
	}

	res := &Result{Load: l, Latency: newHist(), Acquire: newHist(), SendLag: newHist(),
		GrantsPerConn: make([]int64, l.Conns)}
	start := nanotime()
	winStart := start + int64(l.Warmup)
	end := winStart + int64(l.Duration)
	// The calls end with the drain, as Run's pairs do: a member that dies
	// or stalls leaves its clients waiting for a ready connection
	// (clientv3's default), and the run would never end.
	calls, stop := context.WithTimeout(ctx, time.Duration(end-nanotime())+l.Drain)
	defer stop()
	var stopped atomic.Bool
	var mu sync.Mutex
	var firstErr error
	var wg sync.WaitGroup
	for i := range l.Conns {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(l.Seed, uint64(i)))
			lat, acq := newHist(), newHist()
			var lines, pairs, acquired int64
			prefix := "/" + l.KeyPrefix
			for !stopped.Load() && nanotime() < end && ctx.Err() == nil {
				m := concurrency.NewMutex(sessions[i], prefix+strconv.Itoa(rng.IntN(l.Keys.Keys)))
				t0 := nanotime()
				err := m.Lock(calls)
				t1 := nanotime()
				if err == nil {
					err = m.Unlock(calls)
				}
				t2 := nanotime()
				if err != nil {
					if ctx.Err() == nil {
						if calls.Err() != nil {
							err = fmt.Errorf("unanswered %v after the window: %w", l.Drain, err)
						}
						mu.Lock()
						if firstErr == nil {
							firstErr = fmt.Errorf("etcd: client %d: %w", i, err)
						}
						mu.Unlock()
						stopped.Store(true)
					}
					return
				}
				// As the generator counts ticketd's and Redis's answers: by
				// when they came for the counts, by when they were sent for
				// the latencies.
				in := func(t int64) bool { return t >= winStart && t < end }
				if in(t0) {
					record(lat, []int64{t1 - t0})
					record(acq, []int64{t1 - t0})
				}
				if in(t1) {
					record(lat, []int64{t2 - t1})
					lines++
					acquired++
				}
				if in(t2) {
					lines++
					pairs++
				}
			}
			mu.Lock()
			res.Latency.Merge(lat)
			res.Acquire.Merge(acq)
			res.Lines += lines
			res.Pairs += pairs
			res.Acquired += acquired
			res.Released += pairs
			res.GrantsPerConn[i] = acquired
			mu.Unlock()
		})
	}
	// Mutex.Lock whose wait failed deletes its key with its client's own
	// context, which has no deadline: sent to a stalled member, that
	// delete waits for ever (CI saw a run held 15 minutes). Only closing
	// the clients ends it, once the calls' time is up and a second more.
	finished := make(chan struct{})
	go func() {
		select {
		case <-finished:
		case <-calls.Done():
			select {
			case <-finished:
			case <-time.After(time.Second):
				for _, c := range clients {
					_ = c.Close()
				}
			}
		}
	}()
	wg.Wait()
	close(finished)
	res.Window = time.Duration(end - winStart)
	if firstErr != nil {
		return res, firstErr
	}
	return res, ctx.Err()
}
