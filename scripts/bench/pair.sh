# shellcheck shell=bash
# bench/pair.sh: pairs, the way `make bench` measures what one option or one kind of key
# costs: two gateway sites that differ in one option line, or two keys on one site,
# served by one Caddy of their own, PAIR_ROUNDS alternating runs each (pair_run).
#
# Adding a pair: copy metrics.sh to NAME.sh (a function bench_NAME that sets
# NAME_report, here with bench_pair), add NAME to the list of sections in
# scripts/bench.sh (BENCH_NAME=0 then skips it) and, to let BENCH_ONLY=NAME run it
# alone, set paragraph[NAME] to the start of its report's first line, as usage.sh
# does. Then its paragraph in docs/performance.md, and the knob among the others.

# pair_run VAR TITLE PID LABEL_A URL_A KEY_A LABEL_B URL_B KEY_B [RATIO [CPU]] measures
# URL_A with key KEY_A and URL_B with KEY_B, both served by the Caddy PID, PAIR_ROUNDS
# times alternating, Caddy's, PostgreSQL's and Redis's CPU per request included, stops
# PID, and sets VAR to a report with the A/B throughput ratio (target: at least RATIO,
# 0.95; - for none, a cost reported rather than judged) and Caddy's CPU per request
# A - B (target: at most CPU us, when given).
#
# Each target is judged on the median of the rounds' own figures (A's run against the
# B run beside it), with the ratio and difference of the means beside it. Two runs
# 10 s apart differ by 10 to 20 % on this kind of machine. A pair shares its moment,
# so its ratio carries the drift of neither, and one disturbed round cannot move a
# median as it moves a mean.
pair_run() {
	local -n _report=$1
	local title=$2 pid=$3 label_a=$4 url_a=$5 key_a=$6 label_b=$7 url_b=$8 key_b=$9
	local want_ratio=${10:-0.95} want_cpu=${11:-}
	local auth_a=(-H "Authorization: Bearer $key_a") auth_b=(-H "Authorization: Bearer $key_b") load_start
	load_start=$(cut -d' ' -f1 /proc/loadavg)
	wrk -t"$THREADS" -c"$CONNS" -d"$WARMUP" "${auth_a[@]}" "$url_a" >/dev/null
	wrk -t"$THREADS" -c"$CONNS" -d"$WARMUP" "${auth_b[@]}" "$url_b" >/dev/null
	# cpu_snapshot reads caddy_pid: this Caddy's, for these runs.
	local caddy_pid=$pid a_runs=() b_runs=()
	# shellcheck disable=SC2034 # rotate_runs runs a_cmd and b_cmd
	local a_cmd=(measure_cpu ok "$url_a" "${auth_a[@]}") b_cmd=(measure_cpu ok "$url_b" "${auth_b[@]}")
	rotate_runs "$title" a b
	kill "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
	local a_rps a_p99 a_cpu a_pg a_rd b_rps b_p99 b_cpu b_pg b_rd ratio runs_a runs_b cpu_diff pg_diff rd_diff cpu_rounds cpu_verdict=""
	local ratio_rounds ratio_median cpu_median pg_rounds pg_median ratio_verdict="(informational)"
	a_rps=$(FIELD=1 mean "${a_runs[@]}") a_p99=$(FIELD=3 mean "${a_runs[@]}") a_cpu=$(FIELD=4 mean "${a_runs[@]}")
	b_rps=$(FIELD=1 mean "${b_runs[@]}") b_p99=$(FIELD=3 mean "${b_runs[@]}") b_cpu=$(FIELD=4 mean "${b_runs[@]}")
	a_pg=$(FIELD=6 mean "${a_runs[@]}") b_pg=$(FIELD=6 mean "${b_runs[@]}")
	a_rd=$(FIELD=7 mean "${a_runs[@]}") b_rd=$(FIELD=7 mean "${b_runs[@]}")
	ratio=$(awk -v a="$a_rps" -v b="$b_rps" 'BEGIN {printf "%.3f", a / b}')
	cpu_diff=$(awk -v a="$a_cpu" -v b="$b_cpu" 'BEGIN {printf "%+.1f", a - b}')
	pg_diff=$(awk -v a="$a_pg" -v b="$b_pg" 'BEGIN {printf "%+.1f", a - b}')
	rd_diff=$(awk -v a="$a_rd" -v b="$b_rd" 'BEGIN {printf "%+.1f", a - b}')
	cpu_rounds=$(per_round 4 - %+.1f a_runs b_runs | paste -sd' ')
	ratio_rounds=$(per_round 1 / %.3f a_runs b_runs | paste -sd' ')
	# shellcheck disable=SC2086 # one figure a word
	ratio_median=$(median 1 $ratio_rounds) cpu_median=$(median 1 $cpu_rounds)
	cpu_median=$(printf '%+.1f' "$cpu_median")
	pg_rounds=$(per_round 6 - %+.1f a_runs b_runs | paste -sd' ')
	# shellcheck disable=SC2086 # one figure a word
	pg_median=$(printf '%+.1f' "$(median 1 $pg_rounds)")
	[ -z "$want_cpu" ] || cpu_verdict="   (<= +$want_cpu: $(verdict "$cpu_median <= $want_cpu"))"
	[ "$want_ratio" = - ] || ratio_verdict="(>= $want_ratio: $(verdict "$ratio_median >= $want_ratio"))"
	runs_a=$(rates "${a_runs[@]}") runs_b=$(rates "${b_runs[@]}")
	_report=$'\n\n'$(
		cat <<EOT
$title, mean of $PAIR_ROUNDS alternating runs      req/s      p99 ms  caddy us/req
    $(printf '%-34s %9.0f %11.3f %11.1f' "$label_a" "$a_rps" "$a_p99" "$a_cpu")
    $(printf '%-34s %9.0f %11.3f %11.1f' "$label_b" "$b_rps" "$b_p99" "$b_cpu")
    A/B throughput ratio               $ratio_median median of the rounds   $ratio_verdict; $ratio of the means; rounds $ratio_rounds
    Caddy CPU A - B                    $cpu_median us/req median of the rounds$cpu_verdict; $cpu_diff of the means; rounds $cpu_rounds
    PostgreSQL CPU A - B               $pg_median us/req median of the rounds; $pg_diff of the means; rounds $pg_rounds
    Redis CPU A - B                    $rd_diff us/req
    runs (req/s): A $runs_a; B $runs_b; load average $load_start before the rounds, $(cut -d' ' -f1 /proc/loadavg) after
EOT
	)
}
# pair_caddy ADDR... starts a Caddy for pair_run on $stack/Caddyfile.pair, its PID in
# CADDY_PID, and waits until each ADDR answers /v1/me.
pair_caddy() {
	local addr urls=()
	for addr in "$@"; do urls+=("$addr/v1/me"); done
	start_caddy "$stack/Caddyfile.pair" "$stack/caddy-pair.log" "${urls[@]}"
}
# pair_site starts a Caddy for pair_run with one gateway site, PAIR_SITE (host:port),
# for a pair of two keys.
pair_site() {
	PAIR_SITE="127.0.0.1:$(bench_port)"
	{
		caddy_globals
		gateway_site "$PAIR_SITE"
	} >"$stack/Caddyfile.pair"
	pair_caddy "$PAIR_SITE"
}
# bench_pair VAR TITLE LABEL_A OPTION_A LABEL_B OPTION_B [RATIO [CPU]] runs one Caddy
# with two gateway sites that differ only in one option line (empty: none) and measures
# them with pair_run, the bench key on both. Both sites share one process, one
# PostgreSQL pool and one Redis client, so the only difference is the option's work.
bench_pair() {
	local var=$1 title=$2 label_a=$3 opt_a=$4 label_b=$5 opt_b=$6 a b
	a="127.0.0.1:$(bench_port)"
	b="127.0.0.1:$(bench_port)"
	{
		caddy_globals
		gateway_site "$a" ${opt_a:+"$opt_a"}
		gateway_site "$b" ${opt_b:+"$opt_b"}
	} >"$stack/Caddyfile.pair"
	pair_caddy "$a" "$b"
	pair_run "$var" "$title" "$CADDY_PID" "$label_a" "http://$a/v1/monitors/$monitor" "$key" \
		"$label_b" "http://$b/v1/monitors/$monitor" "$key" "${@:7}"
}
# module_cpu VAR TITLE SUB_A SUB_B WANT appends to VAR the module's CPU per request A - B,
# measured in process: BenchmarkServeHTTP's sub-benchmarks SUB_A and SUB_B
# (caddymodule/hotpath_test.go), each run MODULE_RUNS times (8) for 20,000 requests on
# one core, alternating, judged on the median of the pairs' differences of the
# process's CPU per request (target: at most WANT us). Through wrk, a round's Caddy CPU
# also holds the proxying, the sockets and whatever else the machine does meanwhile:
# its rounds spread by tens of microseconds, so a target of a few cannot be judged from
# them. ServeHTTP alone, on one core, spreads by about a microsecond.
module_cpu() {
	local -n _out=$1
	local title=$2 sub_a=$3 sub_b=$4 want=$5 runs round a=() b=() diffs d sub
	runs=${MODULE_RUNS:-8}
	echo "measuring $title in process…" >&2
	[ -x "$stack/caddymodule.test" ] || go test -c -o "$stack/caddymodule.test" ./caddymodule
	# one_run SUB prints the CPU per request of one run of BenchmarkServeHTTP/SUB.
	one_run() {
		"$stack/caddymodule.test" -test.run '^$' -test.bench "^BenchmarkServeHTTP\$/^$1\$" \
			-test.benchtime 20000x -test.cpu 1 | awk '{for (i = 2; i <= NF; i++) if ($i == "cpu-µs/op") print $(i - 1)}'
	}
	for round in $(seq 1 "$runs"); do
		if ((round % 2)); then
			a+=("$(one_run "$sub_a")") b+=("$(one_run "$sub_b")")
		else
			b+=("$(one_run "$sub_b")") a+=("$(one_run "$sub_a")")
		fi
	done
	for sub in "${a[@]}" "${b[@]}"; do
		[ -n "$sub" ] || { echo "bench: $title: BenchmarkServeHTTP reported no CPU" >&2; exit 1; }
	done
	diffs=$(per_round 1 - %+.2f a b | paste -sd' ')
	# shellcheck disable=SC2086 # one figure a word
	d=$(printf '%+.2f' "$(median 1 $diffs)")
	_out+=$'\n'"$(printf '    %-34s %s us/req median of %s alternating runs   (<= +%s: %s); A %.2f us, B %.2f us (medians); rounds %s' \
		"module CPU A - B, in process" "$d" "$runs" "$want" "$(verdict "$d <= $want")" \
		"$(median 1 "${a[@]}")" "$(median 1 "${b[@]}")" "$diffs")"
	_out+=$'\n'"    (BenchmarkServeHTTP/$sub_a against /$sub_b, -cpu 1; the Caddy CPU above holds the whole process)"
}
