package netloop

// Fail writes line (an E answer) after every answer already posted and then
// closes the connection; its unanswered requests are left to the client to
// treat as failed. Safe from any goroutine. The line goes through the
// mailbox, and the loop that writes it closes the connection and reads
// nothing more (OnTraffic): a close queued here could overtake the wake of
// a post made just before, and the line would be lost. Only the first call
// writes: two failures at once (two batches of the connection given up
// together) must not send two E lines. Nothing is posted after the line:
// the client reads no further, so a grant posted later goes back through
// Backend.Orphaned instead (PostGrants refuses it).
func (c *Conn) Fail(line []byte) {
	if c.post(line, 0, nil, true) {
		// The mailbox may have held mail whose wake is still to come. After
		// the client's end of stream the writer is woken, not the loop:
		// gnet has let the connection go, and at Stop its poller may be
		// closed, its descriptor number another file's.
		c.wake()
	}
}
