# shellcheck shell=bash
# bench/cluster.sh: (k), the gateway on a 3-master Redis Cluster beside the single Redis.
# bench_cluster starts the Cluster (stack.sh up-cluster) and two Caddys of one gateway
# site each, one whose REDIS_URL is the stack's single Redis and one whose REDIS_URL is
# the Cluster (redis_mode cluster), and measures GET /v1/monitors/{id} and GET /v1/me on
# both, ROUNDS times alternating which goes first. It prints the cluster/single ratios
# and appends them to OUT. BENCH_CLUSTER=0 skips it.
bench_cluster() {
	scripts/stack.sh up-cluster "$stack" >/dev/null
	local cluster_url single cluster spid cpid addr round path
	cluster_url=$(stack_env REDIS_CLUSTER_URL)
	single="127.0.0.1:$(bench_port)"
	cluster="127.0.0.1:$(bench_port)"
	{
		caddy_globals
		gateway_site "$single"
	} >"$stack/Caddyfile.single"
	{
		caddy_globals
		gateway_site "$cluster" "redis_mode cluster"
	} >"$stack/Caddyfile.cluster"
	start_caddy "$stack/Caddyfile.single" "$stack/caddy-single.log" "$single/v1/me"
	spid=$CADDY_PID
	REDIS_URL=$cluster_url start_caddy "$stack/Caddyfile.cluster" "$stack/caddy-cluster.log" "$cluster/v1/me"
	cpid=$CADDY_PID
	for addr in "$single" "$cluster"; do
		wrk -t"$THREADS" -c"$CONNS" -d"$WARMUP" "${auth[@]}" "http://$addr/v1/monitors/$monitor" >/dev/null
	done
	# Both really count: the answer carries the RateLimit header.
	for addr in "$single" "$cluster"; do
		curl -sf -D - -o /dev/null "${auth[@]}" "http://$addr/v1/me" | grep -qi '^RateLimit:' ||
			{ echo "bench: the gateway at $addr does not count" >&2; exit 1; }
	done
	local lines=""
	for path in "/v1/monitors/$monitor" /v1/me; do
		local s_runs=() c_runs=() name=${path/$monitor/\{id\}}
		for round in $(seq 1 "$ROUNDS"); do
			echo "measuring (k) single Redis / Redis Cluster, GET $name, round $round…" >&2
			if ((round % 2)); then
				s_runs+=("$(measure "http://$single$path" "${auth[@]}")")
				c_runs+=("$(measure "http://$cluster$path" "${auth[@]}")")
			else
				c_runs+=("$(measure "http://$cluster$path" "${auth[@]}")")
				s_runs+=("$(measure "http://$single$path" "${auth[@]}")")
			fi
		done
		local s_rps s_p99 c_rps c_p99 k_ratio
		s_rps=$(FIELD=1 mean "${s_runs[@]}") s_p99=$(FIELD=3 mean "${s_runs[@]}")
		c_rps=$(FIELD=1 mean "${c_runs[@]}") c_p99=$(FIELD=3 mean "${c_runs[@]}")
		k_ratio=$(awk -v a="$c_rps" -v b="$s_rps" 'BEGIN {printf "%.3f", a / b}')
		lines+=$(printf '\n    %-22s single %7.0f req/s p99 %7.3f ms; cluster %7.0f req/s p99 %7.3f ms; ratio %s' \
			"GET $name" "$s_rps" "$s_p99" "$c_rps" "$c_p99" "$k_ratio")
	done
	kill "$spid" "$cpid" 2>/dev/null || true
	local k_report
	k_report=$(printf '\n(k) the gateway on a 3-master Redis Cluster beside the single Redis, mean of %s alternating runs,\n    cluster/single throughput ratio:%s' "$ROUNDS" "$lines")
	echo "$k_report"
	echo "$k_report" >>"$OUT"
	echo "(appended to $OUT)"
}
