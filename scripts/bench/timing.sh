# shellcheck shell=bash
# bench/timing.sh: (t), nothing to time: on the (c) gateway, a key limited to
# 10.9.0.0/16 asked from loopback (right secret, wrong address: refused with the one 401
# after its lookup) against a revoked key (the same 401, its row filtered out by the
# lookup), TIMING_PAIRS (2000) interleaved pairs, one request at a time over one
# connection: both medians and the share of pairs in which each was the slower
# (internal/testkit/timingpair). BENCH_TIMING=0 skips it, BENCH_ONLY=timing runs it
# alone and replaces it in OUT.
paragraph[timing]="(t) nothing to time"

bench_timing() {
	local restricted revoked revoked_id
	restricted=$(create_key "$org" restricted Admin "$jar" "http://$gw" '"allowed_cidrs":["10.9.0.0/16"]')
	revoked=$(create_key "$org" revoked Admin "$jar" "http://$gw")
	revoked_id=${revoked#mon_live_}
	revoked_id=${revoked_id%%.*}
	curl -sf -b "$jar" -X DELETE -o /dev/null "http://$gw/orgs/$org/api-keys/$revoked_id"
	if [ -z "$restricted" ] || [ -z "$revoked" ]; then
		echo "could not create the timing keys" >&2
		exit 1
	fi
	[ -x "$stack/timingpair" ] || go build -o "$stack/timingpair" ./internal/testkit/timingpair/cmd/timingpair
	echo "measuring (t) a refused restricted key against a revoked key…" >&2
	timing_report=$'\n\n'"(t) nothing to time: GET /v1/me, a refused restricted key against a revoked key"
	timing_report+=$'\n'"$("$stack/timingpair" -url "http://$gw/v1/me" -pairs "${TIMING_PAIRS:-2000}" \
		-a "$restricted" -a-name "restricted key, wrong address" -b "$revoked" -b-name "revoked key")"
}
