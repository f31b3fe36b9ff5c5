package netloop

import (
	"bytes"
	"fmt"
	"testing"
	"time"
	"unsafe"
)

// A connection that takes a burst of late answers (a run of hand-overs
// posted while its loop was busy, an Outbox flush) and then goes quiet
// keeps no more than a few answers' worth of mailbox: idle connections
// cost about 1 KiB each.
func TestQuietConnectionKeepsNoBurst(t *testing.T) {
	b := &fakeBackend{}
	_, addr := startServer(t, Config{Backend: b})
	c, r := dial(t, addr)
	_, _ = c.Write([]byte("A w later 1000 5000\n"))
	for deadline := time.Now().Add(5 * time.Second); ; {
		b.mu.Lock()
		n := len(b.parked)
		b.mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("not parked")
		}
		time.Sleep(5 * time.Millisecond)
	}
	b.mu.Lock()
	pc := b.parked[0]
	b.mu.Unlock()
	// One burst of late answers, as an Outbox flush (one PostGrants) or a
	// run of hand-overs posted while the loop is busy would make.
	var buf bytes.Buffer
	var gs []Grant
	const n = 1500
	for i := 0; i < n; i++ {
		fmt.Fprintf(&buf, "A %d o k%d\n", i+1, i)
		gs = append(gs, Grant{Token: uint64(i + 1), Key: []byte(fmt.Sprintf("k%d", i))})
	}
	if !pc.PostGrants(buf.Bytes(), n, gs) {
		t.Fatal("post refused")
	}
	for i := 0; i < n; i++ {
		readLine(t, r)
	}
	time.Sleep(50 * time.Millisecond)
	pc.mu.Lock()
	m, g, k := cap(pc.mail), cap(pc.grants), cap(pc.keys)
	pc.mu.Unlock()
	held := m + g*int(unsafe.Sizeof(grant{})) + k
	if most := 2*keepMail + keepGrants*int(unsafe.Sizeof(grant{})); held > most {
		t.Errorf("after a burst of %d bytes the quiet connection keeps %d bytes of mailbox (mail %d, grants %d, keys %d), want at most %d",
			buf.Len(), held, m, g, k, most)
	}
}
