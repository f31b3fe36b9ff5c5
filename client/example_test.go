package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/ticketd/ticketd/client"
)

// Hold a lock around a piece of work. The lease bounds how long the lock
// outlives a crashed holder; the release ends it early.
func Example() {
	ctx := context.Background()
	cl, err := client.Dial(ctx, "127.0.0.1:7411")
	if err != nil {
		log.Fatal(err) // e.g. connection refused: is ticketd running?
	}
	defer cl.Close()

	lock, err := cl.Acquire(ctx, "invoices", 30*time.Second, 10*time.Second)
	if errors.Is(err, client.ErrHeld) {
		fmt.Println("someone else is on it")
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	defer cl.Release(ctx, lock)

	// Work until lock.Deadline at the latest, and send lock.Token with
	// every write to the guarded resource (see the Fencing example).
	fmt.Println("holding", lock.Key, "with token", lock.Token, "for", time.Until(lock.Deadline).Round(time.Second))
}

// store is a resource guarded by ticketd locks: it remembers, per key, the
// highest token that has written, and refuses writes with a lower one.
type store struct {
	mu      sync.Mutex
	highest map[string]uint64
	data    map[string]string
}

func (s *store) Write(key string, token uint64, value string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h := s.highest[key]; token < h {
		return fmt.Errorf("token %d refused: %d has written to %s since", token, h, key)
	}
	s.highest[key] = token
	s.data[key] = value
	return nil
}

// The token is a fencing token. A holder can stall past the end of its lease
// (a GC pause, a slow disk) and wake up believing it still holds the lock.
// The resource, not the holder, makes that safe: it refuses writes that
// carry a token lower than one it has already seen.
func Example_fencing() {
	s := &store{highest: map[string]uint64{}, data: map[string]string{}}

	// Worker A was granted token 33, then stalled past its lease. Worker B
	// was granted the key next, with token 34, and wrote.
	a := client.Lock{Key: "invoices", Token: 33}
	b := client.Lock{Key: "invoices", Token: 34}
	fmt.Println(s.Write(b.Key, b.Token, "total=120"))

	// A wakes up and writes with its old token: refused.
	fmt.Println(s.Write(a.Key, a.Token, "total=100"))

	// B's later writes, with the same token, go through.
	fmt.Println(s.Write(b.Key, b.Token, "total=130"), s.data["invoices"])
	// Output:
	// <nil>
	// token 33 refused: 34 has written to invoices since
	// <nil> total=130
}

// Bound a call with a context. A wait longer than the context's deadline is
// cut to it; a cancelled acquire that the server grants later is released by
// the client.
func ExampleClient_Acquire() {
	cl, err := client.Dial(context.Background(), "127.0.0.1:7411")
	if err != nil {
		log.Fatal(err)
	}
	defer cl.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	lock, err := cl.Acquire(ctx, "reports/daily", time.Minute, time.Hour)
	switch {
	case err == nil:
		defer cl.Release(context.Background(), lock)
		fmt.Println("token", lock.Token)
	case errors.Is(err, client.ErrHeld), errors.Is(err, context.DeadlineExceeded):
		fmt.Println("still held by someone else after 2s")
	case errors.Is(err, client.ErrBusy):
		fmt.Println("server at capacity; retry later")
	case errors.Is(err, client.ErrOutcomeUnknown):
		// The connection broke with the request in flight: it may have been
		// granted. Nobody knows its token, so it stays held until its lease
		// (a minute) ends. Retrying at once would likely see ErrHeld.
		fmt.Println("outcome unknown:", err)
	default:
		log.Fatal(err)
	}
}

// A release can fail because the lease ended and someone else took the key:
// the work done since the deadline was not protected by the lock.
func ExampleClient_Release() {
	ctx := context.Background()
	cl, err := client.Dial(ctx, "127.0.0.1:7411,127.0.0.2:7411")
	if err != nil {
		log.Fatal(err)
	}
	defer cl.Close()

	lock, err := cl.Acquire(ctx, "invoices", 5*time.Second, 0)
	if err != nil {
		log.Fatal(err)
	}
	// ... work ...
	switch err := cl.Release(ctx, lock); {
	case err == nil:
	case errors.Is(err, client.ErrNotHeld):
		fmt.Println("the lease ended before the release; another holder may have run meanwhile")
	default:
		fmt.Println("release failed, the lease ends at", lock.Deadline, ":", err)
	}
}

// Keep many acquires in flight from one goroutine: each func queues the
// next request itself, and the connection's reader runs it as the answer
// comes, so no goroutine waits per lock. The funcs must not block.
func ExampleClient_AcquireFunc() {
	cl, err := client.Dial(context.Background(), "127.0.0.1:7411")
	if err != nil {
		log.Fatal(err)
	}
	defer cl.Close()

	jobs := []string{"job-1", "job-2", "job-3"}
	var wg sync.WaitGroup
	wg.Add(len(jobs))
	for _, job := range jobs {
		err := cl.AcquireFunc(job, time.Minute, 0, func(l client.Lock, err error) {
			if err != nil { // ErrHeld: another worker has it
				wg.Done()
				return
			}
			go func() { // the work may block: not on the reader's goroutine
				defer wg.Done()
				fmt.Println("running", l.Key, "with token", l.Token)
				cl.ReleaseNoWait(l)
			}()
		})
		if err != nil {
			wg.Done()
		}
	}
	wg.Wait()
}
