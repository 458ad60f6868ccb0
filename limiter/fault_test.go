package limiter_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/keygate/keygate/internal/testkit/latencyproxy"
	"github.com/keygate/keygate/internal/testkit/redistest"
	"github.com/keygate/keygate/limiter"
)

// slowRedis starts a Redis of the test's own (redistest.Own: no other package's SCRIPT
// FLUSH reaches it). It returns a client of it through a latency proxy, a client
// straight to it, and the proxy. The first client is set up as the gateway's: no
// retries, every wait bounded by timeout.
func slowRedis(t *testing.T, timeout time.Duration) (rdb, direct *redis.Client, p *latencyproxy.Proxy) {
	t.Helper()
	direct = redistest.Connect(t, redistest.Own(t))
	p, err := latencyproxy.Start(direct.Options().Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	opt := *direct.Options()
	opt.Addr = p.Addr()
	opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout, opt.PoolTimeout = timeout, timeout, timeout, timeout
	opt.ContextTimeoutEnabled = true
	opt.MaxRetries = -1
	opt.DialerRetries = 1
	opt.PoolSize = 256 // so that plain counts (one connection each) do not queue for one
	rdb = redis.NewClient(&opt)
	t.Cleanup(func() { rdb.Close() })
	return rdb, direct, p
}

// burst runs n concurrent Allow calls, each under its own timeout (0: none). It
// returns how many were allowed, refused and failed.
func burst(l limiter.Limiter, key string, n, limit int, timeout time.Duration) (allowed, refused, failed int64) {
	var a, r, f atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			ctx := context.Background()
			if timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, timeout)
				defer cancel()
			}
			res, err := allowKey(l, ctx, key, limit)
			switch {
			case err != nil:
				f.Add(1)
			case res.Allowed:
				a.Add(1)
			default:
				r.Add(1)
			}
		}()
	}
	close(start)
	wg.Wait()
	return a.Load(), r.Load(), f.Load()
}

func TestASlowRedisInsideTheTimeoutCountsExactly(t *testing.T) {
	// Redis answers in a bit more than half the timeout. Every count must come back in
	// time, pipelined or not. A limit of 50 must let exactly 50 of 200 concurrent
	// requests through. A pipelined caller must not wait for the round in flight and
	// then for its own: that would take longer than the timeout. A fixed window clock
	// keeps the burst from straddling a minute.
	const timeout = 1500 * time.Millisecond
	rdb, direct, proxy := slowRedis(t, timeout)
	clock := newClock(at(base, 20*time.Second))
	bothModes(t, rdb, timeout, func(t *testing.T, l *limiter.Redis, prefix string) {
		// Warm: a pool of connections, then the clock reading at this speed. A new
		// connection costs round trips of its own (HELLO, CLIENT SETINFO). So the
		// burst must find its connections made. A count that failed takes its
		// connection with it, so neither warm-up may fail. The pool is filled while
		// Redis is fast: dialling 200 connections at this speed can outlast the
		// warm-up under -race.
		warm := func() {
			if _, _, failed := burst(l, "warm", 200, 1000, 20*timeout); failed != 0 {
				t.Fatalf("%d of 200 warm-up counts failed", failed)
			}
		}
		warm()
		proxy.SetDelay(timeout * 55 / 100)
		defer proxy.SetDelay(0)
		warm()
		allowed, refused, failed := burst(l, "k", 200, 50, timeout)
		if allowed != 50 || refused != 150 || failed != 0 {
			t.Errorf("allowed %d, refused %d, failed %d; want 50, 150 and 0", allowed, refused, failed)
		}
		keys, _ := direct.Keys(context.Background(), prefix+"{k}*").Result()
		if len(keys) != 1 {
			t.Fatalf("counters %v", keys)
		}
		if n, _ := direct.Get(context.Background(), keys[0]).Int(); n != 200 {
			t.Errorf("counter %d, want 200", n)
		}
	}, limiter.WithClock(clock.now))
}

func TestACountGivenUpOnIsNeverWrittenLater(t *testing.T) {
	// While Redis hangs, every count times out at its deadline. When Redis comes back,
	// the commands held meanwhile reach it. The script must refuse them: the caller
	// has already treated them as not counted. The deadline is the caller's context's.
	// For calls without one, as the gateway's, it is WithTimeout's. The client's own
	// timeouts are ten times longer, so they do not end the wait.
	const timeout = 300 * time.Millisecond
	for _, tc := range []struct {
		name                  string
		ctxTimeout, clientTTL time.Duration
		opt                   limiter.Option
	}{
		{"context", timeout, timeout, nil},
		{"WithTimeout", 0, 10 * timeout, limiter.WithTimeout(timeout)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rdb, direct, proxy := slowRedis(t, tc.clientTTL)
			// A fixed clock for the window, so that the test never straddles a minute.
			// Deadlines use the real clock whatever WithClock says.
			opts := []limiter.Option{limiter.WithClock(newClock(at(base, 20*time.Second)).now)}
			if tc.opt != nil {
				opts = append(opts, tc.opt)
			}
			bothModes(t, rdb, tc.clientTTL, func(t *testing.T, l *limiter.Redis, prefix string) {
				if a, _, f := burst(l, "k", 5, 100, tc.ctxTimeout); a != 5 || f != 0 {
					t.Fatalf("before the hang: allowed %d, failed %d", a, f)
				}
				proxy.Hang()
				start := time.Now()
				_, _, failed := burst(l, "k", 20, 100, tc.ctxTimeout)
				waited := time.Since(start)
				proxy.Resume()
				if failed != 20 || waited < timeout || waited > 3*timeout {
					t.Errorf("%d of 20 counts failed, after %v, while Redis hung; want 20 after %v", failed, waited, timeout)
				}
				time.Sleep(500 * time.Millisecond) // the held commands arrive and run: nothing shows them run
				keys, _ := direct.Keys(context.Background(), prefix+"{k}*").Result()
				if len(keys) != 1 {
					t.Fatalf("counters %v", keys)
				}
				if n, _ := direct.Get(context.Background(), keys[0]).Int(); n != 5 {
					t.Errorf("counter %d after the hang, want 5: counts given up on were written later", n)
				}
				// And Redis counts again once it answers.
				res, err := allowKey(l, context.Background(), "k", 100)
				if err != nil || res.Remaining != 94 {
					t.Errorf("after the hang: %+v, %v; want remaining 94", res, err)
				}
			}, opts...)
		})
	}
}

func TestCountersExpireRelativeToRedis(t *testing.T) {
	// A gateway clock ten minutes behind Redis. The counter must still live for the
	// rest of its window and one more, on Redis's clock.
	rdb := redisClient(t)
	prefix := uniquePrefix(t)
	lag := time.Now().Add(-10 * time.Minute)
	lag = lag.Truncate(time.Minute).Add(30 * time.Second)
	l := limiter.NewRedis(rdb, limiter.WithPrefix(prefix), limiter.WithClock(func() time.Time { return lag }))
	if _, err := allowKey(l, context.Background(), "k", 10); err != nil {
		t.Fatal(err)
	}
	if r, _ := allowKey(l, context.Background(), "k", 10); r.Remaining != 8 {
		t.Errorf("second count of a lagging gateway: remaining %d, want 8", r.Remaining)
	}
	keys, _ := rdb.Keys(context.Background(), prefix+"*").Result()
	if len(keys) != 1 {
		t.Fatalf("counters %v", keys)
	}
	ttl, _ := rdb.PTTL(context.Background(), keys[0]).Result()
	if ttl < 89*time.Second || ttl > 90*time.Second {
		t.Errorf("TTL %v, want 90s (30s left in the window, and one more)", ttl)
	}
}

func TestACountReachingRedisInTheLastMillisecondsOfItsTimeoutIsRefused(t *testing.T) {
	// Deadlines go to Redis 2 ms early (see redisClock.deadline). So a count reaching
	// Redis in the last 2 ms before its deadline is refused, and one after it a
	// fortiori. Here Redis hangs while the count is sent, and resumes 0.7 ms before
	// the caller's deadline, 20 times. Without the margin, about one in eight is
	// written.
	const timeout = 20 * time.Millisecond
	rdb, direct, proxy := slowRedis(t, timeout)
	bothModes(t, rdb, timeout, func(t *testing.T, l *limiter.Redis, prefix string) {
		if _, err := allowKey(l, context.Background(), "warm", 10); err != nil { // reads Redis's clock
			t.Fatal(err)
		}
		for i := range 20 {
			key := fmt.Sprintf("k%d", i)
			proxy.Hang()
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			deadline, _ := ctx.Deadline()
			done := make(chan error, 1)
			go func() {
				_, err := allowKey(l, ctx, key, 10)
				done <- err
			}()
			time.Sleep(time.Until(deadline.Add(-700 * time.Microsecond))) // to 0.7 ms before the deadline
			proxy.Resume()
			err := <-done
			cancel()
			time.Sleep(5 * time.Millisecond) // the held command runs: nothing shows it run
			if keys, _ := direct.Keys(context.Background(), prefix+"{"+key+"}*").Result(); len(keys) != 0 {
				t.Errorf("attempt %d (Allow: %v): counter %v written, in the last 2 ms of its timeout", i, err, keys)
			}
		}
	}, limiter.WithClock(newClock(at(base, 20*time.Second)).now))
}

// bothModes runs f twice, as subtests "plain" and "pipelined" (WithPipelining(timeout)).
// Each gets a limiter on rdb with opts, under a prefix of its own.
func bothModes(t *testing.T, rdb *redis.Client, timeout time.Duration, f func(t *testing.T, l *limiter.Redis, prefix string), opts ...limiter.Option) {
	for name, pipelined := range map[string]bool{"plain": false, "pipelined": true} {
		t.Run(name, func(t *testing.T) {
			prefix := uniquePrefix(t)
			o := append([]limiter.Option{limiter.WithPrefix(prefix)}, opts...)
			if pipelined {
				o = append(o, limiter.WithPipelining(timeout))
			}
			f(t, limiter.NewRedis(rdb, o...), prefix)
		})
	}
}
