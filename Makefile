# Sluice: the two commands of the README, and a few helpers.
GO ?= go
SHELL := /bin/bash

.PHONY: run build test bench fmt vet

## run: build Caddy with Sluice and serve Caddyfile.example on localhost:8080
run: build
	./caddy run --config Caddyfile.example

## build: build ./caddy (Caddy + standard modules + Sluice)
build:
	$(GO) build -o caddy ./cmd/caddy

## test: vet, then every test with the race detector. The integration
## package logs every Caddy it starts, so a failure's own lines get lost in
## the output: they are printed again at the end (everything is in test.out).
test: vet
	@set -o pipefail; $(GO) test -race -count=1 -timeout 40m ./... 2>&1 | tee test.out; status=$$?; \
	if [ $$status -ne 0 ]; then \
		echo; echo "== what failed (the whole output is in test.out) =="; \
		grep -E -A15 -- '--- FAIL|^panic:|^FAIL|DATA RACE' test.out | grep -v '^{"level"' | head -300; \
	fi; exit $$status

## vet: gofmt, go vet, then staticcheck and promlinter at the versions .ci/tools pins
vet:
	@test -z "$$(gofmt -l .)" || (echo "gofmt needed:"; gofmt -l .; exit 1)
	$(GO) vet ./...
	GO=$(GO) bash .ci/lint

## bench: the Go benchmarks (see BENCHMARKS.md for the commands behind its numbers)
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...
