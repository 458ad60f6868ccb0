package keystore_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keygate/keygate/internal/testkit/testenv"
	"github.com/keygate/keygate/keystore"
)

// lastUsedOf returns the key's last_used_at as List shows it.
func lastUsedOf(t *testing.T, s *keystore.Store, org, keyID string) *time.Time {
	t.Helper()
	list, err := s.List(context.Background(), org)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range list {
		if r.ID == keyID {
			return r.LastUsedAt
		}
	}
	t.Fatalf("key %s is not listed", keyID)
	return nil
}

func TestLastUsedFlushWritesTheRecordedKeysOnly(t *testing.T) {
	ctx := context.Background()
	s, pool, org := newStore(t, "pro")
	used, _ := create(t, s, keystore.NewKey{OrgID: org, Name: "used", Role: keystore.RoleEditor})
	idle, _ := create(t, s, keystore.NewKey{OrgID: org, Name: "idle", Role: keystore.RoleEditor})
	var flushed []int
	lu := keystore.NewLastUsed(pool, keystore.LastUsedOptions{OnFlush: func(n int, err error) {
		if err != nil {
			t.Errorf("flush failed: %v", err)
		}
		flushed = append(flushed, n)
	}})

	if got := lastUsedOf(t, s, org, used.ID); got != nil {
		t.Fatalf("a new key lists last_used_at %v, want none", got)
	}
	before := time.Now()
	for range 3 {
		lu.Record(used.ID)
	}
	if err := lu.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	got := lastUsedOf(t, s, org, used.ID)
	if got == nil || got.Before(before.Add(-time.Minute)) || got.After(time.Now().Add(time.Minute)) {
		t.Errorf("last_used_at = %v, want about %v", got, before)
	}
	if got := lastUsedOf(t, s, org, idle.ID); got != nil {
		t.Errorf("an unused key lists last_used_at %v", got)
	}
	// Nothing noted since: the next flush sends nothing.
	if err := lu.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if len(flushed) != 1 || flushed[0] != 1 {
		t.Errorf("flushes wrote %v ids, want one flush of 1", flushed)
	}
	if after := lastUsedOf(t, s, org, used.ID); !after.Equal(*got) {
		t.Errorf("an empty flush moved last_used_at from %v to %v", got, after)
	}
}

func TestLastUsedNeverGoesBack(t *testing.T) {
	ctx := context.Background()
	s, pool, org := newStore(t, "pro")
	k, _ := create(t, s, keystore.NewKey{OrgID: org, Name: "k", Role: keystore.RoleEditor})
	future := time.Now().Add(time.Hour).UTC().Truncate(time.Microsecond)
	if _, err := pool.Exec(ctx, `INSERT INTO api_key_last_used (key_id, last_used_at) VALUES ($1, $2)`, k.ID, future); err != nil {
		t.Fatal(err)
	}
	lu := keystore.NewLastUsed(pool, keystore.LastUsedOptions{})
	lu.Record(k.ID)
	if err := lu.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if got := lastUsedOf(t, s, org, k.ID); got == nil || !got.Equal(future) {
		t.Errorf("last_used_at = %v, want it kept at %v", got, future)
	}
}

func TestLastUsedIsBoundedAndCountsWhatItDrops(t *testing.T) {
	ctx := context.Background()
	s, pool, org := newStore(t, "pro")
	var ids []string
	for range 3 {
		r, _ := create(t, s, keystore.NewKey{OrgID: org, Name: "k", Role: keystore.RoleEditor})
		ids = append(ids, r.ID)
	}
	var drops atomic.Int64
	lu := keystore.NewLastUsed(pool, keystore.LastUsedOptions{MaxPending: 2, OnDrop: func() { drops.Add(1) }})
	for _, id := range ids {
		lu.Record(id)
		lu.Record(id) // already noted: neither stored twice nor dropped
	}
	if got := drops.Load(); got != 2 {
		t.Errorf("dropped %d, want 2 (the third key, twice)", got)
	}
	if err := lu.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	for i, id := range ids {
		if got := lastUsedOf(t, s, org, id); (got != nil) != (i < 2) {
			t.Errorf("key %d: last_used_at %v", i, got)
		}
	}
	// After a flush there is room again.
	lu.Record(ids[2])
	if err := lu.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if got := lastUsedOf(t, s, org, ids[2]); got == nil {
		t.Error("the key dropped earlier is not written after the next flush")
	}
}

func TestLastUsedKeepsTheIdsOfAFailedFlush(t *testing.T) {
	s, pool, org := newStore(t, "pro")
	k, _ := create(t, s, keystore.NewKey{OrgID: org, Name: "k", Role: keystore.RoleEditor})
	var errs []error
	lu := keystore.NewLastUsed(pool, keystore.LastUsedOptions{OnFlush: func(_ int, err error) { errs = append(errs, err) }})
	lu.Record(k.ID)
	dead, cancel := context.WithCancel(context.Background())
	cancel()
	if err := lu.Flush(dead); err == nil {
		t.Fatal("a flush under a cancelled context succeeded")
	}
	if got := lastUsedOf(t, s, org, k.ID); got != nil {
		t.Fatalf("last_used_at %v after a failed flush", got)
	}
	if err := lu.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := lastUsedOf(t, s, org, k.ID); got == nil {
		t.Error("the failed flush's key is not written by the next one")
	}
	if len(errs) != 2 || errs[0] == nil || errs[1] != nil {
		t.Errorf("OnFlush saw %v, want a failure then a success", errs)
	}
}

// TestRecordDoesNotWaitForABlockedFlush holds the key's row locked, so that a flush
// waits on it, and records meanwhile.
func TestRecordDoesNotWaitForABlockedFlush(t *testing.T) {
	ctx := context.Background()
	s, pool, org := newStore(t, "pro")
	k, _ := create(t, s, keystore.NewKey{OrgID: org, Name: "k", Role: keystore.RoleEditor})
	tx := holdLocks(t, pool, `SELECT 1 FROM api_keys WHERE key_id = $1 FOR UPDATE`, k.ID)

	lu := keystore.NewLastUsed(pool, keystore.LastUsedOptions{})
	lu.Record(k.ID)
	flushed := make(chan error, 1)
	go func() { flushed <- lu.Flush(ctx) }()
	waitForALockWait(t, pool)
	select {
	case err := <-flushed:
		t.Fatalf("the flush returned (%v) while the row was locked", err)
	default:
	}
	recorded := make(chan struct{})
	go func() {
		for range 1000 {
			lu.Record(k.ID)
		}
		close(recorded)
	}()
	select {
	case <-recorded:
	case <-time.After(5 * time.Second):
		t.Fatal("Record waited for the blocked flush")
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-flushed; err != nil {
		t.Fatalf("the flush failed once the lock was released: %v", err)
	}
	if got := lastUsedOf(t, s, org, k.ID); got == nil {
		t.Error("last_used_at not written once the lock was released")
	}
}

func TestRunFlushesEveryIntervalAndOnceMoreWhenStopped(t *testing.T) {
	s, pool, org := newStore(t, "pro")
	a, _ := create(t, s, keystore.NewKey{OrgID: org, Name: "a", Role: keystore.RoleEditor})
	b, _ := create(t, s, keystore.NewKey{OrgID: org, Name: "b", Role: keystore.RoleEditor})
	lu := keystore.NewLastUsed(pool, keystore.LastUsedOptions{Interval: 100 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { lu.Run(ctx); close(done) }()

	lu.Record(a.ID)
	testenv.Eventually(t, 10*time.Second, "Run's flush at an interval of 100ms", func() bool {
		return lastUsedOf(t, s, org, a.ID) != nil
	})
	cancel()
	<-done

	// An hour's interval: only the flush of a stopping Run can write b.
	lu = keystore.NewLastUsed(pool, keystore.LastUsedOptions{Interval: time.Hour})
	ctx, cancel = context.WithCancel(context.Background())
	done = make(chan struct{})
	go func() { lu.Run(ctx); close(done) }()
	lu.Record(b.ID)
	cancel()
	<-done
	if got := lastUsedOf(t, s, org, b.ID); got == nil {
		t.Error("the key recorded before Run stopped was not flushed")
	}
}

func TestNilLastUsedRecordsNothing(t *testing.T) {
	var lu *keystore.LastUsed
	lu.Record("AbCdEfGhIjKlMnOpQrStUv") // must not panic
}

// TestLastUsedOfTheLastReleaseAndThisOneShowTheLater: while gateways roll, those of
// the release before api_key_last_used still write api_keys.last_used_at, with their
// own statement, and the key list shows the later of what either release wrote.
func TestLastUsedOfTheLastReleaseAndThisOneShowTheLater(t *testing.T) {
	ctx := context.Background()
	s, pool, org := newStore(t, "pro")
	k, _ := create(t, s, keystore.NewKey{OrgID: org, Name: "k", Role: keystore.RoleEditor})
	// The last release's statement, as it was.
	const lastRelease = `UPDATE api_keys SET last_used_at = now()
WHERE key_id = ANY($1) AND (last_used_at IS NULL OR last_used_at < now())`
	lu := keystore.NewLastUsed(pool, keystore.LastUsedOptions{})
	var seen []time.Time
	for i, write := range []func() error{
		func() error { _, err := pool.Exec(ctx, lastRelease, []string{k.ID}); return err },
		func() error { lu.Record(k.ID); return lu.Flush(ctx) },
		func() error { _, err := pool.Exec(ctx, lastRelease, []string{k.ID}); return err },
	} {
		if err := write(); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
		got := lastUsedOf(t, s, org, k.ID)
		if got == nil || (len(seen) > 0 && !got.After(seen[len(seen)-1])) {
			t.Fatalf("after write %d (of %s) the list shows %v, want later than %v", i,
				[]string{"the last release", "this release", "the last release"}[i], got, seen)
		}
		seen = append(seen, *got)
	}
}
