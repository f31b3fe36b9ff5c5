package bench

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// floodMain plays clients that pipeline without end and never read: each
// connection sends acquires of keys of its own (wait 0) for the duration,
// and the server's backpressure is all that slows it. It says how much
// went out; what it did to the server is read off the server (RSS,
// /metrics) and off a well-behaved client run beside it.
func floodMain(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlagSet("flood")
	addr := fs.String("addr", "", "ticketd address")
	n := fs.Int("conns", 500, "connections")
	d := fs.Duration("duration", 25*time.Second, "how long to send")
	keys := fs.Int("keys", 2000, "keys per connection, acquired in turn")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ncs, err := DialMany(ctx, *addr, *n, nil)
	if err != nil {
		return err
	}
	end := time.Now().Add(*d)
	var sent atomic.Int64
	var wg sync.WaitGroup
	for i, nc := range ncs {
		wg.Go(func() {
			defer nc.Close()
			var b []byte
			for j := range *keys {
				b = fmt.Appendf(b, "A o%d k%d-%d 30000 0\n", i, i, j)
			}
			for time.Now().Before(end) && ctx.Err() == nil {
				_ = nc.SetWriteDeadline(end)
				k, err := nc.Write(b)
				sent.Add(int64(k))
				if err != nil {
					if ne, ok := err.(net.Error); ok && ne.Timeout() {
						return
					}
					fmt.Fprintf(stdout, "connection %d: %v\n", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	fmt.Fprintf(stdout, "flood %s: %d connections sent %.1f MB in %v without reading\n", *addr, *n, float64(sent.Load())/1e6, *d)
	return nil
}
