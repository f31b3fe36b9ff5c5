package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// burstMain dials a burst of connections as a client fleet does when it
// reconnects all at once, then makes one round trip on each (a release of a
// key nobody holds, answered N and changing nothing), and says how long
// the slowest took. A connection the server did not take from its listen
// backlog in time waits out a SYN retransmit (1 s, then 3 s): the answers
// later than a second count those.
func burstMain(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlagSet("burst")
	addr := fs.String("addr", "", "ticketd address")
	n := fs.Int("conns", 5000, "connections")
	if err := fs.Parse(args); err != nil {
		return err
	}
	over0 := listenOverflows()
	t0 := time.Now()
	ncs, err := DialMany(ctx, *addr, *n, nil)
	if err != nil {
		return err
	}
	dialled := time.Since(t0)
	defer func() {
		for _, nc := range ncs {
			nc.Close()
		}
	}()
	var (
		mu      sync.Mutex
		slowest time.Duration
		late    int
		first   error
		wg      sync.WaitGroup
	)
	for i, nc := range ncs {
		wg.Go(func() {
			_ = nc.SetDeadline(time.Now().Add(30 * time.Second))
			_, err := fmt.Fprintf(nc, "R 1 burst-probe-%d\n", i)
			var line string
			if err == nil {
				line, err = bufio.NewReader(nc).ReadString('\n')
			}
			if err == nil && !strings.HasPrefix(line, "N ") {
				err = fmt.Errorf("answered %q, want N", strings.TrimSpace(line))
			}
			d := time.Since(t0)
			mu.Lock()
			defer mu.Unlock()
			if err != nil && first == nil {
				first = fmt.Errorf("connection %d: %w", i, err)
			}
			slowest = max(slowest, d)
			if d > time.Second {
				late++
			}
		})
	}
	wg.Wait()
	if first != nil {
		return first
	}
	fmt.Fprintf(stdout, "%d connections dialled in %v, all answered %v after the first dial, %d later than 1s",
		*n, dialled.Round(time.Millisecond), slowest.Round(time.Millisecond), late)
	if over0 >= 0 {
		fmt.Fprintf(stdout, "; listen overflows on this host +%d", listenOverflows()-over0)
	}
	fmt.Fprintln(stdout)
	return nil
}

// listenOverflows reads the host's TcpExt ListenOverflows counter (SYNs and
// handshakes dropped because a listen backlog was full), or -1.
func listenOverflows() int64 {
	b, err := os.ReadFile("/proc/net/netstat")
	if err != nil {
		return -1
	}
	lines := strings.Split(string(b), "\n")
	for i := 0; i+1 < len(lines); i++ {
		names, values := strings.Fields(lines[i]), strings.Fields(lines[i+1])
		if len(names) == 0 || names[0] != "TcpExt:" || len(values) != len(names) {
			continue
		}
		for j, name := range names {
			if name == "ListenOverflows" {
				v, err := strconv.ParseInt(values[j], 10, 64)
				if err != nil {
					return -1
				}
				return v
			}
		}
	}
	return -1
}
