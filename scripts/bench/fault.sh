# shellcheck shell=bash
# bench/fault.sh: (f), the fault run: the gateway's rate while Redis hangs, as a share
# of its rate just before, under limiter_failure open and local; and the rate of 503s
# while PostgreSQL hangs. A hang is internal/testkit/latencyproxy's hang mode (no byte
# forwarded, as with SIGSTOP) in front of the real servers. Each run is wrk for
# FAULT_DURATION (5s).
#
# bench_fault sets f_open_before, f_open_hung, f_local_before, f_local_hung (req/s),
# f_pg_503 (503s a second while PostgreSQL hangs), f_open_share and f_local_share. It
# runs its own Caddy, with the gateways reaching Redis and PostgreSQL through latency
# proxies it hangs (SIGUSR1) and resumes (SIGUSR2).

# fault_rate URL prints requests a second, whatever their status.
fault_rate() {
	wrk -t"$THREADS" -c"$CONNS" -d"${FAULT_DURATION:-5s}" "${auth[@]}" "$1" | awk '/^Requests\/sec:/ {print $2}'
}

bench_fault() {
	local rproxy pproxy rpid ppid fpid
	go build -o "$stack/latencyproxy" ./internal/testkit/latencyproxy/cmd/latencyproxy
	local redis_hp=${REDIS_URL#redis://}
	redis_hp=${redis_hp%%/*}
	redis_hp=${redis_hp##*@}
	local pg_hp=${DATABASE_URL#postgres://}
	pg_hp=${pg_hp#*@}
	pg_hp=${pg_hp%%/*}
	"$stack/latencyproxy" -target "$redis_hp" -listen-file "$stack/rproxy.addr" &
	rpid=$!
	pids+=("$rpid")
	"$stack/latencyproxy" -target "$pg_hp" -listen-file "$stack/pproxy.addr" &
	ppid=$!
	pids+=("$ppid")
	for _ in $(seq 50); do [ -s "$stack/rproxy.addr" ] && [ -s "$stack/pproxy.addr" ] && break; sleep 0.1; done
	rproxy=$(cat "$stack/rproxy.addr")
	pproxy=$(cat "$stack/pproxy.addr")
	local f_open f_local f_pg
	f_open="127.0.0.1:$(bench_port)" f_local="127.0.0.1:$(bench_port)" f_pg="127.0.0.1:$(bench_port)"
	local redis_via=${REDIS_URL/$redis_hp/$rproxy} pg_via=${DATABASE_URL/$pg_hp/$pproxy}
	local site name db redis policy
	{
		caddy_globals
		for site in "$f_open open" "$f_local local" "$f_pg open"; do
			read -r name policy <<<"$site"
			db='{env.DATABASE_URL}' redis=$redis_via
			if [ "$name" = "$f_pg" ]; then db=$pg_via redis='{env.REDIS_URL}'; fi
			SITE_DB=$db SITE_REDIS=$redis gateway_site "$name" "limiter_failure $policy"
		done
	} >"$stack/Caddyfile.fault"
	start_caddy "$stack/Caddyfile.fault" "$stack/caddy-fault.log" "$f_open/" "$f_local/" "$f_pg/"
	fpid=$CADDY_PID
	local mon="/v1/monitors/$monitor" code
	echo "measuring (f) fault run: before the hang…" >&2
	wrk -t"$THREADS" -c"$CONNS" -d"$WARMUP" "${auth[@]}" "http://$f_open$mon" >/dev/null
	wrk -t"$THREADS" -c"$CONNS" -d"$WARMUP" "${auth[@]}" "http://$f_local$mon" >/dev/null
	f_open_before=$(fault_rate "http://$f_open$mon")
	f_local_before=$(fault_rate "http://$f_local$mon")
	echo "measuring (f) fault run: Redis hung…" >&2
	kill -USR1 "$rpid"
	f_open_hung=$(fault_rate "http://$f_open$mon")
	f_local_hung=$(fault_rate "http://$f_local$mon")
	kill -USR2 "$rpid"
	echo "measuring (f) fault run: PostgreSQL hung…" >&2
	curl -sf -o /dev/null "${auth[@]}" "http://$f_pg/v1/me"
	kill -USR1 "$ppid"
	code=$(curl -s -o /dev/null -w '%{http_code}' "${auth[@]}" "http://$f_pg/v1/me")
	[ "$code" = 503 ] || echo "bench: expected 503 with PostgreSQL hung, got $code" >&2
	f_pg_503=$(fault_rate "http://$f_pg/v1/me")
	kill -USR2 "$ppid"
	kill "$fpid" 2>/dev/null || true
	f_open_share=$(awk -v h="$f_open_hung" -v b="$f_open_before" 'BEGIN {printf "%.3f", h / b}')
	f_local_share=$(awk -v h="$f_local_hung" -v b="$f_local_before" 'BEGIN {printf "%.3f", h / b}')
}
