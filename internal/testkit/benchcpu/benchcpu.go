// Package benchcpu is a benchmark helper: it makes Go benchmarks report CPU time per
// operation. It measures the benchmark's own process and the servers it talks to
// (Redis, PostgreSQL), as `make bench` does for the gateway (docs/performance.md). On
// a small shared machine, ns/op moves with whatever else runs. The CPU each process
// spends per operation is much steadier. It shows where a hand-off or a round trip
// costs.
//
//	benchcpu.Run(b, func(b *testing.B, i int) { … one operation … },
//		benchcpu.Self(), benchcpu.Redis(client))
//
// runs one sub-benchmark per entry of Goroutines. Next to ns/op and the allocations,
// it reports:
//
//   - "cpu-µs/op": this process, getrusage user + system;
//   - "redis-µs/op": Redis, from INFO cpu;
//   - "pg-µs/op": the postmaster and its backends, from /proc.
//
// A server's figure includes whatever else uses that server meanwhile. So run the
// benchmarks on a stack of their own (scripts/stack.sh), not beside `make test`.
package benchcpu

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// Goroutines are the numbers of goroutines Run measures at: one alone (no batching),
// a few, and as many as `make bench`'s wrk connections. Batch sizes depend on it, and
// so does the cost per operation of each hand-off and round trip.
var Goroutines = []int{1, 4, 32}

// A Probe reads a cumulative CPU time. Run reports its growth per operation, in
// microseconds, under Unit.
type Probe struct {
	Unit string
	Read func() (time.Duration, error)
}

// Self is this process's CPU time, user and system, reported as "cpu-µs/op". It reads
// getrusage(RUSAGE_SELF).
func Self() Probe {
	return Probe{Unit: "cpu-µs/op", Read: selfCPU}
}

func selfCPU() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, fmt.Errorf("getrusage: %w", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

// Run runs op as a sub-benchmark "goroutines=N" for each N of Goroutines. Each runs
// b.N operations in all, shared out among exactly N goroutines; i numbers them 0 to
// b.N-1. Run reports allocations and the probes' CPU per operation. Call it after the
// setup: it reads the probes right before and right after the operations.
func Run(b *testing.B, op func(b *testing.B, i int), probes ...Probe) {
	b.Helper()
	for _, n := range Goroutines {
		b.Run("goroutines="+strconv.Itoa(n), func(b *testing.B) {
			b.ReportAllocs()
			start := read(b, probes)
			b.ResetTimer()
			parallel(b.N, n, func(i int) { op(b, i) })
			b.StopTimer()
			report(b, start, probes)
		})
	}
}

// Loop runs op in a b.Loop, from one goroutine, and reports the probes' CPU per
// operation beside ns/op. Call it after the setup, as Run.
func Loop(b *testing.B, op func(), probes ...Probe) {
	b.Helper()
	start := read(b, probes)
	for b.Loop() {
		op()
	}
	report(b, start, probes)
}

// report reports each probe's growth since start, per operation of b.
func report(b *testing.B, start []time.Duration, probes []Probe) {
	b.Helper()
	end := read(b, probes)
	for i, p := range probes {
		b.ReportMetric(float64(end[i]-start[i])/float64(time.Microsecond)/float64(b.N), p.Unit)
	}
}

// parallel calls op(0) … op(total-1), each once, from exactly n goroutines.
func parallel(total, n int, op func(i int)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(total) {
					return
				}
				op(int(i))
			}
		}()
	}
	wg.Wait()
}

func read(b *testing.B, probes []Probe) []time.Duration {
	b.Helper()
	out := make([]time.Duration, len(probes))
	for i, p := range probes {
		d, err := p.Read()
		if err != nil {
			b.Fatalf("reading %s: %v", p.Unit, err)
		}
		out[i] = d
	}
	return out
}

// probeTimeout bounds a server probe's query.
const probeTimeout = 5 * time.Second

func probeContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), probeTimeout)
}
