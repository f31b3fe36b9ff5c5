#!/usr/bin/env bash
# pgo.sh regenerates cmd/ticketd/default.pgo, the CPU profile that `go
# build` uses to optimise ticketd (profile-guided optimisation: hot calls
# inlined, the Backend interface devirtualised). It runs single mode under
# the shapes of load the bench measures, profiles each through --admin, and
# merges the profiles, so that they weigh by the CPU each one used:
# pipelined at depth 64, one request in flight per connection, and hot keys
# with waiters queued. Regenerate it after a change to the hot path:
#
#   make pgo && make build
#
# It starts one server with a fresh data dir on a loopback port (PORT,
# default 17990, and the next for --admin) and stops only that.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${TICKETD:-$root/bin/ticketd}
bench=${BENCH:-$root/bin/bench}
port=${PORT:-17990}
admin=$((port + 1))
work=$(mktemp -d)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

"$bin" --listen 127.0.0.1:$port --admin 127.0.0.1:$admin --data-dir "$work/data" >"$work/server.log" 2>&1 &
pid=$!
sleep 1

# profile NAME SECONDS LOAD-FLAGS...: the load runs a second longer on each
# side of the profile, so that it covers only the steady part.
profile() {
	local name=$1 secs=$2
	shift 2
	"$bench" load -addr 127.0.0.1:$port -duration $((secs + 2))s -warmup 0 -quiet "$@" >"$work/$name.txt" 2>&1 &
	local load=$!
	sleep 1
	go tool pprof -proto -seconds "$secs" "http://127.0.0.1:$admin/debug/pprof/profile" >"$work/$name.pprof" 2>"$work/$name.err"
	wait "$load"
	grep -E '^window' "$work/$name.txt" | sed "s/^/$name: /"
}
profile depth64 15 -depth 64
profile depth1 10 -depth 1
profile hot 10 -depth 1 -conns 200 -hot 20 -hot-frac 0.9 -wait 2000 -lease 50

go tool pprof -proto "$work"/*.pprof >"$root/cmd/ticketd/default.pgo" 2>"$work/merge.err"
echo "wrote cmd/ticketd/default.pgo ($(wc -c <"$root/cmd/ticketd/default.pgo") bytes)"
