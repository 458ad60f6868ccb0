# shellcheck shell=bash
# bench/metrics.sh: (m), the cost of metrics: the gateway with and without
# disable_metrics, a pair of sites (bench_pair, pair.sh): what the metrics bookkeeping
# costs. BENCH_METRICS=0 skips it. The simplest pair: a new one starts from a copy.
bench_metrics() {
	bench_pair metrics_report "(m) metrics" "A: gateway, metrics on" "" "B: gateway, disable_metrics" disable_metrics
}
