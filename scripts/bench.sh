#!/usr/bin/env bash
# bench.sh is `make bench`: it starts a throwaway stack and measures, in one run and
# under the same load (wrk, CONNS connections, DURATION each, after a warm-up):
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
#   (e) a 50 MB JSON list through the gateway's field filter: Caddy's peak RSS growth
#   (f) the fault run (fault_run below): the gateway's rate while Redis hangs, as a share
#       of its rate just before, under limiter_failure open and local; and the rate of
#       503s while PostgreSQL hangs. A hang is internal/testkit/latencyproxy's hang mode (no
#       byte forwarded, as with SIGSTOP) in front of the real servers.
#   (r) (c) and (b) again at one equal rate, below their full-load rates, through hey's
#       rate limit: the module's CPU per request without the throughput effect
#       (bench_matched below; informational)
#   (m) the cost of metrics: the gateway with and without disable_metrics, in one Caddy
#       of its own, PAIR_ROUNDS alternating runs each (bench_pair below)
#   (i) the cost of signed identity: the gateway with identity_key and with
#       gateway_secret alone, the same way (bench_pair below)
#   (sb) key lookups on a standby: the gateway with database_read_urls on one streaming
#       standby (stack.sh up-standbys) and with every lookup on the primary, the same way:
#       the throughput ratio (target 0.97: within 0.03) and the primary's CPU per request
#       (PostgreSQL CPU counts the primary's processes only); BENCH_STANDBY=0 skips it,
#       BENCH_ONLY=standby runs it alone and replaces it in OUT
#   (u) the cost of the usage record: the gateway with it on (the default) and with
#       usage off, the same way; then (u1) PostgreSQL's CPU per row written and rolled
#       up and per month read (integration/capacity); BENCH_ONLY=usage runs it alone and
#       replaces it in OUT
#   (o) the cost of organisation budgets: one gateway site, a key whose plan has an
#       organisation ceiling and a monthly quota (too large to refuse) against the bench
#       key, whose plan has neither, the same way (pair_run below); then Redis's CPU per
#       count, (o1) the key's minute alone against (o2) the budgets' script, at
#       BUDGETS_WAITERS (1,4,16,64) goroutines per process (integration/capacity, with
#       capacity.sh's CAP_KEYS, CAP_ORGS, CAP_PROCS, CAP_WARMUP, CAP_DURATION);
#       BENCH_ONLY=budgets runs it alone and replaces it in OUT
#   (s) the cost of scopes: a key with scopes against one without, on one gateway site,
#       the same way (pair_run below); (s2) the cost of a route table: a gateway with a
#       table of 20 rules (costs above 1 among them, so every request is matched, the
#       last rule the bench's route) against one with the built-in table;
#       BENCH_ONLY=scopes runs both alone and replaces them in OUT
#   (t) nothing to time: 2,000 interleaved pairs on loopback, one request at a time,
#       of a refused restricted key (right secret, wrong address) and a revoked key,
#       whose 401s are byte-identical: both medians and the share of pairs in which
#       each was the slower (internal/testkit/timingpair); BENCH_TIMING=0 skips it,
#       BENCH_ONLY=timing runs it alone and replaces it in OUT
#   (mk) many keys: 1,000,000 keys seeded into the bench's database (integration/capacity),
#       every 500th moved to the bench org, so that 2,000 keys read the bench's monitor;
#       PAIR_ROUNDS rounds of three runs, their order rotating (rotate_runs below): plain
#       Caddy, the gateway with the bench key alone, and the gateway with the 2,000 keys
#       (one wrk Lua script for both gateway runs, round robin over its keys in each thread).
#       Medians of the rounds: the 2,000 keys' throughput over plain's (target 0.80), the
#       bench key's beside it, CPU per request by process, and the distinct key ids and
#       requests per lookup query (the gateway's /metrics). It leaves the 1,000,000 keys
#       in the database, so it runs after the other pairs. BENCH_MANYKEYS=0 skips it,
#       BENCH_ONLY=manykeys runs it alone and replaces it in OUT
#   (k) the gateway on a 3-master Redis Cluster beside the single Redis
#   capacity: each shared dependency on its own, as CPU per operation (scripts/capacity.sh:
#       key lookups on PostgreSQL, through PgBouncer and with one standby, counts on one Redis and on a
#       2-master Cluster, last_used_at writes, Caddy per request); BENCH_CAPACITY=0 skips
#       it, BENCH_ONLY=capacity (`make bench-capacity`) runs it alone and replaces it in OUT
#
# (c), (cL), (b), (c401) and (c429) run ROUNDS times, in that order, so that gateway and
# plain alternate; the report gives the median of the rounds, since the machine is small
# and noisy. Next to requests/s and latency, each of these runs measures the CPU time every
# process spent (utime + stime from /proc/<pid>/stat, before and after the run) divided
# by the requests wrk made: Caddy (one process serves the gateway and the plain sites,
# one site at a time), the upstream, PostgreSQL (the postmaster and all its backends,
# reaped ones included) and Redis. The module's own cost is Caddy's CPU per gateway
# request minus Caddy's per plain request; CPU per request is far steadier than req/s
# on a shared machine. It prints a table per round, the medians, the module overhead
# with its spread, the targets met or missed, and writes the figures to
# scripts/bench-results.txt.
#
# Environment: CONNS (32), THREADS (2), DURATION (10s), WARMUP (3s), ROUNDS (3),
# PAIR_ROUNDS (6: the rounds of each pair, (m), (i), (u) and (o)), OUT,
# FAULT_DURATION (5s, each run of (f)), BENCH_LINGER ((cL)'s batch_linger, 2ms; off skips
# (cL)), BENCH_MATCHED (1; 0 skips (r)), MATCHED_RATE
# ((r)'s rate in requests a second) or MATCHED_SHARE (0.6: of the median (c) rate),
# MATCHED_CONNS (CONNS: hey's workers in (r)), BENCH_METRICS, BENCH_IDENTITY, BENCH_USAGE,
# BENCH_BUDGETS, BENCH_SCOPES and BENCH_CLUSTER (1; 0 skips (m), (i), (u), (o), (s) and
# (t), or (k)); BENCH_STANDBY (1; 0 skips (sb)), STANDBY_WARMUP ((sb)'s warm-up, 10s);
# BENCH_MANYKEYS (1; 0 skips (mk)); BENCH_CAPACITY
# and BENCH_ONLY above, the capacity section's own CAP_* in scripts/capacity.sh.
# PROFILE=DIR also writes DIR/gateway.cpu.pprof (Caddy's pprof, through its admin
# endpoint, during one more (c) run after the rounds), DIR/top.txt (CPU by process
# meanwhile) and DIR/run.txt (that run's figures, as in the CPU table); and, with (mk),
# DIR/manykeys.cpu.pprof, DIR/manykeys.top.txt and DIR/manykeys.run.txt, the same for
# one more run of the 2,000 keys, and DIR/onekey.* for one more run of the one key.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

CONNS=${CONNS:-32}
THREADS=${THREADS:-2}
DURATION=${DURATION:-10s}
WARMUP=${WARMUP:-3s}
ROUNDS=${ROUNDS:-3}
PAIR_ROUNDS=${PAIR_ROUNDS:-6}
OUT=${OUT:-scripts/bench-results.txt}
bench_start_load=$(cut -d' ' -f1-3 /proc/loadavg)
need_tools wrk curl openssl
case ${BENCH_ONLY:-} in
"" | capacity | usage | budgets | scopes | timing | standby | manykeys) ;;
*) echo "bench: BENCH_ONLY=$BENCH_ONLY: only capacity, usage, budgets, scopes, timing, standby or manykeys runs alone" >&2; exit 1 ;;
esac
[ "${BENCH_MATCHED:-1}" = 1 ] && need_tools hey

# bench_port picks the bench's listening ports below the ephemeral range (32768 and
# up), where wrk's and the proxies' thousands of outgoing connections take their local
# ports: a port free when picked could be taken by one of them before Caddy binds it.
bench_port() { free_port 20000 12000; }

stack=$(mktemp -d "${TMPDIR:-/tmp}/keygate-bench.XXXXXX")
pids=()
trap 'stop_stack "$stack"' EXIT
scripts/stack.sh up "$stack" >/dev/null
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
big="127.0.0.1:$(bench_port)"
# The gateway's /metrics, read around the (mk) runs for the lookups' batch sizes.
metrics_addr="127.0.0.1:$(bench_port)"

bin/upstream serve --addr "$up" >"$stack/upstream.log" 2>&1 &
upstream_pid=$!
pids+=($upstream_pid)

# The 50 MB list: 100,000 monitors, each with fields the filter must remove at depth.
mkdir -p "$stack/www/v1"
awk 'BEGIN {
	printf "{\"data\":["
	for (i = 0; i < 100000; i++) {
		if (i) printf ","
		printf "{\"id\":\"00000000-0000-4000-8000-%012d\",\"name\":\"monitor %d\",\"type\":\"http\",", i, i
		printf "\"target\":\"https://example.com/%d\",\"interval_seconds\":60,\"locations\":[\"us-east\",\"eu-west\"],", i
		printf "\"paused\":false,\"created_at\":\"2026-11-22T12:00:00Z\",\"updated_at\":\"2026-11-22T12:00:00Z\","
		printf "\"org_id\":\"11111111-1111-4111-8111-111111111111\",\"config_version\":3,\"paused_reason\":null,"
		printf "\"config\":{\"headers\":{\"X-Token\":\"secret-%d\"},\"body\":\"%s\"},", i, "padding padding padding padding padding"
		printf "\"assertions\":[{\"type\":\"status\",\"equals\":200},{\"type\":\"latency\",\"below_ms\":500}],"
		printf "\"tags\":[{\"k\":\"team\",\"v\":\"core\",\"config\":{\"x\":1}}]}"
	}
	printf "],\"next_cursor\":null}"
}' >"$stack/www/v1/big.json"

# gateway_site ADDR [OPTION...] prints a Caddyfile site at ADDR: v1_gateway with the
# given extra options (one a line) under /v1/*, the reverse proxy to the upstream
# behind it and for every other path (the dashboard routes bench uses to log in and
# create keys). SITE_DB and SITE_REDIS replace the database_url and redis_url.
gateway_site() {
	local addr=$1 opt
	shift
	printf 'http://%s {\n\tbind 127.0.0.1\n\thandle /v1/* {\n\t\tv1_gateway {\n' "$addr"
	printf '\t\t\tdatabase_url   %s\n' "${SITE_DB:-{env.DATABASE_URL\}}"
	printf '\t\t\tredis_url      %s\n' "${SITE_REDIS:-{env.REDIS_URL\}}"
	printf '\t\t\tgateway_secret {env.GATEWAY_SECRET}\n'
	for opt in "$@"; do printf '\t\t\t%s\n' "$opt"; done
	printf '\t\t}\n\t\treverse_proxy %s\n\t}\n\thandle {\n\t\treverse_proxy %s\n\t}\n}\n' "$up" "$up"
}

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
cat >"$stack/Caddyfile.big" <<EOF
{
	admin off
	auto_https off
	persist_config off
	order v1_gateway before file_server
}
http://$big {
	bind 127.0.0.1
	root * $stack/www
	v1_gateway {
		database_url   {env.DATABASE_URL}
		redis_url      {env.REDIS_URL}
		gateway_secret {env.GATEWAY_SECRET}
	}
	file_server
}
EOF
bin/caddy run --config "$stack/Caddyfile" --adapter caddyfile >"$stack/caddy.log" 2>&1 &
caddy_pid=$!
pids+=($caddy_pid)
addrs=("$up" "$gw" "$plain" "$unbatched")
[ "$linger" = off ] || addrs+=("$lingering")
for addr in "${addrs[@]}"; do
	wait_http "http://$addr/" || { tail -n 20 "$stack"/*.log >&2; exit 1; }
done

jar="$stack/cookies"
login bench@example.com bench-password "$jar" "http://$gw"
key=$(create_key "$org" bench Admin "$jar" "http://$gw")
key_id=${key#mon_live_}
key_id=${key_id%%.*}
monitor=$(curl -sf "http://$gw/v1/monitors" -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
	-d '{"name":"bench","type":"http","target":"https://example.com","interval_seconds":60,"config":{"a":1}}' | json_field id)
[ -n "$monitor" ] || { echo "could not create the bench monitor" >&2; exit 1; }

# A key over its limit, for (c429): an org on a plan of one request a minute.
bin/upstream plan put --name bench-tiny --api-rate-limit 1 --max-monitors -1 --min-interval 10 \
	--locations us-east --check-types http >/dev/null
tiny_org=$(bin/upstream org create --name bench-tiny --plan bench-tiny | json_field id)
bin/upstream member add --org "$tiny_org" --email bench@example.com --role Owner >/dev/null
tiny_key=$(create_key "$tiny_org" tiny Viewer "$jar" "http://$gw")
for _ in 1 2; do curl -s -o /dev/null -H "Authorization: Bearer $tiny_key" "http://$gw/v1/me"; done
code=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $tiny_key" "http://$gw/v1/monitors/$monitor")
[ "$code" = 429 ] || { echo "bench: the key over its limit answered $code, not 429" >&2; exit 1; }

# Random well-formed keys, for (c401): a new key id and secret on every request, in
# today's format (43 base64url characters and a 6-character checksum; docs/security.md).
# Their checksums are random too, so all but one in 62^6 fail it: the flood an attacker
# can send, which the gateway answers without a database query.
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

ident=(-H "X-Gateway-Org-Id: $org" -H "X-Gateway-Key-Id: $key_id" -H "X-Gateway-Key-Role: Admin" -H "X-Gateway-Secret: $GATEWAY_SECRET")
auth=(-H "Authorization: Bearer $key")

# to_ms turns a wrk latency (850.00us, 1.20ms, 2.00s) into milliseconds.
to_ms() {
	awk -v v="$1" 'BEGIN {
		n = v + 0
		if (v ~ /us$/) n /= 1000; else if (v ~ /ms$/) n += 0; else if (v ~ /s$/) n *= 1000
		printf "%.3f", n
	}'
}

# measure NAME URL [curl-style -H args...] runs wrk and prints "rps p50 p99".
measure() {
	local url=$1
	shift
	local out rps p50 p99
	out=$(wrk -t"$THREADS" -c"$CONNS" -d"$DURATION" --latency "$@" "$url")
	if echo "$out" | grep -q 'Non-2xx'; then
		echo "$out" >&2
		echo "bench: $url answered errors under load" >&2
		exit 1
	fi
	rps=$(echo "$out" | awk '/^Requests\/sec:/ {print $2}')
	p50=$(to_ms "$(echo "$out" | awk '$1 == "50%" {print $2}')")
	p99=$(to_ms "$(echo "$out" | awk '$1 == "99%" {print $2}')")
	echo "$rps $p50 $p99"
}

echo "warming up…" >&2
for u in "http://$up/v1/monitors/$monitor" "http://$plain/v1/monitors/$monitor"; do
	wrk -t"$THREADS" -c"$CONNS" -d"$WARMUP" "${ident[@]}" "$u" >/dev/null
done
wrk -t"$THREADS" -c"$CONNS" -d"$WARMUP" "${auth[@]}" "http://$gw/v1/monitors/$monitor" >/dev/null

# ---- CPU per request, per process ------------------------------------------------
# proc_ticks PID prints the CPU time of PID and of its reaped children (utime + stime +
# cutime + cstime, /proc/PID/stat fields 14-17) in clock ticks; 0 once it is gone.
# pg_ticks sums the postmaster and every backend and worker it runs.
CLK_TCK=$(getconf CLK_TCK)
pg_pid=$(head -n1 "$stack/pg/postmaster.pid")
redis_pid=$(cat "$stack/redis/redis.pid")
proc_ticks() {
	awk '{sub(/^.*\) /, ""); print $12 + $13 + $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0
}
pg_ticks() {
	local t=0 p
	for p in "$pg_pid" $(ps -o pid= --ppid "$pg_pid"); do t=$((t + $(proc_ticks "$p"))); done
	echo "$t"
}
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
	local rps p50 p99
	rps=$(echo "$out" | awk '/^Requests\/sec:/ {print $2}')
	p50=$(to_ms "$(echo "$out" | awk '$1 == "50%" {print $2}')")
	p99=$(to_ms "$(echo "$out" | awk '$1 == "99%" {print $2}')")
	echo "$rps $p50 $p99 $(cpu_per_request "$before" "$after" "$reqs")"
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
	local name=$1
	read -r rps p50 p99 c u p r _ <<<"$2"
	printf '    %-24s %8.0f %8.3f %8.3f %8.1f %8.1f %8.1f %8.1f\n' "$name" "$rps" "$p50" "$p99" "$c" "$u" "$p" "$r"
}
cpu_header() {
	printf '    %-24s %8s %8s %8s %8s %8s %8s %8s\n' "$1" req/s "p50 ms" "p99 ms" caddy upstream postgres redis
	printf '    %-24s %8s %8s %8s %8s %8s %8s %8s\n' "" "" "" "" "us/req" "us/req" "us/req" "us/req"
}

verdict() { if awk "BEGIN {exit !($1)}"; then echo met; else echo MISSED; fi; }

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

# ---- (m), (i), (u) and (o): two gateways, or two keys, in one Caddy ---------------------
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

# pair_run VAR TITLE PID LABEL_A URL_A KEY_A LABEL_B URL_B KEY_B [RATIO [CPU]] measures
# URL_A with key KEY_A and URL_B with KEY_B, both served by the Caddy PID, PAIR_ROUNDS
# times alternating, Caddy's, PostgreSQL's and Redis's CPU per request included, stops
# PID, and sets VAR to a report with the A/B throughput ratio (target: at least RATIO,
# 0.95) and Caddy's CPU per request A - B (target: at most CPU us, when given).
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
	local a_cmd=(measure_cpu ok "$url_a" "${auth_a[@]}") b_cmd=(measure_cpu ok "$url_b" "${auth_b[@]}")
	rotate_runs "$title" a b
	kill "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
	local a_rps a_p99 a_cpu a_pg a_rd b_rps b_p99 b_cpu b_pg b_rd ratio runs_a runs_b cpu_diff pg_diff rd_diff cpu_rounds cpu_verdict=""
	local ratio_rounds ratio_median cpu_median pg_rounds pg_median
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
	runs_a=$(rates "${a_runs[@]}") runs_b=$(rates "${b_runs[@]}")
	_report=$'\n\n'$(
		cat <<EOT
$title, mean of $PAIR_ROUNDS alternating runs      req/s      p99 ms  caddy us/req
    $(printf '%-34s %9.0f %11.3f %11.1f' "$label_a" "$a_rps" "$a_p99" "$a_cpu")
    $(printf '%-34s %9.0f %11.3f %11.1f' "$label_b" "$b_rps" "$b_p99" "$b_cpu")
    A/B throughput ratio               $ratio_median median of the rounds   (>= $want_ratio: $(verdict "$ratio_median >= $want_ratio")); $ratio of the means; rounds $ratio_rounds
    Caddy CPU A - B                    $cpu_median us/req median of the rounds$cpu_verdict; $cpu_diff of the means; rounds $cpu_rounds
    PostgreSQL CPU A - B               $pg_median us/req median of the rounds; $pg_diff of the means; rounds $pg_rounds
    Redis CPU A - B                    $rd_diff us/req
    runs (req/s): A $runs_a; B $runs_b; load average $load_start before the rounds, $(cut -d' ' -f1 /proc/loadavg) after
EOT
	)
}
# pair_caddy ADDR... starts a Caddy for pair_run on $stack/Caddyfile.pair, sets
# PAIR_PID, and waits until each ADDR answers.
pair_caddy() {
	local addr
	bin/caddy run --config "$stack/Caddyfile.pair" --adapter caddyfile >"$stack/caddy-pair.log" 2>&1 &
	PAIR_PID=$!
	pids+=($PAIR_PID)
	for addr in "$@"; do
		wait_http "http://$addr/v1/me" || { tail -n 20 "$stack/caddy-pair.log" >&2; exit 1; }
	done
}
# bench_pair VAR TITLE LABEL_A OPTION_A LABEL_B OPTION_B [RATIO [CPU]] runs one Caddy
# with two gateway sites that differ only in one option line (empty: none) and measures
# them with pair_run, the bench key on both. Both sites share one process, one
# PostgreSQL pool and one Redis client, so the only difference is the option's work.
#   (m) metrics on against disable_metrics: what the metrics bookkeeping costs.
#   (i) identity_key against gateway_secret alone: what signing X-Gateway-Identity
#       costs (the upstream checks the shared secret in both; verifying the assertion
#       is the upstream's cost, not the gateway's).
#   (u) the usage record on (the default) against usage off: what counting every
#       request and writing the counts every usage_flush_interval cost.
# BENCH_METRICS=0, BENCH_IDENTITY=0 and BENCH_USAGE=0 skip them; BENCH_ONLY=usage runs
# (u) alone, right after the setup, and replaces it in OUT.
metrics_site() { gateway_site "$@"; } # ADDR [OPTION]
bench_pair() {
	local var=$1 title=$2 label_a=$3 opt_a=$4 label_b=$5 opt_b=$6 a b
	a="127.0.0.1:$(bench_port)"
	b="127.0.0.1:$(bench_port)"
	{
		printf '{\n\tadmin off\n\tauto_https off\n\tpersist_config off\n}\n'
		metrics_site "$a" ${opt_a:+"$opt_a"}
		metrics_site "$b" ${opt_b:+"$opt_b"}
	} >"$stack/Caddyfile.pair"
	pair_caddy "$a" "$b"
	pair_run "$var" "$title" "$PAIR_PID" "$label_a" "http://$a/v1/monitors/$monitor" "$key" \
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
# capacity_tool builds integration/capacity's command as $stack/capacity, once.
capacity_tool() {
	[ -x "$stack/capacity" ] || go build -o "$stack/capacity" ./integration/capacity/cmd/capacity
}
# bench_usage sets usage_report: (u), the usage record on against usage off, and then
# PostgreSQL's side on its own (u1): integration/capacity writing and rolling up rows of
# the usage record and reading months, in a database of its own (keygate_usage).
bench_usage() {
	bench_pair usage_report "(u) usage record" "A: gateway, usage on (default)" "" "B: gateway, usage off" "usage off" 0.97 3
	echo "measuring (u1) the usage record on PostgreSQL…" >&2
	capacity_tool
	usage_report+=$'\n'"$("$stack/capacity" usage -label "(u1)" -orgs "${CAP_ORGS:-10000}" -sizes 1000,100000 -per-size 100000 \
		-database-url "$(sed -E 's#^([a-z]+://[^/]*)/[^?]*#\1/keygate_usage#' <<<"$DATABASE_URL")" | sed '/^$/d; s/^/    /')"
}
# bench_budgets sets budgets_report: (o), one gateway site and two keys, the bench key
# (its plan has no organisation budget: one count a request, as in (c)) and a key of
# another organisation whose plan has an organisation ceiling and a monthly quota, both
# too large to refuse anything here: what counting the key's minute, the org's minute
# and the org's month in one script call costs against the key's minute alone. Each
# key reads a monitor of its own organisation. BENCH_BUDGETS=0 skips it;
# BENCH_ONLY=budgets runs it alone, right after the setup, and replaces it in OUT.
bench_budgets() {
	local site policy budget_key budget_monitor budget_org
	bin/upstream plan put --name bench-budgets --api-rate-limit 1000000000 --max-monitors -1 --min-interval 10 \
		--locations us-east,us-west,eu-west,eu-central,ap-southeast --check-types http,tcp,dns,icmp \
		--org-rate-limit 100000000 --api-requests-per-month 1000000000000 >/dev/null
	budget_org=$(bin/upstream org create --name bench-budgets --plan bench-budgets | json_field id)
	bin/upstream member add --org "$budget_org" --email bench@example.com --role Owner >/dev/null
	budget_key=$(create_key "$budget_org" budgets Admin "$jar" "http://$gw")
	budget_monitor=$(curl -sf "http://$gw/v1/monitors" -H "Authorization: Bearer $budget_key" -H 'Content-Type: application/json' \
		-d '{"name":"bench","type":"http","target":"https://example.com","interval_seconds":60,"config":{"a":1}}' | json_field id)
	[ -n "$budget_monitor" ] || { echo "could not create the budgets monitor" >&2; exit 1; }
	site="127.0.0.1:$(bench_port)"
	{
		printf '{\n\tadmin off\n\tauto_https off\n\tpersist_config off\n}\n'
		metrics_site "$site"
	} >"$stack/Caddyfile.pair"
	pair_caddy "$site"
	# Whether this build counts the organisation's budgets: its answers then list the
	# "org" minute budget in RateLimit-Policy.
	policy=$(curl -sf -D - -o /dev/null -H "Authorization: Bearer $budget_key" "http://$site/v1/me" |
		awk 'tolower($1) == "ratelimit-policy:" {sub(/^[^:]*: */, ""); sub(/\r$/, ""); print}')
	pair_run budgets_report "(o) organisation budgets" "$PAIR_PID" \
		"A: key, org ceiling + month quota" "http://$site/v1/monitors/$budget_monitor" "$budget_key" \
		"B: key, the plan's minute only" "http://$site/v1/monitors/$monitor" "$key" 0.97
	budgets_report+=$'\n'"    A's RateLimit-Policy: $policy"
	case $policy in
	*'"org"'*) ;;
	*) budgets_report+=" (no org budget: this build counts A's key like B's)" ;;
	esac
	# Redis's side, on its own: integration/capacity's workers counting random keys the
	# plain way (the key's minute alone) and then through the org budgets (the key's
	# minute, the org's minute and month in one script call),
	# as capacity.sh's (s1) does.
	local tool="$stack/capacity" orgs=${CAP_ORGS:-10000} waiters=${BUDGETS_WAITERS:-1,4,16,64} part
	capacity_tool
	local common=(-keys "${CAP_KEYS:-1000000}" -procs "${CAP_PROCS:-4}" -warmup "${CAP_WARMUP:-2s}"
		-duration "${CAP_DURATION:-5s}" -waiters "$waiters" -redis-url "$REDIS_URL")
	for part in "(o1) counts on one Redis, the key's minute alone" "(o2) counts on one Redis, the org budgets"; do
		echo "measuring $part…" >&2
		local extra=()
		[[ $part != "(o2)"* ]] || extra=(-orgs "$orgs")
		budgets_report+=$'\n'"$("$tool" counts -label "${part%% *}" -title "${part#* }" "${common[@]}" "${extra[@]}" |
			sed '/^$/d; s/^/    /')"
	done
}
# bench_timing sets timing_report: (t), a key limited to 10.9.0.0/16 asked from
# loopback (refused with the one 401 after its lookup) against a revoked key (the same
# 401, its row filtered out by the lookup), TIMING_PAIRS (2000) interleaved pairs on
# the (c) gateway, one request at a time over one connection.
bench_timing() {
	local restricted revoked revoked_id
	restricted=$(curl -sf -b "$jar" -H 'Content-Type: application/json' \
		-d '{"name":"restricted","role":"Admin","allowed_cidrs":["10.9.0.0/16"]}' "http://$gw/orgs/$org/api-keys" | json_field key)
	revoked=$(create_key "$org" revoked Admin "$jar" "http://$gw")
	revoked_id=${revoked#mon_live_}
	revoked_id=${revoked_id%%.*}
	curl -sf -b "$jar" -X DELETE -o /dev/null "http://$gw/orgs/$org/api-keys/$revoked_id"
	[ -n "$restricted" ] && [ -n "$revoked" ] || { echo "could not create the timing keys" >&2; exit 1; }
	[ -x "$stack/timingpair" ] || go build -o "$stack/timingpair" ./internal/testkit/timingpair/cmd/timingpair
	echo "measuring (t) a refused restricted key against a revoked key…" >&2
	timing_report=$'

'"(t) nothing to time: GET /v1/me, a refused restricted key against a revoked key"
	timing_report+=$'
'"$("$stack/timingpair" -url "http://$gw/v1/me" -pairs "${TIMING_PAIRS:-2000}" \
		-a "$restricted" -a-name "restricted key, wrong address" -b "$revoked" -b-name "revoked key")"
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
		{
			[ ! -s "$OUT" ] || echo
			cat "$OUT.block"
		} >>"$OUT"
	fi
	rm -f "$OUT.block"
	echo "(written to $OUT)"
}
# bench_scopes sets scopes_report: (s), one gateway site and two keys of the bench's
# organisation, one with two scopes and one without, each reading the bench's monitor:
# what matching the route and checking the key's scopes cost; and (s2), the bench key on
# two sites, one with a table of 20 route lines and one with the built-in table: what
# matching every request against 20 rules costs. BENCH_SCOPES=0 skips them;
# BENCH_ONLY=scopes runs them alone, right after the setup, and replaces them in OUT.
bench_scopes() {
	local site scoped_key rules="" i table_report
	scoped_key=$(create_key "$org" scoped Admin "$jar" "http://$gw" '"scopes":["monitors:read","monitors:write"]')
	[ -n "$scoped_key" ] || { echo "could not create the scoped key" >&2; exit 1; }
	site="127.0.0.1:$(bench_port)"
	{
		printf '{\n\tadmin off\n\tauto_https off\n\tpersist_config off\n}\n'
		metrics_site "$site"
	} >"$stack/Caddyfile.pair"
	pair_caddy "$site"
	pair_run scopes_report "(s) scopes" "$PAIR_PID" \
		"A: key with scopes" "http://$site/v1/monitors/$monitor" "$scoped_key" \
		"B: key without" "http://$site/v1/monitors/$monitor" "$key" 0.97
	module_cpu scopes_report "(s) scopes" proxied_scoped proxied 2
	for i in $(seq 0 18); do
		rules+="route GET,POST /v1/service$i/* scope s:read cost $((1 + i % 3))"$'\n\t\t\t'
	done
	rules+="route GET,HEAD /v1/monitors/* scope monitors:read"
	bench_pair table_report "(s2) route table" "A: gateway, 20 route lines" "$rules" \
		"B: gateway, the built-in table" "" 0.97
	module_cpu table_report "(s2) route table" proxied_20_rules proxied 2
	# One paragraph with (s), which BENCH_ONLY=scopes replaces whole.
	scopes_report+=$'\n'"${table_report#$'\n\n'}"
}
# bench_standby sets standby_report: (sb), the bench key on two gateway sites of one
# Caddy, one with database_read_urls on the bench stack's fast standby (started here
# unless it runs) and one with every lookup on the primary. The standby runs on the same
# machine, so its CPU competes with the gateway's; the primary's CPU per request
# (PostgreSQL CPU A - B) shows what leaves the primary.
bench_standby() {
	local standby
	# The bench's own stack, never a standby the caller's environment names: it must
	# stream from this PostgreSQL.
	scripts/stack.sh up-standbys "$stack" >/dev/null
	standby=$(. "$stack/env" && echo "$DATABASE_STANDBY_FAST_URL")
	# A standby just made still replays what the setup wrote: the rounds start once it
	# has caught up, after a longer warm-up (STANDBY_WARMUP, 10s) than the other pairs'.
	wait_replayed "$standby"
	# Its rounds spread from 0.75 to 1.20 on this kind of machine, against a target of
	# 0.97: it runs STANDBY_ROUNDS (10) of them.
	WARMUP=${STANDBY_WARMUP:-10s} PAIR_ROUNDS=${STANDBY_ROUNDS:-10} bench_pair standby_report "(sb) lookups on a standby" "A: gateway, database_read_urls" \
		"database_read_urls $standby" "B: gateway, lookups on the primary" "" 0.97
	# Running, the standbys would replay every later write of the bench on the same two
	# cores: the usage record's, (mk)'s million keys. Stopped, their replication slots
	# would make the primary keep all that WAL. So it removes them; the capacity
	# section's (pr) makes new ones.
	scripts/stack.sh down-standbys "$stack"
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
# key does. Both gateway runs send their keys through one wrk Lua script, so that wrk
# costs the same in both; each of its threads takes the keys of its file in turn (round
# robin), from a start of its own. The 1,000,000 keys stay: later runs look keys up in
# the larger table.
bench_manykeys() {
	local rows=1000000 n=2000 every=500 seeded moved
	capacity_tool
	echo "seeding $rows keys for (mk)…" >&2
	seeded=$("$stack/capacity" seed -database-url "$DATABASE_URL" -keys "$rows" -orgs 10000)
	moved=$("$(cat "$stack/pg.bindir")/psql" "$DATABASE_URL" -qAt -v ON_ERROR_STOP=1 <<-SQL
		UPDATE api_keys SET org_id = '$org' WHERE key_id IN
			(SELECT 'capacity' || lpad(i::text, 14, '0') FROM generate_series(0, $(((n - 1) * every)), $every) AS i);
		VACUUM ANALYZE api_keys;
		SELECT count(*) FROM api_keys WHERE org_id = '$org' AND key_id LIKE 'capacity%';
	SQL
	)
	[ "$moved" = "$n" ] || { echo "bench: (mk) moved $moved keys to the bench org, not $n" >&2; exit 1; }
	"$stack/capacity" keys -count "$n" -every "$every" >"$stack/manykeys.txt"
	echo "$key" >"$stack/onekey.txt"
	# keys_script FILE prints the Lua script that sends FILE's keys.
	keys_script() {
		sed "s#@FILE@#$1#" <<-'EOF'
		-- Each request carries the next key of @FILE@, in turn. setup numbers the
		-- threads; thread t starts at key t * 997, so that the threads are not in step.
		local threads = 0
		function setup(thread)
			threads = threads + 1
			thread:set("number", threads)
		end
		function init()
			reqs = {}
			for line in io.lines("@FILE@") do
				reqs[#reqs + 1] = wrk.format(nil, nil, {["Authorization"] = "Bearer " .. line})
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
	local code url="http://$gw/v1/monitors/$monitor"
	code=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $(tail -n1 "$stack/manykeys.txt")" "$url")
	[ "$code" = 200 ] || { echo "bench: (mk) the last of the 2,000 keys answered $code, not 200" >&2; exit 1; }
	local mkp_cmd=(with_batches measure_cpu ok "http://$plain/v1/monitors/$monitor" "${ident[@]}")
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
	manykeys_report+=$'\n'"    of three runs, their order rotating; wrk -t$THREADS -c$CONNS -d$DURATION, one Lua script for both gateway runs (round robin per thread)"
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
usage_report="" budgets_report="" scopes_report="" timing_report="" standby_report="" manykeys_report=""
case ${BENCH_ONLY:-} in
timing)
	bench_timing
	only_run timing_report "(t) nothing to time"
	exit 0
	;;
usage)
	bench_usage
	only_run usage_report "(u) usage record"
	exit 0
	;;
budgets)
	bench_budgets
	only_run budgets_report "(o) organisation budgets"
	exit 0
	;;
scopes)
	bench_scopes
	only_run scopes_report "(s) scopes"
	exit 0
	;;
standby)
	bench_standby
	only_run standby_report "(sb) lookups on a standby"
	exit 0
	;;
manykeys)
	bench_manykeys
	only_run manykeys_report "(mk) many keys"
	exit 0
	;;
esac

if [ "${BENCH_ONLY:-}" = capacity ]; then
	source scripts/capacity.sh
	capacity_main replace
	exit 0
fi

echo "measuring (a) upstream alone…" >&2
a_run=$(measure_cpu ok "http://$up/v1/monitors/$monitor" "${ident[@]}")
read -r a_rps a_p50 a_p99 _ <<<"$a_run"
b_runs=() c_runs=() cl_runs=() e401_runs=() e429_runs=() rounds_report=""
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
# ---- (r) CPU per request at an equal rate (informational) ---------------------------
# At full load the gateway serves fewer requests a second than plain Caddy, and on 2
# cores every process spends more CPU per request at a lower rate (fewer events per
# wake-up, more scheduler and futex time per request): the upstream, whose work is the
# same behind either, shows it. So part of the module overhead above is a throughput
# effect, not the module's code. bench_matched runs (c) and (b) again, ROUNDS times
# alternating, at one fixed rate both reach (MATCHED_RATE, or MATCHED_SHARE (0.6) of
# the median (c) rate of the rounds, rounded to 50: hey, a Go client, costs more CPU a
# request than wrk, so 80% was often out of the gateway's reach) through hey's rate
# limit, measures the same CPU per request and sets matched_report. BENCH_MATCHED=0
# skips it.

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
matched_report=""
[ "${BENCH_MATCHED:-1}" = 1 ] && bench_matched
# ---- end of (r) ----------------------------------------------------------------------
echo "measuring (c0) gateway without batching or pipelining…" >&2
read -r c0_rps c0_p50 c0_p99 < <(measure "http://$unbatched/v1/monitors/$monitor" "${auth[@]}")
echo "measuring (d) /v1/me…" >&2
read -r d_rps d_p50 d_p99 < <(measure "http://$gw/v1/me" "${auth[@]}")

# medians LINE... prints the median of each of the 7 fields of measure_cpu's lines.
medians() {
	local f out=""
	for f in 1 2 3 4 5 6 7; do out+="$(median "$f" "$@") "; done
	echo "$out"
}
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
linger_report=""
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
ratio=$(median 1 "${ratios[@]}") ratio_spread=$(spread "${ratios[@]}")
p99_extra=$(median 1 "${p99_extras[@]}")
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
# ---- end of CPU per request -----------------------------------------------------------
cpu_report+=$matched_report

# ---- (m), (i), (u) and (o), measured with pair_run (above) -------------------------
metrics_report="" identity_report=""
if [ "${BENCH_METRICS:-1}" = 1 ]; then
	bench_pair metrics_report "(m) metrics" "A: gateway, metrics on" "" "B: gateway, disable_metrics" disable_metrics
fi
if [ "${BENCH_IDENTITY:-1}" = 1 ]; then
	openssl genpkey -algorithm ed25519 -out "$stack/identity.pem"
	bench_pair identity_report "(i) signed identity" "A: gateway, identity_key" "identity_key $stack/identity.pem" \
		"B: gateway, gateway_secret alone" ""
fi
if [ "${BENCH_STANDBY:-1}" = 1 ]; then bench_standby; fi
if [ "${BENCH_USAGE:-1}" = 1 ]; then bench_usage; fi
if [ "${BENCH_BUDGETS:-1}" = 1 ]; then bench_budgets; fi
if [ "${BENCH_SCOPES:-1}" = 1 ]; then bench_scopes; fi
if [ "${BENCH_TIMING:-1}" = 1 ]; then bench_timing; fi
# Last of them: it leaves 1,000,000 keys in the database.
if [ "${BENCH_MANYKEYS:-1}" = 1 ]; then bench_manykeys; fi
# ---- end of (m), (i), (u) and (o) -----------------------------------------------------

# (e) The 50 MB list, on a Caddy of its own so that its peak RSS is the filter's alone.
echo "measuring (e) 50 MB list through the filter…" >&2
bin/caddy run --config "$stack/Caddyfile.big" --adapter caddyfile >"$stack/caddy-big.log" 2>&1 &
big_pid=$!
pids+=($big_pid)
wait_http "http://$big/" || { tail -n 20 "$stack/caddy-big.log" >&2; exit 1; }
curl -sf -o /dev/null "${auth[@]}" "http://$big/v1/me"
rss_before=$(awk '/^VmRSS:/ {print $2}' "/proc/$big_pid/status")
size_in=$(stat -c %s "$stack/www/v1/big.json")
size_out=$(curl -sf "${auth[@]}" -o "$stack/big.out" -w '%{size_download}' "http://$big/v1/big.json")
for _ in 1 2; do curl -sf -o /dev/null "${auth[@]}" "http://$big/v1/big.json"; done
rss_peak=$(awk '/^VmHWM:/ {print $2}' "/proc/$big_pid/status")
rss_growth_mb=$(awk -v a="$rss_before" -v b="$rss_peak" 'BEGIN {printf "%.1f", (b - a) / 1024}')
leaked=$(grep -c -E '"(config|assertions|org_id|config_version|paused_reason)"' "$stack/big.out" || true)

# ---- (f) fault run: slow and hung dependencies ------------------------------------
# fault_run sets f_open_before, f_open_hung, f_local_before, f_local_hung (req/s) and
# f_pg_503 (503s a second while PostgreSQL hangs). It runs its own Caddy, with the
# gateways reaching Redis and PostgreSQL through latency proxies it hangs (SIGUSR1)
# and resumes (SIGUSR2).
fault_run() {
	local fd=${FAULT_DURATION:-5s} rproxy pproxy rpid ppid fpid
	go build -o "$stack/latencyproxy" ./internal/testkit/latencyproxy/cmd/latencyproxy
	local redis_hp=${REDIS_URL#redis://}
	redis_hp=${redis_hp%%/*}
	redis_hp=${redis_hp##*@}
	local pg_hp=${DATABASE_URL#postgres://}
	pg_hp=${pg_hp#*@}
	pg_hp=${pg_hp%%/*}
	"$stack/latencyproxy" -target "$redis_hp" -listen-file "$stack/rproxy.addr" &
	rpid=$!
	pids+=($rpid)
	"$stack/latencyproxy" -target "$pg_hp" -listen-file "$stack/pproxy.addr" &
	ppid=$!
	pids+=($ppid)
	for _ in $(seq 50); do [ -s "$stack/rproxy.addr" ] && [ -s "$stack/pproxy.addr" ] && break; sleep 0.1; done
	rproxy=$(cat "$stack/rproxy.addr")
	pproxy=$(cat "$stack/pproxy.addr")
	local f_open="127.0.0.1:$(bench_port)" f_local="127.0.0.1:$(bench_port)" f_pg="127.0.0.1:$(bench_port)"
	local redis_via=${REDIS_URL/$redis_hp/$rproxy} pg_via=${DATABASE_URL/$pg_hp/$pproxy}
	local site name db redis policy
	{
		printf '{\n\tadmin off\n\tauto_https off\n\tpersist_config off\n}\n'
		for site in "$f_open open" "$f_local local" "$f_pg open"; do
			read -r name policy <<<"$site"
			db='{env.DATABASE_URL}' redis=$redis_via
			if [ "$name" = "$f_pg" ]; then db=$pg_via redis='{env.REDIS_URL}'; fi
			SITE_DB=$db SITE_REDIS=$redis gateway_site "$name" "limiter_failure $policy"
		done
	} >"$stack/Caddyfile.fault"
	bin/caddy run --config "$stack/Caddyfile.fault" --adapter caddyfile >"$stack/caddy-fault.log" 2>&1 &
	fpid=$!
	pids+=($fpid)
	for addr in "$f_open" "$f_local" "$f_pg"; do
		wait_http "http://$addr/" || { tail -n 20 "$stack/caddy-fault.log" >&2; exit 1; }
	done
	# rate URL prints requests a second, whatever their status.
	rate() {
		wrk -t"$THREADS" -c"$CONNS" -d"$fd" "${auth[@]}" "$1" | awk '/^Requests\/sec:/ {print $2}'
	}
	local mon="/v1/monitors/$monitor" code
	echo "measuring (f) fault run: before the hang…" >&2
	wrk -t"$THREADS" -c"$CONNS" -d"$WARMUP" "${auth[@]}" "http://$f_open$mon" >/dev/null
	wrk -t"$THREADS" -c"$CONNS" -d"$WARMUP" "${auth[@]}" "http://$f_local$mon" >/dev/null
	f_open_before=$(rate "http://$f_open$mon")
	f_local_before=$(rate "http://$f_local$mon")
	echo "measuring (f) fault run: Redis hung…" >&2
	kill -USR1 "$rpid"
	f_open_hung=$(rate "http://$f_open$mon")
	f_local_hung=$(rate "http://$f_local$mon")
	kill -USR2 "$rpid"
	echo "measuring (f) fault run: PostgreSQL hung…" >&2
	curl -sf -o /dev/null "${auth[@]}" "http://$f_pg/v1/me"
	kill -USR1 "$ppid"
	code=$(curl -s -o /dev/null -w '%{http_code}' "${auth[@]}" "http://$f_pg/v1/me")
	[ "$code" = 503 ] || echo "bench: expected 503 with PostgreSQL hung, got $code" >&2
	f_pg_503=$(rate "http://$f_pg/v1/me")
	kill -USR2 "$ppid"
	kill "$fpid" 2>/dev/null || true
}
fault_run
f_open_share=$(awk -v h="$f_open_hung" -v b="$f_open_before" 'BEGIN {printf "%.3f", h / b}')
f_local_share=$(awk -v h="$f_local_hung" -v b="$f_local_before" 'BEGIN {printf "%.3f", h / b}')
# ---- end of (f) -----------------------------------------------------------------------


report=$(
	cat <<EOF
keygate benchmark, $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)
machine: $(nproc) cores; wrk -t$THREADS -c$CONNS -d$DURATION after ${WARMUP} warm-up; (b) and (c) median of $ROUNDS alternating runs

                                   req/s      p50 ms    p99 ms
(a) upstream alone              $(printf '%9.0f %11.3f %9.3f' "$a_rps" "$a_p50" "$a_p99")
(b) caddy plain reverse_proxy   $(printf '%9.0f %11.3f %9.3f' "$b_rps" "$b_p50" "$b_p99")
(c) gateway (PG + Redis each)   $(printf '%9.0f %11.3f %9.3f' "$c_rps" "$c_p50" "$c_p99")
(c0) (c) without batching or
     pipelining (informational) $(printf '%9.0f %11.3f %9.3f' "$c0_rps" "$c0_p50" "$c0_p99")
(d) gateway GET /v1/me          $(printf '%9.0f %11.3f %9.3f' "$d_rps" "$d_p50" "$d_p99")

$cpu_report

(e) 50 MB list through the filter: $size_in bytes in, $size_out out, hidden fields left: $leaked;
    Caddy RSS ${rss_before} kB before, peak ${rss_peak} kB: growth ${rss_growth_mb} MB

(f) fault run (wrk -c$CONNS -d${FAULT_DURATION:-5s} each; a hang = no byte forwarded):
    limiter_failure open:  $(printf '%7.0f' "$f_open_before") req/s before, $(printf '%7.0f' "$f_open_hung") while Redis hangs: share $f_open_share
    limiter_failure local: $(printf '%7.0f' "$f_local_before") req/s before, $(printf '%7.0f' "$f_local_hung") while Redis hangs: share $f_local_share
    PostgreSQL hung:       $(printf '%7.0f' "$f_pg_503") 503s/s

targets:
  (c)/(b) throughput ratio  $ratio   (median; >= 0.85: $(verdict "$ratio >= 0.85"))
  p99 (c) - p99 (b)         ${p99_extra} ms   (median; <= 2 ms: $(verdict "$p99_extra <= 2"))
  module CPU overhead       ${overhead} µs/req   (median; <= 30: $(verdict "$overhead <= 30"))
  401 and 429 vs plain 200  $(median 1 "${e401_runs[@]}" | awk '{printf "%.0f", $1}') and $(median 1 "${e429_runs[@]}" | awk '{printf "%.0f", $1}') req/s vs $(printf '%.0f' "$b_rps")   (at least as fast: $(verdict "$(median 1 "${e401_runs[@]}") >= $b_rps && $(median 1 "${e429_runs[@]}") >= $b_rps"))
  RSS growth, 50 MB list    ${rss_growth_mb} MB  (< 32 MB: $(verdict "$rss_growth_mb < 32 && $leaked == 0"))
  Redis hung, open          $f_open_share   (>= 0.5: $(verdict "$f_open_share >= 0.5"))
  Redis hung, local         $f_local_share   (>= 0.5: $(verdict "$f_local_share >= 0.5"))
  PostgreSQL hung, 503s/s   $(printf '%.0f' "$f_pg_503")   (>= 100: $(verdict "$f_pg_503 >= 100"))
EOF
)
report+=$metrics_report$identity_report$standby_report$usage_report$budgets_report$scopes_report$timing_report$manykeys_report
echo "$report"
echo "$report" >"$OUT"
echo "(written to $OUT)"

# ---- (k) Redis Cluster beside the single Redis ------------------------------------
# bench_cluster starts a 3-master Redis Cluster (stack.sh up-cluster) and two Caddys of
# the (m) site (metrics_site), one whose REDIS_URL is the stack's single Redis and one
# whose REDIS_URL is the Cluster (redis_mode cluster), and measures GET
# /v1/monitors/{id} and GET /v1/me on both, ROUNDS times alternating which goes first.
# It prints the cluster/single ratios and appends them to OUT. BENCH_CLUSTER=0 skips it.
bench_cluster() {
	scripts/stack.sh up-cluster "$stack" >/dev/null
	local cluster_url single cluster spid cpid addr round path
	cluster_url=$(. "$stack/env" && echo "$REDIS_CLUSTER_URL")
	single="127.0.0.1:$(bench_port)"
	cluster="127.0.0.1:$(bench_port)"
	{
		printf '{\n\tadmin off\n\tauto_https off\n\tpersist_config off\n}\n'
		metrics_site "$single"
	} >"$stack/Caddyfile.single"
	{
		printf '{\n\tadmin off\n\tauto_https off\n\tpersist_config off\n}\n'
		metrics_site "$cluster" "redis_mode cluster"
	} >"$stack/Caddyfile.cluster"
	bin/caddy run --config "$stack/Caddyfile.single" --adapter caddyfile >"$stack/caddy-single.log" 2>&1 &
	spid=$!
	pids+=($spid)
	REDIS_URL=$cluster_url bin/caddy run --config "$stack/Caddyfile.cluster" --adapter caddyfile \
		>"$stack/caddy-cluster.log" 2>&1 &
	cpid=$!
	pids+=($cpid)
	for addr in "$single" "$cluster"; do
		wait_http "http://$addr/v1/me" || { tail -n 20 "$stack"/caddy-single.log "$stack"/caddy-cluster.log >&2; exit 1; }
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
if [ "${BENCH_CLUSTER:-1}" = 1 ]; then bench_cluster; fi
# ---- end of (k) -----------------------------------------------------------------------

if [ "${BENCH_CAPACITY:-1}" = 1 ]; then
	source scripts/capacity.sh
	capacity_main append
fi
