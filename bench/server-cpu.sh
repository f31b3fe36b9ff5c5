#!/usr/bin/env bash
# server-cpu.sh compares ticketd builds at pipeline depth 64 (DEPTH): in
# each round it drives every build, Redis if REDIS names its server binary,
# and the echo ceiling in turn with `bench load` (50 connections, a million
# keys) and prints, per run, pairs/s, the ratio to echo's pairs/s in the
# same round, the p99 latency, and the server's user and system CPU per
# lock pair (from /proc/<pid>/stat). One run per system per round, so that
# the machine's slow and fast spells fall on all of them alike: compare
# medians over many rounds, not single runs.
#
#   bench/server-cpu.sh ROUNDS SECONDS TICKETD... > out.txt
#   DEPTH=1 REDIS=$(command -v redis-server) bench/server-cpu.sh ROUNDS SECONDS TICKETD...
#
# RATE=N makes every run an open loop at N acquires a second over all
# connections (with DEPTH=256, say, as the bench's open loop), and adds the
# generator's own send lag p99 to each line: at equal offered load a
# server's p99 follows how late the generator sends beside it
# (bench/results/depth1-tail.txt).
#
# WARMUP=S runs each system S seconds before each measured run (default 0;
# the bench's runs have 1 s), on connections of its own, outside the CPU
# counted. It starts each server with a fresh data dir on its own loopback
# port, from PORT (default 17960) up, in this script's session as the bench
# does (OWN_SESSION=1: each in a session of its own, which at depth 1 about
# doubles every server's p99: bench/results/sessions.txt), and stops only
# those.
set -euo pipefail
rounds=${1:?rounds}; secs=${2:?seconds}; shift 2
root=$(cd "$(dirname "$0")/.." && pwd)
bench=${BENCH:-$root/bin/bench}
depth=${DEPTH:-64}
echo_bin=${ECHO_BIN:-$root/bin/echo}
work=$(mktemp -d)
# A background job of a script without job control is no group leader, so
# setsid makes the session in place and the pid is the server's.
sid=
[ -n "${OWN_SESSION:-}" ] && sid=setsid
pids=() ports=() names=() systems=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

open=()
[ -n "${RATE:-}" ] && open=(-rate "$RATE")
port=${PORT:-17960}
i=0
for bin in "$@"; do
	$sid "$bin" --listen 127.0.0.1:$port --data-dir "$work/d$i" >"$work/s$i.log" 2>&1 &
	pids+=($!) ports+=($port) names+=("$i:$(basename "$bin")") systems+=(ticketd)
	i=$((i + 1)) port=$((port + 1))
done
if [ -n "${REDIS:-}" ]; then
	$sid "$REDIS" --port $port --bind 127.0.0.1 --save '' --appendonly no >"$work/redis.log" 2>&1 &
	pids+=($!) ports+=($port) names+=(redis) systems+=(redis)
	port=$((port + 1))
fi
$sid "$echo_bin" --listen 127.0.0.1:$port >"$work/echo.log" 2>&1 &
pids+=($!) ports+=($port) names+=(echo) systems+=(echo)
sleep 1

ticks() { awk '{print $14, $15}' "/proc/$1/stat"; }
for r in $(seq "$rounds"); do
	declare -A pps=()
	lines=()
	for k in "${!pids[@]}"; do
		# The warm-up is a run of its own, before the CPU is read: the pairs
		# counted are the window's alone, so the CPU must be too.
		if [ "${WARMUP:-0}" != 0 ]; then
			"$bench" load -system "${systems[$k]}" -addr "127.0.0.1:${ports[$k]}" -depth "$depth" "${open[@]}" \
				-duration "${WARMUP}s" -warmup 0s -quiet >/dev/null 2>&1
		fi
		read -r u0 s0 < <(ticks "${pids[$k]}")
		out=$("$bench" load -system "${systems[$k]}" -addr "127.0.0.1:${ports[$k]}" -depth "$depth" "${open[@]}" \
			-duration "${secs}s" -warmup 0s -quiet 2>&1 | grep -E '^(window|latency)')
		read -r u1 s1 < <(ticks "${pids[$k]}")
		pairs=$(sed -n 's/.*(\([0-9]*\) granted.*/\1/p' <<<"$out")
		rate=$(sed -n 's/^window [^:]*: \([0-9,]*\) pairs.*/\1/p' <<<"$out" | tr -d ,)
		p99=$(sed -n 's/^latency p50 [^ ]* p99 \([^ ]*\) .*/\1/p' <<<"$out")
		lag=$(sed -n 's/.*generator lag p99 \([^,]*\),.*/  lag \1/p' <<<"$out")
		pps[$k]=$rate
		hz=$(getconf CLK_TCK)
		lines+=("$k $rate $(((u1 - u0) * 1000000000 / hz / pairs)) $(((s1 - s0) * 1000000000 / hz / pairs)) $p99$lag")
	done
	echo_rate=${pps[$((${#pids[@]} - 1))]}
	for l in "${lines[@]}"; do
		read -r k rate user sys p99 <<<"$l"
		awk -v r="$r" -v n="${names[$k]}" -v p="$rate" -v e="$echo_rate" -v u="$user" -v s="$sys" -v l="$p99" \
			'BEGIN { printf "round %d %-16s pairs/s %8d  vs echo %.3f  user %4d ns/pair  sys %4d ns/pair  p99 %s\n", r, n, p, p / e, u, s, l }'
	done
done
