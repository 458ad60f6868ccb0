package limiter_test

import (
	"context"
	"testing"
	"time"

	"github.com/keygate/keygate/limiter"
)

// BenchmarkPipelinedAllow counts from many goroutines at once through the pipeline over
// the real Redis; allocs/op is what one count costs, the pipeline included.
func BenchmarkPipelinedAllow(b *testing.B) {
	l := limiter.NewRedis(redisClient(b), limiter.WithPrefix(uniquePrefix(b)), limiter.WithPipelining(time.Second))
	keys := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	b.SetParallelism(16)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for i := 0; pb.Next(); i++ {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			if _, err := l.Allow(ctx, keys[i%len(keys)], 1<<30); err != nil {
				b.Errorf("Allow: %v", err)
			}
			cancel()
		}
	})
}
