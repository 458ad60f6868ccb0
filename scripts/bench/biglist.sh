# shellcheck shell=bash
# bench/biglist.sh: (e), a 50 MB JSON list through the gateway's field filter, on a
# Caddy of its own so that its peak RSS is the filter's alone: Caddy's RSS before and
# at its peak (VmHWM) over three downloads, the bytes in and out, and how many of the
# fields it must remove are left. Sets size_in, size_out, leaked, rss_before, rss_peak
# and rss_growth_mb for report.sh.

# biglist_file writes the 50 MB list, $stack/www/v1/big.json: 100,000 monitors, each
# with fields the filter must remove at depth.
biglist_file() {
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
}

bench_biglist() {
	local big big_pid
	big="127.0.0.1:$(bench_port)"
	biglist_file
	cat >"$stack/Caddyfile.big" <<EOC
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
EOC
	echo "measuring (e) 50 MB list through the filter…" >&2
	start_caddy "$stack/Caddyfile.big" "$stack/caddy-big.log" "$big/"
	big_pid=$CADDY_PID
	curl -sf -o /dev/null "${auth[@]}" "http://$big/v1/me"
	rss_before=$(awk '/^VmRSS:/ {print $2}' "/proc/$big_pid/status")
	size_in=$(stat -c %s "$stack/www/v1/big.json")
	size_out=$(curl -sf "${auth[@]}" -o "$stack/big.out" -w '%{size_download}' "http://$big/v1/big.json")
	for _ in 1 2; do curl -sf -o /dev/null "${auth[@]}" "http://$big/v1/big.json"; done
	rss_peak=$(awk '/^VmHWM:/ {print $2}' "/proc/$big_pid/status")
	rss_growth_mb=$(awk -v a="$rss_before" -v b="$rss_peak" 'BEGIN {printf "%.1f", (b - a) / 1024}')
	leaked=$(grep -c -E '"(config|assertions|org_id|config_version|paused_reason)"' "$stack/big.out" || true)
}
