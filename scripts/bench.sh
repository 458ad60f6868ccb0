#!/usr/bin/env bash
# bench.sh is `make bench`: it starts a throwaway stack and measures, in one run and
# under the same load (wrk, CONNS connections, DURATION each, after a warm-up), the
# gateway against a plain reverse proxy and what each of its features costs. It prints
# the report and writes it to OUT (scripts/bench-results.txt).
#
# Each section is a file of scripts/bench/, sourced below, which defines its functions
# and runs nothing when sourced; the end of this file runs them in order.
#
# A section NAME of the list `sections` below is the function bench_NAME, which sets
# NAME_report (its paragraph of the report); BENCH_NAME=0 skips it. One that sets
# paragraph[NAME] (the start of its paragraph) runs alone with BENCH_ONLY=NAME, right
# after the setup, and replaces its paragraph in OUT (only_run); (fs) needs no setup.
#
# Environment: CONNS (32), THREADS (2), DURATION (10s), WARMUP (3s), ROUNDS (3),
# PAIR_ROUNDS (6: the rounds of each pair, (m), (i), (u) and (o)), OUT,
# FAULT_DURATION (5s, each run of (f)), BENCH_LINGER ((cL)'s batch_linger, 2ms; off skips
# (cL)), BENCH_MATCHED (1; 0 skips (r)), MATCHED_RATE
# ((r)'s rate in requests a second) or MATCHED_SHARE (0.6: of the median (c) rate),
# MATCHED_CONNS (CONNS: hey's workers in (r)), BENCH_METRICS, BENCH_IDENTITY, BENCH_USAGE,
# BENCH_BUDGETS, BENCH_SCOPES, BENCH_WINDOWS, BENCH_TRACING, BENCH_TIMING, BENCH_FIELDSTRIP
# and BENCH_CLUSTER (1; 0 skips (m), (i), (u), (o), (s), (w), (tr), (t), (fs) or (k));
# BENCH_STANDBY (1; 0 skips (sb)),
# STANDBY_WARMUP ((sb)'s warm-up, 10s), STANDBY_ROUNDS ((sb)'s rounds, 10);
# BENCH_MANYKEYS (1; 0 skips (mk)); BUDGETS_WAITERS ((o1) and (o2), 1,4,16,64);
# MODULE_RUNS ((s), (s2), (w) and (tr) in process, 8); TIMING_PAIRS ((t), 2000); FIELDSTRIP_RUNS
# ((fs), 5); LANES (the (c) gateway's lookup_lanes, 1); BENCH_CAPACITY (1; 0 skips the
# capacity section) and BENCH_ONLY above, the capacity section's own CAP_* in
# scripts/bench/capacity.sh.
# PROFILE=DIR also writes DIR/gateway.cpu.pprof (Caddy's pprof, through its admin
# endpoint, during one more (c) run after the rounds), DIR/top.txt (CPU by process
# meanwhile) and DIR/run.txt (that run's figures, as in the CPU table); and, with (mk),
# DIR/manykeys.cpu.pprof, DIR/manykeys.top.txt and DIR/manykeys.run.txt, the same for
# one more run of the 2,000 keys, and DIR/onekey.* for one more run of the one key.
set -euo pipefail
cd "$(dirname "$0")/.."
# paragraph[NAME] is the first words of section NAME's paragraph, set by its file.
declare -A paragraph=()
# shellcheck source-path=SCRIPTDIR/..
source scripts/lib.sh
source scripts/bench/lib.sh        # what the sections share: wrk runs with CPU by process,
#                                    the statistics of rounds, table rows, only_run
source scripts/bench/setup.sh      # the stack, the upstream, the main Caddy, the bench's key
source scripts/bench/core.sh       # (a) (b) (c) (c401) (c429) (c0) (cL) (d): the gateway
#                                    against plain Caddy, CPU per request by process
source scripts/bench/matched.sh    # (r) (c) and (b) again at one equal rate
source scripts/bench/pair.sh       # pairs: two sites or two keys on a Caddy of their own,
#                                    PAIR_ROUNDS rounds alternating; how to add one
source scripts/bench/metrics.sh    # (m) metrics on against disable_metrics
source scripts/bench/identity.sh   # (i) identity_key against gateway_secret alone
source scripts/bench/standby.sh    # (sb) lookups on a standby against the primary
source scripts/bench/usage.sh      # (u) the usage record on against off; (u1)
source scripts/bench/budgets.sh    # (o) organisation budgets; (o1) (o2)
source scripts/bench/scopes.sh     # (s) scopes; (s2) a route table
source scripts/bench/windows.sh    # (w) a key's second, minute and day against its minute
source scripts/bench/tracing.sh    # (tr) tracing at full sampling against none
source scripts/bench/timing.sh     # (t) nothing to time: restricted against revoked key
source scripts/bench/manykeys.sh   # (mk) 2,000 keys among 1,000,000 rows
source scripts/bench/fieldstrip.sh # (fs) the field stripper's Go benchmark, in process
source scripts/bench/biglist.sh    # (e) a 50 MB list through the filter: Caddy's RSS
source scripts/bench/fault.sh      # (f) while Redis or PostgreSQL hangs
source scripts/bench/report.sh     # the report: core, (e), (f), targets, the sections
source scripts/bench/cluster.sh    # (k) a 3-master Redis Cluster (appended to OUT)
source scripts/bench/capacity.sh   # each shared dependency on its own (appended to OUT)

# The sections after the core, in the order they run and report.
sections=(metrics identity standby usage budgets scopes windows tracing timing manykeys fieldstrip)

CONNS=${CONNS:-32}
THREADS=${THREADS:-2}
DURATION=${DURATION:-10s}
WARMUP=${WARMUP:-3s}
ROUNDS=${ROUNDS:-3}
PAIR_ROUNDS=${PAIR_ROUNDS:-6}
OUT=${OUT:-scripts/bench-results.txt}
bench_start_load=$(cut -d' ' -f1-3 /proc/loadavg)
need_tools wrk curl openssl
if [ -n "${BENCH_ONLY:-}" ] && [ "$BENCH_ONLY" != capacity ] && [ -z "${paragraph[$BENCH_ONLY]:-}" ]; then
	alone=capacity
	for name in "${sections[@]}"; do [ -z "${paragraph[$name]:-}" ] || alone+=", $name"; done
	echo "bench: BENCH_ONLY=$BENCH_ONLY: only ${alone%, *} or ${alone##*, } runs alone" >&2
	exit 1
fi
if [ "${BENCH_MATCHED:-1}" = 1 ]; then need_tools hey; fi

stack=$(mktemp -d "${TMPDIR:-/tmp}/keygate-bench.XXXXXX")
pids=()
trap 'stop_stack "$stack"' EXIT
for name in "${sections[@]}"; do printf -v "${name}_report" '%s' ""; done

case ${BENCH_ONLY:-} in
"") ;;
fieldstrip)
	bench_fieldstrip
	only_run fieldstrip_report "${paragraph[fieldstrip]}"
	exit 0
	;;
esac

bench_setup

case ${BENCH_ONLY:-} in
"") ;;
capacity)
	capacity_main replace
	exit 0
	;;
*)
	"bench_$BENCH_ONLY"
	only_run "${BENCH_ONLY}_report" "${paragraph[$BENCH_ONLY]}"
	exit 0
	;;
esac

matched_report=""
bench_core
if [ "${BENCH_MATCHED:-1}" = 1 ]; then bench_matched; fi
bench_core_summary
for name in "${sections[@]}"; do
	knob=BENCH_${name^^}
	if [ "${!knob:-1}" = 1 ]; then "bench_$name"; fi
done
bench_biglist
bench_fault
bench_report "${sections[@]}"
if [ "${BENCH_CLUSTER:-1}" = 1 ]; then bench_cluster; fi
if [ "${BENCH_CAPACITY:-1}" = 1 ]; then capacity_main append; fi
