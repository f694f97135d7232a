#!/usr/bin/env bash
# Sluice beside the limiters Caddy operators compare it with, in one run on
# this machine: plain Caddy, mholt/caddy-ratelimit (built here at this
# project's Caddy version), Sluice on memory and on Redis, and nginx's
# limit_req over its own plain nginx. Each limiter is measured with every
# request allowed (10,000 keys, 1000 per minute each, none reaching it) and
# with nearly every request denied (one key, 100 per minute).
#
# The server (and its redis-server) runs on core 0, wrk on core 1, one
# configuration at a time, rounds interleaved so that a noisy moment hits
# them all. Figures are medians: requests/s, CPU per request of the server
# processes from /proc (Redis's separately), p99 latency from wrk, and the
# server's peak RSS.
#
# Usage: bench/peers.sh [seconds per run] [rounds]
# Writes the medians to docs/img/peers.tsv and draws the charts
# docs/img/peers-*.svg from them (bench/chart).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
rounds=${2:-3}
port=${SLUICE_BENCH_PORT:-18090}
for cmd in wrk nginx redis-server redis-cli taskset; do
	command -v $cmd >/dev/null || { echo "peers: needs $cmd (apt-get install wrk nginx redis-server util-linux)"; exit 1; }
done
[ "$(nproc)" -ge 2 ] || { echo "peers: needs 2 cores (server on one, wrk on the other)"; exit 1; }
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; [ -f "$tmp/nginx.pid" ] && kill "$(cat "$tmp/nginx.pid")" 2>/dev/null; rm -rf "$tmp"' EXIT

# The peers are built at the Caddy version this project builds with, so
# that only the limiter differs. mholt/caddy-ratelimit comes from the Go
# module proxy, as xcaddy would fetch it.
caddy_version=$(awk '$1 == "github.com/caddyserver/caddy/v2" {print $2}' go.mod)
mholt_version=${MHOLT_VERSION:-v0.1.0}
go build -o bench/caddy ./cmd/caddy
mkdir "$tmp/mholt"
(
	cd "$tmp/mholt"
	go mod init peers.local/mholt >/dev/null 2>&1
	cat >main.go <<'GO'
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"
	_ "github.com/mholt/caddy-ratelimit"
)

func main() { caddycmd.Main() }
GO
	go get "github.com/caddyserver/caddy/v2@$caddy_version" "github.com/mholt/caddy-ratelimit@$mholt_version" >/dev/null 2>&1
	go mod tidy >/dev/null 2>&1
	go build -o "$tmp/caddy-mholt" .
)

rport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
taskset -c 0 redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no >"$tmp/redis.log" 2>&1 &
rpid=$!
for _ in $(seq 50); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.1; done


caddyfile() { # name, handler block[, global options]
	cat >"$tmp/$1.Caddyfile" <<CF
{
	admin off
	auto_https off
${3:-}
}
:$port {
	route {
$2
		respond "ok"
	}
}
CF
}
caddyfile caddy_plain ""
mholt() { # name, events per minute
	caddyfile "$1" "		rate_limit {
			zone $1 {
				key {http.request.header.X-Key}
				events $2
				window 1m
			}
		}"
}
mholt mholt_allowed 1000
mholt mholt_denied 100
sluice() { # name, rate[, global options]
	caddyfile "$1" "		rate_limit {
			zone $1 {
				by header X-Key
				rate $2
				algorithm token_bucket
			}
		}" "${3:-}"
}
sluice sluice_memory_allowed 1000/1m
sluice sluice_memory_denied 100/1m
redis_backend="	rate_limit {
		backend redis {
			address 127.0.0.1:$rport
			# A loaded machine can take over the default 100ms; an open
			# breaker would admit without Redis, which is not measured here.
			timeout 1s
		}
	}"
sluice sluice_redis_allowed 1000/1m "$redis_backend"
sluice sluice_redis_denied 100/1m "$redis_backend"

mkdir "$tmp/www"
chmod 755 "$tmp" "$tmp/www" # nginx's worker runs as another user
printf ok >"$tmp/www/ok"
nginx_conf() { # name, limit_req line (empty for plain)
	cat >"$tmp/$1.nginx.conf" <<NGINX
worker_processes 1;
daemon off;
pid $tmp/nginx.pid;
error_log $tmp/nginx-error.log;
events { worker_connections 1024; }
http {
	access_log off;
	default_type text/plain;
	limit_req_zone \$http_x_key zone=allowed:10m rate=1000r/m;
	limit_req_zone \$http_x_key zone=denied:1m rate=100r/m;
	limit_req_status 429;
	server {
		listen 127.0.0.1:$port;
		root $tmp/www;
		# A file, not "return": return answers before limit_req runs.
		location / { $2 }
	}
}
NGINX
}
nginx_conf nginx_plain ""
nginx_conf nginx_allowed "limit_req zone=allowed;"
nginx_conf nginx_denied "limit_req zone=denied;"

ticks() { # user + system CPU ticks of the processes $@
	local t=0 p
	for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done
	echo $t
}

start() { # name: starts the server, sets pids to its processes
	case $1 in
	nginx_*)
		taskset -c 0 nginx -c "$tmp/$1.nginx.conf" -p "$tmp" >/dev/null 2>&1 &
		;;
	mholt_*)
		taskset -c 0 "$tmp/caddy-mholt" run --config "$tmp/$1.Caddyfile" --adapter caddyfile >/dev/null 2>"$tmp/server.log" &
		;;
	*)
		taskset -c 0 bench/caddy run --config "$tmp/$1.Caddyfile" --adapter caddyfile >/dev/null 2>"$tmp/server.log" &
		;;
	esac
	pids=($!)
	for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$port/ok" && break; sleep 0.1; done
	if [[ $1 == nginx_* ]]; then pids+=($(pgrep -P "${pids[0]}")); fi
}

run() { # name: appends "rps cpu_us redis_us p99_ms rss_mb denied_share" to out[name]
	local args=(-t1 -c32 -d"${secs}s" --latency)
	start "$1"
	case $1 in
	*_denied) args+=(-H "X-Key: one") ;;
	*_plain) ;;
	*) args+=(-s bench/keys.lua) ;;
	esac
	local c0 r0 c1 r1
	c0=$(ticks "${pids[@]}")
	r0=$(ticks "$rpid")
	taskset -c 1 wrk "${args[@]}" "http://127.0.0.1:$port/ok" >"$tmp/wrk.out"
	c1=$(ticks "${pids[@]}")
	r1=$(ticks "$rpid")
	local rss=0 p
	for p in "${pids[@]}"; do rss=$((rss + $(awk '/VmHWM/ {print $2}' "/proc/$p/status"))); done
	kill "${pids[0]}"
	wait "${pids[0]}" 2>/dev/null || true
	# Clock ticks are 10 ms: over a run of several seconds, per request
	# they resolve well under a microsecond.
	local line
	line=$(awk -v c=$((c1 - c0)) -v r=$((r1 - r0)) -v rss="$rss" '
		/Requests\/sec/ {rps = $2}
		/requests in/ {n = $1}
		/^ +99%/ {v = $2; u = v; sub(/[0-9.]+/, "", u); sub(/[a-z]+$/, "", v)
			p99 = (u == "us") ? v / 1000 : (u == "s") ? v * 1000 : v}
		/Non-2xx/ {bad = $NF}
		END {printf "%s %.1f %.1f %.2f %.1f %.3f\n", rps, c * 1e4 / n, r * 1e4 / n, p99, rss / 1024, bad / n}
	' "$tmp/wrk.out")
	out[$1]+="$line"$'\n'
	echo "round $round $1: $line" >&2
	if [[ $1 == sluice_redis_* ]] && grep -q 'redis unreachable' "$tmp/server.log"; then
		echo "peers: $1: the Redis circuit breaker opened; that run admitted without Redis" >&2
	fi
}

names=(caddy_plain mholt_allowed sluice_memory_allowed sluice_redis_allowed mholt_denied sluice_memory_denied sluice_redis_denied nginx_plain nginx_allowed nginx_denied)
declare -A out
pids=()
for round in $(seq "$rounds"); do
	for name in "${names[@]}"; do
		# A fresh Redis state per run, so that denied runs start alike.
		redis-cli -p "$rport" flushall >/dev/null
		run "$name"
	done
done

median() { sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
mkdir -p docs/img
tsv=docs/img/peers.tsv
{
	printf '# bench/peers.sh %s s x %s rounds, %s, %s cores, Caddy %s, mholt/caddy-ratelimit %s, %s, %s\n' \
		"$secs" "$rounds" "$(date -u +%F)" "$(nproc)" "$caddy_version" "$mholt_version" \
		"$(nginx -v 2>&1 | sed 's/.*: //')" "$(redis-server --version | sed 's/.*v=\([^ ]*\).*/Redis \1/')"
	printf 'name\tbase\trps\tcpu_us\tredis_us\tp99_ms\trss_mb\tdenied\n'
	for name in "${names[@]}"; do
		base=caddy_plain
		[[ $name == nginx_* ]] && base=nginx_plain
		printf '%s\t%s' "$name" "$base"
		for col in 1 2 3 4 5 6; do
			printf '\t%s' "$(awk -v c=$col 'NF {print $c}' <<<"${out[$name]}" | median)"
		done
		echo
	done
} >"$tsv"
head -1 "$tsv"
go run ./bench/chart -in "$tsv" -out docs/img -md
