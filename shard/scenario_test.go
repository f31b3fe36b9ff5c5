package shard

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Scenario files (testdata/*.txt) drive a table on virtual time. A line is a command, a
// "#" comment or blank; the lines under a command indented by two spaces are its expected
// output. go test ./shard -run TestScenarios -rewrite regenerates the expected output
// (keeping commands and comments): read the diff before keeping it.
//
// Commands (times like 10ms or 1m30s, counted from 0; at= never goes back, default: the
// previous at):
//
//	new [max-keys=N] [max-waiters-per-key=N] [max-waiters=N] [budget=N] [replicated]
//	acquire [node=N] conn=N seq=N owner=S key=S lease=MS wait=MS [at=T]
//	release [node=N] conn=N seq=N key=S token=N [at=T]
//	expire key=S token=N [at=T]
//	waittimeout [node=N] conn=N seq=N key=S [at=T]
//	withdraw [node=N] conn=N [at=T]
//	tick [at=T] | sweep [at=T] | due [at=T] | next | stats | state
//	grace until=T | settoken token=N | snapshot   (round trip into a new table)
//
// Answers print as on the wire, then the requester as node/conn/seq and, for A, the lease
// end. Every command is followed by a check of the table's internal invariants.
var rewrite = flag.Bool("rewrite", false, "rewrite the expected output of testdata/*.txt")

func TestScenarios(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scenario files: %v", err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) { runScenarioFile(t, f) })
	}
}

func runScenarioFile(t *testing.T, path string) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	s := &scenario{tb: New(Config{})}
	var outFile strings.Builder
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if strings.HasPrefix(line, "  ") {
			t.Fatalf("%s:%d: output line without a command", path, i+1)
		}
		outFile.WriteString(line + "\n")
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue
		}
		var want []string
		for i+1 < len(lines) && strings.HasPrefix(lines[i+1], "  ") {
			i++
			want = append(want, strings.TrimPrefix(lines[i], "  "))
		}
		got, err := s.run(trimmed)
		if err != nil {
			t.Fatalf("%s:%d: %s: %v", path, i+1-len(want), trimmed, err)
		}
		if err := checkTable(s.tb); err != nil {
			t.Fatalf("%s:%d: %s: invariant: %v", path, i+1-len(want), trimmed, err)
		}
		for _, g := range got {
			outFile.WriteString("  " + g + "\n")
		}
		if !*rewrite && !slices.Equal(got, want) {
			t.Errorf("%s:%d: %s\n got:\n  %s\nwant:\n  %s", path, i+1-len(want), trimmed,
				strings.Join(got, "\n  "), strings.Join(want, "\n  "))
		}
	}
	if *rewrite {
		if err := os.WriteFile(path, []byte(outFile.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

type scenario struct {
	tb  *Table
	cfg Config
	now int64
	out []Answer
}

type args map[string]string

func (a args) str(k string) (string, error) {
	v, ok := a[k]
	if !ok {
		return "", fmt.Errorf("missing %s=", k)
	}
	return v, nil
}

func (a args) num(k string, def uint64, required bool) (uint64, error) {
	v, ok := a[k]
	if !ok {
		if required {
			return 0, fmt.Errorf("missing %s=", k)
		}
		return def, nil
	}
	return strconv.ParseUint(v, 10, 64)
}

func (a args) dur(k string, def int64) (int64, error) {
	v, ok := a[k]
	if !ok {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	return int64(d), err
}

func (s *scenario) run(line string) ([]string, error) {
	f := strings.Fields(line)
	a := args{}
	for _, kv := range f[1:] {
		k, v, _ := strings.Cut(kv, "=")
		a[k] = v
	}
	at, err := a.dur("at", s.now)
	if err != nil {
		return nil, err
	}
	if at < s.now {
		return nil, fmt.Errorf("at=%v goes back from %v", time.Duration(at), time.Duration(s.now))
	}
	s.now = at
	req := func() (Requester, error) {
		node, err := a.num("node", 0, false)
		if err != nil {
			return Requester{}, err
		}
		conn, err := a.num("conn", 0, true)
		if err != nil {
			return Requester{}, err
		}
		seq, err := a.num("seq", 0, f[0] != "withdraw" && f[0] != "withdraw-below")
		return Requester{Node: uint32(node), Conn: conn, Seq: seq}, err
	}
	c := Command{}
	switch f[0] {
	case "new":
		cfg := Config{}
		for k, v := range a {
			n, _ := strconv.Atoi(v)
			switch k {
			case "max-keys":
				cfg.MaxKeys = n
			case "max-waiters-per-key":
				cfg.MaxWaitersPerKey = n
			case "max-waiters":
				cfg.MaxWaiters = n
			case "budget":
				cfg.Keys = NewBudget(n)
			case "replicated":
				cfg.Replicated = true
			default:
				return nil, fmt.Errorf("unknown option %s", k)
			}
		}
		s.cfg, s.tb, s.now = cfg, New(cfg), 0
		return nil, nil
	case "acquire":
		c.Op = OpAcquire
		if c.From, err = req(); err != nil {
			return nil, err
		}
		owner, err1 := a.str("owner")
		key, err2 := a.str("key")
		lease, err3 := a.num("lease", 0, true)
		wait, err4 := a.num("wait", 0, true)
		for _, e := range []error{err1, err2, err3, err4} {
			if e != nil {
				return nil, e
			}
		}
		c.Owner, c.Key, c.LeaseMs, c.WaitMs = []byte(owner), []byte(key), lease, wait
	case "release":
		c.Op = OpRelease
		if c.From, err = req(); err != nil {
			return nil, err
		}
		key, err1 := a.str("key")
		tok, err2 := a.num("token", 0, true)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("%v %v", err1, err2)
		}
		c.Key, c.Token = []byte(key), tok
	case "expire":
		c.Op = OpExpire
		key, err1 := a.str("key")
		tok, err2 := a.num("token", 0, true)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("%v %v", err1, err2)
		}
		c.Key, c.Token = []byte(key), tok
	case "waittimeout":
		c.Op = OpWaitTimeout
		if c.From, err = req(); err != nil {
			return nil, err
		}
		key, err := a.str("key")
		if err != nil {
			return nil, err
		}
		c.Key = []byte(key)
	case "withdraw", "withdraw-below":
		c.Op = OpWithdraw
		if f[0] == "withdraw-below" {
			c.Op = OpWithdrawBelow
		}
		if c.From, err = req(); err != nil {
			return nil, err
		}
	case "tick":
		return s.answers(s.tb.Tick(s.now, s.out[:0])), nil
	case "sweep":
		return []string{fmt.Sprintf("swept %d", s.tb.Sweep(s.now))}, nil
	case "due":
		cmds := s.tb.Due(s.now, nil)
		if len(cmds) == 0 {
			return []string{"(nothing due)"}, nil
		}
		var r []string
		for _, c := range cmds {
			r = append(r, fmtCommand(&c))
		}
		return r, nil
	case "next":
		d, ok := s.tb.NextDeadline()
		if !ok {
			return []string{"next none"}, nil
		}
		return []string{"next " + fmtTime(d)}, nil
	case "stats":
		st := s.tb.Stats()
		return []string{
			fmt.Sprintf("keys=%d waiters=%d last-token=%d max-deadline=%s", st.Keys, st.Waiters, st.LastToken, fmtTime(s.tb.MaxDeadline())),
			fmt.Sprintf("grants=%d hand-overs=%d expiries=%d timed-out=%d busy=%d released=%d not-released=%d swept=%d withdrawn=%d",
				st.Grants, st.HandOvers, st.Expiries, st.TimedOut, st.Busy, st.Released, st.NotReleased, st.Swept, st.Withdrawn),
		}, nil
	case "state":
		return dumpTable(s.tb), nil
	case "grace":
		until, err := a.dur("until", 0)
		if err != nil {
			return nil, err
		}
		s.tb.SetGrace(until)
		return nil, nil
	case "settoken":
		tok, err := a.num("token", 0, true)
		if err != nil {
			return nil, err
		}
		s.tb.SetLastToken(tok)
		return nil, nil
	case "snapshot":
		var b1, b2 bytes.Buffer
		if err := s.tb.WriteSnapshot(&b1); err != nil {
			return nil, err
		}
		cfg := s.cfg
		if cfg.Keys != nil {
			cfg.Keys = NewBudget(cfg.Keys.Max())
		}
		t2 := New(cfg)
		if err := t2.ReadSnapshot(bytes.NewReader(b1.Bytes())); err != nil {
			return nil, err
		}
		if err := t2.WriteSnapshot(&b2); err != nil {
			return nil, err
		}
		if !bytes.Equal(b1.Bytes(), b2.Bytes()) {
			return nil, fmt.Errorf("snapshot of the restored table differs")
		}
		s.tb = t2
		return []string{fmt.Sprintf("restored %d bytes", b1.Len())}, nil
	default:
		return nil, fmt.Errorf("unknown command %q", f[0])
	}
	return s.answers(s.tb.Apply(s.now, &c, s.out[:0])), nil
}

func (s *scenario) answers(out []Answer) []string {
	s.out = out
	if len(out) == 0 {
		return []string{"(no answer)"}
	}
	r := make([]string, len(out))
	for i, a := range out {
		r[i] = fmtAnswer(&a)
	}
	return r
}

func fmtTime(ns int64) string { return time.Duration(ns).String() }

func fmtReq(r Requester) string { return fmt.Sprintf("%d/%d/%d", r.Node, r.Conn, r.Seq) }

func fmtAnswer(a *Answer) string {
	switch a.Result {
	case Acquired:
		return fmt.Sprintf("A %d %s %s to=%s deadline=%s", a.Token, a.Owner, a.Key, fmtReq(a.To), fmtTime(a.Deadline))
	case TimedOut, Busy:
		return fmt.Sprintf("%c %s %s to=%s", a.Result.Letter(), a.Owner, a.Key, fmtReq(a.To))
	default:
		return fmt.Sprintf("%c %d %s to=%s", a.Result.Letter(), a.Token, a.Key, fmtReq(a.To))
	}
}

func fmtCommand(c *Command) string {
	switch c.Op {
	case OpExpire:
		return fmt.Sprintf("expire key=%s token=%d", c.Key, c.Token)
	case OpWaitTimeout:
		return fmt.Sprintf("waittimeout from=%s key=%s", fmtReq(c.From), c.Key)
	}
	return fmt.Sprintf("%v %+v", c.Op, *c)
}

// dumpTable lists the registered keys in key order with holder and queue.
func dumpTable(t *Table) []string {
	var keys []string
	t.keys.each(func(e *entry) {
		if e.live {
			keys = append(keys, string(e.key))
		}
	})
	slices.Sort(keys)
	if len(keys) == 0 {
		return []string{"(no keys)"}
	}
	var r []string
	for _, k := range keys {
		e := t.keys.get([]byte(k))
		holder := fmt.Sprintf("token=%d", e.token)
		if e.token == 0 {
			holder = "grace"
		}
		line := fmt.Sprintf("%s %s deadline=%s", k, holder, fmtTime(e.deadline))
		for w := e.head; w != nil; w = w.next {
			line += fmt.Sprintf(" | %s %s lease=%dms wait-until=%s", fmtReq(w.from), w.owner, w.leaseMs, fmtTime(w.wait))
		}
		r = append(r, line)
	}
	return r
}
