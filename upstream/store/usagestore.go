package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keygate/keygate/internal/pgfailover"
	"github.com/keygate/keygate/upstream/apperr"
)

// The usage record (docs/operations.md, Usage). The gateways add their counts to
// usage_minutes (keystore.Usage). RollUpUsage adds them to usage_hours and
// usage_days, and PurgeUsage keeps each table as long as it must. The reads are exact
// and fresh: an hour or a day is what the roll-up put in its table plus what it has
// not rolled up yet, read in one statement.

// The granularities of the usage record.
const (
	UsageMinute = "minute"
	UsageHour   = "hour"
	UsageDay    = "day"
)

// How long the rows of each table are kept, at least: minutes 48 hours and hours 400
// days, plus an hour and a day for the reads that start at the oldest. Days are kept
// for ever. A write id is kept long enough for a gateway to send its write again.
const (
	UsageMinutesKept = 49 * time.Hour
	UsageHoursKept   = 401 * 24 * time.Hour
	usageFlushesKept = 7 * 24 * time.Hour
)

// rollUpBatch is the most minute rows one roll-up statement takes, so that a roll-up
// after a long pause never runs, or holds locks, for long.
const rollUpBatch = 10000

// UsageQuery selects rows of the usage record: the org's, or only those of KeyID,
// in [From, To) by Granularity. From and To are whole units of it.
type UsageQuery struct {
	OrgID       string
	KeyID       string // "": every key
	Granularity string // UsageMinute, UsageHour or UsageDay
	From, To    time.Time
}

// UsageRow is a count of the usage record: the requests of a key in a minute, hour or
// day, with an outcome and a status, and their units (the sum of their routes' costs).
// A total leaves the fields it sums over empty.
type UsageRow struct {
	KeyID   string
	Start   time.Time
	Outcome string
	Status  int
	Count   int64
	Units   int64
}

// usageRowsSQL returns the statement of q's rows, key, start, outcome, status, count
// and units, without an order, and its arguments. An hour or a day is its rolled-up
// row plus the part of its minutes not rolled up yet. A row's units are count + extra
// (schema/migrations/008_usage_units.sql), each part rolled up on its own.
func usageRowsSQL(q UsageQuery) (string, []any) {
	args := []any{q.OrgID, q.From, q.To}
	where := `org_id = $1 AND start >= $2 AND start < $3`
	if q.KeyID != "" {
		args = append(args, q.KeyID)
		where += ` AND key_id = $4`
	}
	if q.Granularity == UsageMinute {
		return `SELECT key_id, start, outcome, status, count, count + extra AS units FROM usage_minutes WHERE ` + where, args
	}
	table := "usage_hours"
	if q.Granularity == UsageDay {
		table = "usage_days"
	}
	return `SELECT key_id, start, outcome, status, sum(count)::bigint AS count, sum(units)::bigint AS units FROM (
		SELECT key_id, start, outcome, status, count, count + extra AS units FROM ` + table + ` WHERE ` + where + `
		UNION ALL
		SELECT key_id, date_trunc('` + q.Granularity + `', start, 'UTC'), outcome, status,
			count - rolled, count - rolled + extra - extra_rolled
		FROM usage_minutes WHERE ` + where + ` AND (count > rolled OR extra > extra_rolled)
	) u GROUP BY key_id, start, outcome, status`, args
}

// Usage returns q's rows ordered by start, key, outcome and status, with text
// compared byte by byte. No row has a count of 0. more reports that there were more
// than limit rows; then rows holds the first limit.
func (s *Store) Usage(ctx context.Context, q UsageQuery, limit int) (rows []UsageRow, more bool, err error) {
	sql, args := usageRowsSQL(q)
	args = append(args, limit+1)
	sql += fmt.Sprintf(` ORDER BY start, key_id COLLATE "C", outcome COLLATE "C", status LIMIT $%d`, len(args))
	rows, err = queryUsage(ctx, s, sql, args, func(r pgx.Rows, u *UsageRow) error {
		return r.Scan(&u.KeyID, &u.Start, &u.Outcome, &u.Status, &u.Count, &u.Units)
	})
	if len(rows) > limit {
		return rows[:limit], true, err
	}
	return rows, false, err
}

// UsageByStart returns the sums of q's rows per start, outcome and status, in that
// order.
func (s *Store) UsageByStart(ctx context.Context, q UsageQuery) ([]UsageRow, error) {
	sql, args := usageRowsSQL(q)
	return queryUsage(ctx, s, `SELECT start, outcome, status, sum(count)::bigint, sum(units)::bigint FROM (`+sql+`) r
		GROUP BY start, outcome, status ORDER BY start, outcome COLLATE "C", status`, args,
		func(r pgx.Rows, u *UsageRow) error {
			return r.Scan(&u.Start, &u.Outcome, &u.Status, &u.Count, &u.Units)
		})
}

// UsageByKey returns the sums of q's rows per key, outcome and status, in that order.
func (s *Store) UsageByKey(ctx context.Context, q UsageQuery) ([]UsageRow, error) {
	sql, args := usageRowsSQL(q)
	return queryUsage(ctx, s, `SELECT key_id, outcome, status, sum(count)::bigint, sum(units)::bigint FROM (`+sql+`) r
		GROUP BY key_id, outcome, status ORDER BY key_id COLLATE "C", outcome COLLATE "C", status`, args,
		func(r pgx.Rows, u *UsageRow) error {
			return r.Scan(&u.KeyID, &u.Outcome, &u.Status, &u.Count, &u.Units)
		})
}

// queryUsage runs a read of the usage record and scans each row with scan.
func queryUsage(ctx context.Context, s *Store, sql string, args []any, scan func(pgx.Rows, *UsageRow) error) ([]UsageRow, error) {
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("reading usage: %w", err)
	}
	defer rows.Close()
	var out []UsageRow
	for rows.Next() {
		var u UsageRow
		if err := scan(rows, &u); err != nil {
			return nil, fmt.Errorf("reading usage: %w", err)
		}
		u.Start = u.Start.UTC()
		out = append(out, u)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading usage: %w", err)
	}
	return out, nil
}

// OrgKey returns apperr.ErrNotFound unless keyID is a key of orgID, live, revoked or
// expired.
func (s *Store) OrgKey(ctx context.Context, orgID, keyID string) error {
	var one int
	err := s.pool.QueryRow(ctx, `SELECT 1 FROM api_keys WHERE org_id = $1 AND key_id = $2`, orgID, keyID).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return apperr.ErrNotFound
	}
	if err != nil {
		return fmt.Errorf("looking up key: %w", err)
	}
	return nil
}

// rollUpLockSQL takes up to $1 minute rows not rolled up in full, count or extra (a
// roll-up of the release before units rolls count alone), and locks them in the order
// of their primary key, as the gateways' writes do (keystore.Usage), so neither waits
// on the other in a cycle. A gateway's write to a locked row waits for
// the roll-up's commit, then raises count above rolled again: the next roll-up adds
// the difference.
const rollUpLockSQL = `SELECT org_id::text, start, key_id, outcome, status FROM usage_minutes
WHERE count > rolled OR extra > extra_rolled
ORDER BY org_id, start, key_id COLLATE "C", outcome COLLATE "C", status
LIMIT $1 FOR UPDATE`

// rollUpSQL adds the unrolled part of the minute rows given, locked by rollUpLockSQL
// in the same transaction, to their hours and days, and marks it rolled. Its snapshot
// is taken after the locks: it reads the very versions that are locked, which no one
// else can change until the commit.
const rollUpSQL = `WITH pending AS (
	SELECT m.org_id, m.key_id, m.start, m.outcome, m.status, m.count, m.rolled, m.extra, m.extra_rolled
	FROM unnest($1::uuid[], $2::timestamptz[], $3::text[], $4::text[], $5::smallint[]) AS k (org_id, start, key_id, outcome, status)
	JOIN usage_minutes m USING (org_id, start, key_id, outcome, status)
	WHERE m.count > m.rolled OR m.extra > m.extra_rolled),
marked AS (
	UPDATE usage_minutes m SET rolled = p.count, extra_rolled = p.extra FROM pending p
	WHERE m.org_id = p.org_id AND m.start = p.start AND m.key_id = p.key_id
		AND m.outcome = p.outcome AND m.status = p.status
	RETURNING 1),
hours AS (
	INSERT INTO usage_hours AS h (org_id, key_id, start, outcome, status, count, extra)
	SELECT org_id, key_id, date_trunc('hour', start, 'UTC') AS hour, outcome, status,
		sum(count - rolled), sum(extra - extra_rolled)
	FROM pending GROUP BY org_id, key_id, hour, outcome, status
	ORDER BY org_id, hour, key_id COLLATE "C", outcome COLLATE "C", status
	ON CONFLICT (org_id, start, key_id, outcome, status) DO UPDATE
	SET count = h.count + EXCLUDED.count, extra = h.extra + EXCLUDED.extra),
days AS (
	INSERT INTO usage_days AS d (org_id, key_id, start, outcome, status, count, extra)
	SELECT org_id, key_id, date_trunc('day', start, 'UTC') AS day, outcome, status,
		sum(count - rolled), sum(extra - extra_rolled)
	FROM pending GROUP BY org_id, key_id, day, outcome, status
	ORDER BY org_id, day, key_id COLLATE "C", outcome COLLATE "C", status
	ON CONFLICT (org_id, start, key_id, outcome, status) DO UPDATE
	SET count = d.count + EXCLUDED.count, extra = d.extra + EXCLUDED.extra)
SELECT count(*) FROM marked`

// RollUpUsage adds to usage_hours and usage_days what usage_minutes holds beyond what
// earlier roll-ups added, in batches, and returns the minute rows it rolled up. Each
// batch is one transaction: an hour, a day and a minute row's rolled part change
// together, so a read never sees a request twice or not at all. Roll-ups of several
// upstream instances at once only find less to do.
func (s *Store) RollUpUsage(ctx context.Context) (rolled int64, err error) {
	for {
		n, err := s.rollUpBatch(ctx)
		rolled += n
		if err != nil {
			return rolled, fmt.Errorf("rolling up usage: %w", err)
		}
		if n < rollUpBatch {
			return rolled, nil
		}
	}
}

// rollUpBatch rolls up at most rollUpBatch minute rows, and returns how many.
func (s *Store) rollUpBatch(ctx context.Context) (int64, error) {
	tx, err := pgfailover.Begin(ctx, s.pool, pgfailover.Local)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(ctx)
	rows, err := tx.Query(ctx, rollUpLockSQL, rollUpBatch)
	if err != nil {
		return 0, err
	}
	var (
		orgs, keys, outcomes []string
		starts               []time.Time
		statuses             []int16
	)
	for rows.Next() {
		var org, key, outcome string
		var start time.Time
		var status int16
		if err := rows.Scan(&org, &start, &key, &outcome, &status); err != nil {
			rows.Close()
			return 0, err
		}
		orgs, starts, keys, outcomes, statuses = append(orgs, org), append(starts, start),
			append(keys, key), append(outcomes, outcome), append(statuses, status)
	}
	if err := rows.Err(); err != nil {
		return 0, err
	}
	if len(orgs) == 0 {
		return 0, nil
	}
	var n int64
	if err := tx.QueryRow(ctx, rollUpSQL, orgs, starts, keys, outcomes, statuses).Scan(&n); err != nil {
		return 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, err
	}
	return n, nil
}

// exportHeldSQL is true of a minute row the purge keeps for the usage export: not
// exported in full, of a minute the export owes ($3 is the oldest last run of an
// export that still counts, now - UsageExportHold).
const exportHeldSQL = `((count > exported OR extra > extra_exported) AND EXISTS (
	SELECT FROM usage_export p WHERE p.cut_at >= $3 AND usage_minutes.start >= p.since))`

// PurgeUsage deletes, in batches, the minute rows older than UsageMinutesKept that
// are rolled up in full, count and extra, and the hour rows older than UsageHoursKept, as of now, and
// the write ids of the gateways older than a week. It returns how many rows of each it
// deleted. A minute row a gateway adds to while it is deleted is kept, or written
// anew afterwards, and rolled up by the next roll-up. While the usage export runs, a
// minute row it has not exported in full is kept too, however old (UsageExportHold).
func (s *Store) PurgeUsage(ctx context.Context, now time.Time) (minutes, hours, flushes int64, err error) {
	for _, p := range []struct {
		sql  string
		args []any
		n    *int64
	}{
		// The outer conditions are checked again on a row a gateway changed meanwhile.
		{`DELETE FROM usage_minutes WHERE start < $1 AND count = rolled AND extra = extra_rolled AND NOT ` + exportHeldSQL + `
			AND (org_id, start, key_id, outcome, status) IN (SELECT org_id, start, key_id, outcome, status
			FROM usage_minutes WHERE start < $1 AND count = rolled AND extra = extra_rolled AND NOT ` + exportHeldSQL + ` LIMIT $2)`,
			[]any{now.Add(-UsageMinutesKept), purgeBatch, now.Add(-UsageExportHold)}, &minutes},
		{`DELETE FROM usage_hours WHERE (org_id, start, key_id, outcome, status) IN
			(SELECT org_id, start, key_id, outcome, status FROM usage_hours WHERE start < $1 LIMIT $2)`,
			[]any{now.Add(-UsageHoursKept), purgeBatch}, &hours},
		// A write id's time is the database's, and so is its age.
		{`DELETE FROM usage_flushes WHERE id IN (SELECT id FROM usage_flushes WHERE at < now() - $1::interval LIMIT $2)`,
			[]any{usageFlushesKept, purgeBatch}, &flushes},
	} {
		for {
			tag, err := pgfailover.Exec(ctx, s.pool, pgfailover.Local, p.sql, p.args...)
			if err != nil {
				return minutes, hours, flushes, fmt.Errorf("purging usage: %w", err)
			}
			*p.n += tag.RowsAffected()
			if tag.RowsAffected() < purgeBatch {
				break
			}
		}
	}
	return minutes, hours, flushes, nil
}
