package keystore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/schema/schematest"
)

// insertUsage writes rows as the roll-up leaves them: minutes with their rolled part,
// and days.
func insertUsage(t *testing.T, pool *pgxpool.Pool, table, org string, start time.Time, outcome keystore.Outcome, count, rolled int64) {
	t.Helper()
	sql := `INSERT INTO usage_days (org_id, key_id, start, outcome, status, count) VALUES ($1, $2, $3, $4, 200, $5)`
	args := []any{org, keyA, start, outcome.String(), count}
	if table == "usage_minutes" {
		sql = `INSERT INTO usage_minutes (org_id, key_id, start, outcome, status, count, rolled) VALUES ($1, $2, $3, $4, 200, $5, $6)`
		args = append(args, rolled)
	}
	if _, err := pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatal(err)
	}
}

func TestMonthUsedCountsTheRequestsThatPassedEveryBudget(t *testing.T) {
	ctx := context.Background()
	s, pool, _ := newStore(t, "pro")
	march := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	// Rolled up into days: counted from the days.
	insertUsage(t, pool, "usage_days", orgA, march, keystore.OutcomeProxied, 100, 0)
	insertUsage(t, pool, "usage_days", orgA, march.AddDate(0, 0, 30), keystore.OutcomeMe, 20, 0)
	insertUsage(t, pool, "usage_days", orgA, march.AddDate(0, 0, 2), keystore.OutcomeForbidden, 3, 0)
	// Minutes: only their part not rolled up yet (the rest is in the days).
	insertUsage(t, pool, "usage_minutes", orgA, march.Add(time.Minute), keystore.OutcomeProxied, 10, 10)
	insertUsage(t, pool, "usage_minutes", orgA, march.Add(2*time.Minute), keystore.OutcomeProxied, 10, 4)
	insertUsage(t, pool, "usage_minutes", orgA, march.AddDate(0, 1, 0).Add(-time.Minute), keystore.OutcomeMe, 5, 0)
	// Not counted: refused by a budget or before one, another month, another org.
	for _, o := range []keystore.Outcome{keystore.OutcomeRateLimited, keystore.OutcomeQuotaExceeded, keystore.OutcomeFeatureGated,
		keystore.OutcomeLimiterUnavailable, keystore.OutcomeIPDenied} {
		insertUsage(t, pool, "usage_days", orgA, march, o, 1000, 0)
		insertUsage(t, pool, "usage_minutes", orgA, march, o, 1000, 0)
	}
	insertUsage(t, pool, "usage_days", orgA, march.AddDate(0, -1, 0), keystore.OutcomeProxied, 1000, 0)
	insertUsage(t, pool, "usage_minutes", orgA, march.AddDate(0, 1, 0), keystore.OutcomeProxied, 1000, 0)
	insertUsage(t, pool, "usage_days", orgB, march, keystore.OutcomeProxied, 1000, 0)

	const want = 100 + 20 + 3 + 6 + 5
	for _, at := range []time.Time{march, march.AddDate(0, 0, 17).Add(5 * time.Hour), march.AddDate(0, 1, 0).Add(-time.Nanosecond)} {
		if got, err := s.MonthUsed(ctx, orgA, at); err != nil || got != want {
			t.Errorf("MonthUsed(%v) = %d, %v; want %d", at, got, err, want)
		}
	}
	// A month starts at UTC midnight, wherever its caller is.
	if got, err := s.MonthUsed(ctx, orgA, march.In(time.FixedZone("New York", -5*3600))); err != nil || got != want {
		t.Errorf("MonthUsed in another zone = %d, %v; want %d", got, err, want)
	}
	if got, err := s.MonthUsed(ctx, "not an org", march); err != nil || got != 0 {
		t.Errorf("MonthUsed of a malformed org id = %d, %v; want 0, nil", got, err)
	}

	// A recorder adds what it has not written yet, and only that: after its flush the
	// same requests are counted once.
	u := keystore.NewUsage(pool, keystore.UsageOptions{})
	u.Record(orgA, keyB, march.AddDate(0, 0, 9), keystore.OutcomeProxied, 200, 1)
	u.Record(orgA, keyB, march.AddDate(0, 0, 9), keystore.OutcomeMe, 200, 1)
	u.Record(orgA, keyB, march.AddDate(0, 0, 9), keystore.OutcomeRateLimited, 429, 1) // not counted
	u.Record(orgA, keyB, march.AddDate(0, 1, 0), keystore.OutcomeProxied, 200, 1)     // April
	u.Record(orgB, keyB, march, keystore.OutcomeProxied, 200, 1)                      // another org
	if got := u.Pending(orgA, march); got != 2 {
		t.Errorf("Pending = %d, want 2", got)
	}
	for _, flush := range []bool{false, true} {
		if flush {
			if err := u.Flush(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if got, err := u.MonthUsed(ctx, orgA, march); err != nil || got != want+2 {
			t.Errorf("Usage.MonthUsed (flushed %v) = %d, %v; want %d", flush, got, err, want+2)
		}
	}
}

func TestUsageCountsAFlushInProgressAsNotWritten(t *testing.T) {
	ctx := context.Background()
	pool, _ := schematest.NewPool(t)
	u := keystore.NewUsage(pool, keystore.UsageOptions{})
	u.Record(orgA, keyA, t0, keystore.OutcomeProxied, 200, 1)
	tx := holdLocks(t, pool, `LOCK TABLE usage_minutes IN EXCLUSIVE MODE`)
	flushed := make(chan error, 1)
	go func() { flushed <- u.Flush(ctx) }()
	waitForALockWait(t, pool) // the flush has taken its rows and reached the lock
	u.Record(orgA, keyA, t0, keystore.OutcomeProxied, 200, 1)
	if got := u.Pending(orgA, t0); got != 2 {
		t.Errorf("Pending during a flush = %d, want 2 (1 in flight, 1 since)", got)
	}
	// MonthUsed waits for the flush, then counts each request once.
	used := make(chan int64, 1)
	go func() {
		n, err := u.MonthUsed(ctx, orgA, t0)
		if err != nil {
			t.Error(err)
		}
		used <- n
	}()
	time.Sleep(100 * time.Millisecond) // MonthUsed waiting for the flush: nothing shows it waiting
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-flushed; err != nil {
		t.Fatal(err)
	}
	if got := <-used; got != 2 {
		t.Errorf("MonthUsed across a flush = %d, want 2", got)
	}
	// A caller that cannot wait for the flush gets its context's error.
	holdLocks(t, pool, `LOCK TABLE usage_minutes IN EXCLUSIVE MODE`)
	go func() { _ = u.Flush(ctx) }()
	waitForALockWait(t, pool)
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := u.MonthUsed(short, orgA, t0); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("MonthUsed behind a hung flush: %v, want its deadline", err)
	}
}
