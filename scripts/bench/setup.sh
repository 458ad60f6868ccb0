# shellcheck shell=bash
# bench/setup.sh: what every section but (fs) stands on. bench_setup starts the stack in
# $stack (stack.sh up), the upstream and the main Caddy, and makes the bench's plan,
# organisation, user, key and monitor; then it warms the three up. It sets, for the
# sections:
#
#   up, gw, plain, unbatched, lingering, metrics_addr   the main Caddy's sites (host:port):
#       the upstream; the gateway (c); plain reverse_proxy (b); the gateway without
#       batching or pipelining (c0); with batch_linger $linger (cL); /metrics
#   linger, admin          BENCH_LINGER (2ms, or off); the admin endpoint (off unless PROFILE)
#   caddy_pid, upstream_pid, pg_pid, redis_pid, CLK_TCK   what cpu_snapshot reads
#   org, jar, key, key_id, monitor   the bench organisation, the dashboard session, the
#       bench key (its plan refuses nothing here) and the monitor every run reads
#   auth, ident            curl/wrk -H arguments: the bench key; the identity headers the
#       upstream takes directly (for (a) and (b))
bench_setup() {
	scripts/stack.sh up "$stack" >/dev/null
	# shellcheck disable=SC1091 # written by stack.sh
	source "$stack/env"
	GATEWAY_SECRET=bench-secret-0123456789abcdef
	export DATABASE_URL REDIS_URL GATEWAY_SECRET

	bin/upstream migrate >/dev/null
	bin/upstream plan put --name bench --api-rate-limit 1000000000 --max-monitors -1 --min-interval 10 \
		--locations us-east,us-west,eu-west,eu-central,ap-southeast --check-types http,tcp,dns,icmp >/dev/null
	org=$(bin/upstream org create --name bench --plan bench | json_field id)
	printf 'bench-password\n' | bin/upstream user create --email bench@example.com --password-stdin >/dev/null
	bin/upstream member add --org "$org" --email bench@example.com --role Owner >/dev/null

	up="127.0.0.1:$(bench_port)"
	gw="127.0.0.1:$(bench_port)"
	plain="127.0.0.1:$(bench_port)"
	unbatched="127.0.0.1:$(bench_port)"
	lingering="127.0.0.1:$(bench_port)"
	linger=${BENCH_LINGER:-2ms}
	# The gateway's /metrics, read around the (mk) runs for the lookups' batch sizes.
	metrics_addr="127.0.0.1:$(bench_port)"

	bin/upstream serve --addr "$up" >"$stack/upstream.log" 2>&1 &
	upstream_pid=$!
	pids+=("$upstream_pid")
	wait_http "http://$up/" || { tail -n 20 "$stack/upstream.log" >&2; exit 1; }

	admin=off
	if [ -n "${PROFILE:-}" ]; then
		mkdir -p "$PROFILE"
		admin="127.0.0.1:$(bench_port)"
	fi
	{
		cat <<EOF
{
	admin $admin
	auto_https off
	persist_config off
	order v1_gateway before reverse_proxy
}
http://$plain {
	bind 127.0.0.1
	reverse_proxy $up
}
http://$metrics_addr {
	bind 127.0.0.1
	metrics
}
EOF
		gateway_site "$gw" "lookup_lanes   ${LANES:-1}"
		gateway_site "$unbatched" disable_lookup_batching disable_count_pipelining
		[ "$linger" = off ] || gateway_site "$lingering" "batch_linger $linger"
	} >"$stack/Caddyfile"
	local addrs=("$gw/" "$plain/" "$unbatched/")
	[ "$linger" = off ] || addrs+=("$lingering/")
	start_caddy "$stack/Caddyfile" "$stack/caddy.log" "${addrs[@]}"
	caddy_pid=$CADDY_PID

	jar="$stack/cookies"
	login bench@example.com bench-password "$jar" "http://$gw"
	key=$(create_key "$org" bench Admin "$jar" "http://$gw")
	key_id=${key#mon_live_}
	key_id=${key_id%%.*}
	monitor=$(create_monitor "$key" "http://$gw")
	[ -n "$monitor" ] || { echo "could not create the bench monitor" >&2; exit 1; }

	ident=(-H "X-Gateway-Org-Id: $org" -H "X-Gateway-Key-Id: $key_id" -H "X-Gateway-Key-Role: Admin" -H "X-Gateway-Secret: $GATEWAY_SECRET")
	auth=(-H "Authorization: Bearer $key")

	echo "warming up…" >&2
	local u
	for u in "http://$up/v1/monitors/$monitor" "http://$plain/v1/monitors/$monitor"; do
		wrk -t"$THREADS" -c"$CONNS" -d"$WARMUP" "${ident[@]}" "$u" >/dev/null
	done
	wrk -t"$THREADS" -c"$CONNS" -d"$WARMUP" "${auth[@]}" "http://$gw/v1/monitors/$monitor" >/dev/null

	CLK_TCK=$(getconf CLK_TCK)
	pg_pid=$(head -n1 "$stack/pg/postmaster.pid")
	redis_pid=$(cat "$stack/redis/redis.pid")
}
