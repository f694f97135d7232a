# Sluice: the two commands of the README, and a few helpers.
GO ?= go

.PHONY: run build test bench fmt vet

## run: build Caddy with Sluice and serve Caddyfile.example on localhost:8080
run: build
	./caddy run --config Caddyfile.example

## build: build ./caddy (Caddy + standard modules + Sluice)
build:
	$(GO) build -o caddy ./cmd/caddy

## test: vet, then every test with the race detector
test: vet
	$(GO) test -race -count=1 ./...

## vet: gofmt, go vet, then staticcheck and promlinter at the versions .ci/tools pins
vet:
	@test -z "$$(gofmt -l .)" || (echo "gofmt needed:"; gofmt -l .; exit 1)
	$(GO) vet ./...
	GO=$(GO) bash .ci/lint

## bench: the Go benchmarks (see BENCHMARKS.md for the commands behind its numbers)
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...
