package bench

import (
	"bufio"
	"net"
	"sync"
	"testing"

	"github.com/ticketd/ticketd/codec"
)

// fakeTicketd is a small, slow, obviously correct lock server speaking the
// protocol (FIFO queues, no lease expiry), so that the generator's matching
// of answers is tested without the real server.
type fakeTicketd struct {
	ln    net.Listener
	mu    sync.Mutex
	token uint64
	keys  map[string]*fakeKey
	wg    sync.WaitGroup
}

type fakeKey struct {
	token uint64
	queue []fakeWaiter
}

type fakeWaiter struct {
	c     *fakeConn
	owner string
}

type fakeConn struct {
	mu sync.Mutex
	w  *bufio.Writer
}

func (c *fakeConn) send(b []byte) {
	c.mu.Lock()
	c.w.Write(b)
	c.w.Flush()
	c.mu.Unlock()
}

func startFake(t *testing.T) *fakeTicketd {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeTicketd{ln: ln, keys: map[string]*fakeKey{}}
	f.wg.Go(func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			f.wg.Go(func() { f.serve(nc) })
		}
	})
	t.Cleanup(func() { ln.Close(); f.wg.Wait() })
	return f
}

func (f *fakeTicketd) addr() string { return f.ln.Addr().String() }

func (f *fakeTicketd) serve(nc net.Conn) {
	defer nc.Close()
	c := &fakeConn{w: bufio.NewWriter(nc)}
	var buf []byte
	rd := make([]byte, 4096)
	for {
		n, err := nc.Read(rd)
		buf = append(buf, rd[:n]...)
		var out []byte
		for {
			var req codec.Request
			m, perr := codec.ParseRequest(buf, codec.Limits{}, &req)
			if perr != nil {
				c.send(codec.AppendError(out, perr))
				return
			}
			if m == 0 {
				break
			}
			out = f.apply(c, &req, out)
			buf = buf[m:]
		}
		if len(out) > 0 {
			c.send(out)
		}
		if err != nil { // io.EOF or a reset: either way the client is gone
			f.withdraw(c)
			return
		}
	}
}

func (f *fakeTicketd) apply(c *fakeConn, req *codec.Request, out []byte) []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	key := string(req.Key)
	k := f.keys[key]
	switch req.Kind {
	case codec.Acquire:
		switch {
		case k == nil:
			f.token++
			f.keys[key] = &fakeKey{token: f.token}
			return codec.AppendAcquired(out, f.token, req.Owner, req.Key)
		case req.WaitMs == 0:
			return codec.AppendTimedOut(out, req.Owner, req.Key)
		default:
			k.queue = append(k.queue, fakeWaiter{c, string(req.Owner)})
			return out
		}
	default:
		if k == nil || k.token != req.Token {
			return codec.AppendNotReleased(out, req.Token, req.Key)
		}
		out = codec.AppendReleased(out, req.Token, req.Key)
		if len(k.queue) == 0 {
			delete(f.keys, key)
			return out
		}
		w := k.queue[0]
		k.queue = k.queue[1:]
		f.token++
		k.token = f.token
		grant := codec.AppendAcquired(nil, f.token, []byte(w.owner), req.Key)
		if w.c == c {
			return append(out, grant...)
		}
		go w.c.send(grant) // another connection's answer, written by its own lock
		return out
	}
}

func (f *fakeTicketd) withdraw(c *fakeConn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, k := range f.keys {
		q := k.queue[:0]
		for _, w := range k.queue {
			if w.c != c {
				q = append(q, w)
			}
		}
		k.queue = q
	}
}

// held counts keys still held, to check that a run leaves none behind.
func (f *fakeTicketd) held() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.keys)
}
