#!/usr/bin/env bash
# run.sh is `make run`: it checks its ports, builds everything, starts PostgreSQL,
# Redis, the upstream and the gateway (Caddyfile.example), creates a demo org, user
# and API key through the operator CLI and the dashboard, prints curl commands to
# try, and stops everything on Ctrl-C.
#
#   scripts/run.sh           # make run
#   scripts/run.sh reload    # make reload: the running demo's gateway loads its
#                            # Caddyfile again, or GATEWAY_CONFIG's, without a restart
#
# Environment: GATEWAY_PORT (default 8080), UPSTREAM_PORT (default 9000),
# METRICS_PORT (the gateway's /metrics, default 9180), UPSTREAM_ADMIN_PORT (the
# upstream's /metrics, /healthz, /readyz; default 9001),
# GATEWAY_BIND (the gateway's address, default 127.0.0.1; empty for every interface),
# GATEWAY_CONFIG (the gateway's Caddyfile, default Caddyfile.example; one of your own
# keeps `admin unix/{$CADDY_ADMIN_SOCKET}` for reloads),
# UPSTREAM_FLAGS (more flags of `upstream serve`, split on spaces: for example
# --webhook-allow-http --webhook-allow-private for a webhook receiver on loopback),
# DEMO_PASSWORD (the demo owner's password, default a random one),
# DATABASE_URL / REDIS_URL to use servers you already run.
# RUN_CHECK=1 runs the printed curl commands itself, reloads the gateway, and exits
# (used by the tests); RUN_CHECK_WEBHOOK_URL, with it, is a receiver the check sends a
# test webhook to and waits for.
#
# Everything a restart by hand needs is in .stack/run/env, beside DATABASE_URL and
# REDIS_URL: the ports and addresses, IDENTITY_KEY, GATEWAY_JWKS, CADDY_ADMIN_SOCKET,
# GATEWAY_CONFIG and UPSTREAM_FLAGS.
#
# Everything it starts listens on loopback, but the gateway when GATEWAY_BIND says
# otherwise: a demo is no server for the network. The demo owner's password is printed
# only to a terminal, never into a file or a log: set DEMO_PASSWORD to know it when the
# output goes elsewhere.
set -euo pipefail
# GATEWAY_CONFIG is a path from where the command was given.
if [ -n "${GATEWAY_CONFIG:-}" ]; then
	GATEWAY_CONFIG=$(realpath -- "$GATEWAY_CONFIG")
fi
cd "$(dirname "$0")/.."
source scripts/lib.sh
stack=.stack/run

# adapt_gateway adapts GATEWAY_CONFIG into $stack/caddy.json. The example's gateway
# site listens on every interface, as a gateway does. The demo's is bound to
# GATEWAY_BIND: Caddy binds a site by its bind directive, not by the host of its
# address, so the listener is rewritten. A Caddyfile of one's own listens where it says.
adapt_gateway() {
	local listen json
	bin/caddy adapt --config "$GATEWAY_CONFIG" --adapter caddyfile 2>"$stack/adapt.log" >"$stack/caddy.json.new" ||
		{ cat "$stack/adapt.log" >&2; return 1; }
	listen="\"listen\":[\":$GATEWAY_PORT\"]"
	json=$(<"$stack/caddy.json.new")
	if grep -qF "$listen" "$stack/caddy.json.new"; then
		json=${json//"$listen"/"\"listen\":[\"$GATEWAY_BIND:$GATEWAY_PORT\"]"}
	elif [ "$GATEWAY_CONFIG" = "$PWD/Caddyfile.example" ]; then
		echo "make run: no $listen in the adapted Caddyfile.example" >&2
		return 1
	fi
	printf '%s\n' "$json" >"$stack/caddy.json"
	rm -f "$stack/caddy.json.new"
}

# reload is `make reload`: the running demo's gateway loads GATEWAY_CONFIG (the one it
# runs, unless given another) through its admin API's socket, and keeps its
# connections, the demo's data and its counters.
reload() {
	local config=${GATEWAY_CONFIG:-}
	[ -f "$stack/env" ] || { echo "make reload: no demo runs here: start one with make run" >&2; exit 1; }
	# shellcheck disable=SC1091
	source "$stack/env"
	GATEWAY_CONFIG=${config:-$GATEWAY_CONFIG}
	adapt_gateway
	bin/caddy reload --config "$stack/caddy.json" --address "unix/$CADDY_ADMIN_SOCKET" --force 2>>"$stack/adapt.log" ||
		{ echo "make reload: the gateway refused the config or did not answer on $CADDY_ADMIN_SOCKET (see $stack/adapt.log, $stack/caddy.log)" >&2; exit 1; }
	sed -i "/^export GATEWAY_CONFIG=/d" "$stack/env"
	printf 'export GATEWAY_CONFIG=%q\n' "$GATEWAY_CONFIG" >>"$stack/env"
	echo "make reload: the gateway runs $GATEWAY_CONFIG"
}

if [ "${1:-}" = reload ]; then
	reload
	exit 0
fi
[ $# = 0 ] || { echo "usage: scripts/run.sh [reload]" >&2; exit 2; }

GATEWAY_PORT=${GATEWAY_PORT:-8080}
GATEWAY_BIND=${GATEWAY_BIND-127.0.0.1}
UPSTREAM_PORT=${UPSTREAM_PORT:-9000}
METRICS_PORT=${METRICS_PORT:-9180}
UPSTREAM_ADMIN_PORT=${UPSTREAM_ADMIN_PORT:-9001}
GATEWAY_CONFIG=${GATEWAY_CONFIG:-$PWD/Caddyfile.example}
UPSTREAM_FLAGS=${UPSTREAM_FLAGS:-}
[ -f "$GATEWAY_CONFIG" ] || { echo "make run: GATEWAY_CONFIG $GATEWAY_CONFIG is no file" >&2; exit 1; }
for p in "$GATEWAY_PORT" "$UPSTREAM_PORT" "$METRICS_PORT" "$UPSTREAM_ADMIN_PORT"; do
	if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
		echo "port $p is in use: set GATEWAY_PORT / UPSTREAM_PORT / METRICS_PORT / UPSTREAM_ADMIN_PORT to free ones" >&2
		exit 1
	fi
done
need_tools curl openssl

start=$SECONDS
echo "make run: building bin/caddy and bin/upstream (about 5 minutes the first time, seconds once built)"
make -s build
echo "make run: built in $(duration $((SECONDS - start))); starting PostgreSQL, Redis, the upstream and the gateway"

mkdir -p .stack
pids=()
trap 'stop_stack "$stack"' EXIT
trap 'exit 0' INT TERM
scripts/stack.sh down "$stack"
scripts/stack.sh up "$stack" >/dev/null
source "$stack/env"
# Signed identity: the gateway signs who is calling with a key made here, and the
# upstream verifies it with the public half the gateway publishes. No shared secret.
IDENTITY_KEY="$PWD/$stack/identity.pem"
openssl genpkey -algorithm ed25519 -out "$IDENTITY_KEY"
unset GATEWAY_SECRET
# The address to reach the gateway at: loopback when it listens on every interface.
case "$GATEWAY_BIND" in
"" | 0.0.0.0 | :: | "[::]") base="http://127.0.0.1:$GATEWAY_PORT" ;;
*:*) base="http://[${GATEWAY_BIND#[}" base="${base%]}]:$GATEWAY_PORT" ;;
*) base="http://$GATEWAY_BIND:$GATEWAY_PORT" ;;
esac
# Caddyfile.example reads GATEWAY_ADDR and UPSTREAM_ADDR to place the gateway and find
# the upstream, CADDY_ADMIN_SOCKET for its admin API; the upstream reads GATEWAY_JWKS.
GATEWAY_ADDR=":$GATEWAY_PORT" UPSTREAM_ADDR="127.0.0.1:$UPSTREAM_PORT" UPSTREAM_ADMIN_ADDR="127.0.0.1:$UPSTREAM_ADMIN_PORT"
GATEWAY_JWKS="$base/.well-known/jwks.json" CADDY_ADMIN_SOCKET="$PWD/$stack/caddy-admin.sock"
# Everything a restart by hand needs, for `source .stack/run/env`.
for v in IDENTITY_KEY GATEWAY_PORT GATEWAY_BIND UPSTREAM_PORT METRICS_PORT UPSTREAM_ADMIN_PORT GATEWAY_ADDR \
	UPSTREAM_ADDR UPSTREAM_ADMIN_ADDR GATEWAY_JWKS CADDY_ADMIN_SOCKET GATEWAY_CONFIG UPSTREAM_FLAGS; do
	printf 'export %s=%q\n' "$v" "${!v}"
	export "${v?}"
done >>"$stack/env"
export DATABASE_URL REDIS_URL

bin/upstream migrate >/dev/null
# The upstream may start before the gateway: it fetches the JWKS when the first
# assertion comes.
# shellcheck disable=SC2086 # UPSTREAM_FLAGS is a list of flags
bin/upstream serve --addr "$UPSTREAM_ADDR" --admin-addr "$UPSTREAM_ADMIN_ADDR" $UPSTREAM_FLAGS >"$stack/upstream.log" 2>&1 &
pids+=($!)
adapt_gateway
bin/caddy run --config "$stack/caddy.json" >"$stack/caddy.log" 2>&1 &
pids+=($!)
wait_http "http://$UPSTREAM_ADDR/" || { cat "$stack/upstream.log" >&2; exit 1; }
wait_http "$base/" || { cat "$stack/caddy.log" >&2; exit 1; }

# The demo organisation, through the operator CLI.
email=demo@example.com
password=${DEMO_PASSWORD:-demo-password-$RANDOM$RANDOM}
org=$(bin/upstream org create --name "Demo" --plan pro | json_field id)
printf '%s\n' "$password" | bin/upstream user create --email "$email" --password-stdin >/dev/null
bin/upstream member add --org "$org" --email "$email" --role Owner >/dev/null

# The demo key, as a person creates it: log in, then POST to the dashboard route.
jar="$stack/cookies"
login "$email" "$password" "$jar" "$base"
key=$(create_key "$org" "demo key" Admin "$jar" "$base")
[ -n "$key" ] || { echo "could not create the demo key" >&2; exit 1; }

# The password goes to a terminal only; output that goes to a file or a pipe (a CI
# log) says how to know it instead.
terminal=0
[ -t 1 ] && terminal=1
shown=$(shown_password "$password" "$terminal")
cat <<EOF

keygate is running:
  gateway   $base   (Caddy with v1_gateway, config ${GATEWAY_CONFIG#"$PWD/"} adapted to $stack/caddy.json, listening on ${GATEWAY_BIND:-every interface}:$GATEWAY_PORT)
  upstream  http://$UPSTREAM_ADDR${UPSTREAM_FLAGS:+   (serve $UPSTREAM_FLAGS)}
  logs      $stack/caddy.log, $stack/upstream.log
  metrics   http://127.0.0.1:$METRICS_PORT/metrics (gateway), http://127.0.0.1:$UPSTREAM_ADMIN_PORT/metrics (upstream)
  health    $base/healthz (gateway), http://127.0.0.1:$UPSTREAM_ADMIN_PORT/healthz, /readyz (upstream)
  identity  $base/.well-known/jwks.json (the key that signs X-Gateway-Identity: $IDENTITY_KEY)
  OpenAPI   $base/openapi/v1.yaml, $base/openapi/dashboard.yaml

Demo org $org, owner $email / $shown, API key (shown once):
  export KEY='$key'

The operator's command line against this demo, in another shell (DATABASE_URL and REDIS_URL):
  source $PWD/$stack/env
  bin/upstream plan list

A changed Caddyfile, or one of your own, without a restart and without losing the demo's data:
  make reload                              # $stack/caddy.json from ${GATEWAY_CONFIG#"$PWD/"} again
  GATEWAY_CONFIG=my.Caddyfile make reload  # your own; keep \`admin unix/{\$CADDY_ADMIN_SOCKET}\`
Or restart one of them by hand, once this one is stopped (kill it), with the environment it had:
  source $PWD/$stack/env
  bin/caddy run --config $stack/caddy.json
  bin/upstream serve --addr \$UPSTREAM_ADDR --admin-addr \$UPSTREAM_ADMIN_ADDR \$UPSTREAM_FLAGS

Try:
  curl -s $base/v1/me -H "Authorization: Bearer \$KEY"
  curl -s $base/v1/monitors -H "Authorization: Bearer \$KEY" -H 'Content-Type: application/json' \\
       -d '{"name":"example","type":"http","target":"https://example.com","interval_seconds":60,"config":{"method":"GET"}}'
  curl -s $base/v1/monitors -H "Authorization: Bearer \$KEY"

Dashboard in a browser:
  $base/dashboard   log in as $email / $shown

Dashboard's JSON API (session cookie):
  curl -s -c jar -H 'Content-Type: application/json' -d '{"email":"$email","password":"$shown"}' $base/auth/login
  curl -s -b jar $base/orgs/$org/api-keys

Stop with Ctrl-C: everything started here is stopped and its data removed.
EOF

if [ "${RUN_CHECK:-}" = 1 ]; then
	# expect PATTERN CURL-ARGS... fetches with curl and greps the whole answer: a grep -q
	# reading from curl's pipe could close it before curl wrote all (curl exit 23).
	expect() {
		local pattern=$1 out
		shift
		out=$(curl -sf "$@") || { echo "run check: curl $* failed" >&2; return 1; }
		grep -q -- "$pattern" <<<"$out" || { echo "run check: no $pattern in: $out" >&2; return 1; }
	}
	set -x
	expect "\"org_id\":\"$org\"" "$base/v1/me" -H "Authorization: Bearer $key"
	expect '"id"' "$base/v1/monitors" -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
		-d '{"name":"example","type":"http","target":"https://example.com","interval_seconds":60,"config":{"method":"GET"}}'
	expect '"name":"example"' "$base/v1/monitors" -H "Authorization: Bearer $key"
	expect '"masked_key"' -b "$jar" "$base/orgs/$org/api-keys"
	expect 'data-testid="login-email"' "$base/dashboard"
	expect 'data-testid="key-row"' -L -b "$jar" "$base/dashboard"
	expect '^keygate_requests_total{outcome="me"} 1$' "http://127.0.0.1:$METRICS_PORT/metrics"
	expect '^keygate_upstream_http_requests_total{code="201",route="POST /v1/monitors"} 1$' "http://127.0.0.1:$UPSTREAM_ADMIN_PORT/metrics"
	expect '"ready"' "http://127.0.0.1:$UPSTREAM_ADMIN_PORT/readyz"
	expect '^{"status":"ok"}$' "$base/healthz"
	# Every listener the demo started is on loopback, the gateway's on GATEWAY_BIND.
	listeners=$(ss -Hltn "( sport = :$GATEWAY_PORT or sport = :$UPSTREAM_PORT or sport = :$METRICS_PORT or sport = :$UPSTREAM_ADMIN_PORT )" | awk '{print $4}' | sort -u | paste -sd ' ' -)
	[ "$listeners" = "$(printf '127.0.0.1:%s\n' "$GATEWAY_PORT" "$UPSTREAM_PORT" "$METRICS_PORT" "$UPSTREAM_ADMIN_PORT" | sort -u | paste -sd ' ' -)" ] ||
		{ echo "run check: listeners $listeners, want each on 127.0.0.1" >&2; exit 1; }

	expect '"kty":"OKP"' "$base/.well-known/jwks.json"
	expect '^openapi: 3.1' "$base/openapi/v1.yaml"

	# make reload, as another shell runs it: the same process takes the config again
	# and keeps the demo's data and its counters.
	"$0" reload
	expect "\"org_id\":\"$org\"" "$base/v1/me" -H "Authorization: Bearer $key"
	expect '^keygate_requests_total{outcome="me"} 2$' "http://127.0.0.1:$METRICS_PORT/metrics"
	expect '^{"status":"ok"}$' "$base/healthz"

	# A webhook endpoint at a receiver on loopback, which UPSTREAM_FLAGS allows: its test
	# event is delivered.
	if [ -n "${RUN_CHECK_WEBHOOK_URL:-}" ]; then
		hook=$(curl -sf -b "$jar" -H 'Content-Type: application/json' -d "{\"url\":\"$RUN_CHECK_WEBHOOK_URL\"}" "$base/orgs/$org/webhooks") ||
			{ echo "run check: the webhook endpoint $RUN_CHECK_WEBHOOK_URL was refused" >&2; exit 1; }
		hook=$(json_field id <<<"$hook")
		expect '"event_id"' -b "$jar" -H 'Content-Type: application/json' -d '{}' "$base/orgs/$org/webhooks/$hook/test"
		for _ in $(seq 1 300); do
			curl -sf -b "$jar" "$base/orgs/$org/webhooks/$hook/deliveries" | grep -q '"state":"delivered"' && break
			sleep 0.1
		done
		expect '"state":"delivered"' -b "$jar" "$base/orgs/$org/webhooks/$hook/deliveries"
	fi
	set +x
	# The password is in no file the demo wrote (checked untraced: set -x would print it).
	if grep -rqF -- "$password" "$stack"; then
		echo "run check: the password is in $(grep -rlF -- "$password" "$stack")" >&2
		exit 1
	fi
	echo "run check passed"
	exit 0
fi
wait
