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

// Redis counts in Redis, so that every process sharing the Redis shares each budget.
// Each Allow is one round trip, one call of one script (countScript), whatever its
// Budgets hold: EVALSHA, falling back to EVAL once after a SCRIPT FLUSH or a
// failover.
//
// A key without organisation budgets counts on counters of its own, in the Cluster
// hash slot of its id. The counters of an organisation's budgets share the slot of
// the organisation's id, its keys' window counters included:
//
//	<prefix>{<key>}:<window>               a key's minute, without org budgets
//	<prefix>{<key>}:<s|h|d>:<window>       a key's second, hour or day, without them
//	<prefix>{o:<org>}:k:<key>:<window>     a key's minute, with them
//	<prefix>{o:<org>}:k:<key>:<s|h|d>:<window>  its second, hour or day, with them
//	<prefix>{o:<org>}:o:<window>           the org's minute
//	<prefix>{o:<org>}:M:<yyyymm>           the org's month (UTC)
//
// <window> is the window's index: floor(unix(t) / its span's seconds). So all
// counting of one key, or of one organisation with budgets, lands on one Cluster
// shard, and a key whose plan gains or loses an org budget starts its windows afresh
// once (it changes counters). A window's counter lives the rest of its window and
// one window more; the month counter until a day after its month ends.
//
// A count carries its caller's deadline, translated to Redis's clock. That is its
// context's deadline, or WithTimeout's if sooner. The script does not count past it.
// So a count the caller gave up on is never written later. redisClock compares the
// clocks.
//
// With WithMonthSeed, a count that finds the month's counter missing counts nothing;
// the month is seeded (see WithMonthSeed) and the count made again with the seed:
// two round trips and a seed call, once a month per org, or after Redis lost its
// data.
type Redis struct {
	rdb   redis.Scripter
	opts  options
	pipe  *pipeline // nil without WithPipelining
	clock redisClock
	seeds *seeder // WithMonthSeed's; nil for none
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
	}
	l.seeds = newSeeder(l.opts.monthSeed)
	return l
}

// Allow counts one request against b's budgets; see Limiter. Its errors are
// ErrBadLimit and ErrNoOrg for bad budgets, WithMonthSeed's, and Redis's wrapped, the
// context's deadline and ErrLate among them, for the caller's failure policy. In
// every error case, nothing was counted.
func (l *Redis) Allow(ctx context.Context, b Budgets) (Result, error) {
	if err := b.check(); err != nil {
		return Result{}, err
	}
	by := gather.Deadline(ctx, l.opts.timeout)
	if err := l.clock.sync(ctx, by, l.rdb); err != nil {
		return Result{}, fmt.Errorf("counting in redis: reading its clock: %w", err)
	}
	t := l.opts.now()
	w := clockAt(t)
	c := count{limits: b.limits(), cost: b.cost(), redisDeadline: l.clock.deadline(by)}
	c.ttlMs[Minute] = w.ttlMs[Minute] // the org's minute needs it too
	for s, limit := range c.limits.key {
		if limit > 0 {
			c.key, c.ttlMs[s] = b.Key, w.ttlMs[s]
		}
	}
	var m month
	if b.orgWide() {
		m = monthOf(t)
		c.monthTTL, c.seed = m.ttlMs, firstSeed(l.seeds)
	}
	l.counters(&c, b, &w, m.name)
	var call *seedCall // the seed call c.seed came from
	for range seedAttempts {
		sent := time.Now()
		counts, err := l.count(ctx, by, c)
		if errors.Is(err, errMonthMissing) {
			if call, err = l.seeds.seed(ctx, by, sent, b.Org, m.start); err != nil {
				return Result{}, fmt.Errorf("counting in redis: seeding the month of org %s: %w: %w", b.Org, ErrMonthSeed, err)
			}
			c.seed = call.used
			continue
		}
		if err != nil {
			return Result{}, fmt.Errorf("counting in redis: %w", err)
		}
		if call != nil {
			l.seeds.applied(call)
		}
		return newResult(b, counts, &w.resets, m), nil
	}
	return Result{}, fmt.Errorf("counting in redis: %w", errMonthMissing)
}

// count runs c, through the pipeline if there is one, until deadline (zero: none).
func (l *Redis) count(ctx context.Context, deadline time.Time, c count) (stageCounts, error) {
	if l.pipe != nil {
		reply, err := l.pipe.rounds.DoBy(ctx, deadline, c)
		if err == nil {
			err = reply.err
		}
		return reply.counts, err
	}
	ctx, cancel := bounded(ctx, deadline)
	defer cancel()
	round := []count{c}
	calls := scriptCalls(round, false) // one count: one group either way
	if len(calls) != 1 {
		return stageCounts{}, fmt.Errorf("limiter: %d script calls for one count", len(calls))
	}
	v, err := countScript.Run(ctx, l.rdb, calls[0].keys, calls[0].args...).Int64Slice()
	var replies [1]reply
	readReplies(round, &calls[0], v, err, replies[:], &l.clock)
	return replies[0].counts, replies[0].err
}

// Prepare loads the limiter's scripts into Redis and reads Redis's clock. A first
// count would otherwise pay for these two round trips. Prepare does both even when an
// earlier call or count did: a restarted or failed-over Redis has lost its scripts.
// Give it a context of its own, not a request's. It is connection setup, and its point
// is that no request waits on it. On a Redis Cluster, the scripts load on every
// primary.
func (l *Redis) Prepare(ctx context.Context) error {
	for _, s := range []*redis.Script{countScript, clockScript} {
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

// counters sets the Redis keys of c, for b in the windows of w and month yyyymm (see
// Redis), as parts of one string: one allocation.
func (l *Redis) counters(c *count, b Budgets, w *clock, yyyymm int) {
	var stack [320]byte
	buf := stack[:0]
	var ends [spans + 2]int // where each counter ends in buf: the key's, then the org's two
	if b.orgWide() {
		buf = l.appendTag(buf, b)
		buf = append(buf, ":o:"...)
		buf = strconv.AppendInt(buf, w.index[Minute], 10)
		ends[spans] = len(buf)
		buf = l.appendTag(buf, b)
		buf = append(buf, ":M:"...)
		buf = strconv.AppendInt(buf, int64(yyyymm), 10)
		ends[spans+1] = len(buf)
	}
	for s, limit := range c.limits.key {
		if limit <= 0 {
			continue
		}
		buf = l.appendTag(buf, b)
		if b.orgWide() {
			buf = append(buf, ":k:"...)
			buf = append(buf, b.Key...)
		}
		buf = append(buf, spanTags[s]...)
		buf = strconv.AppendInt(buf, w.index[s], 10)
		ends[s] = len(buf)
	}
	str := string(buf)
	start := 0
	if b.orgWide() {
		c.orgCounter, c.monthCounter = str[:ends[spans]], str[ends[spans]:ends[spans+1]]
		start = ends[spans+1]
	}
	for s, limit := range c.limits.key {
		if limit > 0 {
			c.keyCounters[s] = str[start:ends[s]]
			start = ends[s]
		}
	}
}

// appendTag appends the prefix and hash tag of b's counters (see Redis): its
// organisation's if it has an organisation budget, its key's otherwise.
func (l *Redis) appendTag(buf []byte, b Budgets) []byte {
	buf = append(buf, l.opts.prefix...)
	if b.orgWide() {
		buf = append(buf, "{o:"...)
		buf = append(buf, b.Org...)
	} else {
		buf = append(buf, '{')
		buf = append(buf, b.Key...)
	}
	return append(buf, '}')
}

// spanTags are what comes between a key's tag and its window's index in the name of
// its counter of each span (see Redis).
var spanTags = [spans]string{Minute: ":", Second: ":s:", Hour: ":h:", Day: ":d:"}

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
