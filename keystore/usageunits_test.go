package keystore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/schema/schematest"
)

// unitRows returns usage_minutes as "key outcome status count extra units" lines, in
// primary key order.
func unitRows(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT key_id, outcome, status, count, extra
		FROM usage_minutes ORDER BY org_id, start, key_id COLLATE "C", outcome COLLATE "C", status`)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for rows.Next() {
		var key, outcome string
		var status int16
		var count, extra int64
		if err := rows.Scan(&key, &outcome, &status, &count, &extra); err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%s %s %d %d %d %d", key[:4], outcome, status, count, extra, count+extra))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestUsageCountsEachRequestsUnits: a row holds its requests and the sum of their
// units, as count and the units beyond one a request (extra); units below 1 count as
// 1. Units held in memory are in Pending, and a failed flush keeps them.
func TestUsageCountsEachRequestsUnits(t *testing.T) {
	ctx := context.Background()
	pool, _ := schematest.NewPool(t)
	u := keystore.NewUsage(pool, keystore.UsageOptions{})
	for _, units := range []int{5, 5, 1, 0, -3} {
		u.Record(orgA, keyA, t0, keystore.OutcomeProxied, 201, units)
	}
	u.Record(orgA, keyA, t0, keystore.OutcomeRateLimited, 429, 20)
	u.Record(orgA, keyB, t0, keystore.OutcomeMe, 200, 1)
	// me and proxied count in a month; rate_limited does not.
	if got := u.Pending(orgA, t0); got != 5+5+1+1+1+1 { // proxied 13, me 1
		t.Errorf("Pending = %d, want the units of the month's outcomes, 14", got)
	}
	restore := refuseWrites(t, pool)
	if err := u.Flush(ctx); err == nil {
		t.Fatal("a refused flush succeeded")
	}
	restore()
	u.Record(orgA, keyA, t0, keystore.OutcomeProxied, 201, 7) // counted after the failure
	if err := u.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"AAAA proxied 201 6 14 20",
		"AAAA rate_limited 429 1 19 20",
		"BBBB me 200 1 0 1",
	}
	wantLines(t, "usage_minutes", unitRows(t, pool), want...)

	// A second flush adds to the rows: units as requests.
	u.Record(orgA, keyA, t0, keystore.OutcomeProxied, 201, 3)
	if err := u.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	want[0] = "AAAA proxied 201 7 16 23"
	wantLines(t, "usage_minutes after a second flush", unitRows(t, pool), want...)
	if got, err := u.MonthUsed(ctx, orgA, t0); err != nil || got != 23+1 {
		t.Errorf("MonthUsed = %d, %v; want the month's units, 24", got, err)
	}
}

// TestUsageWriteOfTheLastReleaseCountsOneUnitARequest: a gateway of the release
// before units writes count alone; its requests then weigh 1 each, beside the units of
// this release's writes to the same row.
func TestUsageWriteOfTheLastReleaseCountsOneUnitARequest(t *testing.T) {
	ctx := context.Background()
	pool, _ := schematest.NewPool(t)
	// The last release's statement, as it was.
	const lastRelease = `WITH flush AS (
	INSERT INTO usage_flushes (id) VALUES ($1) ON CONFLICT DO NOTHING RETURNING id)
INSERT INTO usage_minutes AS m (org_id, key_id, start, outcome, status, count)
SELECT * FROM unnest($2::uuid[], $3::text[], $4::timestamptz[], $5::text[], $6::smallint[], $7::bigint[])
WHERE EXISTS (SELECT FROM flush)
ON CONFLICT (org_id, start, key_id, outcome, status) DO UPDATE SET count = m.count + EXCLUDED.count`
	old := func(id string, count int64) {
		t.Helper()
		if _, err := pool.Exec(ctx, lastRelease, id, []string{orgA}, []string{keyA}, []time.Time{t0},
			[]string{keystore.OutcomeProxied.String()}, []int16{200}, []int64{count}); err != nil {
			t.Fatal(err)
		}
	}
	old("00000000-0000-4000-8000-000000000001", 3)
	wantLines(t, "usage_minutes, written by the last release", unitRows(t, pool), "AAAA proxied 200 3 0 3")

	u := keystore.NewUsage(pool, keystore.UsageOptions{})
	u.Record(orgA, keyA, t0, keystore.OutcomeProxied, 200, 4)
	if err := u.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	old("00000000-0000-4000-8000-000000000002", 2)
	wantLines(t, "usage_minutes, written by both", unitRows(t, pool), "AAAA proxied 200 6 3 9")
	if got, err := u.MonthUsed(ctx, orgA, t0); err != nil || got != 9 {
		t.Errorf("MonthUsed = %d, %v; want 9", got, err)
	}
}

// TestMonthUsedCountsUnits: the month's re-seed reads units, count + extra, of the
// days and of the minutes' parts not rolled up, each part on its own: the last
// release's roll-up marks count rolled and leaves extra to this one's.
func TestMonthUsedCountsUnits(t *testing.T) {
	ctx := context.Background()
	s, pool, _ := newStore(t, "pro")
	march := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	for _, row := range []struct {
		sql  string
		args []any
	}{
		{`INSERT INTO usage_days (org_id, key_id, start, outcome, status, count, extra)
			VALUES ($1, $2, $3, 'proxied', 201, 10, 40)`, []any{orgA, keyA, march}},
		// Rolled up in full: in the day above already.
		{`INSERT INTO usage_minutes (org_id, key_id, start, outcome, status, count, rolled, extra, extra_rolled)
			VALUES ($1, $2, $3, 'proxied', 201, 10, 10, 40, 40)`, []any{orgA, keyA, march}},
		// Half rolled up: 2 requests and 8 units beyond them are not in a day yet.
		{`INSERT INTO usage_minutes (org_id, key_id, start, outcome, status, count, rolled, extra, extra_rolled)
			VALUES ($1, $2, $3, 'proxied', 201, 5, 3, 20, 12)`, []any{orgA, keyA, march.Add(time.Minute)}},
		// count rolled up by the last release, extra not yet.
		{`INSERT INTO usage_minutes (org_id, key_id, start, outcome, status, count, rolled, extra, extra_rolled)
			VALUES ($1, $2, $3, 'me', 200, 4, 4, 6, 0)`, []any{orgA, keyA, march.Add(2 * time.Minute)}},
		// Refused by a budget: not counted, whatever its units.
		{`INSERT INTO usage_minutes (org_id, key_id, start, outcome, status, count, rolled, extra, extra_rolled)
			VALUES ($1, $2, $3, 'quota_exceeded', 402, 1, 0, 99, 0)`, []any{orgA, keyA, march}},
	} {
		if _, err := pool.Exec(ctx, row.sql, row.args...); err != nil {
			t.Fatal(err)
		}
	}
	const want = 50 + (2 + 8) + 6
	if got, err := s.MonthUsed(ctx, orgA, march); err != nil || got != want {
		t.Errorf("MonthUsed = %d, %v; want %d", got, err, want)
	}
}

// TestUsageRefusedFlushKeepsItsUnitsBesideNewerOnes: the units of a write PostgreSQL
// refused are counted again into the row counted while it was in flight.
func TestUsageRefusedFlushKeepsItsUnitsBesideNewerOnes(t *testing.T) {
	ctx := context.Background()
	pool, _ := schematest.NewPool(t)
	// The constraint that refuses every write, held uncommitted: the flush waits for
	// its lock, then meets it.
	tx := holdLocks(t, pool, `ALTER TABLE usage_minutes ADD CONSTRAINT refused CHECK (false) NOT VALID`)
	u := keystore.NewUsage(pool, keystore.UsageOptions{})
	u.Record(orgA, keyA, t0, keystore.OutcomeProxied, 200, 5)
	flushed := make(chan error, 1)
	go func() { flushed <- u.Flush(ctx) }()
	waitForALockWait(t, pool)
	u.Record(orgA, keyA, t0, keystore.OutcomeProxied, 200, 7) // while the first is in flight
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-flushed; err == nil {
		t.Fatal("a refused flush succeeded")
	}
	if _, err := pool.Exec(ctx, `ALTER TABLE usage_minutes DROP CONSTRAINT refused`); err != nil {
		t.Fatal(err)
	}
	if err := u.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	wantLines(t, "usage_minutes", unitRows(t, pool), "AAAA proxied 200 2 10 12")
}
