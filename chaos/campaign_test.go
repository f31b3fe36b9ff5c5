package chaos

import (
	"os"
	"testing"
	"time"

	"github.com/ticketd/ticketd/internal/serverproc"
)

// The quick campaign as a test: CHAOS=1 go test -run TestQuickCampaign
// -timeout 10m ./chaos (CHAOS_OUT keeps the reports in a directory). Off by
// default: it takes about a minute per mode and needs the machine's cores.
func TestQuickCampaign(t *testing.T) {
	if os.Getenv("CHAOS") == "" {
		t.Skip("set CHAOS=1 to run the quick fault campaign")
	}
	bin, err := serverproc.Ticketd()
	if err != nil {
		t.Fatal(err)
	}
	out := os.Getenv("CHAOS_OUT")
	if out == "" {
		out = t.TempDir()
	}
	for _, mode := range []string{"single", "cluster"} {
		t.Run(mode, func(t *testing.T) {
			if mode == "cluster" && !serverproc.SupportsCluster(bin) {
				t.Skip("ticketd has no cluster mode (no --peers flag)")
			}
			o, err := Run(Config{Name: mode + "-quick", Mode: mode, Bin: bin, Duration: 50 * time.Second,
				Seed: uint64(time.Now().UnixNano() % 1_000_000), Out: out, Netns: true,
				GapMin: 1500 * time.Millisecond, GapMax: 3 * time.Second, Progress: testWriter{t}})
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range o.Skipped {
				t.Logf("skipped: %s", s)
			}
			for _, p := range o.Problems {
				t.Errorf("problem: %s", p)
			}
			for _, v := range o.Check.Violations {
				t.Errorf("violation (seed %d): %s", o.Config.Seed, v)
			}
			for _, u := range o.Check.Undecided {
				t.Errorf("not decided (seed %d): %s", o.Config.Seed, u)
			}
			t.Logf("%d operations, %d faults; report %s", len(o.History.Ops), len(o.History.Events), o.Report)
		})
	}
}

func TestMain(m *testing.M) { os.Exit(serverproc.Main(m.Run)) }

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p[:len(p)-1]))
	return len(p), nil
}
