package limiter_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/keygate/keygate/internal/testkit/redistest"
	"github.com/keygate/keygate/limiter"
)

// allowKey counts one request of key against limit, the one budget of a key whose
// plan has no organisation budget, and returns its minute window.
func allowKey(l limiter.Limiter, ctx context.Context, key string, limit int) (limiter.Window, error) {
	r, err := l.Allow(ctx, limiter.Budgets{Key: key, KeyLimit: limit})
	return r.Key, err
}

// redisClient returns a client of the Redis named by REDIS_URL, started by `make test`.
func redisClient(t testing.TB) *redis.Client { return redistest.Client(t) }

// uniquePrefix keeps tests sharing one Redis apart.
func uniquePrefix(t testing.TB) string {
	var b [6]byte
	rand.Read(b[:])
	return "test:" + hex.EncodeToString(b[:]) + ":"
}

// backends returns one limiter of each kind, both reading the clock now.
func backends(t *testing.T, now func() time.Time) map[string]limiter.Limiter {
	return map[string]limiter.Limiter{
		"local": limiter.NewLocal(limiter.WithClock(now)),
		"redis": limiter.NewRedis(redisClient(t), limiter.WithClock(now), limiter.WithPrefix(uniquePrefix(t))),
		"redis pipelined": limiter.NewRedis(redisClient(t), limiter.WithClock(now), limiter.WithPrefix(uniquePrefix(t)),
			limiter.WithPipelining(time.Second)),
	}
}

// fixedClock is a clock tests move by hand.
type fixedClock struct{ ns atomic.Int64 }

func newClock(t time.Time) *fixedClock {
	c := &fixedClock{}
	c.ns.Store(t.UnixNano())
	return c
}
func (c *fixedClock) now() time.Time  { return time.Unix(0, c.ns.Load()) }
func (c *fixedClock) set(t time.Time) { c.ns.Store(t.UnixNano()) }
func minute(m int64) time.Time        { return time.Unix(m*60, 0) }

// base is a minute a little in the future. Redis counters expire by the wall clock. So
// a fake clock far in the past would see its counters vanish at once.
var base = time.Now().Unix()/60 + 5

func at(m int64, d time.Duration) time.Time { return minute(m).Add(d) }

func TestExactlyLimitAllowedUnderConcurrency(t *testing.T) {
	// Far from a window edge, so that all 200 requests fall in one window.
	clock := newClock(at(base, 10*time.Second))
	for name, l := range backends(t, clock.now) {
		t.Run(name, func(t *testing.T) {
			var allowed, refused atomic.Int64
			var wg sync.WaitGroup
			start := make(chan struct{})
			for range 200 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					r, err := allowKey(l, context.Background(), "key-A", 50)
					if err != nil {
						t.Error(err)
						return
					}
					if r.Allowed {
						allowed.Add(1)
					} else {
						refused.Add(1)
					}
				}()
			}
			close(start)
			wg.Wait()
			if allowed.Load() != 50 || refused.Load() != 150 {
				t.Errorf("allowed %d, refused %d; want 50 and 150", allowed.Load(), refused.Load())
			}
		})
	}
}

func TestCountsRemainingAndRefusesTheRequestAfterTheLimit(t *testing.T) {
	clock := newClock(at(base, 15*time.Second))
	for name, l := range backends(t, clock.now) {
		t.Run(name, func(t *testing.T) {
			for i := 1; i <= 5; i++ {
				r, err := allowKey(l, context.Background(), "k", 3)
				if err != nil {
					t.Fatal(err)
				}
				want := limiter.Window{Allowed: i <= 3, Limit: 3, Remaining: max(3-i, 0), ResetAfter: 45}
				if r != want {
					t.Errorf("request %d: %+v, want %+v", i, r, want)
				}
			}
			// Another key has its own budget.
			if r, _ := allowKey(l, context.Background(), "other", 3); !r.Allowed || r.Remaining != 2 {
				t.Errorf("another key: %+v", r)
			}
		})
	}
}

func TestWindowEdges(t *testing.T) {
	m := base
	for _, tc := range []struct {
		name      string
		offset    time.Duration
		wantReset int
	}{
		{"first instant of the window", 0, 60},
		{"one millisecond in", time.Millisecond, 60},
		{"just under a second in", 999 * time.Millisecond, 60},
		{"one second in", time.Second, 59},
		{"mid window rounds up", 30*time.Second + time.Millisecond, 30},
		{"last second", 59 * time.Second, 1},
		{"last millisecond", 59*time.Second + 999*time.Millisecond, 1},
		{"last nanosecond", time.Minute - time.Nanosecond, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := newClock(at(m, tc.offset))
			for name, l := range backends(t, clock.now) {
				r, err := allowKey(l, context.Background(), "k", 1)
				if err != nil {
					t.Fatal(err)
				}
				if r.ResetAfter != tc.wantReset || !r.Allowed {
					t.Errorf("%s: %+v, want reset after %d", name, r, tc.wantReset)
				}
			}
		})
	}
}

func TestANewWindowStartsAFreshBudget(t *testing.T) {
	clock := newClock(at(base, 59*time.Second+900*time.Millisecond))
	for name, l := range backends(t, clock.now) {
		t.Run(name, func(t *testing.T) {
			clock.set(at(base, 59*time.Second+900*time.Millisecond))
			ctx := context.Background()
			allowKey(l, ctx, "k", 2)
			allowKey(l, ctx, "k", 2)
			if r, _ := allowKey(l, ctx, "k", 2); r.Allowed || r.ResetAfter != 1 {
				t.Fatalf("third request at the window's end: %+v, want refused with reset 1", r)
			}
			clock.set(minute(base + 1)) // the first instant of the next UTC minute
			if r, _ := allowKey(l, ctx, "k", 2); !r.Allowed || r.Remaining != 1 || r.ResetAfter != 60 {
				t.Errorf("first request of the next window: %+v", r)
			}
		})
	}
}

func TestTwoRedisLimitersShareOneBudget(t *testing.T) {
	prefix := uniquePrefix(t)
	clock := newClock(at(base, 5*time.Second))
	// Two clients, as two gateway instances would have.
	a := limiter.NewRedis(redisClient(t), limiter.WithClock(clock.now), limiter.WithPrefix(prefix))
	b := limiter.NewRedis(redisClient(t), limiter.WithClock(clock.now), limiter.WithPrefix(prefix),
		limiter.WithPipelining(time.Second))
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for i := range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := a
			if i%2 == 1 {
				l = b
			}
			r, err := allowKey(l, context.Background(), "shared", 30)
			if err != nil {
				t.Error(err)
			}
			if r.Allowed {
				allowed.Add(1)
			}
		}()
	}
	wg.Wait()
	if allowed.Load() != 30 {
		t.Errorf("two instances allowed %d requests, want 30 in all", allowed.Load())
	}
}

func TestRedisCountersExpireOnTheirOwn(t *testing.T) {
	rdb := redisClient(t)
	prefix := uniquePrefix(t)
	l := limiter.NewRedis(rdb, limiter.WithPrefix(prefix))
	if _, err := allowKey(l, context.Background(), "k", 10); err != nil {
		t.Fatal(err)
	}
	keys, err := rdb.Keys(context.Background(), prefix+"*").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("keys = %v, %v; want one counter", keys, err)
	}
	ttl, err := rdb.PTTL(context.Background(), keys[0]).Result()
	if err != nil {
		t.Fatal(err)
	}
	if ttl <= time.Minute || ttl > 2*time.Minute {
		t.Errorf("counter TTL %v, want between one and two minutes", ttl)
	}
}

func TestRedisErrorsSurface(t *testing.T) {
	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: time.Second})
	defer dead.Close()
	for _, l := range []*limiter.Redis{limiter.NewRedis(dead), limiter.NewRedis(dead, limiter.WithPipelining(time.Second))} {
		if _, err := allowKey(l, context.Background(), "k", 10); err == nil {
			t.Error("Allow against a dead Redis returned no error")
		}
	}
}

func TestPipelinedCountsSurviveAScriptFlush(t *testing.T) {
	rdb := redisClient(t)
	clock := newClock(at(base, 20*time.Second))
	l := limiter.NewRedis(rdb, limiter.WithClock(clock.now), limiter.WithPrefix(uniquePrefix(t)),
		limiter.WithPipelining(time.Second))
	if r, err := allowKey(l, context.Background(), "k", 5); err != nil || r.Remaining != 4 {
		t.Fatalf("first Allow = %+v, %v", r, err)
	}
	if err := rdb.ScriptFlush(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	// After the flush, EVALSHA fails with NOSCRIPT. The count must still happen, once.
	if r, err := allowKey(l, context.Background(), "k", 5); err != nil || r.Remaining != 3 {
		t.Errorf("Allow after SCRIPT FLUSH = %+v, %v; want remaining 3", r, err)
	}
}

func TestRedisHonoursTheContextDeadline(t *testing.T) {
	// A Redis that accepts connections and never answers, as a hung server or network.
	// CLIENT PAUSE on the real Redis would stall the tests of every other package
	// sharing it.
	hung, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hung.Close()
	go func() {
		for {
			c, err := hung.Accept()
			if err != nil {
				return
			}
			defer c.Close() // held open, unread, until the listener closes
		}
	}()
	c := redis.NewClient(&redis.Options{Addr: hung.Addr().String(), ContextTimeoutEnabled: true, MaxRetries: -1})
	defer c.Close()
	for name, l := range map[string]*limiter.Redis{
		"plain":     limiter.NewRedis(c, limiter.WithPrefix(uniquePrefix(t))),
		"pipelined": limiter.NewRedis(c, limiter.WithPrefix(uniquePrefix(t)), limiter.WithPipelining(5*time.Second)),
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		start := time.Now()
		_, err := allowKey(l, ctx, "k", 10)
		cancel()
		if err == nil {
			t.Errorf("%s: Allow on a Redis that never answers returned no error", name)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("%s: Allow took %v past a 100ms deadline", name, d)
		}
	}
}

func TestNonPositiveLimitsAreRefused(t *testing.T) {
	for name, l := range backends(t, time.Now) {
		for _, limit := range []int{0, -1} {
			if _, err := allowKey(l, context.Background(), "k", limit); err != limiter.ErrBadLimit {
				t.Errorf("%s: Allow(limit %d) error = %v, want ErrBadLimit", name, limit, err)
			}
		}
	}
}

func TestLocalForgetsOldWindows(t *testing.T) {
	clock := newClock(minute(base))
	l := limiter.NewLocal(limiter.WithClock(clock.now))
	for i := range 1000 {
		allowKey(l, context.Background(), fmt.Sprint("key-", i), 5)
	}
	clock.set(minute(base + 1))
	// A key used in the old window starts again at 1 in the new one.
	if r, _ := allowKey(l, context.Background(), "key-1", 5); r.Remaining != 4 {
		t.Errorf("remaining %d in a new window, want 4", r.Remaining)
	}
	if n := l.Len(); n != 1 {
		t.Errorf("local limiter holds %d counters after a window change, want 1", n)
	}
}

func ExampleLocal_Allow() {
	l := limiter.NewLocal(limiter.WithClock(func() time.Time { return time.Date(2026, 11, 22, 12, 0, 45, 0, time.UTC) }))
	// A key of a plan without organisation budgets: 2 requests a minute.
	for range 3 {
		r, _ := l.Allow(context.Background(), limiter.Budgets{Key: "AbCdEfGhIjKlMnOpQrStUv", KeyLimit: 2})
		fmt.Printf("allowed=%v remaining=%d retry-after=%ds\n", r.Allowed, r.Key.Remaining, r.Key.ResetAfter)
	}
	// Output:
	// allowed=true remaining=1 retry-after=15s
	// allowed=true remaining=0 retry-after=15s
	// allowed=false remaining=0 retry-after=15s
}

func TestPrepareLoadsTheScriptsARestartedRedisLost(t *testing.T) {
	// A restarted Redis has no scripts. Prepare loads them again, so the first counts
	// after it pay no NOSCRIPT round trip.
	rdb := redisClient(t)
	ctx := context.Background()
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	l := limiter.NewRedis(rdb, limiter.WithPrefix(uniquePrefix(t)))
	if err := l.Prepare(ctx); err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	exists, err := rdb.ScriptExists(ctx, limiter.ScriptHashes()...).Result()
	if err != nil {
		t.Fatal(err)
	}
	for i, ok := range exists {
		if !ok {
			t.Errorf("script %s not loaded by Prepare", limiter.ScriptHashes()[i])
		}
	}
	if r, err := allowKey(l, ctx, "k", 5); err != nil || !r.Allowed || r.Remaining != 4 {
		t.Errorf("Allow after Prepare: %+v, %v", r, err)
	}
}
