# shellcheck shell=bash
# bench/tracing.sh: (tr), the cost of traces at full sampling: two gateway sites on one
# Caddy of their own (pair_run, pair.sh), one under Caddy's tracing directive with
# every request sampled (OTEL_TRACES_SAMPLER=always_on) and its spans sent over
# OTLP/HTTP to a collector that counts them (internal/testkit/otlptest's otlpsink), the
# other without: Caddy's whole cost of tracing, its server span, what v1_gateway adds
# (package spans) and the export. Then the module's CPU per request in process
# (module_cpu): BenchmarkServeHTTP/proxied_traced, under a recording span, against
# /proxied. The pair's throughput is reported, not judged: what tracing every request
# costs is the operator's to weigh against its sampling. BENCH_TRACING=0 skips it, BENCH_ONLY=tracing runs it alone and replaces it
# in OUT.
paragraph[tracing]="(tr) tracing"

bench_tracing() {
	local a b sink_pid
	go build -o "$stack/otlpsink" ./internal/testkit/otlptest/cmd/otlpsink
	rm -f "$stack/otlpsink.addr"
	"$stack/otlpsink" -listen-file "$stack/otlpsink.addr" >"$stack/otlpsink.out" &
	sink_pid=$!
	pids+=("$sink_pid")
	for _ in $(seq 50); do [ -s "$stack/otlpsink.addr" ] && break; sleep 0.1; done
	a="127.0.0.1:$(bench_port)"
	b="127.0.0.1:$(bench_port)"
	{
		caddy_globals
		SITE_LINES=$'tracing {\n\t\tspan keygate\n\t}' gateway_site "$a"
		gateway_site "$b"
	} >"$stack/Caddyfile.pair"
	OTEL_EXPORTER_OTLP_ENDPOINT="http://$(cat "$stack/otlpsink.addr")" OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf \
		OTEL_TRACES_SAMPLER=always_on OTEL_SERVICE_NAME=keygate-gateway pair_caddy "$a" "$b"
	pair_run tracing_report "(tr) tracing" "$CADDY_PID" \
		"A: gateway, tracing, all sampled" "http://$a/v1/monitors/$monitor" "$key" \
		"B: gateway, no tracing" "http://$b/v1/monitors/$monitor" "$key" -
	# pair_run stopped Caddy, which sent the spans it held: the collector has them all.
	kill "$sink_pid" 2>/dev/null || true
	wait "$sink_pid" 2>/dev/null || true
	tracing_report+=$'\n'"    the collector took $(cat "$stack/otlpsink.out") (3 a request of A: the server span, keygate.lookup, keygate.count)"
	module_cpu tracing_report "(tr) tracing" proxied_traced proxied 15
}
