#!/usr/bin/env bash
# Redis's CPU per decision of the store's script calls, two versions side by
# side on one redis-server (or valkey-server: SLUICE_REDIS_SERVER=valkey):
# BenchmarkRedisCPU (backend/redis) of the tree OLD and of this tree, in
# interleaved rounds, and a table of the medians with their ratio. OLD must
# have the benchmark (copy backend/redis/cpu_bench_test.go into it; it needs
# the store's manyCmd, which builds a batch call).
# Usage: bench/redis-cpu.sh OLD [rounds]
set -euo pipefail
old=$(cd "$1" && pwd)
rounds=${2:-5}
cd "$(dirname "$0")/.."
flavour=${SLUICE_REDIS_SERVER:-redis}
tmp=$(mktemp -d)
(cd "$old" && go test -c -o "$tmp/old.test" ./backend/redis/)
go test -c -o "$tmp/new.test" ./backend/redis/
port=$((20000 + RANDOM % 10000))
"$flavour-server" --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$tmp" > "$tmp/log" 2>&1 &
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
sleep 0.5
for _ in $(seq "$rounds"); do
	for v in old new; do
		SLUICE_BENCH_REDIS=127.0.0.1:$port "$tmp/$v.test" -test.run '^$' -test.bench "${FILTER:-RedisCPU}" -test.benchtime 20000x |
			grep '^BenchmarkRedisCPU' | sed "s/^/$v /" >> "$tmp/results"
	done
done
python3 - "$tmp/results" <<'PY'
import collections, re, statistics, sys
d = collections.defaultdict(list)
names = []
for line in open(sys.argv[1]):
    v, name = line.split()[:2]
    name = re.sub(r'-\d+$', '', name.removeprefix('BenchmarkRedisCPU/'))
    d[(name, v)].append(float(re.search(r'([0-9.]+) redis_µs/decision', line).group(1)))
    if name not in names:
        names.append(name)
print("| Redis µs per decision | old | new | new/old |")
print("|---|---|---|---|")
for n in names:
    o, w = statistics.median(d[(n, 'old')]), statistics.median(d[(n, 'new')])
    print(f"| {n} | {o:.1f} | {w:.1f} | {w / o:.2f}× |")
PY
