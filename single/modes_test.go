package single

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/ticketd/ticketd/codec"
)

// modeClient drives one server over one connection and keeps the tokens it
// holds, so that the same script can release "what I hold of key k" on
// servers whose tokens differ.
type modeClient struct {
	c    net.Conn
	r    *bufio.Reader
	held map[string]uint64
}

// batch sends lines (releases written "R held <key>" or "R stale <key>")
// and a probe acquire after them, and returns every answer up to the
// probe's with tokens written as "#": the one thing the two ways of
// applying a batch may order differently.
func (m *modeClient) batch(t *testing.T, round int, lines []string) []string {
	t.Helper()
	var b strings.Builder
	for _, l := range lines {
		switch {
		case strings.HasPrefix(l, "R held "):
			key := strings.TrimPrefix(l, "R held ")
			fmt.Fprintf(&b, "R %d %s\n", m.held[key], key)
		case strings.HasPrefix(l, "R stale "):
			key := strings.TrimPrefix(l, "R stale ")
			fmt.Fprintf(&b, "R %d %s\n", m.held[key]+1_000_000, key)
		default:
			b.WriteString(l + "\n")
		}
	}
	probe := fmt.Sprintf("probe-%d", round)
	fmt.Fprintf(&b, "A probe %s 3600000 0\n", probe)
	if _, err := m.c.Write([]byte(b.String())); err != nil {
		t.Fatal(err)
	}
	_ = m.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var got []string
	var a codec.Answer
	for {
		line, err := m.r.ReadString('\n')
		if err != nil {
			t.Fatalf("round %d: %v after %q", round, err, got)
		}
		if _, err := codec.ParseAnswer([]byte(line), &a); err != nil {
			t.Fatalf("round %d: %q: %v", round, line, err)
		}
		key := string(a.Key)
		switch a.Kind {
		case 'A':
			m.held[key] = a.Token
		case 'R':
			delete(m.held, key)
		}
		if key == probe {
			return got
		}
		if a.Kind == 'A' || a.Kind == 'R' || a.Kind == 'N' {
			f := strings.Fields(line)
			f[1] = "#"
			line = strings.Join(f, " ")
		}
		got = append(got, strings.TrimSpace(line))
	}
}

// One event loop applies a batch in request order under all its shards'
// locks; more apply it shard by shard and put the answers back in order.
// Both must answer the same: random pipelined batches of acquires (some
// queued behind the connection's own holds), releases with the right
// token and with a wrong one, over a few keys of many shards.
func TestHandleModesAgree(t *testing.T) {
	var clients []*modeClient
	for _, loops := range []int{1, 2} {
		addr, stop := startLoops(t, t.TempDir(), loops)
		defer stop()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		clients = append(clients, &modeClient{c: c, r: bufio.NewReader(c), held: map[string]uint64{}})
	}
	rng := rand.New(rand.NewPCG(7, 9))
	for round := range 300 {
		var lines []string
		releasing := map[string]bool{}
		for i := range 1 + rng.IntN(120) {
			key := fmt.Sprintf("key-%d", rng.IntN(24))
			_, held := clients[0].held[key]
			switch {
			case held && !releasing[key] && rng.IntN(3) > 0:
				if rng.IntN(4) == 0 {
					lines = append(lines, "R stale "+key)
				} else {
					lines = append(lines, "R held "+key)
					releasing[key] = true
				}
			case rng.IntN(3) == 0:
				lines = append(lines, fmt.Sprintf("A o%d-%d %s 3600000 3600000", round, i, key)) // queues if held
			default:
				lines = append(lines, fmt.Sprintf("A o%d-%d %s 3600000 0", round, i, key))
			}
		}
		want := clients[0].batch(t, round, lines)
		got := clients[1].batch(t, round, lines)
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Fatalf("round %d: batch\n%s\none loop answered\n%s\ntwo loops answered\n%s",
				round, strings.Join(lines, "\n"), strings.Join(want, "\n"), strings.Join(got, "\n"))
		}
	}
}
