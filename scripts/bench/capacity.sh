# shellcheck shell=bash
# bench/capacity.sh: `make bench`'s capacity section, run once the setup's stack, Caddy
# and upstream run (it uses their variables and measure_cpu). It measures each shared
# dependency on its own, as CPU per operation, for docs/scaling.md:
#
#   (p)  key lookups on PostgreSQL: integration/capacity's workers, CAP_PROCS processes
#        each with a keystore.Batcher on a pool of its own, as a gateway process has,
#        and W goroutines each (CAP_WAITERS) verifying random keys among CAP_KEYS
#        (1,000,000) seeded keys, in a database of their own (keygate_capacity)
#   (pb) the same through PgBouncer in transaction pooling (default_query_exec_mode=exec)
#   (pr) the same through a keystore.Reader on one streaming standby of that PostgreSQL
#        (scripts/stack.sh up-standbys), as with database_read_urls: the primary's CPU
#        per lookup (the fence's readings and the lookups no standby answered) beside
#        the standby's
#   (s1) counts on one Redis: the same workers, each with a limiter.Redis with
#        pipelining on a client of its own, counting random key ids
#   (s2) the same on a 2-master Redis Cluster (scripts/stack.sh up-cluster2)
#   (l)  last_used_at writes: one keystore.LastUsed flushing N distinct keys at a time
#   (g)  the gateway: Caddy's CPU per request under (c) and (b), from the core's rounds
#        (measured here, ROUNDS times, when the core ran none: BENCH_ONLY=capacity)
#
# capacity_main append adds the section to OUT; capacity_main replace (BENCH_ONLY=
# capacity, `make bench-capacity`) replaces the section already in OUT, or adds it,
# and leaves the rest of OUT as it is.
#
# Environment: CAP_KEYS (1000000), CAP_ORGS (10000), CAP_PROCS (4), CAP_WAITERS
# (1,4,16,64,256), CAP_WARMUP (2s), CAP_DURATION (5s, each level's window), and
# CAP_PGBOUNCER, CAP_STANDBY, CAP_CLUSTER, CAP_LASTUSED (1; 0 skips (pb), (pr), (s2)
# or (l)). (pr) needs the stack's own PostgreSQL.

# cap_header is the first line of the section; replace mode finds it in OUT by it.
cap_header="capacity of each shared dependency"

# capacity_gateway prints (g): Caddy's CPU per request of the gateway (c) and of the
# plain proxy (b), the medians of c_runs and b_runs (measure_cpu's lines).
capacity_gateway() {
	if [ -z "${c_runs+set}" ]; then
		c_runs=() b_runs=()
		local round
		for round in $(seq 1 "$ROUNDS"); do
			echo "measuring (g) gateway and plain, round $round…" >&2
			c_runs+=("$(measure_cpu ok "http://$gw/v1/monitors/$monitor" "${auth[@]}")")
			b_runs+=("$(measure_cpu ok "http://$plain/v1/monitors/$monitor" "${ident[@]}")")
		done
	fi
	local c b module pg_module
	c=$(median 4 "${c_runs[@]}") b=$(median 4 "${b_runs[@]}")
	module=$(median 1 "$(per_round 4 - %.1f c_runs b_runs)")
	pg_module=$(median 1 "$(per_round 6 - %.1f c_runs b_runs)" | xargs printf %.1f)
	echo "(g) the gateway: Caddy's CPU per request, medians of $ROUNDS rounds of (c) and (b) (wrk -t$THREADS -c$CONNS -d$DURATION)"
	printf '    %-34s %9s %11s %10s\n' "" "caddy us/op" "ops/caddy-s" "caddy/100k/s"
	awk -v c="$c" -v b="$b" -v m="$module" 'BEGIN {
		row("(c) gateway request, proxied", c); row("(b) plain reverse_proxy request", b); row("the module: (c) - (b), per round", m)
	}
	function row(name, us) { printf "    %-34s %11.1f %11.0f %12.2f\n", name, us, 1e6 / us, us / 10 }'
	echo "    req/s (c) $(median 1 "${c_runs[@]}" | xargs printf %.0f), (b) $(median 1 "${b_runs[@]}" | xargs printf %.0f);" \
		"PostgreSQL for the module, (c) - (b): $pg_module us/req; Redis in (c): $(median 7 "${c_runs[@]}" | xargs printf %.1f) us/req"
}

# capacity_main MODE runs the section and writes it to OUT (MODE append or replace).
capacity_main() {
	local mode=$1 start tool cap_db report load
	start=$(date +%s)
	load=$(cut -d' ' -f1-3 /proc/loadavg)
	tool="$stack/capacity"
	capacity_tool
	cap_db=$(with_database "$DATABASE_URL" keygate_capacity)
	local common=("${capacity_flags[@]}")
	local waiters=${CAP_WAITERS:-1,4,16,64,256}
	local parts=()
	echo "measuring (p) key lookups on PostgreSQL (seeding ${CAP_KEYS:-1000000} keys first)…" >&2
	parts+=("$("$tool" lookups -label "(p)" -title "key lookups on PostgreSQL" "${common[@]}" -waiters "$waiters" \
		-orgs "${CAP_ORGS:-10000}" -database-url "$cap_db")")
	if [ "${CAP_PGBOUNCER:-1}" = 1 ]; then
		echo "measuring (pb) key lookups through PgBouncer…" >&2
		[ -n "${PGBOUNCER_DATABASE_URL:-}" ] || {
			scripts/stack.sh up-pgbouncer "$stack" >/dev/null
			PGBOUNCER_DATABASE_URL=$(stack_env PGBOUNCER_DATABASE_URL)
		}
		parts+=("$("$tool" lookups -label "(pb)" -title "key lookups through PgBouncer (transaction pooling, exec mode)" \
			"${common[@]}" -waiters 1,16,64 -orgs "${CAP_ORGS:-10000}" -probe-url "$cap_db" \
			-database-url "$(with_param "$(with_database "$PGBOUNCER_DATABASE_URL" keygate_capacity)" default_query_exec_mode=exec)" \
			-pgbouncer-pid "$(cat "$stack/pgbouncer/pgbouncer.pid")")")
	fi
	if [ "${CAP_STANDBY:-1}" = 1 ] && [ -f "$stack/pg.bindir" ]; then
		echo "measuring (pr) key lookups with one standby…" >&2
		[ -n "${DATABASE_STANDBY_FAST_URL:-}" ] || {
			scripts/stack.sh up-standbys "$stack" >/dev/null
			DATABASE_STANDBY_FAST_URL=$(stack_env DATABASE_STANDBY_FAST_URL)
			# A standby just made may still replay (p)'s database and its keys, which
			# the measurement connects to.
			wait_replayed "$DATABASE_STANDBY_FAST_URL" 600
		}
		parts+=("$("$tool" lookups -label "(pr)" -title "key lookups with one standby (database_read_urls)" \
			"${common[@]}" -waiters 1,16,64 -orgs "${CAP_ORGS:-10000}" -database-url "$cap_db" \
			-standby-url "$(with_database "$DATABASE_STANDBY_FAST_URL" keygate_capacity)")")
	fi
	echo "measuring (s1) counts on one Redis…" >&2
	parts+=("$("$tool" counts -label "(s1)" -title "counts on one Redis" "${common[@]}" -waiters "$waiters" \
		-redis-url "$REDIS_URL")")
	if [ "${CAP_CLUSTER:-1}" = 1 ]; then
		echo "measuring (s2) counts on a 2-master Redis Cluster…" >&2
		scripts/stack.sh up-cluster2 "$stack" >/dev/null
		parts+=("$("$tool" counts -label "(s2)" -title "counts on a 2-master Redis Cluster" "${common[@]}" \
			-waiters "$waiters" -redis-url "$(stack_env REDIS_CLUSTER2_URL)" -cluster)")
	fi
	if [ "${CAP_LASTUSED:-1}" = 1 ]; then
		echo "measuring (l) last_used_at writes…" >&2
		parts+=("$("$tool" lastused -label "(l)" -keys "${CAP_KEYS:-1000000}" -sizes 1000,100000 -per-size 100000 \
			-database-url "$cap_db")")
	fi
	parts+=("$(capacity_gateway)")
	report=$(
		echo "$cap_header, $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
		echo "machine: $(nproc) cores ($(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)), load average $load at the start;" \
			"$(($(date +%s) - start)) s"
		cat <<-'EOF'
		columns: W/proc, goroutines per worker process (each process one gateway's Batcher or limiter);
		  batch, key ids per lookup query; round, counts per Redis round trip (per primary);
		  busy, the server's CPU-seconds per second; us/op, its CPU per operation; ops/..-s, operations per
		  CPU-second of it (1e6 / us/op); /100k/s, its cores per 100,000 operations a second (us/op / 10);
		  cli us/op, the workers' own CPU per operation; p50 and p99, each operation's wait, batching included
		EOF
		for part in "${parts[@]}"; do
			echo
			echo "$part"
		done
	)
	echo
	echo "$report"
	# replace: OUT up to the section, without the blank lines before it.
	if [ "$mode" = replace ] && [ -f "$OUT" ]; then
		awk -v h="$cap_header" 'index($0, h) == 1 {exit} /^$/ {blank++; next} {for (; blank; blank--) print ""; print}' \
			"$OUT" >"$OUT.tmp"
		mv "$OUT.tmp" "$OUT"
	fi
	# shellcheck disable=SC2094 # OUT is read before the report is appended
	{
		[ ! -s "$OUT" ] || echo
		echo "$report"
	} >>"$OUT"
	echo "(written to $OUT)"
}
