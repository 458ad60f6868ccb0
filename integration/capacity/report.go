package capacity

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// µsPer is d in microseconds per n operations.
func µsPer(d time.Duration, n uint64) float64 {
	if n == 0 {
		return 0
	}
	return float64(d) / float64(time.Microsecond) / float64(n)
}

// rate is n per second of wall.
func (lv Level) rate(n uint64) float64 { return float64(n) / lv.Wall.Seconds() }

// busy is how many cores d kept busy over the window.
func (lv Level) busy(d time.Duration) float64 { return d.Seconds() / lv.Wall.Seconds() }

// batch is the operations a round trip carried, on average.
func (lv Level) batch() float64 {
	if lv.Rounds == 0 {
		return 0
	}
	return float64(lv.Items) / float64(lv.Rounds)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// serverColumns are the columns every table has for its main server: its busy cores,
// its CPU per operation, operations per CPU-second and cores per 100,000 operations a
// second (µs/op ÷ 10).
const serverHeader = "%8s %8s %9s %10s"

func serverCells(busy, perOp float64) string {
	perSec := 0.0
	if perOp > 0 {
		perSec = 1e6 / perOp
	}
	return fmt.Sprintf("%8.2f %8.1f %9.0f %10.2f", busy, perOp, perSec, perOp/10)
}

// WriteLookups writes the table of a Lookups measurement.
func WriteLookups(w io.Writer, l Lookups, levels []Level) {
	bouncer := l.PgBouncerPID != 0
	head := fmt.Sprintf("    %6s %9s %6s "+serverHeader, "W/proc", "lookups/s", "batch", "pg busy", "pg us/op", "ops/pg-s", "pg/100k/s")
	if bouncer {
		head += fmt.Sprintf(" %9s", "pgb us/op")
	}
	standby := l.StandbyURL != ""
	if standby {
		head += fmt.Sprintf(" %9s", "sb us/op")
	}
	head += fmt.Sprintf(" %9s %7s %7s %6s %6s", "cli us/op", "p50 ms", "p99 ms", "hit %", "errors")
	fmt.Fprintln(w, head)
	for _, lv := range levels {
		row := fmt.Sprintf("    %6d %9.0f %6.1f %s", lv.Waiters, lv.rate(lv.Ops), lv.batch(),
			serverCells(lv.busy(lv.Servers[0]), µsPer(lv.Servers[0], lv.Ops)))
		if bouncer {
			row += fmt.Sprintf(" %9.1f", µsPer(lv.Servers[1], lv.Ops))
		}
		if standby {
			row += fmt.Sprintf(" %9.1f", µsPer(lv.Servers[len(lv.Servers)-1], lv.Ops))
		}
		row += fmt.Sprintf(" %9.1f %7.3f %7.3f %6s %6d", µsPer(lv.Client, lv.Ops),
			ms(quantile(lv.Latency, 0.5)), ms(quantile(lv.Latency, 0.99)), hitCell(lv.Counters), lv.Errors+lv.Rejected)
		fmt.Fprintln(w, row)
	}
	writeErrors(w, levels)
}

// hitCell is the share of the primary's blocks found in shared_buffers, from its
// counters (hits, reads). A primary that touched no block, every lookup on a standby,
// has no share: "—", not 0.0.
func hitCell(counters []float64) string {
	if len(counters) != 2 || counters[0]+counters[1] <= 0 {
		return "—"
	}
	return fmt.Sprintf("%.1f", 100*counters[0]/(counters[0]+counters[1]))
}

// WriteCounts writes the table of a Counts measurement; primaries is how many
// primaries it measured.
func WriteCounts(w io.Writer, levels []Level, primaries int) {
	head := fmt.Sprintf("    %6s %9s %6s "+serverHeader, "W/proc", "counts/s", "round", "rd busy", "rd us/op", "ops/rd-s", "rd/100k/s")
	head += fmt.Sprintf(" %9s %7s %7s %6s", "cli us/op", "p50 ms", "p99 ms", "errors")
	if primaries > 1 {
		head += "  busy by shard, calls by shard %"
	}
	fmt.Fprintln(w, head)
	for _, lv := range levels {
		var total time.Duration
		for _, d := range lv.Servers {
			total += d
		}
		row := fmt.Sprintf("    %6d %9.0f %6.1f %s %9.1f %7.3f %7.3f %6d", lv.Waiters, lv.rate(lv.Ops), lv.batch(),
			serverCells(lv.busy(total), µsPer(total, lv.Ops)), µsPer(lv.Client, lv.Ops),
			ms(quantile(lv.Latency, 0.5)), ms(quantile(lv.Latency, 0.99)), lv.Errors+lv.Rejected)
		if primaries > 1 {
			var busy, split []string
			var calls float64
			for _, c := range lv.Counters {
				calls += c
			}
			for i, d := range lv.Servers {
				busy = append(busy, fmt.Sprintf("%.2f", lv.busy(d)))
				if calls > 0 {
					split = append(split, fmt.Sprintf("%.1f", 100*lv.Counters[i]/calls))
				}
			}
			row += "  " + strings.Join(busy, "/") + ", " + strings.Join(split, "/")
		}
		fmt.Fprintln(w, row)
	}
	writeErrors(w, levels)
}

// WriteLastUsed writes the table of a LastUsedWrites measurement.
func WriteLastUsed(w io.Writer, flushes []Flushes) {
	fmt.Fprintf(w, "    %10s %8s %9s %9s %11s\n", "keys/flush", "flushes", "ms/flush", "pg us/key", "keys/pg-s")
	for _, f := range flushes {
		keys := uint64(f.IDs * f.Flushes)
		perKey := µsPer(f.Postgres, keys)
		perSec := 0.0
		if perKey > 0 {
			perSec = 1e6 / perKey
		}
		fmt.Fprintf(w, "    %10d %8d %9.1f %9.2f %11.0f\n", f.IDs, f.Flushes, ms(f.Wall)/float64(f.Flushes), perKey, perSec)
	}
}

// WriteUsage writes the table of a UsageWrites measurement.
func WriteUsage(w io.Writer, sizes []UsageRows) {
	fmt.Fprintf(w, "    %9s %7s %9s %11s %11s %13s %6s %9s %10s\n", "rows/flush", "minutes", "ms/minute",
		"pg us/new", "pg us/added", "pg us/rolled", "reads", "days/org", "pg us/read")
	for _, r := range sizes {
		rows := uint64(r.Rows * r.Minutes)
		fmt.Fprintf(w, "    %9d %7d %9.1f %11.2f %11.2f %13.2f %6d %9.1f %10.1f\n", r.Rows, r.Minutes,
			ms(r.Wall)/float64(r.Minutes), µsPer(r.New, rows), µsPer(r.Added, rows), µsPer(r.RolledUp, rows),
			r.Reads, r.DayRows, µsPer(r.Read, uint64(r.Reads)))
	}
}

// writeErrors names the first error of every level that had errors.
func writeErrors(w io.Writer, levels []Level) {
	for _, lv := range levels {
		if lv.Errors+lv.Rejected > 0 {
			fmt.Fprintf(w, "    W/proc %d: %d errors, %d keys refused; the first: %s\n", lv.Waiters, lv.Errors, lv.Rejected, lv.Error)
		}
	}
}
