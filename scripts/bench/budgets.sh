# shellcheck shell=bash
# bench/budgets.sh: (o), the cost of organisation budgets: one gateway site and two keys
# (pair_run, pair.sh), the bench key (its plan has no organisation budget: one count a
# request, as in (c)) against a key of another organisation whose plan has an
# organisation ceiling and a monthly quota, both too large to refuse anything here: what
# counting the key's minute, the org's minute and the org's month in one script call
# costs against the key's minute alone. Each key reads a monitor of its own
# organisation. Then Redis's CPU per count, (o1) the key's minute alone against (o2) the
# budgets' script, at BUDGETS_WAITERS (1,4,16,64) goroutines per process
# (integration/capacity, with capacity.sh's CAP_KEYS, CAP_ORGS, CAP_PROCS, CAP_WARMUP,
# CAP_DURATION). BENCH_BUDGETS=0 skips it, BENCH_ONLY=budgets runs it alone and replaces
# it in OUT.
paragraph[budgets]="(o) organisation budgets"

bench_budgets() {
	local policy budget_key budget_monitor budget_org
	bin/upstream plan put --name bench-budgets --api-rate-limit 1000000000 --max-monitors -1 --min-interval 10 \
		--locations us-east,us-west,eu-west,eu-central,ap-southeast --check-types http,tcp,dns,icmp \
		--org-rate-limit 100000000 --api-requests-per-month 1000000000000 >/dev/null
	budget_org=$(bin/upstream org create --name bench-budgets --plan bench-budgets | json_field id)
	bin/upstream member add --org "$budget_org" --email bench@example.com --role Owner >/dev/null
	budget_key=$(create_key "$budget_org" budgets Admin "$jar" "http://$gw")
	budget_monitor=$(create_monitor "$budget_key" "http://$gw")
	[ -n "$budget_monitor" ] || { echo "could not create the budgets monitor" >&2; exit 1; }
	pair_site
	# Whether this build counts the organisation's budgets: its answers then list the
	# "org" minute budget in RateLimit-Policy.
	policy=$(curl -sf -D - -o /dev/null -H "Authorization: Bearer $budget_key" "http://$PAIR_SITE/v1/me" |
		awk 'tolower($1) == "ratelimit-policy:" {sub(/^[^:]*: */, ""); sub(/\r$/, ""); print}')
	pair_run budgets_report "(o) organisation budgets" "$CADDY_PID" \
		"A: key, org ceiling + month quota" "http://$PAIR_SITE/v1/monitors/$budget_monitor" "$budget_key" \
		"B: key, the plan's minute only" "http://$PAIR_SITE/v1/monitors/$monitor" "$key" 0.97
	budgets_report+=$'\n'"    A's RateLimit-Policy: $policy"
	case $policy in
	*'"org"'*) ;;
	*) budgets_report+=" (no org budget: this build counts A's key like B's)" ;;
	esac
	# Redis's side, on its own: integration/capacity's workers counting random keys the
	# plain way (the key's minute alone) and then through the org budgets (the key's
	# minute, the org's minute and month in one script call), as capacity.sh's (s1) does.
	local part common=("${capacity_flags[@]}" -waiters "${BUDGETS_WAITERS:-1,4,16,64}" -redis-url "$REDIS_URL")
	capacity_tool
	for part in "(o1) counts on one Redis, the key's minute alone" "(o2) counts on one Redis, the org budgets"; do
		echo "measuring $part…" >&2
		local extra=()
		[[ $part != "(o2)"* ]] || extra=(-orgs "${CAP_ORGS:-10000}")
		budgets_report+=$'\n'"$("$stack/capacity" counts -label "${part%% *}" -title "${part#* }" "${common[@]}" "${extra[@]}" |
			sed '/^$/d; s/^/    /')"
	done
}
