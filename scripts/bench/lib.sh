# shellcheck shell=bash
# bench/lib.sh: the helpers every section of `make bench` shares: ports and Caddyfile
# sites, wrk runs with CPU per request by process, the statistics of rounds and the
# rows of their tables, alternating rounds, and BENCH_ONLY's ending. scripts/bench.sh
# sources it, after scripts/lib.sh; the setup (setup.sh) sets the variables it reads
# (stack, caddy_pid, upstream_pid, pg_pid, redis_pid, CLK_TCK).

# bench_port picks the bench's listening ports below the ephemeral range (32768 and
# up), where wrk's and the proxies' thousands of outgoing connections take their local
# ports: a port free when picked could be taken by one of them before Caddy binds it.
bench_port() { free_port 20000 12000; }

# caddy_globals prints the global options of a Caddy of its own (no admin endpoint),
# the first lines of every Caddyfile but the main one.
caddy_globals() { printf '{\n\tadmin off\n\tauto_https off\n\tpersist_config off\n}\n'; }

# gateway_site ADDR [OPTION...] prints a Caddyfile site at ADDR: v1_gateway with the
# given extra options (one a line) under /v1/*, the reverse proxy to the upstream
# behind it and for every other path (the dashboard routes bench uses to log in and
# create keys). SITE_DB and SITE_REDIS replace the database_url and redis_url;
# SITE_LINES adds lines to the site, before its handlers (tracing.sh's tracing).
gateway_site() {
	local addr=$1 opt
	shift
	printf 'http://%s {\n\tbind 127.0.0.1\n' "$addr"
	[ -z "${SITE_LINES:-}" ] || printf '\t%s\n' "$SITE_LINES"
	printf '\thandle /v1/* {\n\t\tv1_gateway {\n'
	printf '\t\t\tdatabase_url   %s\n' "${SITE_DB:-{env.DATABASE_URL\}}"
	printf '\t\t\tredis_url      %s\n' "${SITE_REDIS:-{env.REDIS_URL\}}"
	printf '\t\t\tgateway_secret {env.GATEWAY_SECRET}\n'
	for opt in "$@"; do printf '\t\t\t%s\n' "$opt"; done
	printf '\t\t}\n\t\treverse_proxy %s\n\t}\n\thandle {\n\t\treverse_proxy %s\n\t}\n}\n' "$up" "$up"
}

# create_monitor KEY BASE creates a monitor with KEY through BASE and prints its id.
create_monitor() {
	curl -sf "$2/v1/monitors" -H "Authorization: Bearer $1" -H 'Content-Type: application/json' \
		-d '{"name":"bench","type":"http","target":"https://example.com","interval_seconds":60,"config":{"a":1}}' | json_field id
}

# ---- one run of wrk -------------------------------------------------------------------

# to_ms turns a wrk latency (850.00us, 1.20ms, 2.00s) into milliseconds.
to_ms() {
	awk -v v="$1" 'BEGIN {
		n = v + 0
		if (v ~ /us$/) n /= 1000; else if (v ~ /ms$/) n += 0; else if (v ~ /s$/) n *= 1000
		printf "%.3f", n
	}'
}

# wrk_figures OUT prints "rps p50 p99" of wrk --latency's output OUT.
wrk_figures() {
	local rps p50 p99
	rps=$(echo "$1" | awk '/^Requests\/sec:/ {print $2}')
	p50=$(to_ms "$(echo "$1" | awk '$1 == "50%" {print $2}')")
	p99=$(to_ms "$(echo "$1" | awk '$1 == "99%" {print $2}')")
	echo "$rps $p50 $p99"
}

# measure URL [curl-style -H args...] runs wrk and prints "rps p50 p99".
measure() {
	local url=$1
	shift
	local out
	out=$(wrk -t"$THREADS" -c"$CONNS" -d"$DURATION" --latency "$@" "$url")
	if echo "$out" | grep -q 'Non-2xx'; then
		echo "$out" >&2
		echo "bench: $url answered errors under load" >&2
		exit 1
	fi
	wrk_figures "$out"
}

# ---- CPU per request, per process -----------------------------------------------------
# proc_ticks PID prints the CPU time of PID and of its reaped children (utime + stime +
# cutime + cstime, /proc/PID/stat fields 14-17) in clock ticks; 0 once it is gone.
# pg_ticks sums the postmaster and every backend and worker it runs.
proc_ticks() {
	awk '{sub(/^.*\) /, ""); print $12 + $13 + $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0
}
pg_ticks() {
	local t=0 p
	for p in "$pg_pid" $(ps -o pid= --ppid "$pg_pid"); do t=$((t + $(proc_ticks "$p"))); done
	echo "$t"
}
# cpu_snapshot prints the ticks of Caddy (caddy_pid: a pair's Caddy sets its own),
# the upstream, PostgreSQL and Redis.
cpu_snapshot() { echo "$(proc_ticks "$caddy_pid") $(proc_ticks "$upstream_pid") $(pg_ticks) $(proc_ticks "$redis_pid")"; }

# measure_cpu EXPECT URL [wrk args...] runs wrk like measure and prints "rps p50 p99
# caddy upstream postgres redis", the last four in CPU µs per request. EXPECT is ok
# (every answer 2xx) or error (at least 99% of the answers are not 2xx: a limit of one
# request a minute lets one a minute through).
measure_cpu() {
	local expect=$1 url=$2
	shift 2
	local out before after
	before=$(cpu_snapshot)
	out=$(wrk -t"$THREADS" -c"$CONNS" -d"$DURATION" --latency "$@" "$url")
	after=$(cpu_snapshot)
	local reqs errs
	reqs=$(echo "$out" | awk '/requests in/ {print $1}')
	errs=$(echo "$out" | awk '/Non-2xx/ {print $NF}')
	errs=${errs:-0}
	if { [ "$expect" = ok ] && [ "$errs" != 0 ]; } || { [ "$expect" = error ] && ((errs * 100 < reqs * 99)); }; then
		echo "$out" >&2
		echo "bench: $url answered $errs non-2xx of $reqs, expected $expect" >&2
		exit 1
	fi
	echo "$(wrk_figures "$out") $(cpu_per_request "$before" "$after" "$reqs")"
}

# cpu_per_request BEFORE AFTER N prints the CPU µs per request of each process of two
# cpu_snapshot lines taken around N requests.
cpu_per_request() {
	awk -v b="$1" -v a="$2" -v n="$3" -v hz="$CLK_TCK" 'BEGIN {
		split(b, x); split(a, y)
		for (i = 1; i <= 4; i++) printf "%s%.1f", (i > 1 ? " " : ""), (y[i] - x[i]) * 1e6 / hz / n
		print ""
	}'
}

# ---- the statistics of rounds ---------------------------------------------------------
# per_round FIELD OP FORMAT RUNS_A RUNS_B prints, for each round i, field FIELD of
# RUNS_A[i] minus (OP -) or over (OP /) that of RUNS_B[i] (two arrays of measure_cpu's
# lines, named), one a line, in FORMAT: the per-round gateway − plain figures.
per_round() {
	local f=$1 op=$2 fmt=$3 i
	local -n _runs_a=$4 _runs_b=$5
	for i in "${!_runs_a[@]}"; do
		awk -v x="${_runs_a[$i]}" -v y="${_runs_b[$i]}" -v f="$f" -v op="$op" -v fmt="$fmt" \
			'BEGIN {split(x, a); split(y, b); printf fmt "\n", op == "/" ? a[f] / b[f] : a[f] - b[f]}'
	done
}

# FIELD=F mean LINE... prints the mean of field F of the lines.
mean() { printf '%s\n' "$@" | awk -v f="$FIELD" '{s += $f} END {printf "%.2f", s / NR}'; }
# median FIELD LINE... prints the median of field FIELD of the lines; spread prints
# "min..max".
median() {
	local f=$1
	shift
	printf '%s\n' "$@" | awk -v f="$f" '{print $f}' | sort -g |
		awk '{v[NR] = $1} END {m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%.3f", m}'
}
spread() {
	printf '%s\n' "$@" | sort -g | awk 'NR == 1 {lo = $1} {hi = $1} END {printf "%.1f..%.1f", lo, hi}'
}
# rates LINE... prints the req/s of measure_cpu's lines, rounded, on one line.
rates() { printf '%s\n' "$@" | awk '{printf "%s%.0f", (NR > 1 ? " " : ""), $1}'; }
# cpu_row NAME LINE prints one row of a CPU table.
cpu_row() {
	local name=$1 rps p50 p99 c u p r
	read -r rps p50 p99 c u p r _ <<<"$2"
	printf '    %-24s %8.0f %8.3f %8.3f %8.1f %8.1f %8.1f %8.1f\n' "$name" "$rps" "$p50" "$p99" "$c" "$u" "$p" "$r"
}
cpu_header() {
	printf '    %-24s %8s %8s %8s %8s %8s %8s %8s\n' "$1" req/s "p50 ms" "p99 ms" caddy upstream postgres redis
	printf '    %-24s %8s %8s %8s %8s %8s %8s %8s\n' "" "" "" "" "us/req" "us/req" "us/req" "us/req"
}

verdict() { if awk "BEGIN {exit !($1)}"; then echo met; else echo MISSED; fi; }

# ---- rounds, profiles, BENCH_ONLY -----------------------------------------------------

# rotate_runs TITLE NAME... runs PAIR_ROUNDS rounds of one run of each NAME, round r
# starting with NAME number r (counting round the list) and going on in turn, so that
# none always has the warmer (or the more disturbed) slot: with two, odd rounds run A
# first and even rounds B. A run is the command in the array NAME_cmd (measure_cpu's
# command line, or one that prints a line like it); its line is added to the array
# NAME_runs, so that the rounds' lines of two names pair up by index (per_round).
rotate_runs() {
	local _rr_title=$1 _rr_round _rr_i _rr_n
	shift
	local _rr_names=("$@")
	_rr_n=${#_rr_names[@]}
	for _rr_round in $(seq 1 "$PAIR_ROUNDS"); do
		echo "measuring $_rr_title, round $_rr_round…" >&2
		for ((_rr_i = 0; _rr_i < _rr_n; _rr_i++)); do
			local -n _rr_cmd=${_rr_names[(_rr_round - 1 + _rr_i) % _rr_n]}_cmd
			local -n _rr_runs=${_rr_names[(_rr_round - 1 + _rr_i) % _rr_n]}_runs
			_rr_runs+=("$("${_rr_cmd[@]}")")
			unset -n _rr_cmd _rr_runs
		done
	done
}

# profile_run PPROF TOP RUN COMMAND... runs COMMAND (measure_cpu's command line) once,
# with Caddy's CPU profile through its admin endpoint meanwhile (PROFILE/PPROF), the
# busiest processes by CPU (PROFILE/TOP) and the run's own line (PROFILE/RUN). Only with
# PROFILE set, which turns the main Caddy's admin endpoint on.
profile_run() {
	local pprof=$1 top=$2 run=$3 secs prof_pids
	shift 3
	secs=$((${DURATION%s} > 2 ? ${DURATION%s} - 2 : 1))
	(sleep 1; curl -s -o "$PROFILE/$pprof" "http://$admin/debug/pprof/profile?seconds=$secs") &
	prof_pids=($!)
	(sleep 1; top -b -d "$secs" -n 2 -w 200 | awk '/^top -/ {n++} n == 2' | head -n 20 >"$PROFILE/$top") &
	prof_pids+=($!)
	"$@" >"$PROFILE/$run"
	wait "${prof_pids[@]}" || true # top ends on SIGPIPE
}

# only_run VAR PREFIX prints VAR's report and replaces the paragraph of OUT that starts
# with PREFIX, up to its blank line, with it (or adds it at the end): BENCH_ONLY's ending.
# The paragraph ends with when, at which commit and on how busy a machine it ran, since
# the rest of OUT comes from another run.
only_run() {
	local -n _only=$1
	local prefix=$2
	_only+=$'\n'"    run alone (BENCH_ONLY=$BENCH_ONLY), $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown),"
	_only+=" $(nproc) cores, load average $bench_start_load at the start, $(cut -d' ' -f1-3 /proc/loadavg) at the end"
	local speed
	if [ "$BENCH_ONLY" != fieldstrip ] && speed=$(vm_speed); then
		_only+=$';\n'"    the VM's speed then: BenchmarkJSONFilter at $(printf %.1f "$speed") MB/s on one core, median of 3 runs of 1 s (compare (fs))"
	fi
	local pg
	pg=$(pg_settings)
	[ -z "$pg" ] || _only+=$';\n'"    $pg"
	echo "$_only"
	printf '%s\n' "$_only" | sed '/./,$!d' >"$OUT.block"
	if [ -f "$OUT" ] && grep -qF "$prefix" "$OUT"; then
		awk -v bf="$OUT.block" -v p="$prefix" 'index($0, p) == 1 {while ((getline l < bf) > 0) print l; skip = 1; next}
			skip && /^$/ {skip = 0} !skip' "$OUT" >"$OUT.tmp"
		mv "$OUT.tmp" "$OUT"
	elif [ -f "$OUT" ] && grep -qE '^(\(k\) |capacity of each shared dependency)' "$OUT"; then
		# Where a whole run puts it: before (k) and the capacity section, which
		# BENCH_ONLY=capacity replaces up to the end of OUT.
		awk -v bf="$OUT.block" '!done && /^(\(k\) |capacity of each shared dependency)/ {
			while ((getline l < bf) > 0) print l; print ""; done = 1 } {print}' "$OUT" >"$OUT.tmp"
		mv "$OUT.tmp" "$OUT"
	else
		# shellcheck disable=SC2094 # OUT is read before the block is appended
		{
			[ ! -s "$OUT" ] || echo
			cat "$OUT.block"
		} >>"$OUT"
	fi
	rm -f "$OUT.block"
	echo "(written to $OUT)"
}

# ---- the stack's servers --------------------------------------------------------------

# capacity_tool builds integration/capacity's command as $stack/capacity, once.
capacity_tool() {
	[ -x "$stack/capacity" ] || go build -o "$stack/capacity" ./integration/capacity/cmd/capacity
}
# capacity_flags are the flags of every load the capacity tool drives (capacity.sh's
# CAP_* knobs): keys, worker processes, warm-up and each level's window.
capacity_flags=(-keys "${CAP_KEYS:-1000000}" -procs "${CAP_PROCS:-4}" -warmup "${CAP_WARMUP:-2s}"
	-duration "${CAP_DURATION:-5s}")

# pg_settings prints the settings of the bench's PostgreSQL that docs/scaling.md's
# lookups depend on, for the report: its shared_buffers and whether huge pages back
# them (BENCH_SHARED_BUFFERS and BENCH_HUGE_PAGES, bench/setup.sh); nothing for a
# section that starts no PostgreSQL, such as (fs).
pg_settings() {
	[ -f "$stack/pg.bindir" ] || return 0
	local huge="huge pages off"
	[ ! -f "$stack/pg.hugepages" ] || huge="huge pages on ($(cat "$stack/pg.hugepages") of 2 MB)"
	echo "PostgreSQL shared_buffers $("$(cat "$stack/pg.bindir")/psql" "$DATABASE_URL" -qAtc 'SHOW shared_buffers'), $huge"
}

# with_database URL NAME prints URL with its database replaced by NAME.
with_database() {
	sed -E "s#^([a-z]+://[^/]*)/[^?]*#\1/$2#" <<<"$1"
}

# with_param URL PARAM prints URL with the query parameter PARAM (name=value) added.
with_param() {
	case $1 in
	*\?*) echo "$1&$2" ;;
	*) echo "$1?$2" ;;
	esac
}

# stack_env NAME prints the variable NAME of the stack's env file, which stack.sh's
# up-* commands append to.
stack_env() {
	# shellcheck disable=SC1091 # written by stack.sh
	(. "$stack/env" && printf '%s\n' "${!1}")
}

# wait_replayed URL [SECONDS] waits, SECONDS (60) at most, until the standby of URL has
# replayed the bench PostgreSQL's WAL as written when called.
wait_replayed() {
	local lsn i psql secs=${2:-60}
	psql="$(cat "$stack/pg.bindir")/psql"
	lsn=$("$psql" "$DATABASE_URL" -qAtc "SELECT pg_current_wal_lsn()")
	for i in $(seq $((secs * 10))); do
		[ "$("$psql" "$1" -qAtc "SELECT pg_last_wal_replay_lsn() >= '$lsn'" 2>/dev/null)" = t ] && return 0
		sleep 0.1
	done
	echo "bench: the standby has not replayed $lsn within $secs s" >&2
	exit 1
}

# start_caddy CONFIG LOG ADDR... starts bin/caddy on CONFIG (a Caddyfile) with its
# output in LOG, sets CADDY_PID, and waits until each ADDR (host:port/path) answers.
# Variables set on the call (REDIS_URL=…) reach Caddy's environment.
start_caddy() {
	local config=$1 log=$2 addr
	shift 2
	bin/caddy run --config "$config" --adapter caddyfile >"$log" 2>&1 &
	CADDY_PID=$!
	pids+=("$CADDY_PID")
	for addr in "$@"; do
		wait_http "http://$addr" || { tail -n 20 "$log" >&2; exit 1; }
	done
}
