package limiter

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/keygate/keygate/internal/gather"
)

// ErrLate is returned, wrapped, by Redis.Allow when Redis received the count after the
// caller's deadline. Redis did not make the count: the request is not counted, now or
// later.
var ErrLate = errors.New("limiter: redis received the count after its deadline; not counted")

// Redis counts in Redis, so that every process sharing the Redis shares each key's
// budget. Each Allow is one round trip: EVALSHA, falling back to EVAL once per
// connection after a SCRIPT FLUSH or a failover.
//
// A count carries its caller's deadline, translated to Redis's clock. That is its
// context's deadline, or WithTimeout's if sooner. The script does not count past it.
// So a count the caller gave up on is never written later. redisClock compares the
// clocks.
type Redis struct {
	rdb   redis.Scripter
	opts  options
	pipe  *pipeline // nil without WithPipelining
	clock redisClock

	budgets *budgetPipeline // AllowBudgets's; nil without WithPipelining
	seeds   *seeder         // WithMonthSeed's; nil for none
}

// NewRedis returns a limiter counting in rdb: a *redis.Client, *redis.ClusterClient,
// *redis.Ring or any redis.UniversalClient.
//
// Window numbers come from this process's clock. Windows are aligned to the UTC
// minute, so gateways sharing a Redis should keep their clocks in sync (NTP). Expiry
// is relative to Redis's clock. So a lagging gateway clock never writes a counter that
// has already expired.
func NewRedis(rdb redis.Scripter, opts ...Option) *Redis {
	l := &Redis{rdb: rdb, opts: buildOptions(opts), clock: redisClock{once: make(chan struct{}, 1)}}
	if p, ok := rdb.(pipeliner); ok && l.opts.pipelineTimeout > 0 {
		l.pipe = newPipeline(p, l.opts.pipelineTimeout, l.opts.linger, &l.clock)
		l.budgets = newBudgetPipeline(p, l.opts.pipelineTimeout, l.opts.linger, &l.clock)
	}
	l.seeds = newSeeder(l.opts.monthSeed)
	return l
}

// Allow counts one request of key; see Limiter. It returns errors from Redis wrapped,
// the context's deadline and ErrLate among them, for the caller's failure policy. In
// every error case, the count was not made.
func (l *Redis) Allow(ctx context.Context, key string, limit int) (Result, error) {
	if limit <= 0 {
		return Result{}, ErrBadLimit
	}
	by := gather.Deadline(ctx, l.opts.timeout)
	if err := l.clock.sync(ctx, by, l.rdb); err != nil {
		return Result{}, fmt.Errorf("counting in redis: reading its clock: %w", err)
	}
	w, reset, ttl := windowOf(l.opts.now())
	counter := l.counterKey(key, w)
	deadline := l.clock.deadline(by)
	var (
		n   int64
		err error
	)
	if l.pipe != nil {
		n, err = l.pipe.count(ctx, by, counter, ttl, deadline)
	} else {
		var cancel context.CancelFunc
		ctx, cancel = bounded(ctx, by)
		defer cancel()
		var v []int64
		v, err = incrScript.Run(ctx, l.rdb, []string{counter}, ttl, deadline).Int64Slice()
		if err == nil {
			n, err = l.clock.reply(v)
		}
	}
	if err != nil {
		return Result{}, fmt.Errorf("counting in redis: %w", err)
	}
	return result(n, limit, reset), nil
}

// Prepare loads the limiter's scripts into Redis and reads Redis's clock. A first
// count would otherwise pay for these two round trips. Prepare does both even when an
// earlier call or count did: a restarted or failed-over Redis has lost its scripts.
// Give it a context of its own, not a request's. It is connection setup, and its point
// is that no request waits on it. On a Redis Cluster, the scripts load on every
// primary.
func (l *Redis) Prepare(ctx context.Context) error {
	for _, s := range []*redis.Script{incrScript, clockScript, budgetScript} {
		if err := s.Load(ctx, l.rdb).Err(); err != nil {
			return fmt.Errorf("loading the limiter's scripts: %w", err)
		}
	}
	now, err := clockScript.Run(ctx, l.rdb, nil).Int64()
	if err != nil {
		return fmt.Errorf("reading redis's clock: %w", err)
	}
	l.clock.observe(now)
	return nil
}

// counterKey is the Redis key of key's counter in window w. The braces make key the
// hash tag. So all of one key's counters live in one Cluster slot.
func (l *Redis) counterKey(key string, w int64) string {
	b := make([]byte, 0, len(l.opts.prefix)+len(key)+24)
	b = append(b, l.opts.prefix...)
	b = append(b, '{')
	b = append(b, key...)
	b = append(b, "}:"...)
	b = strconv.AppendInt(b, w, 10)
	return string(b)
}

// redisClock compares this process's clock with Redis's, so that Redis itself can
// check a caller's deadline.
//
// Every reply carries Redis's clock when it ran the script. offset is that reading
// minus this process's clock when the reply arrived. Redis's clock can only have moved
// on since the script ran. So offset is at most the true difference. A deadline
// translated with it comes early on Redis's clock, by about the reply's travel time.
// So Redis makes only counts whose replies can still arrive in time. It refuses the
// others (ErrLate) rather than write them behind the caller's back. Deadlines use the
// real clock, not WithClock's.
type redisClock struct {
	offset atomic.Int64 // Redis's clock minus ours, in milliseconds; see redisClock
	known  atomic.Bool
	once   chan struct{} // a one-slot lock: one first reading at a time
}

// sync reads Redis's clock once, before the first count, by deadline (zero: none).
func (c *redisClock) sync(ctx context.Context, deadline time.Time, rdb redis.Scripter) error {
	if c.known.Load() {
		return nil
	}
	ctx, cancel := bounded(ctx, deadline)
	defer cancel()
	select {
	case c.once <- struct{}{}:
		defer func() { <-c.once }()
	case <-ctx.Done():
		return ctx.Err()
	}
	if c.known.Load() {
		return nil
	}
	now, err := clockScript.Run(ctx, rdb, nil).Int64()
	if err != nil {
		return err
	}
	c.observe(now)
	return nil
}

func (c *redisClock) observe(redisNow int64) {
	c.offset.Store(redisNow - time.Now().UnixMilli())
	c.known.Store(true)
}

// deadline is d on Redis's clock in Unix milliseconds, or 0 for none (d zero).
//
// Both clocks are read in whole milliseconds, truncated. So offset may be up to 1 ms
// more than the true difference. A script reading now = n may run up to 1 ms after n.
// So a script could count a request up to 2 ms after its caller gave up on it. The
// deadline sent is 2 ms earlier (clockSlack) to rule that out. A count arriving in the
// last 2 ms of its timeout is refused as late.
func (c *redisClock) deadline(d time.Time) int64 {
	if d.IsZero() {
		return 0
	}
	return max(d.UnixMilli()+c.offset.Load()-clockSlack, 1)
}

// clockSlack is how many milliseconds early a deadline goes to Redis (see deadline).
const clockSlack = 2

// reply reads the script's {count, now} answer.
func (c *redisClock) reply(v []int64) (int64, error) {
	if len(v) != 2 {
		return 0, fmt.Errorf("unexpected reply %v", v)
	}
	c.observe(v[1])
	if v[0] < 0 {
		return 0, ErrLate
	}
	return v[0], nil
}
