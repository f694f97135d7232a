#!/usr/bin/env bash
# Redis's instructions per decision of the store's script calls, two versions
# side by side on one redis-server run under valgrind's callgrind: the
# instruction count does not move with other load on the machine, where
# bench/redis-cpu.sh's CPU time does (on a loaded 2-core machine its rows
# move by 30% from round to round). Each row runs BenchmarkRedisCPU
# (backend/redis) of the tree OLD and of this tree twice, for 2,048 and
# 12,288 decisions, and divides the difference of the server's counts by
# 10,240: the set-up and the warm-up cancel out (each version's library
# is loaded by a run of its own before them). Only the server's work on
# requests is counted (reading them, running the command, writing the
# reply: --toggle-collect on readQueryFromClient and writeToClient), not
# its timer work (serverCron, active expiry), which grows with how long a
# run takes under valgrind and so with the machine's load: counted, it
# moved a row by up to 11% between identical runs. Needs valgrind.
# Usage: bench/redis-instr.sh OLD [rows...]
# (rows as BenchmarkRedisCPU names them, e.g. token_bucket/per_call=8/rt;
# by default the rt and pipe rows of 8 and 64 decisions per call)
set -euo pipefail
old=$(cd "$1" && pwd)
shift
rows=("$@")
if [ ${#rows[@]} -eq 0 ]; then
	for per in 8 64; do
		for shape in rt pipe; do
			rows+=("token_bucket/per_call=$per/$shape" "sliding_window/per_call=$per/$shape")
		done
	done
fi
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "needs valgrind"; exit 1; }
flavour=${SLUICE_REDIS_SERVER:-redis}
tmp=$(mktemp -d)
(cd "$old" && go test -c -o "$tmp/old.test" ./backend/redis/)
go test -c -o "$tmp/new.test" ./backend/redis/
port=$((20000 + RANDOM % 10000))
valgrind --tool=callgrind --toggle-collect=readQueryFromClient --toggle-collect=writeToClient --callgrind-out-file="$tmp/cg.out" "$flavour-server" --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$tmp" >"$tmp/log" 2>&1 &
vg=$!
trap 'kill $vg 2>/dev/null || true; rm -rf "$tmp"' EXIT
for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.3; done
# since: the server's instructions since the last dump (a dump resets them).
since() {
	callgrind_control -d "$vg" >/dev/null 2>&1
	sleep 0.5
	awk '/^(summary|totals):/ {print $2; exit}' "$(ls -t "$tmp"/cg.out.* | head -1)"
}
echo "| Redis instructions per decision | old | new | new/old |"
echo "|---|---|---|---|"
for row in "${rows[@]}"; do
	declare -A per=()
	for v in old new; do
		# A first call of each version loads its library (FUNCTION
		# LOAD, and a full collection of Lua's heap): apart from the
		# counted runs, where it counted for one of the two only.
		SLUICE_BENCH_REDIS=127.0.0.1:$port "$tmp/$v.test" -test.run '^$' -test.bench "RedisCPU/$row\$" \
			-test.benchtime 1x -test.timeout 30m >/dev/null
		counts=()
		for n in 2048 12288; do
			since >/dev/null
			SLUICE_BENCH_REDIS=127.0.0.1:$port "$tmp/$v.test" -test.run '^$' -test.bench "RedisCPU/$row\$" \
				-test.benchtime "${n}x" -test.timeout 30m >/dev/null
			counts+=("$(since)")
		done
		per[$v]=$(( (counts[1] - counts[0]) / 10240 ))
	done
	awk -v r="$row" -v o="${per[old]}" -v n="${per[new]}" 'BEGIN {printf "| %s | %d | %d | %.2f× |\n", r, o, n, n / o}'
done
