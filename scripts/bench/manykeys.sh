# shellcheck shell=bash
# bench/manykeys.sh: (mk), many keys: 1,000,000 keys seeded into the bench's database
# (integration/capacity), every 500th moved to the bench org, so that 2,000 keys read
# the bench's monitor; PAIR_ROUNDS rounds of three runs, their order rotating
# (rotate_runs): plain Caddy, the gateway with the bench key alone, and the gateway with
# the 2,000 keys (one wrk Lua script for all three runs, round robin over its lines of
# header fields in each thread). Medians of the rounds: the 2,000 keys' throughput over
# plain's (target 0.80), the bench key's beside it, CPU per request by process, and the
# distinct key ids and requests per lookup query (the gateway's /metrics). It leaves the
# 1,000,000 keys in the database, so it runs after the other pairs. BENCH_MANYKEYS=0
# skips it, BENCH_ONLY=manykeys runs it alone and replaces it in OUT. With PROFILE=DIR
# it also writes DIR/manykeys.cpu.pprof, DIR/manykeys.top.txt and DIR/manykeys.run.txt
# for one more run of the 2,000 keys, and DIR/onekey.* for one more run of the one key.
paragraph[manykeys]="(mk) many keys"

# lookup_batches prints the gateway's lookup queries so far, the distinct key ids they
# held and the requests they answered ("queries ids requests"), from its /metrics: the
# one set of keygate_* series that every gateway site of the main Caddy shares.
lookup_batches() {
	curl -sf "http://$metrics_addr/metrics" | awk '
		$1 == "keygate_key_lookup_batch_size_count" {q = $2}
		$1 == "keygate_key_lookup_batch_size_sum" {ids = $2}
		$1 == "keygate_key_lookup_duration_seconds_count" {r = $2}
		END {printf "%.0f %.0f %.0f\n", q, ids, r}'
}
# with_batches COMMAND... runs COMMAND (measure_cpu's command line on the main Caddy)
# and prints its line and two more fields: the distinct key ids and the requests per
# lookup query meanwhile (0 0 when it made no query).
with_batches() {
	local before after line
	before=$(lookup_batches)
	line=$("$@")
	after=$(lookup_batches)
	echo "$line $(awk -v b="$before" -v a="$after" 'BEGIN {
		split(b, x); split(a, y); q = y[1] - x[1]
		if (q > 0) printf "%.1f %.1f", (y[2] - x[2]) / q, (y[3] - x[3]) / q; else printf "0 0"
	}')"
}
# bench_manykeys sets manykeys_report: (mk), many keys against one on the (c) gateway,
# with the plain site beside them. integration/capacity seeds 1,000,000 keys over
# 10,000 organisations on the "pro" plan into the bench's database. One UPDATE moves
# every 500th of them, 2,000 spread over the whole range of ids, to the bench org,
# whose plan refuses nothing here, so that they read the bench's monitor as the bench
# key does. All three runs send their fields through one wrk Lua script, so that wrk
# costs the same in each; each of its threads takes the lines of its file in turn (round
# robin), from a start of its own. The 1,000,000 keys stay: later runs look keys up in
# the larger table.
bench_manykeys() {
	local rows=1000000 n=2000 every=500 seeded moved
	capacity_tool
	echo "seeding $rows keys for (mk)…" >&2
	seeded=$("$stack/capacity" seed -database-url "$DATABASE_URL" -keys "$rows" -orgs 10000)
	# The session's commits wait for their WAL: only then can VACUUM mark the moved
	# keys' pages all-visible, for the lookups' index-only scans (capacity.Seed).
	moved=$("$(cat "$stack/pg.bindir")/psql" "$DATABASE_URL" -qAt -v ON_ERROR_STOP=1 <<-SQL
		SET synchronous_commit = on;
		UPDATE api_keys SET org_id = '$org' WHERE key_id IN
			(SELECT 'capacity' || lpad(i::text, 14, '0') FROM generate_series(0, $(((n - 1) * every)), $every) AS i);
		VACUUM ANALYZE api_keys;
		SELECT count(*) FROM api_keys WHERE org_id = '$org' AND key_id LIKE 'capacity%';
	SQL
	)
	[ "$moved" = "$n" ] || { echo "bench: (mk) moved $moved keys to the bench org, not $n" >&2; exit 1; }
	# One request's header fields a line, tab-separated: the 2,000 keys, the bench key,
	# and plain's identity fields. All three runs send theirs through the same Lua
	# script, so that wrk, on the same two cores, costs each run the same: a script
	# costs wrk more than fixed -H fields do, and would otherwise slow the gateway's runs
	# alone.
	"$stack/capacity" keys -count "$n" -every "$every" | sed 's/^/Authorization: Bearer /' >"$stack/manykeys.txt"
	echo "Authorization: Bearer $key" >"$stack/onekey.txt"
	local field fields=()
	for field in "${ident[@]}"; do [ "$field" = -H ] || fields+=("$field"); done
	(IFS=$'\t' && echo "${fields[*]}") >"$stack/plain.txt" # ident's fields, as (b) sends them
	# keys_script FILE prints the Lua script that sends FILE's lines of fields.
	keys_script() {
		sed "s#@FILE@#$1#" <<-'EOF'
		-- Each request carries the next line of @FILE@'s header fields, in turn. setup
		-- numbers the threads; thread t starts at line t * 997, so that the threads are
		-- not in step.
		local threads = 0
		function setup(thread)
			threads = threads + 1
			thread:set("number", threads)
		end
		function init()
			reqs = {}
			for line in io.lines("@FILE@") do
				local headers = {}
				for field in line:gmatch("[^\t]+") do
					local name, value = field:match("^([^:]+): (.*)$")
					headers[name] = value
				end
				reqs[#reqs + 1] = wrk.format(nil, nil, headers)
			end
			i = (number * 997) % #reqs
		end
		function request()
			i = i % #reqs + 1
			return reqs[i]
		end
		EOF
	}
	keys_script "$stack/onekey.txt" >"$stack/onekey.lua"
	keys_script "$stack/manykeys.txt" >"$stack/manykeys.lua"
	keys_script "$stack/plain.txt" >"$stack/plain.lua"
	local code url="http://$gw/v1/monitors/$monitor"
	code=$(curl -s -o /dev/null -w '%{http_code}' -H "$(tail -n1 "$stack/manykeys.txt")" "$url")
	[ "$code" = 200 ] || { echo "bench: (mk) the last of the 2,000 keys answered $code, not 200" >&2; exit 1; }
	# shellcheck disable=SC2034 # rotate_runs runs mkp_cmd, mk1_cmd and mkn_cmd
	local mkp_cmd=(with_batches measure_cpu ok "http://$plain/v1/monitors/$monitor" -s "$stack/plain.lua")
	local mk1_cmd=(with_batches measure_cpu ok "$url" -s "$stack/onekey.lua")
	local mkn_cmd=(with_batches measure_cpu ok "$url" -s "$stack/manykeys.lua")
	local mkp_runs=() mk1_runs=() mkn_runs=() load_start
	load_start=$(cut -d' ' -f1 /proc/loadavg)
	wrk -t"$THREADS" -c"$CONNS" -d"$WARMUP" -s "$stack/manykeys.lua" "$url" >/dev/null
	rotate_runs "(mk) many keys" mkn mk1 mkp
	if [ -n "${PROFILE:-}" ]; then
		echo "profiling (mk)…" >&2
		profile_run manykeys.cpu.pprof manykeys.top.txt manykeys.run.txt "${mkn_cmd[@]}"
		profile_run onekey.cpu.pprof onekey.top.txt onekey.run.txt "${mk1_cmd[@]}"
	fi
	local name ratio_n ratio_1 rounds_n rounds_1
	rounds_n=$(per_round 1 / %.3f mkn_runs mkp_runs | paste -sd' ')
	rounds_1=$(per_round 1 / %.3f mk1_runs mkp_runs | paste -sd' ')
	# shellcheck disable=SC2086 # one figure a word
	ratio_n=$(median 1 $rounds_n) ratio_1=$(median 1 $rounds_1)
	manykeys_report=$'\n\n'"(mk) many keys: GET /v1/monitors/{id} with $n keys among $rows rows, every ${every}th, medians of $PAIR_ROUNDS rounds"
	manykeys_report+=$'\n'"    of three runs, their order rotating; wrk -t$THREADS -c$CONNS -d$DURATION, one Lua script for all three runs (round robin per thread)"
	manykeys_report+=$'\n'"$seeded"
	manykeys_report+=$'\n'"$(cpu_header "" | awk 'NR == 1 {printf "%s %9s %9s\n", $0, "ids", "requests"; next}
		{printf "%s %9s %9s\n", $0, "/query", "/query"}')"
	for name in mkn mk1 mkp; do
		local -n _mk_runs=${name}_runs
		local line="" f label
		for f in 1 2 3 4 5 6 7 8 9; do line+="$(median "$f" "${_mk_runs[@]}") "; done
		case $name in
		mkn) label="A: gateway, $n keys" ;;
		mk1) label="B: gateway, one key" ;;
		mkp) label="P: plain reverse_proxy" ;;
		esac
		manykeys_report+=$'\n'"$(cpu_row "$label" "$line")$(awk -v l="$line" 'BEGIN {split(l, f); printf " %9.1f %9.1f", f[8], f[9]}')"
		unset -n _mk_runs
	done
	manykeys_report+=$'\n'"    A/P throughput ratio     $(printf %.3f "$ratio_n") median of the rounds   (>= 0.80: $(verdict "$ratio_n >= 0.80")); rounds $rounds_n"
	manykeys_report+=$'\n'"    B/P throughput ratio     $(printf %.3f "$ratio_1") median of the rounds (informational); rounds $rounds_1"
	manykeys_report+=$'\n'"    Caddy CPU A - P, B - P   $(median 1 "$(per_round 4 - %.1f mkn_runs mkp_runs)" | xargs printf %+.1f), $(median 1 "$(per_round 4 - %.1f mk1_runs mkp_runs)" | xargs printf %+.1f) us/req medians of the rounds"
	local f diff what=([4]=Caddy [6]=PostgreSQL [7]=Redis) # measure_cpu's fields
	for f in 4 6 7; do
		diff=$(per_round "$f" - %+.1f mkn_runs mk1_runs | paste -sd' ')
		# shellcheck disable=SC2086 # one figure a word
		manykeys_report+=$'\n'"$(printf '    %-24s' "${what[f]} CPU A - B") $(median 1 $diff | xargs printf %+.1f) us/req median of the rounds; rounds $diff"
	done
	manykeys_report+=$'\n'"    runs (req/s): A $(rates "${mkn_runs[@]}"); B $(rates "${mk1_runs[@]}"); P $(rates "${mkp_runs[@]}");"
	manykeys_report+=" load average $load_start before the rounds, $(cut -d' ' -f1 /proc/loadavg) after"
}
