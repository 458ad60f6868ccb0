package store_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keygate/keygate/internal/testkit/testenv"
	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/schema/schematest"
	"github.com/keygate/keygate/upstream/apperr"
	"github.com/keygate/keygate/upstream/store"
)

const (
	usageOrg   = "0b8e0f0a-5d5e-4c4e-9a57-2f1d9b2c9e11"
	otherOrg   = "7f000000-0000-4000-8000-000000000001"
	usageKeyA  = "AAAAbbbbCCCCdddd"
	usageKeyZ  = "ZZZZyyyyXXXXwwww"
	usageKeyLo = "aaaaBBBBccccDDDD" // after Z byte by byte, before it in most locales
)

// midnight is a UTC day boundary the usage tests count around.
var midnight = time.Date(2026, 3, 15, 0, 0, 0, 0, time.UTC)

func usageStore(t *testing.T) (*store.Store, *pgxpool.Pool) {
	t.Helper()
	pool, _ := schematest.NewPool(t)
	return store.New(pool), pool
}

// record counts n requests and flushes them, as a gateway does.
func record(t *testing.T, u *keystore.Usage, org, key string, at time.Time, outcome keystore.Outcome, status, n int) {
	t.Helper()
	for range n {
		u.Record(org, key, at, outcome, status, 1)
	}
	if err := u.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// everything is a query of the org's whole record in the usage tests.
func everything(granularity string) store.UsageQuery {
	return store.UsageQuery{OrgID: usageOrg, Granularity: granularity,
		From: midnight.AddDate(0, 0, -3), To: midnight.AddDate(0, 0, 3)}
}

func readUsage(t *testing.T, s *store.Store, q store.UsageQuery) []store.UsageRow {
	t.Helper()
	rows, more, err := s.Usage(context.Background(), q, 100000)
	if err != nil || more {
		t.Fatalf("Usage(%+v): %v, more %v", q, err, more)
	}
	return rows
}

// lines shows rows as "start key outcome status count".
func lines(rows []store.UsageRow) string {
	var b strings.Builder
	for _, r := range rows {
		fmt.Fprintf(&b, "%s %s %s %d %d\n", r.Start.Format("01-02T15:04"), r.KeyID[:4], r.Outcome, r.Status, r.Count)
	}
	return b.String()
}

// wantSameAcrossResolutions checks that the hours and the days read are the minutes
// read, summed by hour and by day, requests and units. It returns the total of
// requests.
func wantSameAcrossResolutions(t *testing.T, s *store.Store) int64 {
	t.Helper()
	minutes := readUsage(t, s, everything(store.UsageMinute))
	var total int64
	for _, g := range []struct {
		name  string
		trunc time.Duration
	}{{store.UsageHour, time.Hour}, {store.UsageDay, 24 * time.Hour}} {
		sums := map[store.UsageRow][2]int64{}
		total = 0
		for _, m := range minutes {
			k := m
			k.Start, k.Count, k.Units = m.Start.Truncate(g.trunc), 0, 0
			sums[k] = [2]int64{sums[k][0] + m.Count, sums[k][1] + m.Units}
			total += m.Count
		}
		var want []store.UsageRow
		for k, n := range sums {
			k.Count, k.Units = n[0], n[1]
			want = append(want, k)
		}
		slices.SortFunc(want, func(a, b store.UsageRow) int {
			return strings.Compare(fmt.Sprintf("%s %s %s %03d", a.Start.Format(time.RFC3339), a.KeyID, a.Outcome, a.Status),
				fmt.Sprintf("%s %s %s %03d", b.Start.Format(time.RFC3339), b.KeyID, b.Outcome, b.Status))
		})
		if got := readUsage(t, s, everything(g.name)); unitLines(got) != unitLines(want) {
			t.Errorf("by %s:\n%swant the minutes summed:\n%s", g.name, unitLines(got), unitLines(want))
		}
	}
	return total
}

func TestRollUpKeepsTotalsEqualAcrossResolutions(t *testing.T) {
	ctx := context.Background()
	s, pool := usageStore(t)
	u := keystore.NewUsage(pool, keystore.UsageOptions{})
	// Across an hour and a day boundary, several keys, outcomes and statuses.
	for i, at := range []time.Time{midnight.Add(-2 * time.Minute), midnight.Add(-time.Minute), midnight, midnight.Add(61 * time.Minute)} {
		record(t, u, usageOrg, usageKeyA, at, keystore.OutcomeProxied, 200, 10+i)
		record(t, u, usageOrg, usageKeyA, at, keystore.OutcomeProxied, 404, 1)
		record(t, u, usageOrg, usageKeyZ, at, keystore.OutcomeRateLimited, 429, 2*i+1)
	}
	record(t, u, usageOrg, usageKeyLo, midnight, keystore.OutcomeMe, 200, 5)
	record(t, u, otherOrg, usageKeyA, midnight, keystore.OutcomeMe, 200, 1000) // another org's
	const total = 10 + 11 + 12 + 13 + 4 + 1 + 3 + 5 + 7 + 5

	// Before any roll-up, hours and days are read from the minutes alone.
	if got := wantSameAcrossResolutions(t, s); got != total {
		t.Fatalf("total %d, want %d", got, total)
	}
	n, err := s.RollUpUsage(ctx)
	if err != nil || n != 14 {
		t.Fatalf("RollUpUsage = %d, %v; want the 14 minute rows", n, err)
	}
	if got := wantSameAcrossResolutions(t, s); got != total {
		t.Errorf("after the roll-up: total %d, want %d", got, total)
	}
	var hours, days, unrolled int64
	if err := pool.QueryRow(ctx, `SELECT (SELECT sum(count) FROM usage_hours WHERE org_id = $1),
		(SELECT sum(count) FROM usage_days WHERE org_id = $1),
		(SELECT count(*) FROM usage_minutes WHERE count > rolled)`, usageOrg).Scan(&hours, &days, &unrolled); err != nil {
		t.Fatal(err)
	}
	if hours != total || days != total || unrolled != 0 {
		t.Errorf("after the roll-up the tables hold %d by hour, %d by day, %d minute rows unrolled; want %d, %d, 0",
			hours, days, unrolled, total, total)
	}

	// Late rows: a gateway adds to minutes already rolled up, and to a new one.
	record(t, u, usageOrg, usageKeyA, midnight.Add(-time.Minute), keystore.OutcomeProxied, 200, 100)
	record(t, u, usageOrg, usageKeyA, midnight.Add(-30*time.Minute), keystore.OutcomeProxied, 502, 7)
	if got := wantSameAcrossResolutions(t, s); got != total+107 {
		t.Errorf("with late rows: total %d, want %d", got, total+107)
	}
	wantHours := "" +
		"03-14T23:00 AAAA proxied 200 121\n" + // 10 + 11 rolled, 100 not yet
		"03-14T23:00 AAAA proxied 404 2\n" +
		"03-14T23:00 AAAA proxied 502 7\n" +
		"03-14T23:00 ZZZZ rate_limited 429 4\n" +
		"03-15T00:00 AAAA proxied 200 12\n" +
		"03-15T00:00 AAAA proxied 404 1\n" +
		"03-15T00:00 ZZZZ rate_limited 429 5\n" +
		"03-15T00:00 aaaa me 200 5\n" +
		"03-15T01:00 AAAA proxied 200 13\n" +
		"03-15T01:00 AAAA proxied 404 1\n" +
		"03-15T01:00 ZZZZ rate_limited 429 7\n"
	if got := lines(readUsage(t, s, everything(store.UsageHour))); got != wantHours {
		t.Errorf("by hour with late rows:\n%swant:\n%s", got, wantHours)
	}
	if n, err := s.RollUpUsage(ctx); err != nil || n != 2 {
		t.Errorf("RollUpUsage of the late rows = %d, %v; want 2", n, err)
	}
	if got := lines(readUsage(t, s, everything(store.UsageHour))); got != wantHours {
		t.Errorf("by hour after the late rows' roll-up:\n%swant:\n%s", got, wantHours)
	}
	if n, err := s.RollUpUsage(ctx); err != nil || n != 0 {
		t.Errorf("RollUpUsage with nothing new = %d, %v; want 0", n, err)
	}
	if got := wantSameAcrossResolutions(t, s); got != total+107 {
		t.Errorf("after everything: total %d, want %d", got, total+107)
	}
}

func TestRollUpIsExactUnderConcurrentWritesAndRollUps(t *testing.T) {
	ctx := context.Background()
	s, pool := usageStore(t)
	const gateways, rounds, keys = 3, 20, 40
	stop := make(chan struct{})
	var rollers sync.WaitGroup
	var rollErrs atomic.Int64
	for range 2 {
		rollers.Add(1)
		go func() {
			defer rollers.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := s.RollUpUsage(ctx); err != nil && rollErrs.Add(1) == 1 {
					t.Errorf("RollUpUsage: %v", err)
				}
			}
		}()
	}
	var writers sync.WaitGroup
	for g := range gateways {
		writers.Add(1)
		go func() {
			defer writers.Done()
			u := keystore.NewUsage(pool, keystore.UsageOptions{})
			for i := range rounds {
				for k := range keys {
					// Two minutes, rolled up and written again as they go.
					at := midnight.Add(time.Duration((i+k+g)%2) * time.Minute)
					u.Record(usageOrg, fmt.Sprintf("key%013d", k), at, keystore.OutcomeProxied, 200, k%3+1)
				}
				if err := u.Flush(ctx); err != nil {
					t.Errorf("flush: %v", err)
				}
			}
		}()
	}
	writers.Wait()
	close(stop)
	rollers.Wait()
	const total = gateways * rounds * keys
	if got := wantSameAcrossResolutions(t, s); got != total {
		t.Errorf("total %d, want %d", got, total)
	}
	if _, err := s.RollUpUsage(ctx); err != nil {
		t.Fatal(err)
	}
	var hours, days int64
	if err := pool.QueryRow(ctx, `SELECT (SELECT sum(count) FROM usage_hours), (SELECT sum(count) FROM usage_days)`).Scan(&hours, &days); err != nil {
		t.Fatal(err)
	}
	if hours != total || days != total {
		t.Errorf("the roll-ups put %d in hours and %d in days, want %d in each", hours, days, total)
	}
	// Keys cost 1, 2 and 3 units a request in turn: 14 keys 1, 13 keys 2 and 13 keys 3.
	const totalUnits = gateways * rounds * (14*1 + 13*2 + 13*3)
	if hours, days, unrolled := rolledUnits(t, pool); hours != totalUnits || days != totalUnits || unrolled != 0 {
		t.Errorf("the roll-ups put %d units in hours and %d in days, %d minute rows unrolled; want %d, %d, 0",
			hours, days, unrolled, totalUnits, totalUnits)
	}
}

func TestRollUpTakesEveryRowOfALongPause(t *testing.T) {
	// More minute rows than one statement takes: the roll-up goes on until none is left.
	ctx := context.Background()
	s, pool := usageStore(t)
	if _, err := pool.Exec(ctx, `INSERT INTO usage_minutes (org_id, key_id, start, outcome, status, count)
		SELECT $1, 'key' || lpad(i::text, 13, '0'), $2, 'proxied', 200, 2 FROM generate_series(1, 12345) i`,
		usageOrg, midnight); err != nil {
		t.Fatal(err)
	}
	if n, err := s.RollUpUsage(ctx); err != nil || n != 12345 {
		t.Fatalf("RollUpUsage = %d, %v; want 12345", n, err)
	}
	var days int64
	if err := pool.QueryRow(ctx, `SELECT sum(count) FROM usage_days`).Scan(&days); err != nil || days != 2*12345 {
		t.Errorf("usage_days holds %d (%v), want %d", days, err, 2*12345)
	}
}

func TestPurgeUsageKeepsEachResolutionAsLongAsPromised(t *testing.T) {
	ctx := context.Background()
	s, pool := usageStore(t)
	now := midnight.Add(12*time.Hour + 30*time.Second)
	minutes := []struct {
		age    time.Duration
		rolled bool
		kept   bool
	}{
		{48 * time.Hour, true, true},
		{49*time.Hour - time.Minute, true, true},
		{49*time.Hour + time.Minute, true, false},
		{49*time.Hour + time.Minute, false, true}, // not rolled up in full yet
		{100 * time.Hour, true, false},
	}
	for i, m := range minutes {
		rolled := "0"
		if m.rolled {
			rolled = "count"
		}
		if _, err := pool.Exec(ctx, `INSERT INTO usage_minutes (org_id, key_id, start, outcome, status, count, rolled)
			VALUES ($1, $2, $3, 'proxied', 200, 3, 0)`, usageOrg, fmt.Sprintf("minute%010d", i), now.Add(-m.age).Truncate(time.Minute)); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `UPDATE usage_minutes SET rolled = `+rolled+` WHERE key_id = $1`, fmt.Sprintf("minute%010d", i)); err != nil {
			t.Fatal(err)
		}
	}
	day := 24 * time.Hour
	hours := []struct {
		age  time.Duration
		kept bool
	}{{400 * day, true}, {401*day - time.Hour, true}, {401*day + time.Hour, false}, {800 * day, false}}
	for i, h := range hours {
		for _, table := range []string{"usage_hours", "usage_days"} {
			if _, err := pool.Exec(ctx, `INSERT INTO `+table+` (org_id, key_id, start, outcome, status, count)
				VALUES ($1, $2, $3, 'proxied', 200, 1)`, usageOrg, fmt.Sprintf("hour%012d", i), now.Add(-h.age).Truncate(time.Hour)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := pool.Exec(ctx, `INSERT INTO usage_flushes (id, at) VALUES
		(gen_random_uuid(), now() - interval '6 days'), (gen_random_uuid(), now() - interval '8 days')`); err != nil {
		t.Fatal(err)
	}

	m, h, f, err := s.PurgeUsage(ctx, now)
	if err != nil || m != 2 || h != 2 || f != 1 {
		t.Fatalf("PurgeUsage = %d minutes, %d hours, %d write ids, %v; want 2, 2, 1", m, h, f, err)
	}
	for i, want := range minutes {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM usage_minutes WHERE key_id = $1`, fmt.Sprintf("minute%010d", i)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if (n == 1) != want.kept {
			t.Errorf("a minute row %v old, rolled %v: kept %v, want %v", want.age, want.rolled, n == 1, want.kept)
		}
	}
	for i, want := range hours {
		var inHours, inDays int
		if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM usage_hours WHERE key_id = $1), (SELECT count(*) FROM usage_days WHERE key_id = $1)`,
			fmt.Sprintf("hour%012d", i)).Scan(&inHours, &inDays); err != nil {
			t.Fatal(err)
		}
		if (inHours == 1) != want.kept || inDays != 1 {
			t.Errorf("rows %v old: hour kept %v (want %v), day kept %v (want for ever)", want.age, inHours == 1, want.kept, inDays == 1)
		}
	}
}

func TestUsageReadsAreOrderedFilteredAndBounded(t *testing.T) {
	ctx := context.Background()
	s, pool := usageStore(t)
	u := keystore.NewUsage(pool, keystore.UsageOptions{})
	for _, key := range []string{usageKeyLo, usageKeyZ, usageKeyA} {
		record(t, u, usageOrg, key, midnight.Add(time.Minute), keystore.OutcomeProxied, 200, 1)
		record(t, u, usageOrg, key, midnight, keystore.OutcomeProxied, 503, 2)
		record(t, u, usageOrg, key, midnight, keystore.OutcomeMe, 200, 3)
	}
	record(t, u, usageOrg, usageKeyA, midnight.Add(-time.Minute), keystore.OutcomeMe, 200, 1)  // before the range
	record(t, u, usageOrg, usageKeyA, midnight.Add(2*time.Minute), keystore.OutcomeMe, 200, 1) // at its end: excluded
	q := store.UsageQuery{OrgID: usageOrg, Granularity: store.UsageMinute, From: midnight, To: midnight.Add(2 * time.Minute)}
	want := "" +
		"03-15T00:00 AAAA me 200 3\n" +
		"03-15T00:00 AAAA proxied 503 2\n" +
		"03-15T00:00 ZZZZ me 200 3\n" +
		"03-15T00:00 ZZZZ proxied 503 2\n" +
		"03-15T00:00 aaaa me 200 3\n" +
		"03-15T00:00 aaaa proxied 503 2\n" +
		"03-15T00:01 AAAA proxied 200 1\n" +
		"03-15T00:01 ZZZZ proxied 200 1\n" +
		"03-15T00:01 aaaa proxied 200 1\n"
	if got := lines(readUsage(t, s, q)); got != want {
		t.Errorf("minutes:\n%swant:\n%s", got, want)
	}
	rows, more, err := s.Usage(ctx, q, 4)
	if err != nil || !more || lines(rows) != strings.Join(strings.SplitAfter(want, "\n")[:4], "") {
		t.Errorf("Usage limited to 4 = %v, %v:\n%s", more, err, lines(rows))
	}
	if _, more, _ := s.Usage(ctx, q, 9); more {
		t.Error("Usage of exactly the limit says there are more")
	}
	q.KeyID = usageKeyZ
	if got, want := lines(readUsage(t, s, q)), "03-15T00:00 ZZZZ me 200 3\n03-15T00:00 ZZZZ proxied 503 2\n03-15T00:01 ZZZZ proxied 200 1\n"; got != want {
		t.Errorf("key %s:\n%swant:\n%s", usageKeyZ, got, want)
	}
	// By hour, the last minute's row is in the range.
	q.KeyID, q.Granularity, q.To = "", store.UsageHour, midnight.Add(time.Hour)
	byStart, err := s.UsageByStart(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := lines(withKey(byStart)), "03-15T00:00 ---- me 200 10\n03-15T00:00 ---- proxied 200 3\n03-15T00:00 ---- proxied 503 6\n"; got != want {
		t.Errorf("by start, outcome and status:\n%swant:\n%s", got, want)
	}
	byKey, err := s.UsageByKey(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range byKey {
		got = append(got, fmt.Sprintf("%s %s %d %d", r.KeyID[:4], r.Outcome, r.Status, r.Count))
	}
	if got, want := strings.Join(got, ", "), "AAAA me 200 4, AAAA proxied 200 1, AAAA proxied 503 2, ZZZZ me 200 3, ZZZZ proxied 200 1, ZZZZ proxied 503 2, "+
		"aaaa me 200 3, aaaa proxied 200 1, aaaa proxied 503 2"; got != want {
		t.Errorf("by key, outcome and status: %s, want %s", got, want)
	}
	// A range with nothing in it, and another org's range, are empty.
	q.From, q.To = midnight.Add(-time.Hour), midnight
	q.Granularity = store.UsageHour
	if got := readUsage(t, s, store.UsageQuery{OrgID: otherOrg, Granularity: store.UsageDay, From: midnight, To: midnight.Add(24 * time.Hour)}); len(got) != 0 {
		t.Errorf("another org's usage: %s", lines(got))
	}
	if got := lines(readUsage(t, s, q)); got != "03-14T23:00 AAAA me 200 1\n" {
		t.Errorf("the hour before:\n%s", got)
	}
}

// withKey gives sums without a key a placeholder one, for lines.
func withKey(rows []store.UsageRow) []store.UsageRow {
	for i := range rows {
		rows[i].KeyID = "----"
	}
	return rows
}

func TestOrgKeyFindsOnlyTheOrgsKeys(t *testing.T) {
	ctx := context.Background()
	s, pool := usageStore(t)
	var org, other string
	for _, id := range []*string{&org, &other} {
		if err := pool.QueryRow(ctx, `INSERT INTO orgs (name, plan) VALUES ('acme', 'pro') RETURNING id::text`).Scan(id); err != nil {
			t.Fatal(err)
		}
	}
	format, _ := keystore.NewFormat("mon")
	rec, _, err := keystore.New(pool, format).Create(ctx, keystore.NewKey{OrgID: org, Name: "k", Role: keystore.RoleViewer})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.OrgKey(ctx, org, rec.ID); err != nil {
		t.Errorf("OrgKey of the org's key: %v", err)
	}
	for _, tc := range [][2]string{{other, rec.ID}, {org, usageKeyA}} {
		if err := s.OrgKey(ctx, tc[0], tc[1]); err != apperr.ErrNotFound {
			t.Errorf("OrgKey(%s, %s) = %v, want not found", tc[0], tc[1], err)
		}
	}
}

// TestPurgeUsageKeepsARowAGatewayAddsToMeanwhile deletes an old minute row, rolled up
// in full, while a gateway's write to it waits to commit: the row then has requests
// not rolled up, and must stay.
func TestPurgeUsageKeepsARowAGatewayAddsToMeanwhile(t *testing.T) {
	ctx := context.Background()
	s, pool := usageStore(t)
	start := midnight.Add(-50 * time.Hour)
	if _, err := pool.Exec(ctx, `INSERT INTO usage_minutes (org_id, key_id, start, outcome, status, count, rolled)
		VALUES ($1, $2, $3, 'proxied', 200, 3, 3)`, usageOrg, usageKeyA, start); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `UPDATE usage_minutes SET count = count + 1`); err != nil {
		t.Fatal(err)
	}
	purged := make(chan int64, 1)
	go func() {
		m, _, _, err := s.PurgeUsage(ctx, midnight)
		if err != nil {
			t.Error(err)
		}
		purged <- m
	}()
	testenv.Eventually(t, 10*time.Second, "the purge waiting on the row", func() bool {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE 'DELETE FROM usage_minutes%'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	})
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if m := <-purged; m != 0 {
		t.Errorf("PurgeUsage deleted %d minute rows, want 0", m)
	}
	var count, rolled int64
	if err := pool.QueryRow(ctx, `SELECT count, rolled FROM usage_minutes`).Scan(&count, &rolled); err != nil {
		t.Fatalf("the row a gateway added to: %v", err)
	}
	if count != 4 || rolled != 3 {
		t.Errorf("the row holds count %d, rolled %d; want 4, 3", count, rolled)
	}
}
