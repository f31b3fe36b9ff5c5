// Package netloop provides ticketd's network side: a gnet v2 reactor that
// parses pipelined frames straight from each connection's inbound buffer,
// hands them to a Backend, and writes the answers of one read with one write.
//
// Invariants a reader needs:
//
//   - Everything on a Conn except Post and ID runs on the connection's own
//     event loop. Post is the only way in from other goroutines: it copies the
//     answer into the connection's mailbox and wakes the loop, which writes it.
//   - Request fields handed to the Backend are slices of gnet's inbound
//     buffer; they die when Handle returns. A Backend copies what it keeps.
//   - Backpressure: a connection whose answered-later requests (queued
//     acquires, in cluster mode every request until commit) or unsent output
//     pass their limits is no longer parsed, and its socket is no longer polled
//     for reading, so the kernel's receive window pushes back on the client.
//     gnet v2 has no pause API; see pause_linux.go for how it is done
//     (Linux with gnet's default poller only; elsewhere parsing stops but
//     gnet keeps reading).
//   - Accepting is ours, not gnet's: gnet v2.9.7 stops its whole engine when
//     accept fails (for example with EMFILE). The accept loop in accept.go
//     refuses connections beyond MaxConns and rides out descriptor exhaustion,
//     then enrolls each socket into the gnet engine.
//   - Idle and unfinished-frame timeouts are decided by each connection's
//     own loop from stamps it keeps; a sweep only wakes the connections that
//     look due (timeout.go).
package netloop
