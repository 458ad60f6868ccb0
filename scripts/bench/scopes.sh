# shellcheck shell=bash
# bench/scopes.sh: (s), the cost of scopes: one gateway site and two keys of the bench's
# organisation (pair_run, pair.sh), one with two scopes and one without, each reading
# the bench's monitor: what matching the route and checking the key's scopes cost; and
# (s2), the cost of a route table: the bench key on two sites (bench_pair), one with a
# table of 20 route lines (costs above 1 among them, so every request is matched, the
# last rule the bench's route) and one with the built-in table. Each with the module's
# CPU per request measured in process beside it (module_cpu, MODULE_RUNS).
# BENCH_SCOPES=0 skips both, BENCH_ONLY=scopes runs both alone and replaces them in OUT.
paragraph[scopes]="(s) scopes"

bench_scopes() {
	local scoped_key rules="" i table_report
	scoped_key=$(create_key "$org" scoped Admin "$jar" "http://$gw" '"scopes":["monitors:read","monitors:write"]')
	[ -n "$scoped_key" ] || { echo "could not create the scoped key" >&2; exit 1; }
	pair_site
	pair_run scopes_report "(s) scopes" "$CADDY_PID" \
		"A: key with scopes" "http://$PAIR_SITE/v1/monitors/$monitor" "$scoped_key" \
		"B: key without" "http://$PAIR_SITE/v1/monitors/$monitor" "$key" 0.97
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
