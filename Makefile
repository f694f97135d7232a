# Sluice: the two commands of the README, and a few helpers.
GO ?= go
SHELL := /bin/bash

.PHONY: run build test test-valkey bench fmt vet

## run: build Caddy with Sluice and serve Caddyfile.example on localhost:8080
run: build
	./caddy run --config Caddyfile.example

## build: build ./caddy (Caddy + standard modules + Sluice)
build:
	$(GO) build -o caddy ./cmd/caddy

## test: vet, then every test with the race detector on Redis (redis-server,
## the default), then the Redis tests again on Valkey (test-valkey). The
## integration package logs every Caddy it starts, so a failure's own lines
## get lost in the output: they are printed again at the end (everything is
## in test.out, and the Valkey leg's in test-valkey.out).
test: vet
	@set -o pipefail; $(GO) test -race -count=1 -timeout 40m ./... 2>&1 | tee test.out; status=$$?; \
	if [ $$status -ne 0 ]; then $(call failures,test.out); fi; exit $$status
	@$(MAKE) --no-print-directory test-valkey

# The integration tests that use Redis, by name: the fleets, the Cluster,
# Sentinel, failover, leases, concurrency slots.
VALKEY_RUN := Redis|Cluster

## test-valkey: the Redis backend's tests, and the integration tests that
## use Redis (-run '$(VALKEY_RUN)'), on Valkey (SLUICE_REDIS_SERVER=valkey).
## Without valkey-server it warns and runs nothing, unless CI=true (then
## the tests fail).
test-valkey:
	@if ! command -v valkey-server >/dev/null 2>&1 && [ "$${CI:-}" != true ]; then \
		echo "test-valkey: WARNING: valkey-server is not installed: the Redis tests were NOT run on Valkey"; exit 0; \
	fi; \
	command -v valkey-server >/dev/null 2>&1 && valkey-server --version; \
	set -o pipefail; export SLUICE_REDIS_SERVER=valkey; \
	$(GO) test -race -count=1 -timeout 30m ./internal/redistest/ ./backend/redis/ 2>&1 | tee test-valkey.out && \
	$(GO) test -race -count=1 -timeout 30m -run '$(VALKEY_RUN)' ./integration/ 2>&1 | tee -a test-valkey.out; status=$$?; \
	if [ $$status -ne 0 ]; then $(call failures,test-valkey.out); fi; exit $$status

# failures prints again what failed in the output file $(1).
failures = echo; echo "== what failed (the whole output is in $(1)) =="; \
	grep -E -A15 -- '--- FAIL|^panic:|^FAIL|DATA RACE' $(1) | grep -v '^{"level"' | head -300

## vet: gofmt, go vet, then staticcheck and promlinter at the versions .ci/tools pins.
## go vet compiles the dependencies it reads with -race, as the tests do:
## one compile of Caddy's 1,050 packages serves both (without it, a cold
## build cache compiled them twice).
vet:
	@test -z "$$(gofmt -l .)" || (echo "gofmt needed:"; gofmt -l .; exit 1)
	$(GO) vet -race ./...
	GO=$(GO) bash .ci/lint

## bench: the Go benchmarks (see BENCHMARKS.md for the commands behind its numbers)
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...
