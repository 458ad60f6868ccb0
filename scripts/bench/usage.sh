# shellcheck shell=bash
# bench/usage.sh: (u), the cost of the usage record: the gateway with it on (the
# default) and with usage off, a pair of sites (bench_pair, pair.sh): what counting
# every request and writing the counts every usage_flush_interval cost; then (u1)
# PostgreSQL's side on its own: integration/capacity writing and rolling up rows of the
# usage record and reading months, in a database of its own (keygate_usage), as CPU per
# row and per month read. BENCH_USAGE=0 skips it, BENCH_ONLY=usage runs it alone and
# replaces it in OUT.
paragraph[usage]="(u) usage record"

bench_usage() {
	bench_pair usage_report "(u) usage record" "A: gateway, usage on (default)" "" "B: gateway, usage off" "usage off" 0.97 3
	echo "measuring (u1) the usage record on PostgreSQL…" >&2
	capacity_tool
	usage_report+=$'\n'"$("$stack/capacity" usage -label "(u1)" -orgs "${CAP_ORGS:-10000}" -sizes 1000,100000 -per-size 100000 \
		-database-url "$(with_database "$DATABASE_URL" keygate_usage)" | sed '/^$/d; s/^/    /')"
}
