package store_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/upstream/store"
)

// recordUnits counts n requests of units each and flushes them, as a gateway does.
func recordUnits(t *testing.T, u *keystore.Usage, key string, at time.Time, outcome keystore.Outcome, status, n, units int) {
	t.Helper()
	for range n {
		u.Record(usageOrg, key, at, outcome, status, units)
	}
	if err := u.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// unitLines shows rows as "start key outcome status count units".
func unitLines(rows []store.UsageRow) string {
	var b strings.Builder
	for _, r := range rows {
		fmt.Fprintf(&b, "%s %s %s %d %d %d\n", r.Start.Format("01-02T15:04"), r.KeyID[:4], r.Outcome, r.Status, r.Count, r.Units)
	}
	return b.String()
}

// rolledUnits returns the units usage_hours and usage_days hold, and the minute rows
// with a part not rolled up.
func rolledUnits(t *testing.T, pool *pgxpool.Pool) (hours, days, unrolled int64) {
	t.Helper()
	if err := pool.QueryRow(context.Background(), `SELECT
		(SELECT coalesce(sum(count + extra), 0) FROM usage_hours),
		(SELECT coalesce(sum(count + extra), 0) FROM usage_days),
		(SELECT count(*) FROM usage_minutes WHERE count > rolled OR extra > extra_rolled)`).Scan(&hours, &days, &unrolled); err != nil {
		t.Fatal(err)
	}
	return hours, days, unrolled
}

// wantUnits checks the rows read by granularity, the totals by key and by start
// included.
func wantUnits(t *testing.T, s *store.Store, what, granularity, want string) {
	t.Helper()
	if got := unitLines(readUsage(t, s, everything(granularity))); got != want {
		t.Errorf("%s, by %s:\n%swant:\n%s", what, granularity, got, want)
	}
}

// TestRollUpAddsUnitsExactly: the units of a minute row reach its hour and its day
// once, whether read before the roll-up, after it, or with late writes on top, and
// the reads' totals by key and by start carry them.
func TestRollUpAddsUnitsExactly(t *testing.T) {
	ctx := context.Background()
	s, pool := usageStore(t)
	u := keystore.NewUsage(pool, keystore.UsageOptions{})
	recordUnits(t, u, usageKeyA, midnight.Add(-2*time.Minute), keystore.OutcomeProxied, 201, 3, 5)
	recordUnits(t, u, usageKeyA, midnight.Add(-time.Minute), keystore.OutcomeProxied, 201, 2, 5)
	recordUnits(t, u, usageKeyA, midnight.Add(-time.Minute), keystore.OutcomeProxied, 200, 4, 1)
	recordUnits(t, u, usageKeyZ, midnight, keystore.OutcomeRateLimited, 429, 2, 20)
	wantDays := "" +
		"03-14T00:00 AAAA proxied 200 4 4\n" +
		"03-14T00:00 AAAA proxied 201 5 25\n" +
		"03-15T00:00 ZZZZ rate_limited 429 2 40\n"
	wantUnits(t, s, "before the roll-up", store.UsageDay, wantDays)
	wantUnits(t, s, "before the roll-up", store.UsageMinute, ""+
		"03-14T23:58 AAAA proxied 201 3 15\n"+
		"03-14T23:59 AAAA proxied 200 4 4\n"+
		"03-14T23:59 AAAA proxied 201 2 10\n"+
		"03-15T00:00 ZZZZ rate_limited 429 2 40\n")

	if n, err := s.RollUpUsage(ctx); err != nil || n != 4 {
		t.Fatalf("RollUpUsage = %d, %v; want the 4 minute rows", n, err)
	}
	wantUnits(t, s, "after the roll-up", store.UsageDay, wantDays)
	if hours, days, unrolled := rolledUnits(t, pool); hours != 69 || days != 69 || unrolled != 0 {
		t.Errorf("after the roll-up: %d units by hour, %d by day, %d minute rows unrolled; want 69, 69, 0", hours, days, unrolled)
	}

	// Late writes to a minute rolled up, and to a new one.
	recordUnits(t, u, usageKeyA, midnight.Add(-time.Minute), keystore.OutcomeProxied, 201, 1, 5)
	recordUnits(t, u, usageKeyA, midnight.Add(-30*time.Minute), keystore.OutcomeProxied, 201, 1, 3)
	wantHours := "" +
		"03-14T23:00 AAAA proxied 200 4 4\n" +
		"03-14T23:00 AAAA proxied 201 7 33\n" + // 5 requests and 25 units rolled up, 2 and 8 not yet
		"03-15T00:00 ZZZZ rate_limited 429 2 40\n"
	wantUnits(t, s, "with late writes", store.UsageHour, wantHours)
	if n, err := s.RollUpUsage(ctx); err != nil || n != 2 {
		t.Errorf("RollUpUsage of the late writes = %d, %v; want 2", n, err)
	}
	wantUnits(t, s, "after the late writes' roll-up", store.UsageHour, wantHours)
	if hours, days, unrolled := rolledUnits(t, pool); hours != 77 || days != 77 || unrolled != 0 {
		t.Errorf("after the late writes' roll-up: %d units by hour, %d by day, %d minute rows unrolled; want 77, 77, 0", hours, days, unrolled)
	}

	q := everything(store.UsageDay)
	byKey, err := s.UsageByKey(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := unitLines(byKey), ""+
		"01-01T00:00 AAAA proxied 200 4 4\n"+
		"01-01T00:00 AAAA proxied 201 7 33\n"+
		"01-01T00:00 ZZZZ rate_limited 429 2 40\n"; got != want {
		t.Errorf("UsageByKey:\n%swant:\n%s", got, want)
	}
	byStart, err := s.UsageByStart(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := unitLines(withKey(byStart)), ""+
		"03-14T00:00 ---- proxied 200 4 4\n"+
		"03-14T00:00 ---- proxied 201 7 33\n"+
		"03-15T00:00 ---- rate_limited 429 2 40\n"; got != want {
		t.Errorf("UsageByStart:\n%swant:\n%s", got, want)
	}
}

// TestRollUpAddsTheUnitsTheLastReleaseLeft: the roll-up of the release before units
// adds a minute's requests to its hour and day and marks count rolled, and knows
// nothing of extra. This release's roll-up adds the extra alone, and the reads show
// the units whole throughout.
func TestRollUpAddsTheUnitsTheLastReleaseLeft(t *testing.T) {
	ctx := context.Background()
	s, pool := usageStore(t)
	u := keystore.NewUsage(pool, keystore.UsageOptions{})
	at := midnight.Add(-time.Minute)
	recordUnits(t, u, usageKeyA, at, keystore.OutcomeProxied, 201, 2, 5)
	// What the last release's roll-up does to that row.
	for _, sql := range []struct {
		sql   string
		start time.Time
	}{
		{`INSERT INTO usage_hours (org_id, key_id, start, outcome, status, count) VALUES ($1, $2, $3, 'proxied', 201, 2)`, at.Truncate(time.Hour)},
		{`INSERT INTO usage_days (org_id, key_id, start, outcome, status, count) VALUES ($1, $2, $3, 'proxied', 201, 2)`, midnight.AddDate(0, 0, -1)},
		{`UPDATE usage_minutes SET rolled = count WHERE org_id = $1 AND key_id = $2 AND start = $3`, at},
	} {
		if _, err := pool.Exec(ctx, sql.sql, usageOrg, usageKeyA, sql.start); err != nil {
			t.Fatal(err)
		}
	}
	want := "03-14T23:00 AAAA proxied 201 2 10\n"
	wantUnits(t, s, "after the last release's roll-up", store.UsageHour, want)
	if n, err := s.RollUpUsage(ctx); err != nil || n != 1 {
		t.Fatalf("RollUpUsage = %d, %v; want the minute row whose extra is not rolled up", n, err)
	}
	wantUnits(t, s, "after this release's roll-up", store.UsageHour, want)
	wantUnits(t, s, "after this release's roll-up", store.UsageDay, "03-14T00:00 AAAA proxied 201 2 10\n")
	if hours, days, unrolled := rolledUnits(t, pool); hours != 10 || days != 10 || unrolled != 0 {
		t.Errorf("%d units by hour, %d by day, %d minute rows unrolled; want 10, 10, 0", hours, days, unrolled)
	}
}

// TestPurgeUsageKeepsAMinuteWhoseUnitsAreNotRolledUp: a minute row whose requests are
// rolled up and whose extra is not stays until it is.
func TestPurgeUsageKeepsAMinuteWhoseUnitsAreNotRolledUp(t *testing.T) {
	ctx := context.Background()
	s, pool := usageStore(t)
	if _, err := pool.Exec(ctx, `INSERT INTO usage_minutes (org_id, key_id, start, outcome, status, count, rolled, extra)
		VALUES ($1, $2, $3, 'proxied', 200, 3, 3, 6)`, usageOrg, usageKeyA, midnight.Add(-50*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if m, _, _, err := s.PurgeUsage(ctx, midnight); err != nil || m != 0 {
		t.Errorf("PurgeUsage deleted %d minute rows (%v), want 0", m, err)
	}
	if _, err := s.RollUpUsage(ctx); err != nil {
		t.Fatal(err)
	}
	if m, _, _, err := s.PurgeUsage(ctx, midnight); err != nil || m != 1 {
		t.Errorf("PurgeUsage after the roll-up deleted %d minute rows (%v), want 1", m, err)
	}
}
