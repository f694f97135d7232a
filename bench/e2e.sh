#!/usr/bin/env bash
# End-to-end throughput of Caddy with and without Sluice, in one run on this
# machine: the same static response behind no limiter, one zone, a zone with
# three scopes, and a zone that denies almost everything (as a Caddy error,
# with the built-in JSON body, and with it and every header field). Uses wrk on
# loopback. Usage: bench/e2e.sh [seconds per run] [rounds]
#
# bench/e2e.sh redis [seconds per run] [rounds] runs the Redis backend
# instead, against a redis-server of its own on a free port: no limiter vs
# 10,000 keys all allowed, the same with local_cache off, one key flooded
# at about 100x its limit (Redis calls per request from INFO
# commandstats), and Redis memory per tracked token-bucket key.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=memory
if [ "${1:-}" = redis ]; then mode=redis; shift; fi
secs=${1:-10}
rounds=${2:-3}
# Caddy's port; another free one lets two runs share the machine.
port=${SLUICE_BENCH_PORT:-18080}
command -v wrk >/dev/null || { echo "needs wrk (apt-get install wrk)"; exit 1; }
go build -o bench/caddy ./cmd/caddy
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT

site() { # name, handler block[, global rate_limit block]
	cat > "$tmp/$1.Caddyfile" <<CF
{
	admin off
	auto_https off
${3:-}
}
:$port {
$2
	respond "ok"
}
CF
}
site baseline ""
if [ "$mode" = memory ]; then
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
site denying_json "	rate_limit {
		respond json
		zone e2e_deny_json {
			by ip
			rate 1/1h
		}
	}"
site denying_json_headers "	rate_limit {
		respond json
		headers both
		zone e2e_deny_json_h {
			by ip
			rate 1/1h
		}
	}"
fi

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; } # user + system CPU of a process

run() { # name [wrk script] -> requests/s
	bench/caddy run --config "$tmp/$1.Caddyfile" --adapter caddyfile >/dev/null 2>"$tmp/caddy.log" &
	local pid=$!
	for _ in $(seq 50); do curl -s -o /dev/null localhost:$port/ && break; sleep 0.1; done
	local c0 r0=0 c1 r1=0
	c0=$(ticks $pid)
	[ -z "${rpid:-}" ] || r0=$(ticks "$rpid")
	wrk -t1 -c32 -d"${secs}s" ${2:+-s "$2"} http://127.0.0.1:$port/ >"$tmp/wrk.out"
	c1=$(ticks $pid)
	[ -z "${rpid:-}" ] || r1=$(ticks "$rpid")
	awk '/Requests\/sec/ {print $2}' "$tmp/wrk.out"
	# CPU per request (clock ticks of 10 ms over the requests wrk sent):
	# the work each request costs, whatever share of the cores the
	# processes got on a shared machine.
	awk -v c=$((c1 - c0)) -v r=$((r1 - r0)) '/requests in/ {printf "%.1f %.1f\n", c * 1e4 / $1, r * 1e4 / $1}' "$tmp/wrk.out" >>"$tmp/cpu.$1"
	kill $pid; wait $pid 2>/dev/null || true
	# A run whose calls timed out opened the circuit breaker: for a while
	# the zone admitted without asking Redis, which flatters its figure.
	local opened
	opened=$(grep -c 'redis unreachable' "$tmp/caddy.log" || true)
	if [ "$opened" -gt 0 ]; then
		echo "$1: the circuit breaker opened $opened time(s) (Redis calls timed out; fail open admitted without Redis)" >>"$tmp/notes"
	fi
}

# E2E_CONFIGS picks some of the configs (names as printed), for more rounds
# of the ones being compared in the same time.
read -ra names <<<"${E2E_CONFIGS:-baseline one_zone three_scopes denying denying_json denying_json_headers}"
script=
if [ "$mode" = redis ]; then
	command -v redis-server >/dev/null || { echo "needs redis-server (apt-get install redis-server)"; exit 1; }
	rport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
	redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no >"$tmp/redis.log" 2>&1 &
	rpid=$!
	for _ in $(seq 50); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.1; done
	rcli() { redis-cli -p "$rport" "$@"; }
	# Each connection walks its own stride of 10,000 keys, one per request.
	script=$tmp/keys.lua
	cat >"$script" <<'LUA'
local n = 0
local counter = 0
setup = function(thread) counter = counter + 1; thread:set("id", counter) end
init = function() n = tonumber(wrk.thread:get("id") or 1) * 7919 end
request = function()
	n = n + 1
	return wrk.format(nil, nil, { ["X-Key"] = "k" .. (n % 10000) })
end
LUA
	redis_site() { # name, local_cache, zone name, rate
		site "$1" "	rate_limit {
		zone $3 {
			by header X-Key
			rate $4
			algorithm token_bucket
		}
	}" "	rate_limit {
		backend redis {
			address 127.0.0.1:$rport
			local_cache $2
			# On a loaded machine a call can take over the default 100ms;
			# the breaker would then open and the zone admit without
			# Redis, which is not what is measured here.
			timeout 1s
		}
	}"
	}
	redis_site redis_10k on e2e_redis "10000/1d"
	redis_site redis_10k_nocache off e2e_redis "10000/1d"
	redis_site flood_cache on e2e_flood "100/1s"
	redis_site flood_nocache off e2e_flood "100/1s"
	names=(baseline redis_10k redis_10k_nocache)
fi

# Rounds interleave the configs so that a noisy moment hits all of them.
declare -A results
for _ in $(seq "$rounds"); do
	for name in "${names[@]}"; do
		s=
		[ "$name" = baseline ] || s=$script
		results[$name]+="$(run "$name" "$s") "
	done
done
median() { tr ' ' '\n' <<<"$1" | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
for name in "${names[@]}"; do
	printf '%-21s median %9s req/s   runs: %s\n' "$name" "$(median "${results[$name]}")" "${results[$name]}"
done
for name in "${names[@]}"; do
	c=$(awk '{print $1}' "$tmp/cpu.$name" | sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}')
	r=$(awk '{print $2}' "$tmp/cpu.$name" | sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}')
	printf '%-21s CPU per request (medians): Caddy %5s µs (runs: %s)' "$name" "$c" "$(awk '{printf "%s ", $1}' "$tmp/cpu.$name")"
	if [ "$mode" = redis ]; then printf ', Redis %5s µs' "$r"; fi
	echo
done

[ ! -s "$tmp/notes" ] || { cat "$tmp/notes"; : >"$tmp/notes"; }
[ "$mode" = redis ] || exit 0

# Memory of the 10,000 token-bucket keys the runs above wrote (they stay
# for the bucket's refill time, 8.6 s per request at 10000/1d).
rcli --scan --pattern '*e2e_redis*' | sed 's/^/MEMORY USAGE /' | rcli >"$tmp/mem.out"
awk '{s += $1; n++} END {printf "Redis MEMORY USAGE per token-bucket key: %.1f bytes (mean of %d keys)\n", s / n, n}' "$tmp/mem.out"
printf 'one key: '; rcli --scan --pattern '*e2e_redis*' | awk 'NR == 1'

calls() { # EVALSHA + EVAL calls Redis has run so far
	rcli info commandstats | tr -d '\r' | awk -F'[=,:]' '/^cmdstat_eval(sha)?:/ {n += $3} END {print n + 0}'
}
# One key, all connections: 100/1s against what Caddy serves (~100x the limit).
for name in flood_cache flood_nocache; do
	for _ in $(seq "$rounds"); do
		before=$(calls)
		rps=$(run "$name")
		reqs=$(awk '/requests in/ {print $1}' "$tmp/wrk.out")
		after=$(calls)
		awk -v n="$name" -v r="$rps" -v q="$reqs" -v c="$((after - before))" \
			'BEGIN {printf "%-17s %9s req/s  %6.0fx the limit  %8d requests  %7d Redis calls  %.4f calls/request\n", n, r, r / 100, q, c, c / q}'
	done
done
[ ! -s "$tmp/notes" ] || cat "$tmp/notes"

rcli shutdown nosave >/dev/null 2>&1 || true
