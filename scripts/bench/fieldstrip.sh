# shellcheck shell=bash
# bench/fieldstrip.sh: (fs), the field stripper on its own: BenchmarkJSONFilter of
# package fieldstrip (fieldstrip/filter_test.go: a JSON list of monitors, each carrying
# every stripped field, written in the reverse proxy's 32 KiB pieces), FIELDSTRIP_RUNS
# (5) runs on one core, in process. It reports the medians of the runs' MB/s, ns/op, B/op
# and allocs/op, and checks that it allocates nothing per operation. It needs no stack:
# BENCH_ONLY=fieldstrip runs it alone, before any setup, and replaces it in OUT;
# BENCH_FIELDSTRIP=0 skips it.
paragraph[fieldstrip]="(fs) the field stripper"

# filter_runs RUNS runs BenchmarkJSONFilter RUNS times on one core, for Go's 1 s each,
# and prints one line a run: "MB/s ns/op B/op allocs/op".
filter_runs() {
	[ -x "$stack/fieldstrip.test" ] || go test -c -o "$stack/fieldstrip.test" ./fieldstrip
	"$stack/fieldstrip.test" -test.run '^$' -test.bench '^BenchmarkJSONFilter$' -test.cpu 1 -test.count "$1" |
		awk '$1 == "BenchmarkJSONFilter" {
			split("", v)
			for (i = 3; i <= NF; i++) v[$i] = $(i - 1)
			print v["MB/s"], v["ns/op"], v["B/op"], v["allocs/op"]
		}'
}

# vm_speed prints the median MB/s of three 1 s runs of BenchmarkJSONFilter: pure
# computation on one core, to tell the VM's speed at the time of a section run alone
# (only_run) against the (fs) of other reports. The VM's speed varies from day to day.
vm_speed() {
	local lines
	mapfile -t lines < <(filter_runs 3)
	[ "${#lines[@]}" = 3 ] && median 1 "${lines[@]}"
}

bench_fieldstrip() {
	local runs=${FIELDSTRIP_RUNS:-5} lines load_start mbs ns bytes allocs
	echo "measuring (fs) the field stripper in process…" >&2
	load_start=$(cut -d' ' -f1 /proc/loadavg)
	lines=$(filter_runs "$runs")
	if [ "$(grep -c . <<<"$lines")" != "$runs" ]; then
		echo "bench: (fs) BenchmarkJSONFilter reported $(grep -c . <<<"$lines") runs of $runs" >&2
		exit 1
	fi
	mapfile -t lines <<<"$lines"
	mbs=$(median 1 "${lines[@]}") ns=$(median 2 "${lines[@]}") bytes=$(median 3 "${lines[@]}") allocs=$(median 4 "${lines[@]}")
	fieldstrip_report=$'\n\n'"(fs) the field stripper on its own (package fieldstrip, in process, -cpu 1), medians of $runs runs"
	fieldstrip_report+=$'\n'"$(printf '    %-24s %9s %11s %9s %9s' "" "MB/s" "ns/op" "B/op" "allocs/op")"
	fieldstrip_report+=$'\n'"$(printf '    %-24s %9.1f %11.0f %9.0f %9.0f   (no allocation: %s)' \
		BenchmarkJSONFilter "$mbs" "$ns" "$bytes" "$allocs" "$(verdict "$allocs == 0")")"
	fieldstrip_report+=$'\n'"    runs (MB/s): $(printf '%s\n' "${lines[@]}" | awk '{printf "%s%.1f", (NR > 1 ? " " : ""), $1}');"
	fieldstrip_report+=" load average $load_start before the runs, $(cut -d' ' -f1 /proc/loadavg) after"
}
