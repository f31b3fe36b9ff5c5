// Package replica provides ticketd's cluster mode: every shard of the lock
// table is a Dragonboat raft group with a replica on every node, and every
// replica applies the same committed batches to a shard.Table in Replicated
// mode.
//
// A node accepts any key: the requests of one shard are batched into one
// proposal (entries are described in command.go) stamped with the
// proposer's clock; the replicated clock is the largest stamp applied, so it
// never moves back. Every replica computes every answer and the node that
// owns the requester's connection writes it. Time enters the tables only as
// committed commands: the leader of a shard proposes Expire and WaitTimeout
// when they come due by its clock (a lease only MaxClockSkew after its
// deadline), so replicas never consult their own clocks to decide lock state.
//
// A proposal that times out or is dropped around a leader change is retried
// with the same batch id, and a replica applies a batch id once. Connection
// ids carry the node's incarnation (a counter in the data dir), so a node's
// first batch after a restart withdraws the waiters of its earlier run.
package replica
