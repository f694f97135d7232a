#!/usr/bin/env bash
# Branch points (if conditions, switch cases, loop tests) that one request
# evaluates on the handler's hot path, counted from coverage: the root
# package's BenchmarkServeHTTP case runs for two numbers of requests under
# -covermode=count over every package of the module, and bench/conditions
# divides the difference. Usage:
#   bench/conditions.sh [case] [-list]
# case as BenchmarkServeHTTP names it (default allowed/by_ip: one zone, one
# limit, keyed by client IP, in memory); -list prints each branch point.
set -euo pipefail
cd "$(dirname "$0")/.."
bench=${1:-allowed/by_ip}
shift || true
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go test -c -o "$tmp/sluice.test" -covermode=count -coverpkg=./... . >/dev/null
for n in 100 1100; do
	"$tmp/sluice.test" -test.run '^$' -test.bench "^BenchmarkServeHTTP\$/^${bench}\$" \
		-test.benchtime "${n}x" -test.coverprofile "$tmp/$n.out" >/dev/null
done
go run ./bench/conditions "$@" "$tmp/100.out" 100 "$tmp/1100.out" 1100
