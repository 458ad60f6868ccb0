package keystore_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keygate/keygate/internal/testkit/testenv"
	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/keystore/keystoretest"
	"github.com/keygate/keygate/schema/schematest"
)

// TestBatcherRefusesEveryRequestStartedAfterARevokeCommits is the freshness guarantee
// under load. Many goroutines verify keys through batches while the key is revoked.
// Every verification that started after Revoke returned must be refused.
func TestBatcherRefusesEveryRequestStartedAfterARevokeCommits(t *testing.T) {
	for _, lanes := range []int{1, 3} {
		t.Run(map[int]string{1: "one lane", 3: "three lanes"}[lanes], func(t *testing.T) {
			testFreshness(t, lanes)
		})
	}
}

func testFreshness(t *testing.T, lanes int) {
	ctx := context.Background()
	s, _, org := newStore(t, "pro")
	b := keystore.NewBatcher(s, keystore.BatcherOptions{Lanes: lanes})

	victim, victimKey := create(t, s, keystore.NewKey{OrgID: org, Name: "victim", Role: keystore.RoleAdmin})
	// Other keys keep the batches mixed, as in real traffic.
	var others []string
	for range 4 {
		_, full := create(t, s, keystore.NewKey{OrgID: org, Name: "other", Role: keystore.RoleViewer})
		others = append(others, full)
	}

	type outcome struct {
		start time.Time
		ok    bool
		err   error
	}
	var (
		mu       sync.Mutex
		outcomes []outcome
		stop     atomic.Bool
		wg       sync.WaitGroup
		verified atomic.Int64 // the victim's verifications done
	)
	for i := range 48 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				if i%4 == 0 {
					if _, ok, err := b.Verify(ctx, others[i%len(others)]); !ok || err != nil {
						t.Errorf("another key refused: %v, %v", ok, err)
						return
					}
					continue
				}
				start := time.Now()
				_, ok, err := b.Verify(ctx, victimKey)
				mu.Lock()
				outcomes = append(outcomes, outcome{start, ok, err})
				mu.Unlock()
				verified.Add(1)
			}
		}()
	}

	// Under load: 200 verifications before the revoke, and 200 begun after it (the
	// 36 in flight when it commits began before).
	testenv.Eventually(t, 30*time.Second, "200 verifications of the victim", func() bool { return verified.Load() >= 200 })
	if found, err := s.Revoke(ctx, org, victim.ID, "test"); !found || err != nil {
		t.Fatalf("Revoke = %v, %v", found, err)
	}
	committed := time.Now()
	mark := verified.Load()
	testenv.Eventually(t, 30*time.Second, "200 verifications after the revoke", func() bool { return verified.Load() >= mark+36+200 })
	stop.Store(true)
	wg.Wait()

	var before, after, staleAccepted int
	for _, o := range outcomes {
		if o.err != nil {
			t.Fatalf("Verify failed: %v", o.err)
		}
		if o.start.After(committed) {
			after++
			if o.ok {
				staleAccepted++
			}
		} else if o.ok {
			before++
		}
	}
	if staleAccepted > 0 {
		t.Errorf("%d of %d verifications that started after the revoke committed accepted the key", staleAccepted, after)
	}
	if before == 0 || after == 0 {
		t.Fatalf("the test saw %d accepted before and %d verifications after the revoke: no load to speak of", before, after)
	}
	st := b.Stats()
	if st.Queries == 0 || st.Lookups/st.Queries < 2 && float64(len(outcomes))/float64(st.Queries) < 2 {
		t.Errorf("no batching happened: %+v for %d verifications", st, len(outcomes))
	}
	t.Logf("%d verifications (%d after the revoke), %d queries", len(outcomes), after, st.Queries)
}

func TestBatcherGathersConcurrentLookupsIntoFewQueries(t *testing.T) {
	ctx := context.Background()
	s, _, org := newStore(t, "pro")
	b := keystore.NewBatcher(s, keystore.BatcherOptions{})
	var keys []string
	for range 20 {
		_, full := create(t, s, keystore.NewKey{OrgID: org, Name: "k", Role: keystore.RoleEditor})
		keys = append(keys, full)
	}
	var wg sync.WaitGroup
	const n = 400
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if k, ok, err := b.Verify(ctx, keys[i%len(keys)]); !ok || err != nil || k.Role != keystore.RoleEditor {
				t.Errorf("Verify = %+v, %v, %v", k, ok, err)
			}
		}()
	}
	wg.Wait()
	st := b.Stats()
	if st.Queries >= n/2 {
		t.Errorf("%d verifications took %d queries; want them batched", n, st.Queries)
	}
	t.Logf("%d verifications, %+v", n, st)
}

func TestBatcherRecoversAfterADatabaseError(t *testing.T) {
	ctx := context.Background()
	s, pool, org := newStore(t, "pro")
	b := keystore.NewBatcher(s, keystore.BatcherOptions{Timeout: 200 * time.Millisecond})
	_, full := create(t, s, keystore.NewKey{OrgID: org, Name: "k", Role: keystore.RoleAdmin})

	tx := holdLocks(t, pool, `LOCK TABLE api_keys IN ACCESS EXCLUSIVE MODE`)
	// The batch query ends at its own timeout, even if the caller would wait longer.
	if _, ok, err := b.Verify(ctx, full); ok || err == nil {
		t.Errorf("Verify on a locked table = %v, %v; want an error", ok, err)
	}
	tx.Rollback(ctx)
	if _, ok, err := b.Verify(ctx, full); !ok || err != nil {
		t.Errorf("Verify after the lock was released = %v, %v", ok, err)
	}
}

// TestBatcherReportsEveryBatchToOnBatch: OnBatch sees every query sent, with the number
// of distinct key ids in it. So a histogram fed by it counts what Stats counts.
func TestBatcherReportsEveryBatchToOnBatch(t *testing.T) {
	ctx := context.Background()
	s, _, org := newStore(t, "pro")
	var (
		mu    sync.Mutex
		sizes []int
	)
	b := keystore.NewBatcher(s, keystore.BatcherOptions{OnBatch: func(size int) {
		mu.Lock()
		sizes = append(sizes, size)
		mu.Unlock()
	}})
	var keys []string
	for range 10 {
		_, full := create(t, s, keystore.NewKey{OrgID: org, Name: "k", Role: keystore.RoleEditor})
		keys = append(keys, full)
	}

	// One lookup alone is a batch of one.
	if _, ok, err := b.Verify(ctx, keys[0]); !ok || err != nil {
		t.Fatalf("Verify = %v, %v", ok, err)
	}
	mu.Lock()
	if len(sizes) != 1 || sizes[0] != 1 {
		t.Errorf("after one lookup OnBatch saw %v, want [1]", sizes)
	}
	mu.Unlock()

	var wg sync.WaitGroup
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, ok, err := b.Verify(ctx, keys[i%len(keys)]); !ok || err != nil {
				t.Errorf("Verify = %v, %v", ok, err)
			}
		}()
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	st := b.Stats()
	sum := 0
	for _, n := range sizes {
		if n < 1 || n > len(keys) {
			t.Errorf("a batch of %d ids; want 1..%d (distinct ids)", n, len(keys))
		}
		sum += n
	}
	if uint64(len(sizes)) != st.Queries || uint64(sum) != st.Lookups {
		t.Errorf("OnBatch saw %d batches of %d ids in all; Stats says %+v", len(sizes), sum, st)
	}
}

// lookupTracer records every key lookup a pool sends: how many arguments it has, and
// whether its context is marked as a request's own (keystore.RequestLookup).
type lookupTracer struct {
	mu      sync.Mutex
	lookups []tracedLookup
}

type tracedLookup struct {
	args   int
	marked bool
}

func (tr *lookupTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "FROM api_keys k") {
		tr.mu.Lock()
		tr.lookups = append(tr.lookups, tracedLookup{len(d.Args), keystore.RequestLookup(ctx)})
		tr.mu.Unlock()
	}
	return ctx
}

func (tr *lookupTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (tr *lookupTracer) seen() []tracedLookup {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]tracedLookup(nil), tr.lookups...)
}

// TestBatcherMarksOnlyTheLookupsItRunsInline: a request alone in its batch runs its
// lookup on its own goroutine, marked for RequestLookup. A batch of several runs on the
// Batcher's goroutine, unmarked: no one request waits on it directly.
func TestBatcherMarksOnlyTheLookupsItRunsInline(t *testing.T) {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(schematest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	tr := &lookupTracer{}
	cfg.ConnConfig.Tracer = tr
	pool := schematest.OpenPool(t, cfg)
	s := keystore.New(pool, keystoretest.Format(t, "mon"))
	org := newOrg(t, pool, "pro")
	var keys []string
	for range 5 {
		_, full := create(t, s, keystore.NewKey{OrgID: org, Name: "k", Role: keystore.RoleViewer})
		keys = append(keys, full)
	}
	b := keystore.NewBatcher(s, keystore.BatcherOptions{Timeout: time.Minute})

	if _, ok, err := b.Verify(ctx, keys[0]); !ok || err != nil {
		t.Fatalf("a lone Verify = %v, %v", ok, err)
	}
	// With the table locked, a lone lookup holds the one lane while the next requests
	// gather into one batch behind it.
	tx := holdLocks(t, pool, `LOCK TABLE api_keys IN ACCESS EXCLUSIVE MODE`)
	var wg sync.WaitGroup
	verify := func(key string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, ok, err := b.Verify(ctx, key); !ok || err != nil {
				t.Errorf("Verify = %v, %v", ok, err)
			}
		}()
	}
	verify(keys[0])
	testenv.Eventually(t, 10*time.Second, "the lone lookup sent to the locked table", func() bool { return len(tr.seen()) >= 2 })
	for _, key := range keys[1:] {
		verify(key)
	}
	// Time for the four to gather behind the locked lookup: nothing shows a call waiting
	// in the Batcher.
	time.Sleep(200 * time.Millisecond)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()

	seen := tr.seen()
	batched := 0
	for i, l := range seen {
		switch {
		case i < 2 && (l.args != 3 || !l.marked):
			t.Errorf("lookup %d, of a lone request, = %+v; want one id, its digest and address, marked", i, l)
		case l.args > 3 && l.marked:
			t.Errorf("lookup %d, of a batch, = %+v; want it unmarked", i, l)
		}
		if l.args > 3 {
			batched++
		}
	}
	if batched == 0 {
		t.Errorf("lookups %+v: no batch of several ids formed behind the locked one", seen)
	}
}
