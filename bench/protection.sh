#!/usr/bin/env bash
# The upstream slows from 200 ms to 2 s under 500 requests a second (Little's
# law: 100 in flight become 1,000). What the upstream has in flight, and what
# clients get, behind Caddy without a limit, with `concurrency 100` (503 at
# once), with `concurrency 100` and `queue 1s queue_max 50`, and with two
# instances sharing `concurrency 100` through Redis. About 20 s per run.
# Usage: bench/protection.sh [rps] [seconds]
set -euo pipefail
cd "$(dirname "$0")/.."
rps=${1:-500}
secs=${2:-15}
port=${SLUICE_BENCH_PORT:-18080}
port2=$((port + 1))
uport=$((port + 10))
go build -o bench/caddy ./cmd/caddy
go build -o bench/protection.bin ./bench/protection
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp" bench/protection.bin' EXIT

site() { # file, port, rate_limit block, global options
	cat > "$tmp/$1" <<CF
{
	admin off
	auto_https off
${4:-}
}
:$2 {
$3
	reverse_proxy 127.0.0.1:$uport {
		transport http {
			keepalive_idle_conns_per_host 2048
		}
	}
}
CF
}
limit() { # zone options
	printf '\trate_limit {\n\t\tzone protect {\n\t\t\tkey static\n%s\n\t\t}\n\t}' "$1"
}

start() { # config file -> pid
	bench/caddy run --config "$tmp/$1" --adapter caddyfile >/dev/null 2>>"$tmp/caddy.log" &
	echo $!
}
wait_up() {
	for _ in $(seq 100); do curl -s -o /dev/null "localhost:$1/" -m 0.1 && return; sleep 0.1; done
}

echo "| config | peak in flight at the upstream | mean in flight, slow phase | 200 | of them queued | 503 | 200 p50 / p99 | 503 p50 / p99 | other |"
echo "|---|---|---|---|---|---|---|---|---|"
run() { # name, targets, pids...
	local name=$1 targets=$2
	shift 2
	bench/protection.bin -upstream 127.0.0.1:$uport -targets "$targets" -rps "$rps" -duration "${secs}s" -name "$name"
	kill "$@" 2>/dev/null || true
	wait "$@" 2>/dev/null || true
}

site none.Caddyfile $port ""
site cap.Caddyfile $port "$(limit $'\t\t\tconcurrency 100')"
site queue.Caddyfile $port "$(limit $'\t\t\tconcurrency 100\n\t\t\tqueue 1s\n\t\t\tqueue_max 50')"

for c in none cap queue; do
	pid=$(start $c.Caddyfile)
	# The upstream is not up yet: any answer (502) means Caddy is.
	wait_up $port
	run "$c" "http://127.0.0.1:$port/" "$pid"
done

if command -v redis-server >/dev/null; then
	rport=$((port + 20))
	redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no >"$tmp/redis.log" 2>&1 &
	rpid=$!
	for _ in $(seq 50); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.1; done
	global="	rate_limit {
		backend redis {
			address 127.0.0.1:$rport
			timeout 1s
		}
	}"
	site redis1.Caddyfile $port "$(limit $'\t\t\tconcurrency 100')" "$global"
	site redis2.Caddyfile $port2 "$(limit $'\t\t\tconcurrency 100')" "$global"
	p1=$(start redis1.Caddyfile)
	p2=$(start redis2.Caddyfile)
	wait_up $port
	wait_up $port2
	run "redis, 2 instances" "http://127.0.0.1:$port/,http://127.0.0.1:$port2/" "$p1" "$p2"
	kill $rpid
fi
if grep -q 'redis unreachable' "$tmp/caddy.log"; then
	echo "note: the circuit breaker opened during a Redis run (calls over the timeout): that run admitted without Redis for a while"
fi
