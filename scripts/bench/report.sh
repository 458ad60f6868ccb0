# shellcheck shell=bash
# bench/report.sh: the report of a whole `make bench`. bench_report NAME... prints the
# core's tables (core.sh, with (r) from matched.sh), (e), (f) and the targets, met or
# missed, then the paragraph of each section NAME (NAME_report, in the order given), and
# writes it all to OUT. (k) and the capacity section append to OUT afterwards.
bench_report() {
	local report name
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
	for name in "$@"; do
		local -n _section=${name}_report
		report+=$_section
		unset -n _section
	done
	echo "$report"
	echo "$report" >"$OUT"
	echo "(written to $OUT)"
}
