// Package shard provides the ticketd lock table: keys, holders, FIFO wait queues and
// their deadlines, as a deterministic state machine shared by single mode and the
// replicated cluster mode.
//
// A Table does no I/O, reads no clock, logs nothing and draws no random numbers. Every
// input carries what it needs: the time now (nanoseconds on a clock that only moves
// forward), the command, and for an acquire the Requester, so that whoever owns that
// connection can deliver an answer decided later. Every output is an Answer addressed to
// a requester; a release can answer two requesters (R to the releaser, A to the new
// holder), a Tick many. The same commands at the same times give the same answers in the
// same order, which is what lets every replica of a cluster shard agree byte for byte.
//
// A Table is not safe for concurrent use. Answer and Command slices that point into the
// table stay valid until the next call on it. Budget is safe for concurrent use.
//
// # Time
//
// A lease granted at now ends at now + LeaseMs; it is valid while now < deadline, so at
// the deadline itself it has ended. A wait queued at now ends at now + WaitMs, and at that
// instant it has passed. Deadlines saturate at the largest int64 instead of wrapping.
//
// Single mode (Config.Replicated false) processes expiry lazily, as the protocol says: an
// acquire of a key whose lease has ended takes it over in place, its queue staying as it
// is; Tick hands a key whose lease ended to its queue head and ends the waits that have
// passed; Sweep deletes expired keys without waiters. Until Sweep runs, a release of an
// expired key with its token gets R (and hands over if acquires are queued).
//
// Replicated mode never compares now with a deadline in Apply: a lease ends only by
// OpExpire with its token, a wait only by OpWaitTimeout, and an expired holder counts as
// held until then. The leader finds those commands with Due. Tick does nothing in this
// mode, and neither does Sweep.
//
// # Decisions where the protocol is silent
//
//   - No mode grants to a queued acquire whose wait has passed, even if Tick (or, in
//     Replicated mode, its OpWaitTimeout) has not come yet: a hand-over (release, lease
//     end) answers it T and tries the next in line. Replicated mode compares the wait with
//     the command's time, which every replica shares. A release that finds nobody left deletes the key.
//   - Tick runs due timers in a fixed order: by deadline; at the same deadline wait ends
//     before lease ends; then by token (lease) or arrival (wait); then by key. Answers
//     come in that order. A release appends R, then the T of any skipped waiter, then A.
//   - Tick never deletes a key with a real holder: when the lease ends and no waiter is
//     left, the key stays registered, expired, until an acquire takes it over, its holder
//     releases it, or Sweep deletes it. Until then it keeps its room under MaxKeys and the
//     Budget, and a queued acquire whose wait has passed keeps its room under the waiter
//     limits until Tick answers it. (The Sweep interval bounds both.)
//   - Capacity: a new key needs room under MaxKeys and the Budget; a queued acquire needs
//     room under MaxWaiters and MaxWaitersPerKey. An acquire that needs no room (a held
//     key, wait 0) gets T, whatever the limits. A take-over of an expired key needs no
//     room either.
//   - Grace (SetGrace): only keys that are not registered are affected; each counts as
//     held by a phantom with token 0 whose lease ends at the grace's end. Wait 0 gets T.
//     A wait queues, which registers the key and needs room for a key and a waiter. No
//     release matches a phantom (N, whatever the token). At the end of the grace Tick
//     hands the key to its queue head; an acquire that comes first takes it over in place
//     like an expired key. A phantom key whose queue empties is deleted at once. In
//     Replicated mode the comparison of now with the grace's end uses the command's time,
//     and the phantom's lease ends by OpExpire with token 0 (Due reports it).
//   - OpExpire and OpWaitTimeout work in single mode too, as explicit commands.
//   - OpWithdrawBelow drops the queued acquires of one node's connections numbered below
//     a bound: a cluster node numbers its connections above every earlier incarnation's,
//     so this withdraws the waiters a restarted node can no longer answer.
//   - OpWaitTimeout matches the waiter by the whole Requester and the key; the earliest
//     such waiter goes if one was queued twice.
//   - The holder's owner is not kept: the protocol gives it no meaning beyond the answer.
//   - SetLastToken only raises the counter. ReserveTokens is called before the grant
//     that would pass the ceiling; a ceiling below the next token panics (granting then
//     would break the fencing promise). New panics for a Budget in Replicated mode (a
//     count shared with other tables would make replicas answer differently); Apply
//     panics on an unknown Op (a replica must stop rather than skip it).
//   - Counters (Stats) are not state: they start at zero in New and in a restored table.
//     Expiries counts leases of real holders that ended without a release and were acted
//     on: take-over, hand-over at lease end, OpExpire, Sweep.
//
// # Timers
//
// The table keeps one binary min-heap of timers, indexed by their owners: each entry and
// each queued acquire records the position of its timer, so a timer leaves the heap at
// once when it stops matching the table (an acquire answered or withdrawn, a key handed
// over or deleted) and is moved when its deadline changes. The heap holds exactly the live
// timers: one per queued acquire, plus one lease timer per key with waiters (single mode)
// or per registered key (Replicated mode). A high hand-over rate with hour-long waits
// leaves nothing behind. Costs are O(log n) per change; Due walks only the due part.
//
// # Memory
//
// Keys live in keyIndex, an open-addressing hash table whose deletes leave no tombstones
// (see keyindex.go for why not a Go map). A key of up to 48 bytes is stored inside its entry.
// A released key without waiters leaves the index at once: the live set then stays small
// and in cache, which measured 2.7x faster on the uncontended server benchmark
// (acquire+release over a million keys) than keeping released keys in the index for reuse.
// Entries and waiters that leave are kept on small free lists with their key and owner
// buffers, so acquire, release, queueing and hand-over allocate nothing in steady state.
// A queued acquire copies its owner (it outlives the request buffer); its key is its entry's.
//
// # Snapshots
//
// WriteSnapshot writes a compact binary image, described in snapshot.go: a magic and a
// version byte, the token counter, lease high-water mark, grace end and waiter counter,
// then every registered key in byte order with its holder's token and deadline and its
// queue in order (requester, owner, lease, wait deadline), and a CRC-32C. The same state
// gives the same bytes. ReadSnapshot loads one into an empty table.
//
// # Shards
//
// Index maps a key to a shard with 64-bit FNV-1a mod n. Cluster data is placed by it:
// changing the hash is a breaking change for cluster deployments.
package shard
