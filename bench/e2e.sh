#!/usr/bin/env bash
# End-to-end throughput of Caddy with and without Sluice, in one run on this
# machine: the same static response behind no limiter, one zone, a zone with
# three scopes, and a zone that denies almost everything (as a Caddy error,
# with the built-in JSON body, and with it and every header field). Uses wrk on
# loopback. Usage: bench/e2e.sh [seconds per run] [rounds]
#
# bench/e2e.sh redis [seconds per run] [rounds] measures the Redis backend
# against plain Caddy and the memory backend (token_bucket 1000/1m, 10,000
# keys, all allowed, wrk -t1 -c32), against a redis-server of its own:
#   shared  wrk on core 1; Caddy and redis-server on core 0
#   own     Redis on a core of its own (core 1); Caddy and wrk share core 0
#           (a 2-core machine has no third core)
# and the same zone with sliding_window ("redis_sliding", shared core only).
# It prints per configuration: requests/s and the ratio to plain Caddy in
# the same layout, Caddy CPU µs per request (/proc utime+stime), Redis CPU
# µs per decision (INFO cpu) and decisions per Redis call (INFO
# commandstats); then one key flooded at about 100x its limit and Redis
# memory per tracked key. SLUICE_BENCH_BEFORE=<caddy binary> adds the Redis
# configuration run with that binary ("redis_before"), for before/after
# ratios in one run. Medians of interleaved rounds. E2E_FLOOD=0 skips the
# flood and memory runs.
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
if [ "$mode" = memory ]; then
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

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; } # user + system CPU of a process

run() { # name [wrk script] -> requests/s
	bench/caddy run --config "$tmp/$1.Caddyfile" --adapter caddyfile >/dev/null 2>"$tmp/caddy.log" &
	local pid=$!
	for _ in $(seq 50); do curl -s -o /dev/null localhost:$port/ && break; sleep 0.1; done
	local c0 c1
	c0=$(ticks $pid)
	wrk -t1 -c32 -d"${secs}s" ${2:+-s "$2"} http://127.0.0.1:$port/ >"$tmp/wrk.out"
	c1=$(ticks $pid)
	awk '/Requests\/sec/ {print $2}' "$tmp/wrk.out"
	# CPU per request (clock ticks of 10 ms over the requests wrk sent):
	# the work each request costs, whatever share of the cores the
	# processes got on a shared machine.
	awk -v c=$((c1 - c0)) '/requests in/ {printf "%.1f\n", c * 1e4 / $1}' "$tmp/wrk.out" >>"$tmp/cpu.$1"
	kill $pid; wait $pid 2>/dev/null || true
}

# E2E_CONFIGS picks some of the configs (names as printed), for more rounds
# of the ones being compared in the same time.
read -ra names <<<"${E2E_CONFIGS:-baseline one_zone three_scopes denying denying_json denying_json_headers}"
# Rounds interleave the configs so that a noisy moment hits all of them.
declare -A results
for _ in $(seq "$rounds"); do
	for name in "${names[@]}"; do
		results[$name]+="$(run "$name") "
	done
done
median() { tr ' ' '\n' <<<"$1" | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
for name in "${names[@]}"; do
	printf '%-21s median %9s req/s   runs: %s\n' "$name" "$(median "${results[$name]}")" "${results[$name]}"
done
for name in "${names[@]}"; do
	printf '%-21s CPU per request (median): Caddy %5s µs (runs: %s)\n' "$name" \
		"$(median "$(tr '\n' ' ' <"$tmp/cpu.$name")")" "$(tr '\n' ' ' <"$tmp/cpu.$name")"
done
exit 0
fi

# The Redis backend.
for cmd in redis-server redis-cli taskset python3; do
	command -v $cmd >/dev/null || { echo "needs $cmd"; exit 1; }
done
[ "$(nproc)" -ge 2 ] || { echo "needs 2 cores"; exit 1; }
before=${SLUICE_BENCH_BEFORE:-}
rport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no >"$tmp/redis.log" 2>&1 &
rpid=$!
for _ in $(seq 50); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.1; done
rcli() { redis-cli -p "$rport" "$@"; }
# Each connection walks its own stride of 10,000 keys, one per request.
keys=bench/keys.lua
zone() { # name, rate[, algorithm]
	echo "	rate_limit {
		zone $1 {
			by header X-Key
			rate $2
			algorithm ${3:-token_bucket}
		}
	}"
}
backend() { # local_cache
	echo "	rate_limit {
		backend redis {
			address 127.0.0.1:$rport
			local_cache $1
			# On a loaded machine a call can take over the default 100ms;
			# the breaker would then open and the zone admit without
			# Redis, which is not what is measured here.
			timeout 1s
		}
	}"
}
site plain ""
site memory "$(zone e2e_memory 1000/1m)"
site redis "$(zone e2e_redis 1000/1m)" "$(backend on)"
# The sliding log beside it: Redis's CPU per decision of the two, as the
# log keeps its events for the window where a bucket that refills is
# forgotten.
site redis_sliding "$(zone e2e_sliding 1000/1m sliding_window)" "$(backend on)"
site keys_1d "$(zone e2e_keys 10000/1d)" "$(backend on)"
site flood_cache "$(zone e2e_flood 100/1s)" "$(backend on)"
site flood_nocache "$(zone e2e_flood 100/1s)" "$(backend off)"

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; } # user + system CPU of a process
rcpu() { rcli info cpu | tr -d '\r' | awk -F: '/^used_cpu_(sys|user):/ {s += $2} END {printf "%.6f", s}'; }
calls() { # script calls Redis has run so far
	rcli info commandstats | tr -d '\r' | awk -F'[=,:]' '/^cmdstat_(eval|evalsha|fcall|fcall_ro):/ {n += $3} END {print n + 0}'
}
pin() { taskset -pc "$1" "$2" >/dev/null; }

# run name layout [binary]: one wrk run; appends "rps caddy_us redis_us
# decisions_per_call" to $tmp/out.<name>.<layout>.
run() {
	local name=$1 layout=$2 bin=${3:-bench/caddy} conf=$1 caddy_core=0 wrk_core=1 redis_core=0
	[ "$name" != redis_before ] || conf=redis
	if [ "$layout" = own ]; then wrk_core=0 redis_core=1; fi
	pin "$redis_core" "$rpid"
	taskset -c "$caddy_core" "$bin" run --config "$tmp/$conf.Caddyfile" --adapter caddyfile >/dev/null 2>"$tmp/caddy.log" &
	local pid=$!
	for _ in $(seq 50); do curl -s -o /dev/null localhost:$port/ && break; sleep 0.1; done
	local args=(-t1 -c32 -d"${secs}s")
	[ "$name" = plain ] || args+=(-s "$keys")
	[[ $name != flood_* ]] || args=(-t1 -c32 -d"${secs}s" -H "X-Key: one")
	local c0 c1 r0 r1 n0 n1
	c0=$(ticks $pid) r0=$(rcpu) n0=$(calls)
	taskset -c "$wrk_core" wrk "${args[@]}" http://127.0.0.1:$port/ >"$tmp/wrk.out"
	c1=$(ticks $pid) r1=$(rcpu) n1=$(calls)
	kill $pid; wait $pid 2>/dev/null || true
	# CPU per request from clock ticks of 10 ms over the requests wrk
	# got answers to: the work each request costs, whatever share of the
	# cores the processes got on a shared machine. Every request here is
	# one decision (all allowed, so the over-limit cache answers none).
	awk -v c=$((c1 - c0)) -v r="$(awk -v a="$r0" -v b="$r1" 'BEGIN {print b - a}')" -v k=$((n1 - n0)) '
		/Requests\/sec/ {rps = $2}
		/requests in/ {n = $1}
		/Non-2xx/ {bad = $NF}
		END {printf "%s %.1f %.1f %.2f %d %d\n", rps, c * 1e4 / n, k ? r * 1e6 / n : 0, k ? n / k : 0, bad, k}
	' "$tmp/wrk.out" >>"$tmp/out.$name.$layout"
	# A run whose calls timed out opened the circuit breaker: for a while
	# the zone admitted without asking Redis, which flatters its figure.
	local opened
	opened=$(grep -c 'redis unreachable' "$tmp/caddy.log" || true)
	if [ "$opened" -gt 0 ]; then
		echo "$name ($layout): the circuit breaker opened $opened time(s) (Redis calls timed out; fail open admitted without Redis)" >>"$tmp/notes"
	fi
}

median() { sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
col() { awk -v c="$2" '{print $c}' "$tmp/out.$1" | median; } # name.layout, column

runs=("plain shared" "memory shared" "redis shared" "redis_sliding shared" "plain own" "memory own" "redis own")
if [ -n "$before" ]; then runs+=("redis_before shared" "redis_before own"); fi
# E2E_RUNS picks some of the runs ("name layout" pairs, comma-separated),
# for more rounds of the ones being compared in the same time.
[ -z "${E2E_RUNS:-}" ] || IFS=, read -ra runs <<<"$E2E_RUNS"
# Rounds interleave the configs so that a noisy moment hits all of them.
for round in $(seq "$rounds"); do
	for r in "${runs[@]}"; do
		read -r name layout <<<"$r"
		bin=bench/caddy
		[ "$name" != redis_before ] || bin=$before
		run "$name" "$layout" "$bin"
		echo "round $round $name ($layout): $(tail -1 "$tmp/out.$name.$layout")" >&2
	done
done

echo "Medians of $rounds interleaved rounds of ${secs}s, wrk -t1 -c32, 10,000 keys, token_bucket 1000/1m (redis_sliding: sliding_window), all allowed."
echo "shared: Caddy and redis-server on core 0, wrk on core 1. own: redis-server on core 1, Caddy and wrk on core 0."
echo "Throughput ratios are noisy on a machine others use; the CPU figures are per request and steadier."
echo
printf '| layout | config | req/s | vs plain | Caddy CPU µs/request | vs memory | Redis CPU µs/decision | decisions/call |\n'
printf '|---|---|---|---|---|---|---|---|\n'
for r in "${runs[@]}"; do
	read -r name layout <<<"$r"
	rps=$(col "$name.$layout" 1)
	ratio=–
	if [ -f "$tmp/out.plain.$layout" ]; then
		ratio=$(awk -v a="$rps" -v b="$(col "plain.$layout" 1)" 'BEGIN {printf "%.2f×", a / b}')
	fi
	cpu=$(col "$name.$layout" 2)
	added=–
	if [ -f "$tmp/out.memory.$layout" ] && [ "$name" != plain ] && [ "$name" != memory ]; then
		added=$(awk -v a="$cpu" -v b="$(col "memory.$layout" 2)" 'BEGIN {printf "%+.1f", a - b}')
	fi
	redis=– dpc=–
	if [[ $name == redis* ]]; then redis=$(col "$name.$layout" 3) dpc=$(col "$name.$layout" 4); fi
	printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "$layout" "$name" "$rps" "$ratio" "$cpu" "$added" "$redis" "$dpc"
done
echo
[ ! -s "$tmp/notes" ] || { cat "$tmp/notes"; : >"$tmp/notes"; }

[ "${E2E_FLOOD:-1}" = 1 ] || exit 0
# Memory per token-bucket key: 10,000 keys at 10000/1d, which stay for the
# bucket's refill time (8.6 s per request) where 1000/1m keys go in 60 ms.
run keys_1d shared
rcli --scan --pattern '*e2e_keys*' | sed 's/^/MEMORY USAGE /' | rcli >"$tmp/mem.out"
awk '{s += $1; n++} END {printf "Redis MEMORY USAGE per token-bucket key: %.1f bytes (mean of %d keys)\n", s / n, n}' "$tmp/mem.out"
printf 'one key: '; rcli --scan --pattern '*e2e_keys*' | awk 'NR == 1'

# One key, all connections: 100/1s against what Caddy serves (~100x the limit).
for name in flood_cache flood_nocache; do
	for _ in $(seq "$rounds"); do
		run "$name" shared
		awk -v n="$name" '{printf "%-17s %9s req/s  %6.0fx the limit  %7d Redis calls  %.4f calls/request\n", n, $1, $1 / 100, $6, $4 ? 1 / $4 : 0}' <(tail -1 "$tmp/out.$name.shared")
	done
done
[ ! -s "$tmp/notes" ] || cat "$tmp/notes"

rcli shutdown nosave >/dev/null 2>&1 || true
