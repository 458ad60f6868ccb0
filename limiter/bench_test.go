package limiter_test

import (
	"context"
	"testing"
	"time"

	"github.com/keygate/keygate/internal/testkit/benchcpu"
	"github.com/keygate/keygate/limiter"
)

// BenchmarkPipelinedAllow counts from 1, 4 and 32 goroutines at once through the
// pipeline, over the real Redis. allocs/op is what one count costs, the pipeline
// included. cpu-µs/op is this process's CPU per count, and redis-µs/op is Redis's.
// Run it on a stack of its own (see internal/testkit/benchcpu).
func BenchmarkPipelinedAllow(b *testing.B) {
	c := redisClient(b)
	l := limiter.NewRedis(c, limiter.WithPrefix(uniquePrefix(b)), limiter.WithPipelining(time.Second))
	keys := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	benchcpu.Run(b, func(b *testing.B, i int) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		if _, err := allowKey(l, ctx, keys[i%len(keys)], 1<<30); err != nil {
			b.Errorf("Allow: %v", err)
		}
		cancel()
	}, benchcpu.Self(), benchcpu.Redis(c))
}

// BenchmarkPipelinedAllowBudgets is BenchmarkPipelinedAllow for keys whose plan has an
// org ceiling and a monthly quota: every count goes through all three stages. "keys in
// their own orgs" makes as many script calls per round as the key-only counts' eight
// keys; "keys of one org" shares one call per round among them.
func BenchmarkPipelinedAllowBudgets(b *testing.B) {
	c := redisClient(b)
	l := limiter.NewRedis(c, limiter.WithPrefix(uniquePrefix(b)), limiter.WithPipelining(time.Second))
	keys := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	for _, bc := range []struct {
		name string
		org  func(i int) string
	}{
		{"keys in their own orgs", func(i int) string { return "org-" + keys[i%len(keys)] }},
		{"keys of one org", func(int) string { return "org" }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			benchcpu.Run(b, func(b *testing.B, i int) {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				budgets := limiter.Budgets{Key: keys[i%len(keys)], KeyLimit: 1 << 30, Org: bc.org(i), OrgLimit: 1 << 30, MonthLimit: 1 << 50}
				if _, err := l.Allow(ctx, budgets); err != nil {
					b.Errorf("Allow: %v", err)
				}
				cancel()
			}, benchcpu.Self(), benchcpu.Redis(c))
		})
	}
}

// BenchmarkPipelinedAllowWindows is BenchmarkPipelinedAllow for keys with a second's
// and a day's limits beside their minute: three counters a count, in the same call.
func BenchmarkPipelinedAllowWindows(b *testing.B) {
	c := redisClient(b)
	l := limiter.NewRedis(c, limiter.WithPrefix(uniquePrefix(b)), limiter.WithPipelining(time.Second))
	keys := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	benchcpu.Run(b, func(b *testing.B, i int) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		budgets := limiter.Budgets{Key: keys[i%len(keys)], KeyLimit: 1 << 30, KeyPerSecond: 1 << 30, KeyPerDay: 1 << 30}
		if _, err := l.Allow(ctx, budgets); err != nil {
			b.Errorf("Allow: %v", err)
		}
		cancel()
	}, benchcpu.Self(), benchcpu.Redis(c))
}
