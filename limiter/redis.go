package limiter

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// Redis counts in Redis, so that every process sharing the Redis shares each key's
// budget. Each Allow is one round trip (EVALSHA, falling back to EVAL once per
// connection after a SCRIPT FLUSH or failover).
type Redis struct {
	rdb  redis.Scripter
	opts options
	pipe *pipeline // nil without WithPipelining
}

var _ Limiter = (*Redis)(nil)

// NewRedis returns a limiter counting in rdb, which may be a *redis.Client,
// *redis.ClusterClient, *redis.Ring or any redis.UniversalClient.
//
// Windows are computed from this process's clock; gateways sharing a Redis should
// keep their clocks in sync (NTP), as the windows are aligned to the UTC minute.
func NewRedis(rdb redis.Scripter, opts ...Option) *Redis {
	l := &Redis{rdb: rdb, opts: buildOptions(opts)}
	if p, ok := rdb.(pipeliner); ok && l.opts.pipelineTimeout > 0 {
		l.pipe = &pipeline{rdb: p, timeout: l.opts.pipelineTimeout}
	}
	return l
}

// Allow counts one request of key; see Limiter. Errors from Redis, including the
// context's deadline, are returned as they are so that the caller can apply its
// failure policy.
func (l *Redis) Allow(ctx context.Context, key string, limit int) (Result, error) {
	if limit <= 0 {
		return Result{}, ErrBadLimit
	}
	w, reset := windowOf(l.opts.now())
	var (
		n   int64
		err error
	)
	if l.pipe != nil {
		n, err = l.pipe.count(ctx, l.counterKey(key, w), expireAt(w))
	} else {
		n, err = incrScript.Run(ctx, l.rdb, []string{l.counterKey(key, w)}, expireAt(w)).Int64()
	}
	if err != nil {
		return Result{}, fmt.Errorf("counting in redis: %w", err)
	}
	return result(n, limit, reset), nil
}

// counterKey is the Redis key of key's counter in window w. The braces make key the
// hash tag, so all of one key's counters live in one Cluster slot.
func (l *Redis) counterKey(key string, w int64) string {
	b := make([]byte, 0, len(l.opts.prefix)+len(key)+24)
	b = append(b, l.opts.prefix...)
	b = append(b, '{')
	b = append(b, key...)
	b = append(b, "}:"...)
	b = strconv.AppendInt(b, w, 10)
	return string(b)
}

// expireAt is when window w's counters may go: one window after it ends, so that a
// gateway whose clock runs a little behind still finds the count.
func expireAt(w int64) int64 {
	return (w + 2) * Window.Milliseconds()
}
