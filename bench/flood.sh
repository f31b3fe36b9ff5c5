#!/usr/bin/env bash
# flood.sh runs a 3-node cluster of TICKETD on loopback, floods node 1 with
# connections that pipeline acquires and never read (`bench flood`), runs a
# depth-1 client beside them on the same node, and prints node 1's peak
# RSS, the client's latency, and each node's leader changes and E
# unavailable counts (what --max-queued bounds: ARCHITECTURE.md, cluster
# mode, the node's backlog).
#
#   bench/flood.sh TICKETD [CONNS] [SECONDS]
#
# Ports from PORT (default 7511) up: client PORT..PORT+2, raft +10..+12,
# admin +20..+22. It stops only the nodes it started.
set -euo pipefail
bin=${1:?ticketd binary}; conns=${2:-500}; secs=${3:-25}
root=$(cd "$(dirname "$0")/.." && pwd)
bench=${BENCH:-$root/bin/bench}
port=${PORT:-7511}
work=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
peers=1=127.0.0.1:$((port + 10)),2=127.0.0.1:$((port + 11)),3=127.0.0.1:$((port + 12))
for i in 0 1 2; do
	"$bin" --node-id $((i + 1)) --peers "$peers" --listen 127.0.0.1:$((port + i)) \
		--admin 127.0.0.1:$((port + 20 + i)) --data-dir "$work/n$i" --bootstrap >"$work/n$i.log" 2>&1 &
	pids+=($!)
done
for i in 0 1 2; do
	until curl -sf 127.0.0.1:$((port + 20 + i))/readyz >/dev/null; do sleep 0.2; done
done
(while kill -0 "${pids[0]}" 2>/dev/null; do ps -o rss= -p "${pids[0]}"; sleep 1; done) >"$work/rss" &
"$bench" load -system ticketd -addr 127.0.0.1:$port -conns 10 -depth 1 -duration $((secs + 5))s \
	-key-prefix good -quiet >"$work/good" 2>&1 &
good=$!
"$bench" flood -addr 127.0.0.1:$port -conns "$conns" -duration "${secs}s"
wait $good || true
sleep 2
echo "node 1 peak RSS: $(sort -n "$work/rss" | tail -1 | awk '{printf "%.0f MB", $1 / 1024}')"
echo "depth-1 client beside the flood:"; sed 's/^/  /' "$work/good"
for i in 0 1 2; do
	curl -s 127.0.0.1:$((port + 20 + i))/metrics |
		awk -v n=$((i + 1)) '/^ticketd_(leader_changes|unavailable)_total /{printf "node %d %s %s\n", n, $1, $2}'
done
