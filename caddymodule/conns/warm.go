package conns

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/keygate/keygate/keystore"
)

// This file holds connection setup, which runs on a budget of its own, never on a
// request's deadline (docs/dependencies.md, Connection setup has its own budget). A
// connection slower to open than a request may wait would otherwise never open while
// the dependency is slow. For PostgreSQL, pgxpool already opens connections off the
// request's deadline, and TunePostgres (postgres.go) bounds and prepares them. For
// Redis, a RedisWarmer keeps redis_min_conns connections opened and greeted. The
// breakers' probes run on the same budgets.

// warmEvery is how often a RedisWarmer checks its pool's floor.
const warmEvery = 250 * time.Millisecond

// RedisWarmer keeps at least floor connections in a Redis client's pool, in each
// primary's pool on a Cluster. It opens and greets them on a budget of its own.
type RedisWarmer struct {
	client redis.UniversalClient
	floor  int
	budget time.Duration // dial_timeout plus redis_timeout: the bound on one round of warming
	kicks  chan struct{} // a count failed: warm now, and PING every pooled connection
	stop   chan struct{}
	done   chan struct{}
}

func StartRedisWarmer(client redis.UniversalClient, floor int, budget time.Duration) *RedisWarmer {
	w := &RedisWarmer{
		client: client, floor: floor, budget: budget,
		kicks: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
	}
	go w.run()
	return w
}

func (w *RedisWarmer) run() {
	defer close(w.done)
	t := time.NewTicker(warmEvery)
	defer t.Stop()
	kicked := false
	for {
		ctx, cancel := context.WithTimeout(context.Background(), w.budget)
		w.warm(ctx, w.floor, kicked)
		cancel()
		select {
		case <-w.stop:
			return
		case <-t.C:
			kicked = false
		case <-w.kicks:
			kicked = true
		}
	}
}

// Kick has the warmer check its pools now rather than at its next tick. A count
// failed, so the connection it used may have been thrown away. Or it may be one of
// many a restarted Redis left dead in the pool. Kick never blocks.
func (w *RedisWarmer) Kick() {
	select {
	case w.kicks <- struct{}{}:
	default:
	}
}

// Close stops the warmer and waits for it.
func (w *RedisWarmer) Close() {
	close(w.stop)
	<-w.done
}

// warm opens connections until each pool holds floor of them, or ctx ends. With
// always, it sends floor PINGs to each pool even when it holds enough: a probe
// (RedisProbe) or a ping (RedisPing) wants an answer, not a count. It reports whether
// every PING was answered.
func (w *RedisWarmer) warm(ctx context.Context, floor int, always bool) bool {
	if c, ok := w.client.(*redis.ClusterClient); ok {
		return c.ForEachShard(ctx, func(ctx context.Context, shard *redis.Client) error {
			if !warmPool(ctx, shard, floor, always) {
				return context.DeadlineExceeded
			}
			return nil
		}) == nil
	}
	return warmPool(ctx, w.client, floor, always)
}

// warmPool sends floor PINGs at once through c, unless c's pool already holds floor
// connections and not always. Each PING takes a connection of its own, opening one
// if none is idle, and gives it back greeted.
func warmPool(ctx context.Context, c redis.UniversalClient, floor int, always bool) bool {
	if !always && int(c.PoolStats().TotalConns) >= floor {
		return true
	}
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		failed bool
	)
	for range floor {
		wg.Go(func() {
			if err := c.Ping(ctx).Err(); err != nil {
				mu.Lock()
				failed = true
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return !failed
}

// preparer is what a Redis probe asks of the limiter: limiter.Redis.Prepare.
type preparer interface {
	Prepare(ctx context.Context) error
}

// RedisProbe is the probe of Redis's breaker. On dial_timeout plus redis_timeout, it
// sends the warmer's PINGs through every pool. Then it prepares the limiter again:
// its scripts and its reading of Redis's clock. A restarted Redis has lost the
// scripts.
func RedisProbe(w *RedisWarmer, lim preparer, budget time.Duration) func() bool {
	return func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), budget)
		defer cancel()
		return w.warm(ctx, w.floor, true) && lim.Prepare(ctx) == nil
	}
}

// RedisPing is the Ping of Redis's breaker: one PING through each pool (each
// primary's on a Cluster), on dial_timeout plus redis_timeout.
func RedisPing(w *RedisWarmer, budget time.Duration) func() bool {
	return func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), budget)
		defer cancel()
		return w.warm(ctx, 1, true)
	}
}

// PostgresProbe is the probe of PostgreSQL's breaker. On dial_timeout plus
// database_timeout, it pings through the pool's floor of connections (at least one),
// again until every one answers. A PostgreSQL that restarted leaves dead connections
// in the pool. Each fails one ping and is then thrown away. So the breaker closes
// only once the floor is open again, not with one connection for requests to queue
// on. The probe leaves one connection of a full pool to the usage and last_used_at
// writes: holding them all, it would wait for a write that waits for a connection.
func PostgresProbe(pool *pgxpool.Pool, budget time.Duration) func() bool {
	return func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), budget)
		defer cancel()
		cfg := pool.Config()
		n := max(min(int(cfg.MinConns), int(cfg.MaxConns)-1), 1)
		for {
			if pingConns(ctx, pool, n) {
				return true
			}
			select {
			case <-ctx.Done():
				return false
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
}

// PostgresPing is the Ping of PostgreSQL's breaker: one connection of the pool,
// opened if none is idle, pinged once on dial_timeout plus database_timeout. A dead
// connection that a restart left in the pool fails it once, and is thrown away.
func PostgresPing(pool *pgxpool.Pool, budget time.Duration) func() bool {
	return func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), budget)
		defer cancel()
		return pingConns(ctx, pool, 1)
	}
}

// pingConns holds n connections of pool at once, opening those it lacks, and pings
// each. It reports whether every one answered. A connection whose ping failed is
// closed, so it leaves the pool when it is given back.
func pingConns(ctx context.Context, pool *pgxpool.Pool, n int) bool {
	var (
		held   sync.WaitGroup // every connection taken and pinged
		wg     sync.WaitGroup
		mu     sync.Mutex
		failed bool
	)
	release := make(chan struct{})
	held.Add(n)
	for range n {
		wg.Go(func() {
			c, err := pool.Acquire(ctx)
			if err == nil {
				err = c.Ping(ctx)
			}
			if err != nil {
				mu.Lock()
				failed = true
				mu.Unlock()
			}
			held.Done()
			// Held until all are, so that the n pings take n connections.
			<-release
			if c != nil {
				c.Release()
			}
		})
	}
	held.Wait()
	close(release)
	wg.Wait()
	return !failed
}

// prepareLookups is pgxpool's AfterConnect for the gateway's pool. It prepares the
// lookups on a new connection within budget, before any request uses it.
func prepareLookups(budget time.Duration) func(context.Context, *pgx.Conn) error {
	return func(ctx context.Context, conn *pgx.Conn) error {
		ctx, cancel := context.WithTimeout(ctx, budget)
		defer cancel()
		return keystore.PrepareLookups(ctx, conn)
	}
}
