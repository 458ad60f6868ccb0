#!/usr/bin/env bash
# run.sh is `make run`: it builds everything, starts PostgreSQL, Redis, the upstream and
# the gateway (Caddyfile.example), creates a demo org, user and API key through the
# operator CLI and the dashboard, prints curl commands to try, and stops everything on
# Ctrl-C.
#
# Environment: GATEWAY_PORT (default 8080), UPSTREAM_PORT (default 9000),
# METRICS_PORT (the gateway's /metrics, default 9180), UPSTREAM_ADMIN_PORT (the
# upstream's /metrics, /healthz, /readyz; default 9001),
# GATEWAY_BIND (the gateway's address, default 127.0.0.1; empty for every interface),
# DEMO_PASSWORD (the demo owner's password, default a random one),
# DATABASE_URL / REDIS_URL to use servers you already run.
# RUN_CHECK=1 runs the printed curl commands itself and exits (used by the tests).
#
# Everything it starts listens on loopback, but the gateway when GATEWAY_BIND says
# otherwise: a demo is no server for the network. The demo owner's password is printed
# only to a terminal, never into a file or a log: set DEMO_PASSWORD to know it when the
# output goes elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

GATEWAY_PORT=${GATEWAY_PORT:-8080}
GATEWAY_BIND=${GATEWAY_BIND-127.0.0.1}
UPSTREAM_PORT=${UPSTREAM_PORT:-9000}
METRICS_PORT=${METRICS_PORT:-9180}
UPSTREAM_ADMIN_PORT=${UPSTREAM_ADMIN_PORT:-9001}
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

stack=.stack/run
mkdir -p .stack
pids=()
trap 'stop_stack "$stack"' EXIT
trap 'exit 0' INT TERM
scripts/stack.sh down "$stack"
scripts/stack.sh up "$stack" >/dev/null
source "$stack/env"
# Signed identity: the gateway signs who is calling with a key made here, and the
# upstream verifies it with the public half the gateway publishes. No shared secret.
IDENTITY_KEY="$stack/identity.pem"
openssl genpkey -algorithm ed25519 -out "$IDENTITY_KEY"
unset GATEWAY_SECRET
export DATABASE_URL REDIS_URL IDENTITY_KEY GATEWAY_PORT UPSTREAM_PORT METRICS_PORT
# Caddyfile.example reads these two to place the gateway and find the upstream.
export GATEWAY_ADDR=":$GATEWAY_PORT" UPSTREAM_ADDR="127.0.0.1:$UPSTREAM_PORT"
# The address to reach the gateway at: loopback when it listens on every interface.
case "$GATEWAY_BIND" in
"" | 0.0.0.0 | :: | "[::]") base="http://127.0.0.1:$GATEWAY_PORT" ;;
*:*) base="http://[${GATEWAY_BIND#[}" base="${base%]}]:$GATEWAY_PORT" ;;
*) base="http://$GATEWAY_BIND:$GATEWAY_PORT" ;;
esac

bin/upstream migrate >/dev/null
# The upstream may start before the gateway: it fetches the JWKS when the first
# assertion comes.
bin/upstream serve --addr "$UPSTREAM_ADDR" --admin-addr "127.0.0.1:$UPSTREAM_ADMIN_PORT" \
	--gateway-jwks "$base/.well-known/jwks.json" >"$stack/upstream.log" 2>&1 &
pids+=($!)
# The example's gateway site listens on every interface, as a gateway does. The demo's
# is bound to GATEWAY_BIND: Caddy binds a site by its bind directive, not by the host
# of its address, so the example is adapted to JSON and its listener rewritten.
bin/caddy adapt --config Caddyfile.example --adapter caddyfile 2>"$stack/adapt.log" >"$stack/caddy.json"
listen="\"listen\":[\":$GATEWAY_PORT\"]"
grep -qF "$listen" "$stack/caddy.json" || { echo "make run: no $listen in the adapted Caddyfile.example" >&2; exit 1; }
json=$(<"$stack/caddy.json")
printf '%s\n' "${json//"$listen"/"\"listen\":[\"$GATEWAY_BIND:$GATEWAY_PORT\"]"}" >"$stack/caddy.json"
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
shown=$password
if [ ! -t 1 ]; then
	shown="<the password: printed only to a terminal; set DEMO_PASSWORD to choose it>"
fi
cat <<EOF

keygate is running:
  gateway   $base   (Caddy with v1_gateway, config Caddyfile.example adapted to $stack/caddy.json, listening on ${GATEWAY_BIND:-every interface}:$GATEWAY_PORT)
  upstream  http://$UPSTREAM_ADDR
  logs      $stack/caddy.log, $stack/upstream.log
  metrics   http://127.0.0.1:$METRICS_PORT/metrics (gateway), http://127.0.0.1:$UPSTREAM_ADMIN_PORT/metrics (upstream)
  health    http://127.0.0.1:$UPSTREAM_ADMIN_PORT/healthz, /readyz (upstream)
  identity  $base/.well-known/jwks.json (the key that signs X-Gateway-Identity: $IDENTITY_KEY)
  OpenAPI   $base/openapi/v1.yaml, $base/openapi/dashboard.yaml

Demo org $org, owner $email / $shown, API key (shown once):
  export KEY='$key'

The operator's command line against this demo, in another shell (DATABASE_URL and REDIS_URL):
  source $PWD/$stack/env
  bin/upstream plan list

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
	# Every listener the demo started is on loopback, the gateway's on GATEWAY_BIND.
	listeners=$(ss -Hltn "( sport = :$GATEWAY_PORT or sport = :$UPSTREAM_PORT or sport = :$METRICS_PORT or sport = :$UPSTREAM_ADMIN_PORT )" | awk '{print $4}' | sort -u | paste -sd ' ' -)
	[ "$listeners" = "$(printf '127.0.0.1:%s\n' "$GATEWAY_PORT" "$UPSTREAM_PORT" "$METRICS_PORT" "$UPSTREAM_ADMIN_PORT" | sort -u | paste -sd ' ' -)" ] ||
		{ echo "run check: listeners $listeners, want each on 127.0.0.1" >&2; exit 1; }

	expect '"kty":"OKP"' "$base/.well-known/jwks.json"
	expect '^openapi: 3.1' "$base/openapi/v1.yaml"
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
