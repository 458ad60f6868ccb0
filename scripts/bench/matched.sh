# shellcheck shell=bash
# bench/matched.sh: (r), CPU per request at an equal rate (informational).
#
# At full load the gateway serves fewer requests a second than plain Caddy, and on 2
# cores every process spends more CPU per request at a lower rate (fewer events per
# wake-up, more scheduler and futex time per request): the upstream, whose work is the
# same behind either, shows it. So part of the module overhead of the core (core.sh) is
# a throughput effect, not the module's code. bench_matched runs (c) and (b) again,
# ROUNDS times alternating, at one fixed rate both reach (MATCHED_RATE, or MATCHED_SHARE
# (0.6) of the median (c) rate of the rounds, rounded to 50: hey, a Go client, costs
# more CPU a request than wrk, so 80% was often out of the gateway's reach) through
# hey's rate limit, measures the same CPU per request and sets matched_report.
# BENCH_MATCHED=0 skips it.

# measure_rate RATE URL [hey args...] runs hey with MATCHED_CONNS (CONNS) workers for
# DURATION at RATE requests a second in all (hey's -q is per worker; a worker whose
# request outlasts two of its periods loses ticks, so a long latency tail lowers the
# rate reached) and prints measure_cpu's fields
# (req/s being the rate reached); every answer must be a 200.
measure_rate() {
	local rate=$1 url=$2
	shift 2
	local qps out before after reqs ok
	qps=$(awk -v r="$rate" -v c="${MATCHED_CONNS:-$CONNS}" 'BEGIN {printf "%.3f", r / c}')
	before=$(cpu_snapshot)
	out=$(hey -z "$DURATION" -c "${MATCHED_CONNS:-$CONNS}" -q "$qps" "$@" "$url")
	after=$(cpu_snapshot)
	reqs=$(echo "$out" | awk '/^ *\[[0-9]+\][ \t]+[0-9]+ responses/ {n += $2} END {print n + 0}')
	ok=$(echo "$out" | awk '$1 == "[200]" {print $2}')
	if [ "$reqs" = 0 ] || [ "${ok:-0}" != "$reqs" ] || echo "$out" | grep -q '^Error distribution'; then
		echo "$out" >&2
		echo "bench: $url at $rate req/s answered ${ok:-0} 200s of $reqs (or hey saw errors)" >&2
		exit 1
	fi
	local head
	head=$(echo "$out" | awk '
		/Requests\/sec:/ {rps = $2}
		$1 == "50%" && $2 == "in" {p50 = $3 * 1000}
		$1 == "99%" && $2 == "in" {p99 = $3 * 1000}
		END {printf "%s %.3f %.3f", rps, p50, p99}')
	echo "$head $(cpu_per_request "$before" "$after" "$reqs")"
}
bench_matched() {
	local rate round mc_runs=() mb_runs=() m_over=() m_pg=() rounds=""
	rate=${MATCHED_RATE:-$(median 1 "${c_runs[@]}" |
		awk -v s="${MATCHED_SHARE:-0.6}" '{printf "%d", int($1 * s / 50 + 0.5) * 50}')}
	((rate > 0)) || { echo "bench: no rate for (r)" >&2; exit 1; }
	for round in $(seq 1 "$ROUNDS"); do
		echo "measuring (r) gateway and plain at $rate req/s, round $round…" >&2
		mc_runs+=("$(measure_rate "$rate" "http://$gw/v1/monitors/$monitor" "${auth[@]}")")
		mb_runs+=("$(measure_rate "$rate" "http://$plain/v1/monitors/$monitor" "${ident[@]}")")
		rounds+=$'\n'"  round $round"$'\n'$(
			cpu_header ""
			cpu_row "(c) gateway 200" "${mc_runs[-1]}"
			cpu_row "(b) plain 200" "${mb_runs[-1]}"
		)
	done
	mapfile -t m_over < <(per_round 4 - %.1f mc_runs mb_runs)
	mapfile -t m_pg < <(per_round 6 - %.1f mc_runs mb_runs)
	local over pg redis up_c up_b full_up_c full_up_b
	over=$(median 1 "${m_over[@]}" | xargs printf %.1f)
	pg=$(median 1 "${m_pg[@]}" | xargs printf %.1f)
	redis=$(median 7 "${mc_runs[@]}" | xargs printf %.1f)
	up_c=$(median 5 "${mc_runs[@]}" | xargs printf %.1f) up_b=$(median 5 "${mb_runs[@]}" | xargs printf %.1f)
	full_up_c=$(median 5 "${c_runs[@]}" | xargs printf %.1f) full_up_b=$(median 5 "${b_runs[@]}" | xargs printf %.1f)
	local reach_c reach_b
	reach_c=$(median 1 "${mc_runs[@]}" | xargs printf %.0f) reach_b=$(median 1 "${mb_runs[@]}" | xargs printf %.0f)
	matched_report=$'\n\n'$(
		echo "(r) CPU per request at an equal rate, $ROUNDS rounds (hey -c${MATCHED_CONNS:-$CONNS} -z$DURATION, $rate req/s in all; gateway, plain in turn; informational):"
		echo "$rounds"
		echo
		echo "  module overhead at equal rate ($rate req/s): $over µs/req, rounds ${m_over[*]} (spread $(spread "${m_over[@]}"))"
		echo "  PostgreSQL for the module at equal rate: $pg µs/req (spread $(spread "${m_pg[@]}")); Redis: $redis µs/req"
		echo "  rates reached (median): gateway $reach_c, plain $reach_b req/s of $rate$(
			awk -v c="$reach_c" -v b="$reach_b" -v r="$rate" 'BEGIN {
				if (c < 0.9 * r || b < 0.9 * r) printf " (one below 90%%: not an equal rate, compare with care)"
			}')"
		echo "  upstream CPU per request, gateway vs plain: $up_c vs $up_b µs/req at equal rate; $full_up_c vs $full_up_b at full load (the rounds above)"
	)
}
