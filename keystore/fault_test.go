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
// also returns a key in it, and the proxy.
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
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return keystore.New(pool, keystoretest.Format(t, "mon")), full, p
}

func TestASlowDatabaseInsideTheTimeoutAnswersEveryLookup(t *testing.T) {
	// PostgreSQL answers in a bit more than half the timeout. Requests arriving while a
	// batch is in flight must not wait for it and then for their own. Every lookup
	// must answer; none may fail.
	const timeout = 1500 * time.Millisecond
	s, full, proxy := slowStore(t)
	b := keystore.NewBatcher(s, keystore.BatcherOptions{Lanes: 1, Timeout: timeout})

	run := func(n int, timeout time.Duration) (ok, failed int64) {
		var okN, failedN atomic.Int64
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				time.Sleep(time.Duration(i) * timeout / time.Duration(4*n)) // arrivals spread over a quarter timeout
				ctx, cancel := context.WithTimeout(context.Background(), timeout)
				defer cancel()
				if _, good, err := b.Verify(ctx, full); err != nil {
					if failedN.Add(1) == 1 {
						t.Log(time.Now().Format("05.000"), err)
					}
				} else if good {
					okN.Add(1)
				}
			}()
		}
		wg.Wait()
		return okN.Load(), failedN.Load()
	}
	// Warm: connections open and their statements prepared, at a speed where the extra
	// round trips fit in the timeout. A connection still cold when the database slows
	// down is a 503 for the requests of its first batch.
	proxy.SetDelay(timeout * 25 / 100)
	run(100, timeout)
	proxy.SetDelay(timeout * 55 / 100)
	if ok, failed := run(100, timeout); ok != 100 || failed != 0 {
		t.Errorf("%d of 100 lookups answered, %d failed; want all answered", ok, failed)
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
