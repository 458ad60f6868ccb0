package keystore_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keygate/keygate/internal/testkit/latencyproxy"
	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/keystore/keystoretest"
	"github.com/keygate/keygate/schema/schematest"
)

// slowStore returns a store on a fresh database reached through a latency proxy. It
// also returns a key in it, and the proxy. Its pool of four connections is set up
// as the gateway's (caddymodule/conns, TunePostgres). A connection prepares the
// lookups as it opens. A connection idle for less than a minute is not pinged before
// use. pgxpool's default pings one idle for a second: a round trip more, through the
// proxy, than a slow lookup fits in. Whether a connection had been idle for a second
// would then depend on how fast a busy machine ran the test so far.
func slowStore(t *testing.T) (*keystore.Store, string, *latencyproxy.Proxy) {
	t.Helper()
	direct, u := schematest.NewPool(t)
	s := keystore.New(direct, keystoretest.Format(t, "mon"))
	_, full := create(t, s, keystore.NewKey{OrgID: newOrg(t, direct, "pro"), Name: "k", Role: keystore.RoleAdmin})

	cfg, err := pgxpool.ParseConfig(u)
	if err != nil {
		t.Fatal(err)
	}
	p := schematest.Proxied(t, cfg)
	cfg.MaxConns = 4
	cfg.AfterConnect = keystore.PrepareLookups
	cfg.ShouldPing = func(_ context.Context, c pgxpool.ShouldPingParams) bool {
		return c.IdleDuration > time.Minute
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	openAll(t, pool)
	return keystore.New(pool, keystoretest.Format(t, "mon")), full, p
}

// openAll opens every connection of pool, which prepares the lookups on each, while
// the proxy adds no delay. Holding each until all are open, it opens them all
// whatever the machine's speed. A connection still cold when the database slows down
// is a connect and a preparation on top of the lookups of its first batch.
func openAll(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for range pool.Config().MaxConns {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatalf("opening the pool's connections: %v", err)
		}
		defer c.Release()
	}
}

func TestASlowDatabaseInsideTheTimeoutAnswersEveryLookup(t *testing.T) {
	// PostgreSQL answers in a bit more than half the timeout. Requests arriving while a
	// batch is in flight must not wait for it and then for their own. Every lookup
	// must answer; none may fail. The first batch runs inline; those after it go out
	// after a tenth of the timeout each. So a lookup waits at most 65% of the timeout
	// on an idle machine, and the rest is the margin for a busy one. Waiting for a
	// batch in flight and then for its own would take 110%.
	const timeout = 1500 * time.Millisecond
	s, full, proxy := slowStore(t)
	b := keystore.NewBatcher(s, keystore.BatcherOptions{Lanes: 1, Timeout: timeout})
	proxy.SetDelay(timeout * 55 / 100)

	const n = 100
	var (
		wg                sync.WaitGroup
		mu                sync.Mutex
		answered, failed  int
		slowest, firstBad time.Duration
		firstErr          error
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(i) * timeout / (4 * n)) // arrivals spread over a quarter timeout
			start := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			_, good, err := b.Verify(ctx, full)
			took := time.Since(start)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				if failed++; failed == 1 {
					firstBad, firstErr = took, err
				}
			case good:
				answered++
				slowest = max(slowest, took)
			}
		}()
	}
	wg.Wait()
	if answered != n || failed != 0 {
		t.Errorf("%d of %d lookups answered, the slowest after %v; %d failed, the first after %v: %v; want all answered within %v",
			answered, n, slowest.Round(time.Millisecond), failed, firstBad.Round(time.Millisecond), firstErr, timeout)
	}
}

func TestABatcherBoundsLookupsWithoutADeadlineByItsTimeout(t *testing.T) {
	// The gateway's lookups carry no deadline of their own. The Batcher's Timeout is
	// theirs, for the lookup run inline and for those waiting on a batch alike.
	const timeout = 300 * time.Millisecond
	s, full, proxy := slowStore(t)
	b := keystore.NewBatcher(s, keystore.BatcherOptions{Lanes: 1, Timeout: timeout})
	if _, good, err := b.Verify(context.Background(), full); !good || err != nil {
		t.Fatalf("before the hang: %v, %v", good, err)
	}
	proxy.Hang()
	var wg sync.WaitGroup
	var failed atomic.Int64
	start := time.Now()
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, _, err := b.Verify(context.Background(), full); err != nil {
				failed.Add(1)
			}
		}()
	}
	wg.Wait()
	waited := time.Since(start)
	proxy.Resume()
	if failed.Load() != 10 || waited < timeout || waited > 3*timeout {
		t.Errorf("%d of 10 lookups failed, after %v, while PostgreSQL hung; want 10 after %v", failed.Load(), waited, timeout)
	}
	if _, good, err := b.Verify(context.Background(), full); !good || err != nil {
		t.Errorf("after the hang: %v, %v", good, err)
	}
}
