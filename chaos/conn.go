package chaos

import (
	"bufio"
	"errors"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/ticketd/ticketd/codec"
)

// conn is one raw protocol connection of the recorder. Requests are matched
// to answers the way the protocol says (A/T/B by owner and key, R/N by token
// and key), so an answer that matches nothing in flight is a duplicate or an
// invention, which the recorder keeps as an anomaly. Whatever is in flight
// when the connection breaks gets an unknown outcome.
type conn struct {
	id, node int
	h        *History
	nc       net.Conn
	// floor is the latest send among the requests answered on this
	// connection, as the Go client keeps it to date a waited grant; the
	// reader's alone.
	floor int64

	wmu sync.Mutex // one writer at a time

	mu      sync.Mutex
	pending map[string]*call
	broken  error
	done    chan struct{}
}

type call struct {
	op *Op
	ch chan struct{}
}

var errBroken = errors.New("connection broken")

func dialConn(h *History, id, node int, addr string) (*conn, error) {
	nc, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return nil, err
	}
	c := &conn{id: id, node: node, h: h, nc: nc, pending: map[string]*call{}, done: make(chan struct{})}
	go c.read()
	return c, nil
}

func acqKey(owner, key []byte) string { return "A\x00" + string(owner) + "\x00" + string(key) }
func relKey(token uint64, key []byte) string {
	return "R\x00" + strconv.FormatUint(token, 10) + "\x00" + string(key)
}

// do sends op (Invoke is recorded just before the write) and waits for its
// answer up to timeout; past it the connection is closed, so the op's outcome
// is unknown. It returns false when the outcome is unknown.
func (c *conn) do(op *Op, timeout time.Duration) bool {
	op.Conn, op.Node = c.id, c.node
	var k string
	var line []byte
	if op.Kind == 'A' {
		k = acqKey([]byte(op.Owner), []byte(op.Key))
		line = codec.AppendAcquire(nil, []byte(op.Owner), []byte(op.Key), op.LeaseMs, op.WaitMs)
	} else {
		k = relKey(op.Token, []byte(op.Key))
		line = codec.AppendRelease(nil, op.Token, []byte(op.Key))
	}
	cl := &call{op: op, ch: make(chan struct{})}
	c.mu.Lock()
	if c.broken != nil {
		c.mu.Unlock()
		return false
	}
	if _, dup := c.pending[k]; dup {
		c.mu.Unlock()
		panic("chaos: two requests in flight with one match key: " + k)
	}
	c.pending[k] = cl
	c.mu.Unlock()

	c.wmu.Lock()
	c.h.Invoke(op)
	c.nc.SetWriteDeadline(time.Now().Add(timeout))
	_, err := c.nc.Write(line)
	c.wmu.Unlock()
	if err != nil {
		c.fail("write: " + err.Error())
		// The connection may have broken between registering op and
		// invoking it, when fail found op not yet invoked.
		c.h.Lose(op, "write: "+err.Error())
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-cl.ch:
		return op.Complete >= 0
	case <-t.C:
		c.fail("no answer within " + timeout.String() + "; client gave up")
		<-cl.ch
		return op.Complete >= 0
	}
}

// fail breaks the connection: every request in flight gets an unknown
// outcome with why.
func (c *conn) fail(why string) {
	c.mu.Lock()
	if c.broken != nil {
		c.mu.Unlock()
		return
	}
	c.broken = errors.New(why)
	p := c.pending
	c.pending = map[string]*call{}
	c.mu.Unlock()
	c.nc.Close()
	for _, cl := range p {
		c.h.Lose(cl.op, why)
		close(cl.ch)
	}
}

func (c *conn) isBroken() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.broken != nil
}

func (c *conn) close() { c.fail("closed by the client") }

func (c *conn) read() {
	defer close(c.done)
	br := bufio.NewReaderSize(c.nc, 4096)
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			c.fail("connection lost: " + err.Error())
			return
		}
		at := c.h.Now()
		var a codec.Answer
		if _, err := codec.ParseAnswer(line, &a); err != nil {
			c.h.Anomaly(&Anomaly{At: at, Conn: c.id, Node: c.node, What: "unparsable answer", Line: string(line)})
			continue
		}
		var k string
		switch a.Kind {
		case 'E':
			if string(a.Code) == "unavailable" {
				c.h.unavailable(at)
			} else {
				c.h.Anomaly(&Anomaly{At: at, Conn: c.id, Node: c.node, What: "E answer to a well-formed request", Line: string(line)})
			}
			c.fail("E " + string(a.Code) + " " + string(a.Text))
			return
		case 'A', 'T', 'B':
			k = acqKey(a.Owner, a.Key)
		default:
			k = relKey(a.Token, a.Key)
		}
		c.mu.Lock()
		if c.broken != nil { // the client gave up on everything in flight
			c.mu.Unlock()
			return
		}
		cl, ok := c.pending[k]
		delete(c.pending, k)
		c.mu.Unlock()
		if !ok {
			c.h.Anomaly(&Anomaly{At: at, Conn: c.id, Node: c.node, What: "answer matches no request in flight (duplicate or invented)", Line: string(line)})
			continue
		}
		var res string
		switch a.Kind {
		case 'A':
			res = ResGranted
		case 'T':
			res = ResTimedOut
		case 'B':
			res = ResBusy
		case 'R':
			res = ResReleased
		case 'N':
			res = ResNotReleased
		}
		tok := uint64(0)
		if a.Kind == 'A' {
			tok = a.Token
		}
		c.h.complete(cl.op, at, res, tok, &c.floor)
		close(cl.ch)
	}
}
