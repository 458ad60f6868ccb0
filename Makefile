# keygate: the two commands are `make run` and `make test`.
.PHONY: all build caddy upstream test unit run bench clean

GO ?= go

all: build

## build: bin/upstream and bin/caddy (Caddy with the v1_gateway module, via xcaddy.sh).
build: upstream caddy

upstream:
	$(GO) build -o bin/upstream ./upstream/cmd/upstream

caddy:
	./xcaddy.sh

## test: every test against a throwaway PostgreSQL and Redis (started and stopped here).
test:
	scripts/test.sh

## run: the whole stack with a demo org, user and key; prints curl commands to try.
run:
	scripts/run.sh

## bench: throughput and latency of the gateway against a plain reverse proxy.
bench:
	scripts/bench.sh

clean:
	rm -rf bin .stack
