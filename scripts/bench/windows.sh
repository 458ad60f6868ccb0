# shellcheck shell=bash
# bench/windows.sh: (w), the cost of a key's windows: one gateway site and two keys of
# the bench's organisation (pair_run, pair.sh), one with its own second's and day's
# limits beside its minute (too large to refuse anything here) and the bench key, with
# its minute alone, each reading the bench's monitor: what counting three windows in
# the one script call costs against one. With the module's CPU per request measured in
# process beside it (module_cpu, MODULE_RUNS). BENCH_WINDOWS=0 skips it,
# BENCH_ONLY=windows runs it alone and replaces it in OUT.
paragraph[windows]="(w) windows"

bench_windows() {
	local windowed_key
	windowed_key=$(create_key "$org" windowed Admin "$jar" "http://$gw" '"rate_limit_per_second":1000000000,"rate_limit_per_day":2000000000')
	[ -n "$windowed_key" ] || { echo "could not create the windowed key" >&2; exit 1; }
	pair_site
	pair_run windows_report "(w) windows" "$CADDY_PID" \
		"A: key, second + minute + day" "http://$PAIR_SITE/v1/monitors/$monitor" "$windowed_key" \
		"B: key, the minute alone" "http://$PAIR_SITE/v1/monitors/$monitor" "$key" 0.97
	module_cpu windows_report "(w) windows" proxied_windows proxied 2
}
