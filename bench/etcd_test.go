package bench

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/ticketd/ticketd/internal/serverproc"
)

// An etcd member that stalls during the run (stopped, its connections
// open) leaves its clients waiting (clientv3 waits for a ready connection
// by default): the run still ends, with an error, soon after its window
// and drain. The suite's context has no deadline; this one's 60 s stands
// in for that. On one key the clients wait in Lock when the time is up,
// and a Lock whose wait failed deletes its key with its client's own
// context, which has no deadline: the run waited for ever (CI: 15 minutes).
func TestEtcdRunEndsWhenAMemberStalls(t *testing.T) {
	bin, err := serverproc.FindEtcd()
	if err != nil {
		t.Skip(err)
	}
	for _, keys := range []int{1000, 1} {
		t.Run(fmt.Sprintf("%d keys", keys), func(t *testing.T) {
			e, err := serverproc.StartEtcd(bin, 3, 30*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer e.Stop(5 * time.Second)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			stalled := e.Members[0].Proc.Pid()
			time.AfterFunc(1500*time.Millisecond, func() { _ = syscall.Kill(stalled, syscall.SIGSTOP) })
			defer func() { _ = syscall.Kill(stalled, syscall.SIGCONT) }()
			t0 := time.Now()
			l := Load{Conns: 6, Warmup: 200 * time.Millisecond, Duration: 3 * time.Second,
				Keys: Dist{Keys: keys}, KeyPrefix: "stall", LeaseMs: 30000}
			res, err := RunEtcdMutex(ctx, e.Endpoints(), l)
			took := time.Since(t0)
			t.Logf("RunEtcdMutex returned after %s: err=%v pairs=%d", took.Round(time.Millisecond), err, res.Pairs)
			if took > 30*time.Second {
				t.Fatalf("the run ended only with its context (%s): with the suite's context, which has no deadline, it hangs", took.Round(time.Second))
			}
			if err == nil {
				t.Fatal("a run whose member stalled reported no error")
			}
		})
	}
}
