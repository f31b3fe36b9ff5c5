#!/usr/bin/env bash
# loop-share.sh runs the depth-64 load (50 connections, a million keys, 7 s)
# against ticketd or the echo ceiling and prints, for each of the server's
# threads that ran, its voluntary and involuntary context switches per
# second and its share of a core over 3 s in the middle of the run (from
# /proc/PID/task/TID), then the load's throughput line. A thread that
# blocks rarely but is switched out often was runnable and waiting for a
# core.
#
#   bench/loop-share.sh ticketd|echo PORT
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
d=$(mktemp -d)
if [ "$1" = ticketd ]; then "$root/bin/ticketd" --listen 127.0.0.1:$2 --data-dir $d/data > $d/log 2>&1 & else "$root/bin/echo" --listen 127.0.0.1:$2 > $d/log 2>&1 & fi
pid=$!
sleep 1
"$root/bin/bench" load -system $1 -addr 127.0.0.1:$2 -depth 64 -duration 7s -quiet > $d/load 2>&1 &
lp=$!
sleep 3
snap() { for t in /proc/$pid/task/*; do echo "$(basename $t) $(awk '/^voluntary/{v=$2} /^nonvoluntary/{n=$2} END{print v, n}' $t/status) $(awk '{print $14+$15}' $t/stat)"; done; }
snap > $d/a; sleep 3; snap > $d/b
join $d/a $d/b | awk '{dv=$5-$2; dn=$6-$3; dc=$7-$4; if (dc>5) printf "tid %s: vol %d/s invol %d/s cpu %d%%\n", $1, dv/3, dn/3, dc/3}'
wait $lp; grep window $d/load
kill $pid; wait $pid 2>/dev/null; rm -rf $d
