#!/usr/bin/env bash
# End-to-end throughput of Caddy with and without Sluice, in one run on this
# machine: the same static response behind no limiter, one zone, a zone with
# three scopes, and a zone that denies almost everything. Uses wrk on
# loopback. Usage: bench/e2e.sh [seconds per run] [rounds]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
rounds=${2:-3}
command -v wrk >/dev/null || { echo "needs wrk (apt-get install wrk)"; exit 1; }
go build -o bench/caddy ./cmd/caddy
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT

site() { # name, handler block
	cat > "$tmp/$1.Caddyfile" <<CF
{
	admin off
	auto_https off
}
:18080 {
$2
	respond "ok"
}
CF
}
site baseline ""
site one_zone "	rate_limit {
		zone e2e_one {
			by ip
			rate 1000000000/1s
			algorithm token_bucket
		}
	}"
site three_scopes "	rate_limit {
		zone e2e_three {
			by ip
			rate 1000000000/1s
			algorithm token_bucket
			scope subnet {
				by subnet
				rate 1000000000/1s
				algorithm sliding_window_counter
			}
			scope global {
				by global
				rate 1000000000/1s
				algorithm gcra
			}
		}
	}"
site denying "	rate_limit {
		zone e2e_deny {
			by ip
			rate 1/1h
		}
	}"

run() { # name -> requests/s
	bench/caddy run --config "$tmp/$1.Caddyfile" --adapter caddyfile >/dev/null 2>&1 &
	local pid=$!
	for _ in $(seq 50); do curl -s -o /dev/null localhost:18080/ && break; sleep 0.1; done
	wrk -t1 -c32 -d"${secs}s" http://127.0.0.1:18080/ | awk '/Requests\/sec/ {print $2}'
	kill $pid; wait $pid 2>/dev/null || true
}

# Rounds interleave the configs so that a noisy moment hits all of them.
declare -A results
names=(baseline one_zone three_scopes denying)
for _ in $(seq "$rounds"); do
	for name in "${names[@]}"; do results[$name]+="$(run "$name") "; done
done
for name in "${names[@]}"; do
	median=$(tr ' ' '\n' <<<"${results[$name]}" | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
	printf '%-13s median %9s req/s   runs: %s\n' "$name" "$median" "${results[$name]}"
done
