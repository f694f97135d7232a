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
## the default) and the Redis tests again on Valkey (test-valkey), at once:
## .ci/test runs the packages, the integration tests cut in parts, and the
## Valkey leg as parallel test processes. The integration package logs
## every Caddy it starts, so a failure's own lines get lost in the output:
## they are printed again at the end (everything is in test.out, and the
## Valkey leg's in test-valkey.out).
test: vet
	@GO=$(GO) bash .ci/test

## test-valkey: the Redis backend's tests, and the integration tests that
## start a Redis server (SLUICE_TEST_REDIS_ONLY=1), on Valkey
## (SLUICE_REDIS_SERVER=valkey). Without valkey-server it warns and runs
## nothing, unless CI=true (then it fails).
test-valkey:
	@GO=$(GO) bash .ci/test valkey

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
