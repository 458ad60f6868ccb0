#!/usr/bin/env bash
# test.sh is `make test`: it starts a throwaway PostgreSQL and Redis (or uses
# DATABASE_URL / REDIS_URL when set), runs every Go test against them, runs each fuzz
# target briefly, and tears the servers down even when a test fails.
set -euo pipefail
cd "$(dirname "$0")/.."

# A count, not a duration: Go 1.26's fuzz coordinator can fail a target with a bare
# "context deadline exceeded" when a duration runs out on a loaded machine
# (golang/go#75804, fixed in Go 1.27). A count has no deadline to race.
FUZZTIME=${FUZZTIME:-20000x}
# The dashboard's browser tests drive Debian's headless Chromium.
# shellcheck source=scripts/lib.sh
source scripts/lib.sh
[ -x /usr/bin/chromium ] || apt_install chromium
# The shell verifier of docs/security.md, which a test runs, needs jq.
command -v jq >/dev/null || apt_install jq
# deploy/'s tests check the alert rules with promtool (Debian's prometheus package,
# installed for its promtool) and the systemd units with systemd-analyze.
command -v promtool >/dev/null || apt_install prometheus
command -v systemd-analyze >/dev/null || apt_install systemd

# Two sets of servers: one for every package but integration, and one for the
# integration suite, which stops and restarts its PostgreSQL and Redis. With servers
# of its own it runs beside the other packages (see below). With DATABASE_URL or
# REDIS_URL set, both would be the servers named there: the suite then runs after
# the other packages, on the one set.
stack=$(mktemp -d "${TMPDIR:-/tmp}/keygate-test.XXXXXX")
istack=$stack
if [ -z "${DATABASE_URL:-}${REDIS_URL:-}" ]; then
	istack=$(mktemp -d "${TMPDIR:-/tmp}/keygate-test-integration.XXXXXX")
fi
trap '[ "$istack" = "$stack" ] || scripts/stack.sh down "$istack"; scripts/stack.sh down "$stack"' EXIT
servers() {
	local dir
	for dir in $(printf '%s\n' "$stack" "$istack" | uniq); do
		scripts/stack.sh up "$dir" >/dev/null
		# The Redis Cluster and TLS Redis of the redis_mode / redis_tls_ca tests.
		scripts/stack.sh up-cluster "$dir" >/dev/null
		scripts/stack.sh up-tls "$dir" >/dev/null
		scripts/stack.sh up-pgbouncer "$dir" >/dev/null
		scripts/stack.sh up-sentinel "$dir" >/dev/null
		scripts/stack.sh up-standbys "$dir" >/dev/null
	done
}
stage "throwaway servers: PostgreSQL and two standbys, Redis, Cluster, TLS, PgBouncer, Sentinel" servers
# stack_env DIR exports what the tests read of the servers in DIR.
stack_env() {
	# shellcheck disable=SC1090,SC1091
	source "$1/env"
	export DATABASE_URL REDIS_URL REDIS_CLUSTER_URL REDIS_TLS_URL REDIS_TLS_CA REDIS_TLS_WRONG_CA REDIS_SENTINEL_URL REDIS_SENTINEL_PRIMARY_PIDFILE \
		DATABASE_READ_URLS DATABASE_STANDBY_FAST_URL DATABASE_STANDBY_SLOW_URL STACK_DIR="$1"
}
stack_env "$stack"

# The integration suite runs beside everything up to the fuzz targets, on its own
# servers: the tests spend most of their time waiting (on timeouts, restarts,
# replays), not on the CPU. Its output is printed after the other packages', its own
# lines together. A stage that fails before then stops it (the trap below).
integration() { (stack_env "$istack" && go test -count=1 -timeout 30m "$@" ./integration); }
integration_pid=
if [ "$istack" != "$stack" ]; then
	stage "integration (beside the stages below; its output after every package's)" integration "$@" >"$istack/integration.log" 2>&1 &
	integration_pid=$!
fi
# kill_tree PID stops PID and every process it started.
kill_tree() {
	local child
	for child in $(pgrep -P "$1"); do kill_tree "$child"; done
	kill "$1" 2>/dev/null || true
}
trap '[ -z "$integration_pid" ] || kill_tree "$integration_pid"; [ "$istack" = "$stack" ] || scripts/stack.sh down "$istack"; scripts/stack.sh down "$stack"' EXIT

# Each stage says when it starts and how long it took (README.md gives the whole's
# time on two cores).
stage "go vet ./..." go vet ./...
# gatewayauth is a module of its own: ./... above leaves it out.
gatewayauth_tests() { (cd gatewayauth && go vet ./... && go test -count=1 "$@" ./...); }
stage "gatewayauth: go vet and go test" gatewayauth_tests "$@"
# The OpenAPI documents against a linter and a TypeScript client (go test ./openapi
# generates and builds the Go one).
stage "OpenAPI documents: lint and TypeScript client" scripts/openapi-check.sh
# The key lookups through PgBouncer in transaction pooling, with the exec mode
# docs/operations.md recommends (pgx's default statement cache fails there).
stage "keystore through PgBouncer" env DATABASE_URL="$PGBOUNCER_DATABASE_URL&default_query_exec_mode=exec" go test -count=1 ./keystore
packages() { go test -count=1 -timeout 20m "$@" $(go list ./... | grep -v '/integration$'); }
if [ -z "$integration_pid" ]; then
	stage "every package but integration" packages "$@"
	stage "integration" integration "$@"
else
	rc=0
	stage "every package but integration" packages "$@" || rc=$?
	irc=0
	wait "$integration_pid" || irc=$?
	integration_pid=
	cat "$istack/integration.log"
	if [ "$rc" != 0 ] || [ "$irc" != 0 ]; then exit 1; fi
fi

# Fuzz targets, briefly: each package's Fuzz functions one at a time, in both modules.
fuzz_all() {
	local module pkg fuzz
	for module in . gatewayauth; do
		for pkg in $(cd "$module" && go list ./...); do
			for fuzz in $(cd "$module" && go test -list '^Fuzz' "$pkg" 2>/dev/null | grep '^Fuzz' || true); do
				stage "fuzzing $pkg $fuzz ($FUZZTIME)" \
					sh -c 'cd "$1" && go test -run "^\$" -fuzz "^$2\$" -fuzztime "$3" "$4"' sh "$module" "$fuzz" "$FUZZTIME" "$pkg"
			done
		done
	done
}
stage "fuzz targets" fuzz_all
echo "make test: passed in $(duration "$SECONDS")"
