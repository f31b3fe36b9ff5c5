// Package bench provides ticketd's load generator and the scenarios behind
// `make bench`: the same lock traffic (acquire, then release with what the
// acquire returned) is driven against ticketd, against Redis (SET NX PX and a
// compare-and-delete script) and against a gnet echo server that only returns
// the bytes it gets, the machine's ceiling for this frame size.
//
// The generator is built to stay out of the way of the server it shares the
// machine with: raw connections, one goroutine per connection in closed loop
// (read a batch of answers, write the next requests in one write), a sender
// and a reader per connection in open loop, and latencies kept in HDR
// histograms. In open loop every acquire has an intended send time on a fixed
// schedule and its latency is measured from that time, so a server that
// stalls is charged for the requests it kept the generator from sending
// (no coordinated omission).
//
// Latency is per request line: from its send (closed loop) or intended send
// (open loop) to its answer. A lock pair is one acquire that was granted and
// the release of that grant. Throughput counts answers (lines/s) and completed
// pairs (pairs/s) inside the measured window, which follows a warm-up.
package bench
