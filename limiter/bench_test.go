package limiter_test

import (
	"context"
	"testing"
	"time"

	"github.com/keygate/keygate/internal/benchcpu"
	"github.com/keygate/keygate/limiter"
)

// BenchmarkPipelinedAllow counts from 1, 4 and 32 goroutines at once through the
// pipeline, over the real Redis. allocs/op is what one count costs, the pipeline
// included. cpu-µs/op is this process's CPU per count, and redis-µs/op is Redis's.
// Run it on a stack of its own (see internal/benchcpu).
func BenchmarkPipelinedAllow(b *testing.B) {
	c := redisClient(b)
	l := limiter.NewRedis(c, limiter.WithPrefix(uniquePrefix(b)), limiter.WithPipelining(time.Second))
	keys := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	benchcpu.Run(b, func(b *testing.B, i int) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		if _, err := l.Allow(ctx, keys[i%len(keys)], 1<<30); err != nil {
			b.Errorf("Allow: %v", err)
		}
		cancel()
	}, benchcpu.Self(), benchcpu.Redis(c))
}
