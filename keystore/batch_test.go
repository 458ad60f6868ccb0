package keystore_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keygate/keygate/keystore"
)

// TestBatcherRefusesEveryRequestStartedAfterARevokeCommits is the freshness guarantee
// under load: many goroutines verify keys through batches while the key is revoked;
// every verification that started after Revoke returned must be refused.
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
			}
		}()
	}

	time.Sleep(300 * time.Millisecond)
	if found, err := s.Revoke(ctx, org, victim.ID, "test"); !found || err != nil {
		t.Fatalf("Revoke = %v, %v", found, err)
	}
	committed := time.Now()
	time.Sleep(300 * time.Millisecond)
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
	// The batch query times out on its own timeout even if the caller would wait longer.
	if _, ok, err := b.Verify(ctx, full); ok || err == nil {
		t.Errorf("Verify on a locked table = %v, %v; want an error", ok, err)
	}
	tx.Rollback(ctx)
	if _, ok, err := b.Verify(ctx, full); !ok || err != nil {
		t.Errorf("Verify after the lock was released = %v, %v", ok, err)
	}
}

// TestBatcherReportsEveryBatchToOnBatch: OnBatch sees every query sent, with the number
// of distinct key ids in it, so that a histogram fed by it counts what Stats counts.
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
