# keygate: the two commands are `make run` and `make test`.
.PHONY: all build test run reload screenshots bench bench-capacity clean FORCE

GO ?= go

# VERSION is what the binaries report: the tag at HEAD, or Go's pseudo-version of HEAD
# (scripts/version.sh). A release sets it: make build VERSION=v0.1.0.
# It is computed once, not at each use.
ifndef VERSION
VERSION := $(shell scripts/version.sh)
endif
export VERSION

# Sources of each binary: a binary is rebuilt only when one of them is newer.
LIB_SRC      := $(shell find keystore limiter fieldstrip internal/gather internal/pgfailover internal/version internal/clientip gatewayauth -name '*.go' -not -name '*_test.go') go.mod go.sum gatewayauth/go.mod
CADDY_SRC    := $(LIB_SRC) $(shell find caddymodule -name '*.go' -not -name '*_test.go') xcaddy.sh
UPSTREAM_SRC := $(LIB_SRC) $(shell find upstream schema -name '*.go' -not -name '*_test.go' -o -name '*.sql' -o -path '*/web/*' -type f) \
                openapi/openapi.go $(wildcard openapi/*.yaml)

all: build

## build: bin/upstream and bin/caddy (Caddy with the v1_gateway module, via xcaddy.sh).
build: bin/upstream bin/caddy

bin/upstream: $(UPSTREAM_SRC) bin/.version
	$(GO) build -ldflags "-X github.com/keygate/keygate/internal/version.stamped=$(VERSION)" -o $@ ./upstream/cmd/upstream

bin/caddy: $(CADDY_SRC) bin/.version
	./xcaddy.sh

# bin/.version holds the version the binaries were built with; it changes, and so
# rebuilds them, only when VERSION does (a new commit).
bin/.version: FORCE
	@mkdir -p bin
	@[ "$$(cat $@ 2>/dev/null)" = "$(VERSION)" ] || echo "$(VERSION)" >$@

## test: every test against a throwaway PostgreSQL and Redis (started and stopped here).
test: build
	scripts/test.sh

## run: the whole stack with a demo org, user and key; prints curl commands to try.
## run.sh checks its ports first, then builds: a port in use fails at once.
run:
	scripts/run.sh

## reload: the running demo's gateway loads its Caddyfile again (GATEWAY_CONFIG=FILE:
## another), without a restart and without losing the demo's data.
reload:
	scripts/run.sh reload

## screenshots: docs/dashboard/*.png again, from the browser tests that take them.
screenshots:
	scripts/screenshots.sh

## bench: throughput and latency of the gateway against a plain reverse proxy.
bench: build
	scripts/bench.sh

## bench-capacity: bench's capacity section alone (docs/scaling.md), replaced in scripts/bench-results.txt.
bench-capacity: build
	BENCH_ONLY=capacity scripts/bench.sh

clean:
	rm -rf bin .stack
