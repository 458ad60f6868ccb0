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

stack=$(mktemp -d "${TMPDIR:-/tmp}/keygate-test.XXXXXX")
trap 'scripts/stack.sh down "$stack"' EXIT
servers() {
	scripts/stack.sh up "$stack" >/dev/null
	# The Redis Cluster and TLS Redis of the redis_mode / redis_tls_ca tests, once per run.
	scripts/stack.sh up-cluster "$stack" >/dev/null
	scripts/stack.sh up-tls "$stack" >/dev/null
	scripts/stack.sh up-pgbouncer "$stack" >/dev/null
	scripts/stack.sh up-sentinel "$stack" >/dev/null
	scripts/stack.sh up-standbys "$stack" >/dev/null
}
stage "throwaway servers: PostgreSQL and two standbys, Redis, Cluster, TLS, PgBouncer, Sentinel" servers
# shellcheck disable=SC1091
source "$stack/env"
export DATABASE_URL REDIS_URL REDIS_CLUSTER_URL REDIS_TLS_URL REDIS_TLS_CA REDIS_TLS_WRONG_CA REDIS_SENTINEL_URL REDIS_SENTINEL_PRIMARY_PIDFILE \
	DATABASE_READ_URLS DATABASE_STANDBY_FAST_URL DATABASE_STANDBY_SLOW_URL STACK_DIR="$stack"

# Each stage says when it starts and how long it took: the whole takes about 19
# minutes on two cores (README.md).
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
# The integration suite stops and restarts the shared PostgreSQL and Redis, so it runs
# after the other packages rather than beside them.
stage "every package but integration" go test -count=1 -timeout 20m "$@" $(go list ./... | grep -v '/integration$')
stage "integration" go test -count=1 -timeout 30m "$@" ./integration

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
