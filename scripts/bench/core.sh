# shellcheck shell=bash
# bench/core.sh: the core of `make bench`, on the main Caddy's sites (setup.sh):
#
#   (a) the upstream alone serving GET /v1/monitors/{id}, identity headers given directly
#   (b) bin/caddy with a plain reverse_proxy to it (same headers)
#   (c) the gateway with a real key on a plan with a high but positive limit, so Redis
#       counts every request
#   (c401) the gateway with random well-formed keys: 401 (wrk -s, a new key a request,
#          its checksum random too: no database query)
#   (c429) the gateway with a key over its limit (a plan of 1 request a minute): 429
#   (c0) the same gateway with lookup batching and count pipelining switched off, to
#       show what they bring (informational)
#   (cL) the same gateway with batch_linger BENCH_LINGER (2ms): its batches wait for
#       more requests while requests come fast (informational; BENCH_LINGER=off skips)
#   (d) GET /v1/me answered by the gateway
#
# (c), (cL), (b), (c401) and (c429) run ROUNDS times, in that order, so that gateway and
# plain alternate; the report gives the median of the rounds, since the machine is small
# and noisy. Next to requests/s and latency, each of these runs measures the CPU time every
# process spent (utime + stime from /proc/<pid>/stat, before and after the run) divided
# by the requests wrk made: Caddy (one process serves the gateway and the plain sites,
# one site at a time), the upstream, PostgreSQL (the postmaster and all its backends,
# reaped ones included) and Redis. The module's own cost is Caddy's CPU per gateway
# request minus Caddy's per plain request; CPU per request is far steadier than req/s
# on a shared machine.
#
# bench_core measures (a) and the rounds (c_runs, cl_runs, b_runs, e401_runs, e429_runs:
# measure_cpu's lines) and, with PROFILE, profiles one more (c) run; bench_core_summary,
# after (r) (matched.sh), measures (c0) and (d) and sets cpu_report: a table per round,
# the medians, the module overhead with its spread. report.sh prints them.

# core_keys makes what (c401) and (c429) send: a key over its limit (tiny_key, an org
# on a plan of one request a minute, already spent) and a wrk script of random keys
# ($stack/random-key.lua).
core_keys() {
	local code
	bin/upstream plan put --name bench-tiny --api-rate-limit 1 --max-monitors -1 --min-interval 10 \
		--locations us-east --check-types http >/dev/null
	tiny_org=$(bin/upstream org create --name bench-tiny --plan bench-tiny | json_field id)
	bin/upstream member add --org "$tiny_org" --email bench@example.com --role Owner >/dev/null
	tiny_key=$(create_key "$tiny_org" tiny Viewer "$jar" "http://$gw")
	for _ in 1 2; do curl -s -o /dev/null -H "Authorization: Bearer $tiny_key" "http://$gw/v1/me"; done
	code=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $tiny_key" "http://$gw/v1/monitors/$monitor")
	[ "$code" = 429 ] || { echo "bench: the key over its limit answered $code, not 429" >&2; exit 1; }

	# Random well-formed keys: a new key id and secret on every request, in today's
	# format (43 base64url characters and a 6-character checksum; docs/security.md).
	# Their checksums are random too, so all but one in 62^6 fail it: the flood an
	# attacker can send, which the gateway answers without a database query.
	cat >"$stack/random-key.lua" <<'EOF'
local alnum = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
local b64 = alnum .. "-_"
local last = "AEIMQUYcgkosw048" -- a 43-character secret's last character has two zero bits
local function pick(set, n)
	local t = {}
	for i = 1, n do
		local j = math.random(1, #set)
		t[i] = set:sub(j, j)
	end
	return table.concat(t)
end
init = function() math.randomseed(os.time() + math.floor(os.clock() * 1e6) + (tonumber(tostring({}):match("%x+$"), 16) or 0) % 1e6) end
request = function()
	local key = "mon_live_" .. pick(alnum, 22) .. "." .. pick(b64, 42) .. pick(last, 1) .. pick(alnum, 6)
	return wrk.format(nil, nil, {["Authorization"] = "Bearer " .. key})
end
EOF
	code=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer mon_live_AAAAAAAAAAAAAAAAAAAAAA.$(printf 'A%.0s' $(seq 43))" \
		"http://$gw/v1/monitors/$monitor")
	[ "$code" = 401 ] || { echo "bench: an unknown well-formed key answered $code, not 401" >&2; exit 1; }
}

bench_core() {
	core_keys
	echo "measuring (a) upstream alone…" >&2
	a_run=$(measure_cpu ok "http://$up/v1/monitors/$monitor" "${ident[@]}")
	read -r a_rps a_p50 a_p99 _ <<<"$a_run"
	b_runs=() c_runs=() cl_runs=() e401_runs=() e429_runs=() rounds_report=""
	local round
	for round in $(seq 1 "$ROUNDS"); do
		echo "measuring (c) gateway, round $round…" >&2
		c_runs+=("$(measure_cpu ok "http://$gw/v1/monitors/$monitor" "${auth[@]}")")
		if [ "$linger" != off ]; then
			echo "measuring (cL) gateway with batch_linger $linger, round $round…" >&2
			cl_runs+=("$(measure_cpu ok "http://$lingering/v1/monitors/$monitor" "${auth[@]}")")
		fi
		echo "measuring (b) plain reverse_proxy, round $round…" >&2
		b_runs+=("$(measure_cpu ok "http://$plain/v1/monitors/$monitor" "${ident[@]}")")
		echo "measuring (c401) random keys, round $round…" >&2
		e401_runs+=("$(measure_cpu error "http://$gw/v1/monitors/$monitor" -s "$stack/random-key.lua")")
		echo "measuring (c429) a key over its limit, round $round…" >&2
		e429_runs+=("$(measure_cpu error "http://$gw/v1/monitors/$monitor" -H "Authorization: Bearer $tiny_key")")
		rounds_report+=$'\n'"  round $round"$'\n'$(
			cpu_header ""
			cpu_row "(c) gateway 200" "${c_runs[-1]}"
			[ "$linger" = off ] || cpu_row "(cL) batch_linger $linger" "${cl_runs[-1]}"
			cpu_row "(b) plain 200" "${b_runs[-1]}"
			cpu_row "(c401) random keys" "${e401_runs[-1]}"
			cpu_row "(c429) over its limit" "${e429_runs[-1]}"
		)
	done
	# PROFILE: one more run of (c), outside the rounds (profiling costs CPU of its own).
	if [ -n "${PROFILE:-}" ]; then
		echo "profiling (c)…" >&2
		profile_run gateway.cpu.pprof top.txt run.txt measure_cpu ok "http://$gw/v1/monitors/$monitor" "${auth[@]}"
	fi
}

# medians LINE... prints the median of each of the 7 fields of measure_cpu's lines.
medians() {
	local f out=""
	for f in 1 2 3 4 5 6 7; do out+="$(median "$f" "$@") "; done
	echo "$out"
}

bench_core_summary() {
	echo "measuring (c0) gateway without batching or pipelining…" >&2
	read -r c0_rps c0_p50 c0_p99 < <(measure "http://$unbatched/v1/monitors/$monitor" "${auth[@]}")
	echo "measuring (d) /v1/me…" >&2
	read -r d_rps d_p50 d_p99 < <(measure "http://$gw/v1/me" "${auth[@]}")

	b_med=$(medians "${b_runs[@]}") c_med=$(medians "${c_runs[@]}")
	e401_med=$(medians "${e401_runs[@]}") e429_med=$(medians "${e429_runs[@]}")
	read -r b_rps b_p50 b_p99 _ <<<"$b_med"
	read -r c_rps c_p50 c_p99 _ <<<"$c_med"
	# Per round: the module's CPU (gateway Caddy - plain Caddy), the throughput ratio, the
	# p99 difference, and the module's share of PostgreSQL (gateway - plain: the upstream's
	# own queries are in both).
	mapfile -t overheads < <(per_round 4 - %.1f c_runs b_runs)
	mapfile -t ratios < <(per_round 1 / %.3f c_runs b_runs)
	mapfile -t p99_extras < <(per_round 3 - %.3f c_runs b_runs)
	mapfile -t pg_module < <(per_round 6 - %.1f c_runs b_runs)
	overhead=$(median 1 "${overheads[@]}" | xargs printf %.1f) overhead_spread=$(spread "${overheads[@]}")
	# The same for (cL): its module overhead and Redis per request, and its throughput
	# against plain's.
	local linger_report="" cl_med="" redis_cl cl_overheads cl_ratios
	if [ "$linger" != off ]; then
		mapfile -t cl_overheads < <(per_round 4 - %.1f cl_runs b_runs)
		mapfile -t cl_ratios < <(per_round 1 / %.3f cl_runs b_runs)
		cl_med=$(medians "${cl_runs[@]}")
		read -r _ _ _ _ _ _ redis_cl <<<"$cl_med"
		linger_report=$(
			echo "  with batch_linger $linger (cL): module overhead $(median 1 "${cl_overheads[@]}" | xargs printf %.1f) µs/req, rounds ${cl_overheads[*]}; Redis $(printf %.1f "$redis_cl") µs/req;"
			echo "    throughput/plain median $(median 1 "${cl_ratios[@]}"), rounds ${cl_ratios[*]} (informational)"
		)
	fi
	ratio=$(median 1 "${ratios[@]}")
	p99_extra=$(median 1 "${p99_extras[@]}")
	local pg_mod pg_mod_spread redis_gw
	pg_mod=$(median 1 "${pg_module[@]}" | xargs printf %.1f) pg_mod_spread=$(spread "${pg_module[@]}")
	read -r _ _ _ _ _ _ redis_gw <<<"$c_med"
	redis_gw=$(printf %.1f "$redis_gw")
	cpu_report=$(
		echo "CPU per request by process, $ROUNDS rounds (gateway, plain, 401, 429 in turn; CPU us / requests):"
		echo "$rounds_report"
		echo
		echo "  medians of the rounds"
		cpu_header ""
		cpu_row "(a) upstream alone" "$a_run"
		cpu_row "(c) gateway 200" "$c_med"
		[ "$linger" = off ] || cpu_row "(cL) batch_linger $linger" "$cl_med"
		cpu_row "(b) plain 200" "$b_med"
		cpu_row "(c401) random keys" "$e401_med"
		cpu_row "(c429) over its limit" "$e429_med"
		echo
		echo "  module overhead (Caddy, gateway - plain): $overhead µs/req, rounds ${overheads[*]} (spread $overhead_spread)"
		echo "  PostgreSQL for the module (gateway - plain): $pg_mod µs/req (spread $pg_mod_spread); Redis: $redis_gw µs/req"
		echo "  gateway/plain throughput: median $ratio, rounds ${ratios[*]}"
		echo "  p99 gateway - plain: median $p99_extra ms, rounds ${p99_extras[*]}"
		[ -z "$linger_report" ] || echo "$linger_report"
	)
	cpu_report+=$matched_report
}
