package e2e

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// kill -9 at a random moment after a churn of hour-long leases, each
// released at once, and of minutes-long ones held for a moment, has
// stopped with some of the latter still held, while sweeps every 100 ms
// lower the durable lease ceiling: every restart's crash grace still ends
// at or after the latest lease a client held when the process died, and in
// some rounds it has come down from the hour.
func TestCrashGraceCoversHeldLeasesThroughLowerings(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	lowered := 0
	for round := range 5 {
		dir := t.TempDir()
		s := startServerDir(t, dir, "--sweep-interval", "100ms", "--shards", "4")
		ch := &churn{held: map[string]time.Time{}}
		var wg sync.WaitGroup
		for w := range 6 {
			wg.Go(func() { ch.worker(s.addr, w, rand.New(rand.NewPCG(seed, uint64(100*round+w)))) })
		}
		time.Sleep(500*time.Millisecond + time.Duration(rng.Int64N(int64(time.Second))))
		ch.mu.Lock()
		ch.stopping = true
		ch.mu.Unlock()
		wg.Wait()
		time.Sleep(time.Duration(rng.Int64N(int64(time.Second))))
		s.kill()
		var latest time.Time
		for _, end := range ch.held {
			if end.After(latest) {
				latest = end
			}
		}

		s = startServerDir(t, dir, "--admin", "127.0.0.1:0")
		before := time.Now()
		v, err := s.metric("ticketd_crash_grace_seconds")
		if err != nil {
			t.Fatal(err)
		}
		graceEnd := before.Add(time.Duration(v * float64(time.Second)))
		t.Logf("round %d: %d grants, %d leases held at the kill, the latest ending %v after the restart; grace %.1fs",
			round, ch.grants, len(ch.held), latest.Sub(before).Round(time.Millisecond), v)
		if graceEnd.Before(latest) {
			t.Fatalf("round %d: the crash grace ends %v before a lease still held at the kill",
				round, latest.Sub(graceEnd))
		}
		if v < 30*60 {
			lowered++
		}
		s.kill()
	}
	if lowered == 0 {
		t.Fatal("no round's crash grace came down from the hour's leases released")
	}
}

// churn is the clients of one round: held maps each lease a client holds
// (its grant read, its release not yet sent) to when it ends at the latest
// (sent + lease).
type churn struct {
	mu       sync.Mutex
	held     map[string]time.Time
	stopping bool // each client stops, keeping what it holds but an hour's lease
	grants   int
}

const hour = 3_600_000

func (ch *churn) worker(addr string, w int, rng *rand.Rand) {
	c, err := net.DialTimeout("tcp", addr, readTimeout)
	if err != nil {
		return
	}
	defer c.Close()
	r := bufio.NewReader(c)
	ask := func(line string) []string {
		_ = c.SetDeadline(time.Now().Add(readTimeout))
		if _, err := c.Write([]byte(line + "\n")); err != nil {
			return nil
		}
		a, err := r.ReadString('\n')
		if err != nil {
			return nil
		}
		return strings.Fields(a)
	}
	for n := 0; ; n++ {
		ch.mu.Lock()
		stop := ch.stopping && n >= 2
		ch.mu.Unlock()
		if stop {
			return
		}
		key := fmt.Sprintf("w%d-%d", w, n)
		lease := hour // released at once: what lowers the ceiling
		switch {
		case n < 2:
			lease = 20_000 // held to the end
		case rng.IntN(2) == 0:
			lease = 15_000 + rng.IntN(285_000)
		}
		sent := time.Now()
		a := ask(fmt.Sprintf("A o %s %d 0", key, lease))
		if a == nil {
			return
		}
		if a[0] != "A" {
			continue
		}
		ch.mu.Lock()
		ch.held[key] = sent.Add(time.Duration(lease) * time.Millisecond)
		ch.grants++
		ch.mu.Unlock()
		if n < 2 {
			continue
		}
		if lease != hour {
			time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond)
		}
		ch.mu.Lock()
		if ch.stopping && lease != hour {
			ch.mu.Unlock()
			return
		}
		delete(ch.held, key)
		ch.mu.Unlock()
		tok, _ := strconv.ParseUint(a[1], 10, 64)
		if ask(fmt.Sprintf("R %d %s", tok, key)) == nil {
			return
		}
	}
}
