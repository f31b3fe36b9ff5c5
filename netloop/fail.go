package netloop

// Fail writes line (an E answer) after every answer already posted and then
// closes the connection; its unanswered requests are left to the client to
// treat as failed. Safe from any goroutine. gnet runs Wake and Close tasks in
// the order they were queued, so the line goes out before the close. Only
// the first call writes: two failures at once (two batches of the
// connection given up together) must not send two E lines.
func (c *Conn) Fail(line []byte) {
	c.mu.Lock()
	first := !c.failed
	c.failed = true
	c.mu.Unlock()
	if first && c.Post(line, 0) {
		_ = c.gc.Close()
	}
}
