package e2e

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// A churn of hour-long leases, each released at once, and of minutes-long
// ones held for a moment, stops with some of the latter still held, while
// sweeps every 100 ms lower the durable lease ceiling. Read from the state
// file every millisecond meanwhile, the ceiling on disk never stands below
// a lease a client holds; and after a kill -9 at a random moment the
// restart's crash grace covers them, having come down from the hour in
// some rounds.
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
		watched := make(chan struct{})
		var reads int
		var bad error
		go func() {
			defer close(watched)
			reads, bad = ch.watchCeiling(filepath.Join(dir, "ticketd.state"))
		}()
		time.Sleep(500*time.Millisecond + time.Duration(rng.Int64N(int64(time.Second))))
		ch.mu.Lock()
		ch.stopping = true
		ch.mu.Unlock()
		wg.Wait()
		time.Sleep(time.Duration(rng.Int64N(int64(time.Second))))
		ch.mu.Lock()
		s.kill()
		ch.killed = true
		ch.mu.Unlock()
		<-watched
		if bad != nil {
			t.Fatalf("round %d: %v", round, bad)
		}
		if ch.err != nil || ch.grants == 0 || len(ch.held) == 0 || reads == 0 {
			t.Fatalf("round %d: the clients did not run (%d grants, %d held, %d reads of the ceiling): %v",
				round, ch.grants, len(ch.held), reads, ch.err)
		}
		var latest time.Time
		for _, end := range ch.held {
			if end.After(latest) {
				latest = end
			}
		}

		s = startServerDir(t, dir, "--admin", "127.0.0.1:0")
		v, err := s.metric("ticketd_crash_grace_seconds")
		if err != nil {
			t.Fatal(err)
		}
		graceEnd := time.Now().Add(time.Duration(v * float64(time.Second)))
		t.Logf("round %d: %d grants, %d reads of the ceiling, %d leases held at the kill, the latest ending %v after the restart; grace %.1fs",
			round, ch.grants, reads, len(ch.held), time.Until(latest).Round(time.Millisecond), v)
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
// (sent + lease). Under mu.
type churn struct {
	mu       sync.Mutex
	held     map[string]time.Time
	stopping bool // each client stops, keeping what it holds but an hour's lease
	killed   bool
	grants   int
	err      error // the first client's failure
}

// watchCeiling reads the lease ceiling from the state file every
// millisecond until the kill, each time with the clients held still (mu):
// every lease they hold has had no release sent, so the ceiling on disk
// must cover it. Reads the server's in-place overwrite tore are skipped.
func (ch *churn) watchCeiling(path string) (reads int, err error) {
	for {
		time.Sleep(time.Millisecond)
		ch.mu.Lock()
		if ch.killed {
			ch.mu.Unlock()
			return reads, nil
		}
		ceil, ok := readLeaseCeil(path)
		if ok {
			reads++
			for key, end := range ch.held {
				if ceil < end.UnixNano() {
					ch.mu.Unlock()
					return reads, fmt.Errorf("the lease ceiling on disk is %v before the end of %s, a lease held",
						end.Sub(time.Unix(0, ceil)), key)
				}
			}
		}
		ch.mu.Unlock()
	}
}

// readLeaseCeil reads the lease ceiling from a state record
// (ARCHITECTURE.md: 64 bytes, CRC-32C last).
func readLeaseCeil(path string) (int64, bool) {
	b, err := os.ReadFile(path)
	if err != nil || len(b) != 64 || string(b[:8]) != "TICKETD\x01" ||
		crc32.Checksum(b[:60], crc32.MakeTable(crc32.Castagnoli)) != binary.BigEndian.Uint32(b[60:]) {
		return 0, false
	}
	return int64(binary.BigEndian.Uint64(b[32:])), true
}

const hour = 3_600_000

func (ch *churn) fail(err error) {
	ch.mu.Lock()
	if ch.err == nil {
		ch.err = err
	}
	ch.mu.Unlock()
}

func (ch *churn) worker(addr string, w int, rng *rand.Rand) {
	c, err := net.DialTimeout("tcp", addr, readTimeout)
	if err != nil {
		ch.fail(err)
		return
	}
	defer c.Close()
	r := bufio.NewReader(c)
	ask := func(line string) []string {
		_ = c.SetDeadline(time.Now().Add(readTimeout))
		if _, err := c.Write([]byte(line + "\n")); err != nil {
			ch.fail(err)
			return nil
		}
		a, err := r.ReadString('\n')
		if err != nil {
			ch.fail(err)
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
		if len(a) != 4 || a[0] != "A" {
			ch.fail(fmt.Errorf("got %q to an acquire of a free key", strings.Join(a, " ")))
			return
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
		if a := ask(fmt.Sprintf("R %d %s", tok, key)); a == nil {
			return
		} else if a[0] != "R" {
			ch.fail(fmt.Errorf("got %q to the release of a lease held", strings.Join(a, " ")))
			return
		}
	}
}
