package caddymodule

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/keygate/keygate/caddymodule/conns"
	"github.com/keygate/keygate/internal/testkit/testenv"
	"github.com/keygate/keygate/limiter"
)

// TestClusterSharesOneExactBudget: three clients, as three gateways would have, on
// the real 3-master Cluster. They count keys that live on every master. Under
// concurrency, each key allows exactly its limit.
func TestClusterSharesOneExactBudget(t *testing.T) {
	url := testenv.GetenvOrSkip(t, "REDIS_CLUSTER_URL")
	const limit, perClient, nKeys = 30, 20, 12
	var lims []*limiter.Redis
	var cc *redis.ClusterClient
	for range 3 {
		c, _, err := conns.NewRedisClient(conns.RedisCluster, url, "", 2*time.Second, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		cc = c.(*redis.ClusterClient)
		lims = append(lims, limiter.NewRedis(c, limiter.WithPipelining(2*time.Second)))
	}
	ctx := context.Background()
	run := fmt.Sprintf("cl%d", time.Now().UnixNano())
	masters := map[string]bool{}
	for k := range nKeys {
		key := fmt.Sprintf("%s-%d", run, k)
		node, err := cc.MasterForKey(ctx, "{"+key+"}")
		if err != nil {
			t.Fatal(err)
		}
		masters[node.Options().Addr] = true // the hash tag decides the slot
	}
	if len(masters) < 2 {
		t.Fatalf("keys landed on %d master(s), want several", len(masters))
	}
	allowed := make([]atomic.Int64, nKeys)
	var wg sync.WaitGroup
	for _, l := range lims {
		for k := range nKeys {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range perClient {
					r, err := l.Allow(ctx, limiter.Budgets{Key: fmt.Sprintf("%s-%d", run, k), KeyLimit: limit})
					if err != nil {
						t.Error(err)
						return
					}
					if r.Allowed {
						allowed[k].Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	for k := range nKeys {
		if n := allowed[k].Load(); n != limit {
			t.Errorf("key %d: %d allowed of %d requests, want exactly %d", k, n, 3*perClient, limit)
		}
	}
}

// TestTLSRedisWithCA: rediss:// with the throwaway CA counts. With a CA that did not
// sign the server's certificate, every count fails with a certificate error.
func TestTLSRedisWithCA(t *testing.T) {
	url := testenv.GetenvOrSkip(t, "REDIS_TLS_URL")
	ca, wrong := testenv.GetenvOrSkip(t, "REDIS_TLS_CA"), testenv.GetenvOrSkip(t, "REDIS_TLS_WRONG_CA")
	ctx := context.Background()
	key := fmt.Sprintf("tls%d", time.Now().UnixNano())

	c, _, err := conns.NewRedisClient(conns.RedisSingle, url, ca, 2*time.Second, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l := limiter.NewRedis(c)
	for i := range 3 {
		r, err := l.Allow(ctx, limiter.Budgets{Key: key, KeyLimit: 2})
		if err != nil {
			t.Fatal(err)
		}
		if r.Allowed != (i < 2) {
			t.Fatalf("request %d: allowed %v", i+1, r.Allowed)
		}
	}

	bad, _, err := conns.NewRedisClient(conns.RedisSingle, url, wrong, 2*time.Second, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	_, err = limiter.NewRedis(bad).Allow(ctx, limiter.Budgets{Key: key, KeyLimit: 2})
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("count with the wrong CA: error %v, want a certificate error", err)
	}
}

// TestSentinelFailoverKeepsCounting: a client on the Sentinels counts, and the
// primary is killed (SIGKILL). Counts fail only while no primary is promoted, then
// succeed again on the promoted replica. It kills the stack's Sentinel primary, so it
// runs once.
func TestSentinelFailoverKeepsCounting(t *testing.T) {
	url := testenv.GetenvOrSkip(t, "REDIS_SENTINEL_URL")
	pidfile := testenv.GetenvOrSkip(t, "REDIS_SENTINEL_PRIMARY_PIDFILE")
	c, _, err := conns.NewRedisClient(conns.RedisSentinel, url, "", 300*time.Millisecond, 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l := limiter.NewRedis(c)
	ctx := context.Background()
	key := fmt.Sprintf("sen%d", time.Now().UnixNano())
	if _, err := l.Allow(ctx, limiter.Budgets{Key: key, KeyLimit: 1000}); err != nil {
		t.Fatalf("count before the failover: %v", err)
	}
	pid, err := os.ReadFile(pidfile)
	if err != nil {
		t.Fatal(err)
	}
	var p int
	if _, err := fmt.Sscan(string(pid), &p); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(p, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	os.Remove(pidfile) // so that stack.sh down never signals a reused pid
	failed, last := 0, error(nil)
	testenv.Eventually(t, 60*time.Second, "a count after the Sentinel failover", func() bool {
		_, err := l.Allow(ctx, limiter.Budgets{Key: key, KeyLimit: 1000})
		if err != nil {
			failed, last = failed+1, err
		}
		return err == nil && failed > 0
	})
	t.Logf("%d counts failed during the failover; the last: %v", failed, last)
	for i := range 20 {
		if _, err := l.Allow(ctx, limiter.Budgets{Key: key, KeyLimit: 1000}); err != nil {
			t.Fatalf("count %d after the failover: %v", i, err)
		}
	}
	t.Logf("%d counts failed during the failover", failed)
}

// TestAKeysWindowsAreExactInEveryRedisMode: three clients, as three gateways would
// have, count one key's second of 5 and day of 7 beside its minute, at once, on a
// single Redis, the Cluster, a TLS Redis and the Sentinels' primary: each window lets
// through exactly its number, in the one script call each count makes.
func TestAKeysWindowsAreExactInEveryRedisMode(t *testing.T) {
	now := time.Now().Add(time.Minute) // one instant: every count in one second
	for _, m := range []struct {
		mode, env, ca string
	}{
		{conns.RedisSingle, "REDIS_URL", ""},
		{conns.RedisCluster, "REDIS_CLUSTER_URL", ""},
		{conns.RedisSingle, "REDIS_TLS_URL", "REDIS_TLS_CA"},
		{conns.RedisSentinel, "REDIS_SENTINEL_URL", ""},
	} {
		t.Run(m.env, func(t *testing.T) {
			url, ca := testenv.GetenvOrSkip(t, m.env), ""
			if m.ca != "" {
				ca = testenv.GetenvOrSkip(t, m.ca)
			}
			var lims []*limiter.Redis
			for range 3 {
				c, _, err := conns.NewRedisClient(m.mode, url, ca, 2*time.Second, 2*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.Close() })
				lims = append(lims, limiter.NewRedis(c, limiter.WithPipelining(2*time.Second), limiter.WithClock(func() time.Time { return now })))
			}
			key := fmt.Sprintf("win%d", time.Now().UnixNano())
			for _, step := range []struct {
				b       limiter.Budgets
				allowed int64
				window  limiter.Span
			}{
				{limiter.Budgets{Key: key, KeyLimit: 1000, KeyPerSecond: 5, KeyPerDay: 7}, 5, limiter.Second},
				// A second of 50 now: the day has 2 left.
				{limiter.Budgets{Key: key, KeyLimit: 1000, KeyPerSecond: 50, KeyPerDay: 7}, 2, limiter.Day},
			} {
				var allowed atomic.Int64
				var wg sync.WaitGroup
				for _, l := range lims {
					for range 10 {
						wg.Add(1)
						go func() {
							defer wg.Done()
							r, err := l.Allow(context.Background(), step.b)
							switch {
							case err != nil:
								t.Error(err)
							case r.Allowed:
								allowed.Add(1)
							case r.RefusedIn != step.window:
								t.Errorf("refused in the %s, want the %s", r.RefusedIn, step.window)
							}
						}()
					}
				}
				wg.Wait()
				if n := allowed.Load(); n != step.allowed {
					t.Errorf("%d of 30 allowed, want exactly %d", n, step.allowed)
				}
			}
		})
	}
}
