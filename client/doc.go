// Package client provides the Go client of ticketd, a lock server whose locks
// carry fencing tokens.
//
// A Client keeps a few persistent connections (WithConns, default 2) and is
// safe for concurrent use by any number of goroutines. Calls from all of them
// are pipelined: every request for a key goes out on the connection the key
// hashes to (another one while that one is down), so the requests for one
// key stay in order (but for requests rerouted while their connection was
// down, which its requests after it is back may overtake). Each connection has one reader goroutine that matches
// answers as they come, in any order, and wakes their callers; once they
// have queued their replies, it writes them with one write if the socket
// takes them at once. A writer goroutine sends the rest, and what queues up
// between reads, with one write. Acquires are matched by owner and key
// (each acquire gets its own owner, "<client-id>.<sequence>", which
// Lock.Owner returns), releases by token and key. A call takes no lock of its
// own, starts no goroutine and allocates nothing; its state comes from a
// sync.Pool.
//
// # Locks, leases and fencing
//
// Acquire returns a Lock: the key, a fencing token and the local deadline of
// its lease. The lease is the server's promise; the lock ends when it is
// released or when the lease runs out, whichever comes first, and a process
// can stall (a GC pause, a swapped-out page) past its deadline without
// noticing. That is why every grant carries a token larger than every token
// granted for that key before: send it with each write to the resource the
// lock guards, and have the resource refuse a token lower than the highest it
// has seen. See the Fencing example.
//
// Release waits for the server's answer. ReleaseNoWait does not: it
// returns once the release is queued, so that a caller that does not need
// the outcome saves a round trip, and its next acquire of the key goes out
// right after the release.
//
// # Calls without a goroutine each
//
// Acquire and Release block their goroutine, and waking it for each answer
// is most of what the client costs: a Go scheduler hand-off per answer.
// Code that keeps many locks in flight from few goroutines (a proxy, a
// batch job, an event loop of its own) can use AcquireFunc and ReleaseFunc
// instead: they queue the request and return, and the connection's reader
// calls the func with the outcome as soon as it has matched the answer. A
// func may queue the next requests (AcquireFunc, ReleaseFunc,
// ReleaseNoWait), which go out with that read's other replies in one write,
// as a hand-written pipelined loop would send them; it must not block, as
// the answers after it wait for it. A pair costs about 1.1x such a loop
// (1.2x with ReleaseNoWait against a loop that pipelines the release with
// the next acquire), against 1.5-1.8x through the blocking calls.
//
// # Errors
//
// The server's refusals are plain values: ErrHeld (T: held by someone else
// past the wait), ErrBusy (B: at capacity) and ErrNotHeld (N: the token does
// not hold the key). A T that comes before the wait could have passed is
// ErrWaitEnded: the server gave up the wait, as it does for every queued
// acquire when it shuts down; errors.Is(err, ErrHeld) holds for it too. A
// call that loses its connection fails with a *ConnError (errors.Is(err,
// ErrConnBroken)); errors.Is(err, ErrOutcomeUnknown) tells whether the
// request had been sent, so that the server may have carried it out;
// errors.Is(err, ErrClosedAtOnce), that the server closed the connection
// before it answered anything (over its --max-conns, say). A
// release that meets this is sent again on another connection while the
// lock's lease may still run on the server (see Release), so that it fails
// so only when no connection comes up before then, or when the copy's N
// comes after the lock's Deadline (the key may have gone on meanwhile). An E line from the server (it could not parse a request) fails every
// call unanswered on that connection with a *ConnError wrapping a
// *ServerError. The client checks keys, owners, leases and waits before
// sending, so that one bad call cannot take down the calls of others.
//
// Connection i starts on the i-th address given to Dial (mod their number):
// with fewer connections (WithConns) than nodes, give each process the
// addresses in another order, or the last nodes get no client connection.
// A broken connection is redialled in the background with backoff: first
// its own address, unless that is the one it lost (with a tenth of the dial
// timeout, as a node cut off by the network does not refuse); then the
// others in turn after the one it lost; last the one it lost and any other
// whose connection broke in the last 5 s (a cluster node that answered E
// unavailable has no quorum, or no leader, for some shard, or lags behind
// it). So a connection
// that had to move goes back to its own node at its next break, a rolling
// restart does not leave every connection on one node, and a connection
// that two nodes fail in turn (a bridge: two nodes cut apart, the third
// sees both) goes to the third instead of back and forth. The pause
// between redials doubles from WithBackoff's first to its longest, and
// starts again only after a connection that answered something (or lived
// that longest pause): a node that accepts and closes at once is not
// redialled at the shortest pause for ever. A connection that reads but
// stops answering (a node gone without a reset, a cut link) is given up as
// broken once a request on it is WithAnswerTimeout (20 s) past its wait
// with nothing at all arriving. While a
// connection is down, calls go to the other connections, or fail at once
// with a *ConnError (Unknown false) when none is up.
//
// A connection off its own address tries every 10 s to go back (less
// often, down to every 5 min, while its node breaks it again soon after
// each return: a node cut off from the others still accepts connections);
// once its own node answers, and no acquire that may wait in the server's
// queue is pending on it, it holds new calls back for the moment it takes
// the answers to those already sent to arrive (250 ms at most, or it
// tries later), then sends them on the new connection. So connections
// spread over the nodes again after an outage, and no call fails for it.
//
// # Contexts
//
// The context bounds each call. Acquire cuts the wait it sends to the
// context's deadline. If the context ends while the server still has the
// acquire queued, Acquire returns at once with ctx.Err(), and if the grant
// arrives later the client releases it by itself, so that nothing is left
// held.
package client
