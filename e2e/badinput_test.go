package e2e

import (
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestBadInput: every kind of bad frame gets exactly one "E <code> <text>"
// line after the answers to the valid requests before it, then the close;
// nothing after it is carried out and no lock state changes.
func TestBadInput(t *testing.T) {
	t.Parallel()
	s := startServer(t, "--max-lease", "1m", "--max-wait", "10s")

	// A bystander holds a key across all cases and must keep being served.
	by := s.dial(t)
	byTok := by.acquire("bystander", "by", 60000, 0)

	// %[1]s is the key the bad frame names; %[2]s the key acquired just before it.
	cases := []struct {
		name, frame, code string
	}{
		{"empty line", "\n", "syntax"},
		{"empty line crlf", "\r\n", "syntax"},
		{"acquire with 3 fields", "A o %[1]s 1000\n", "syntax"},
		{"acquire with 5 fields", "A o %[1]s 1000 0 0\n", "syntax"},
		{"acquire alone", "A\n", "syntax"},
		{"release with 1 field", "R 5\n", "syntax"},
		{"release with 3 fields", "R 5 %[1]s x\n", "syntax"},
		{"double space", "A o  %[1]s 1000 0\n", "syntax"},
		{"double space in release", "R 5  %[1]s\n", "syntax"},
		{"trailing space", "A o %[1]s 1000 0 \n", "syntax"},
		{"lower-case acquire", "a o %[1]s 1000 0\n", "command"},
		{"lower-case release", "r 5 %[2]s\n", "command"},
		{"unknown command", "X o %[1]s 1000 0\n", "command"},
		{"long command", "AA o %[1]s 1000 0\n", "command"},
		{"word command", "RELEASE 5 %[2]s\n", "command"},
		{"bad number lease", "A o %[1]s 10x0 0\n", "syntax"},
		{"bad number wait", "A o %[1]s 1000 zero\n", "syntax"},
		{"bad number token", "R 1.5 %[2]s\n", "syntax"},
		{"hex token", "R 0x10 %[2]s\n", "syntax"},
		{"exponent lease", "A o %[1]s 1e3 0\n", "syntax"},
		{"leading zero lease", "A o %[1]s 01000 0\n", "syntax"},
		{"leading zero wait", "A o %[1]s 1000 00\n", "syntax"},
		{"leading zero token", "R 07 %[2]s\n", "syntax"},
		{"plus sign", "A o %[1]s +1000 0\n", "syntax"},
		{"minus sign", "A o %[1]s 1000 -1\n", "syntax"},
		{"negative token", "R -1 %[2]s\n", "syntax"},
		{"lease 0", "A o %[1]s 0 0\n", "range"},
		{"lease above --max-lease", "A o %[1]s 60001 0\n", "range"},
		{"lease above 2^64", "A o %[1]s 99999999999999999999999 0\n", "range"},
		{"wait above --max-wait", "A o %[1]s 1000 10001\n", "range"},
		{"token 0", "R 0 %[2]s\n", "range"},
		{"token 2^64", "R 18446744073709551616 %[2]s\n", "range"},
		{"token far above 2^64", "R 99999999999999999999999999 %[2]s\n", "range"},
		{"key of 251 bytes", "A o " + strings.Repeat("k", 251) + " 1000 0\n", "syntax"},
		{"release key of 251 bytes", "R 5 " + strings.Repeat("k", 251) + "\n", "syntax"},
		{"owner of 129 bytes", "A " + strings.Repeat("o", 129) + " %[1]s 1000 0\n", "syntax"},
		{"control byte in key", "A o %[1]s\x01 1000 0\n", "syntax"},
		{"NUL in key", "A o %[1]s\x00 1000 0\n", "syntax"},
		{"tab in key", "A o %[1]s\tx 1000 0\n", "syntax"},
		{"DEL in owner", "A o\x7f %[1]s 1000 0\n", "syntax"},
		{"CR inside a line", "A o %[1]s\r 1000 0\n", "syntax"},
		{"CR CR LF", "A o %[1]s 1000 0\r\r\n", "syntax"},
		{"control byte in release key", "R 5 %[2]s\x1b\n", "syntax"},
		{"1024 bytes with LF", "A o k 1 0 " + strings.Repeat("x", 1024-len("A o k 1 0 ")-1) + "\n", "syntax"},
		{"1024 bytes with CRLF", "A o k 1 0 " + strings.Repeat("x", 1024-len("A o k 1 0 ")-2) + "\r\n", "syntax"},
		{"1025 bytes with CRLF", "A o k 1 0 " + strings.Repeat("x", 1025-len("A o k 1 0 ")-2) + "\r\n", "too-long"},
		{"1025 bytes with LF", "A o k 1 0 " + strings.Repeat("x", 1025-len("A o k 1 0 ")-1) + "\n", "too-long"},
		{"2000 bytes with LF", "A " + strings.Repeat("x", 1997) + "\n", "too-long"},
		{"1025 bytes without newline", "A " + strings.Repeat("x", 1023), "too-long"},
		{"1025 x without newline", strings.Repeat("x", 1025), "too-long"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			badKey := fmt.Sprintf("bad.%d", i)
			preKey := fmt.Sprintf("pre.%d", i)
			postKey := fmt.Sprintf("post.%d", i)
			frame := tc.frame
			if strings.Contains(frame, "%[") {
				frame = fmt.Sprintf(frame, badKey, preKey)
			}
			c := s.dial(t)
			// Valid requests, the bad frame and a valid request after it, in one write.
			payload := acq("pre", preKey, 60000, 0) + "\n" + rel(maxToken, "nokey") + "\n" + frame
			if strings.HasSuffix(frame, "\n") {
				payload += acq("post", postKey, 60000, 0) + "\n"
			}
			c.sendRaw([]byte(payload))
			line := c.next()
			preTok, ok := parseAcquired(line, "pre", preKey)
			if !ok {
				t.Fatalf("want the answer to the acquire before the bad frame, got %q", line)
			}
			c.expect(notRel(maxToken, "nokey"))
			c.expectError(tc.code)

			k := s.dial(t)
			// Nothing after the bad frame was carried out.
			k.acquire("check", postKey, 1000, 0)
			// The bad frame registered nothing.
			k.acquire("check", badKey, 1000, 0)
			// The valid acquire before it holds, by its token, whatever the bad frame said.
			k.send(acq("check", preKey, 1000, 0), rel(preTok, preKey))
			k.expect(timedOut("check", preKey), released(preTok, preKey))
			// Other connections are untouched.
			by.on(t).sync("by")
		})
	}

	t.Run("queued acquire is withdrawn", func(t *testing.T) {
		h := s.dial(t)
		tok := h.acquire("h", "q", 60000, 0)
		c := s.dial(t)
		c.send(acq("w", "q", 60000, 10000))
		c.sync("q")
		c.send("A w q 0 0")
		c.expectError("range")
		time.Sleep(100 * time.Millisecond)
		h.release(tok, "q")
		h.acquire("h", "q", 60000, 0)
	})

	t.Run("only one E for several bad frames", func(t *testing.T) {
		c := s.dial(t)
		c.send("a o k 1 0", "", "R 0 k", "X")
		c.expectError("command")
	})

	by.send(acq("x", "by", 1000, 0), rel(byTok, "by"))
	by.expect(timedOut("x", "by"), released(byTok, "by"))
}

// A client that pipelines past a bad frame while it reads slowly gets every
// answer before the frame, the E line and then the end of the stream: the
// server keeps the connection open, discarding what it sends, until all of
// it is written. Closed at once, gnet dropped what it had not written yet,
// and the unread input made the kernel reset the connection: the client
// lost grants it never heard of, held until their lease ended.
func TestBadFrameReachesASlowReader(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	d, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	_ = d.(*net.TCPConn).SetReadBuffer(4096)
	const n = 5000
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "A slow sr%d 60000 0\n", i)
	}
	b.WriteString("X\n")
	b.WriteString(strings.Repeat("A p q 1 0\n", 20000)) // still coming after the E line
	go func() { _, _ = d.Write([]byte(b.String())) }()
	time.Sleep(1500 * time.Millisecond) // not reading meanwhile
	_ = d.SetReadDeadline(time.Now().Add(20 * time.Second))
	all, err := io.ReadAll(d)
	if err != nil {
		t.Fatalf("after %d bytes: %v; want every answer, the E line and the end of the stream", len(all), err)
	}
	lines := strings.Split(strings.TrimSuffix(string(all), "\n"), "\n")
	if len(lines) != n+1 || lines[n] != "E command unknown command" {
		t.Fatalf("%d lines, the last %q; want %d grants and the E line", len(lines), lines[len(lines)-1], n)
	}
	for i, l := range lines[:n] {
		if f := strings.Fields(l); len(f) != 4 || f[0] != "A" || f[3] != fmt.Sprintf("sr%d", i) {
			t.Fatalf("line %d: %q, want the grant of sr%d", i, l, i)
		}
	}
}

// The answers to requests before a bad frame come before its E line in
// both modes, also where they are known only later (cluster mode: once
// they commit); a queued acquire is withdrawn, not waited for.
func TestBadFrameComesAfterTheAnswersBeforeIt(t *testing.T) {
	t.Parallel()
	bothModes(t, func(t *testing.T, s *server) {
		h := s.dial(t)
		tok := h.acquire("h", "bfq", 60000, 0)
		c := s.dial(t)
		c.send(acq("x", "bfk", 60000, 0), rel(5, "bfnokey"), acq("w", "bfq", 60000, 60000), "X")
		// Any order: in cluster mode each shard answers as it commits.
		got := []string{c.next(), c.next()}
		slices.Sort(got)
		if f := strings.Fields(got[0]); len(f) != 4 || f[0] != "A" || f[2] != "x" || f[3] != "bfk" || got[1] != "N 5 bfnokey" {
			t.Fatalf("the requests before the bad frame answered %q", got)
		}
		c.expectError("command")
		// The queued acquire went with the connection: the key goes to nobody.
		h.release(tok, "bfq")
		h.expectNothing(300 * time.Millisecond)
		k := s.dial(t)
		k.acquire("k", "bfq", 1000, 0)
	})
}
