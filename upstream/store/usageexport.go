package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keygate/keygate/internal/pgfailover"
)

// The usage export's ledger (docs/operations.md, Usage export). Each minute row
// records in exported and extra_exported how much of it the export has written into
// events. CutUsage writes the events of what settled minutes hold beyond that, and
// marks it exported, in one transaction: a minute's first event, and one more for
// each late write to it. The events wait in an outbox (usageoutbox.go) until the
// receiver takes them.

// UsageExportHold is how long after the export last ran the purge still keeps the
// minute rows it has not exported in full. An export stopped for longer resumes at the
// minutes the purge keeps whole, and skips the older ones (CutResult.SkippedFrom).
const UsageExportHold = 24 * time.Hour

// exportResumeMargin is what an export that resumes leaves between itself and the
// purge: it counts itself stopped this much before the purge does, and resumes this
// much inside the minutes the purge keeps. So a purge statement that started before
// the export's resumption never deletes a row the export then reads.
const exportResumeMargin = time.Hour

// cutBatch is about the most minute rows one cut transaction takes: up to cutBatch of
// one minute's, and the rest of the last key's minute among them.
const cutBatch = 5000

// UsageAmount is a part of a key's minute: requests with one outcome, and their units.
type UsageAmount struct {
	Outcome string
	Count   int64
	Units   int64
}

// UsageDelta is what a key's minute holds beyond what the export has written into
// events: its requests and units by outcome, ordered by outcome. A minute's first
// delta is all of it.
type UsageDelta struct {
	OrgID    string
	KeyID    string
	Minute   time.Time
	Outcomes []UsageAmount
}

// ExportEvent is an event of the usage export's outbox: its id, its key's minute, and
// the JSON object every attempt sends.
type ExportEvent struct {
	ID     string
	Minute time.Time
	Body   []byte
	// Attempts is how many attempts were made before this one (ClaimExportEvents).
	Attempts int
}

// UsageCut is what CutUsage cuts.
type UsageCut struct {
	// Now is the time of the cut. The position records it as the export's last run.
	Now time.Time
	// Settled is the last settled minute: the cut takes the minutes up to it.
	Settled time.Time
	// Encode returns the event of d, with a new id.
	Encode func(d UsageDelta) (ExportEvent, error)
}

// CutResult is what a cut did.
type CutResult struct {
	// Events is how many events it wrote.
	Events int
	// Busy means another exporter held the position: it cut nothing, and need not.
	Busy bool
	// SkippedFrom and SkippedTo, when not zero, are the minutes [from, to) it gave up:
	// the export had not run for UsageExportHold, and the purge may have taken them.
	SkippedFrom, SkippedTo time.Time
}

// StartUsageExport makes the export's position, if no upstream has yet: the export
// begins with now's minute.
func (s *Store) StartUsageExport(ctx context.Context, now time.Time) error {
	_, err := pgfailover.Exec(ctx, s.pool, pgfailover.Local, `INSERT INTO usage_export (since, cut_at) VALUES ($1, $2) ON CONFLICT DO NOTHING`,
		now.Truncate(time.Minute), now)
	if err != nil {
		return fmt.Errorf("starting the usage export: %w", err)
	}
	return nil
}

// CutUsage writes into the outbox, due at once, an event for each key's minute from
// the position's since up to c.Settled that holds more than its events so far, and
// marks that part exported. Each transaction takes one minute's rows, at most about
// cutBatch, until none is left. One exporter cuts at a time: another finds the
// position locked and returns Busy at once (FOR UPDATE SKIP LOCKED).
// StartUsageExport must have run.
func (s *Store) CutUsage(ctx context.Context, c UsageCut) (CutResult, error) {
	var res CutResult
	for {
		n, err := s.cutOnce(ctx, c, &res)
		if err != nil {
			return res, fmt.Errorf("cutting usage events: %w", err)
		}
		if n == 0 || res.Busy {
			return res, nil
		}
	}
}

// cutLockSQL locks up to $3 rows not exported in full of the oldest minute with any
// ($1 <= start <= $2), in the order of the primary key, as the gateways' writes and
// the roll-up lock them, so none waits on another in a cycle. A transaction locks rows
// of one minute only: within it, the order of org, key, outcome and status is the
// primary key's. It returns each row's locked version, with the gateway's write it
// waited for, if any.
const cutLockSQL = `SELECT m.org_id::text, m.start, m.key_id, m.outcome, m.status, m.count - m.exported,
	m.count - m.exported + m.extra - m.extra_exported, m.count, m.extra
FROM usage_minutes m
WHERE m.start = (SELECT min(start) FROM usage_minutes
		WHERE start >= $1 AND start <= $2 AND (count > exported OR extra > extra_exported))
	AND (m.count > m.exported OR m.extra > m.extra_exported)
ORDER BY m.org_id, m.key_id COLLATE "C", m.outcome COLLATE "C", m.status
LIMIT $3 FOR UPDATE`

// cutKeySQL locks the rows not exported in full of one key's minute, in the order of
// the primary key: those cutLockSQL left of the last key's minute it took.
const cutKeySQL = `SELECT m.org_id::text, m.start, m.key_id, m.outcome, m.status, m.count - m.exported,
	m.count - m.exported + m.extra - m.extra_exported, m.count, m.extra
FROM usage_minutes m
WHERE m.org_id = $1 AND m.start = $2 AND m.key_id = $3 AND (m.count > m.exported OR m.extra > m.extra_exported)
ORDER BY m.outcome COLLATE "C", m.status
FOR UPDATE`

// cutOnce runs one cut transaction and returns how many minute rows it exported.
func (s *Store) cutOnce(ctx context.Context, c UsageCut, res *CutResult) (int, error) {
	tx, err := pgfailover.Begin(ctx, s.pool, pgfailover.Local)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(ctx)
	var since, cutAt time.Time
	err = tx.QueryRow(ctx, `SELECT since, cut_at FROM usage_export FOR UPDATE SKIP LOCKED`).Scan(&since, &cutAt)
	if errors.Is(err, pgx.ErrNoRows) {
		res.Busy = true
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	if cutAt.Before(c.Now.Add(-(UsageExportHold - exportResumeMargin))) {
		resume := c.Now.Add(-(UsageMinutesKept - exportResumeMargin)).Truncate(time.Minute)
		if resume.After(since) {
			res.SkippedFrom, res.SkippedTo, since = since.UTC(), resume.UTC(), resume
		}
	}
	deltas, marks, err := lockDeltas(ctx, tx, since, c.Settled)
	if err != nil {
		return 0, err
	}
	if len(marks.orgs) > 0 {
		if _, err := tx.Exec(ctx, `UPDATE usage_minutes m SET exported = k.count, extra_exported = k.extra
			FROM unnest($1::uuid[], $2::timestamptz[], $3::text[], $4::text[], $5::smallint[], $6::bigint[], $7::bigint[])
				AS k (org_id, start, key_id, outcome, status, count, extra)
			WHERE m.org_id = k.org_id AND m.start = k.start AND m.key_id = k.key_id AND m.outcome = k.outcome AND m.status = k.status`,
			marks.orgs, marks.starts, marks.keys, marks.outcomes, marks.statuses, marks.counts, marks.extras); err != nil {
			return 0, err
		}
		if err := writeEvents(ctx, tx, c, deltas); err != nil {
			return 0, err
		}
	}
	if _, err := tx.Exec(ctx, `UPDATE usage_export SET since = $1, cut_at = $2`, since, c.Now); err != nil {
		return 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, err
	}
	res.Events += len(deltas)
	return len(marks.orgs), nil
}

// cutRow is a minute row a cut exports: its key, what it holds beyond what is
// exported (count and units), and the count and extra it is exported up to.
type cutRow struct {
	org, key, outcome string
	start             time.Time
	status            int16
	count, units      int64
	toCount, toExtra  int64
}

// exportMarks are the rows of a cut as the columns of the UPDATE that marks them.
type exportMarks struct {
	orgs, keys, outcomes []string
	starts               []time.Time
	statuses             []int16
	counts, extras       []int64
}

// lockDeltas locks the rows of the next cut and returns their deltas, one per key's
// minute, and the marks that record them exported. When cutLockSQL stops at its
// limit, the last key's minute is completed by cutKeySQL, so that it is one event.
func lockDeltas(ctx context.Context, tx pgx.Tx, since, settled time.Time) ([]UsageDelta, exportMarks, error) {
	rows, err := queryCutRows(ctx, tx, cutLockSQL, since, settled, cutBatch)
	if err != nil || len(rows) < cutBatch {
		return deltasOf(rows), marksOf(rows), err
	}
	last := rows[len(rows)-1]
	rest, err := queryCutRows(ctx, tx, cutKeySQL, last.org, last.start, last.key)
	if err != nil {
		return nil, exportMarks{}, err
	}
	for len(rows) > 0 && rows[len(rows)-1].key == last.key && rows[len(rows)-1].org == last.org {
		rows = rows[:len(rows)-1]
	}
	rows = append(rows, rest...)
	return deltasOf(rows), marksOf(rows), nil
}

// queryCutRows runs cutLockSQL or cutKeySQL.
func queryCutRows(ctx context.Context, tx pgx.Tx, sql string, args ...any) ([]cutRow, error) {
	rows, err := tx.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (cutRow, error) {
		var r cutRow
		err := row.Scan(&r.org, &r.start, &r.key, &r.outcome, &r.status, &r.count, &r.units, &r.toCount, &r.toExtra)
		r.start = r.start.UTC()
		return r, err
	})
}

// deltasOf returns the deltas of rows, which come in the primary key's order: a key's
// minute is a run of them, and within it an outcome's rows (one a status) are a run.
func deltasOf(rows []cutRow) []UsageDelta {
	var deltas []UsageDelta
	for _, r := range rows {
		n := len(deltas)
		if n == 0 || deltas[n-1].OrgID != r.org || deltas[n-1].KeyID != r.key || !deltas[n-1].Minute.Equal(r.start) {
			deltas = append(deltas, UsageDelta{OrgID: r.org, KeyID: r.key, Minute: r.start})
			n++
		}
		d := &deltas[n-1]
		if m := len(d.Outcomes); m > 0 && d.Outcomes[m-1].Outcome == r.outcome {
			d.Outcomes[m-1].Count += r.count
			d.Outcomes[m-1].Units += r.units
		} else {
			d.Outcomes = append(d.Outcomes, UsageAmount{Outcome: r.outcome, Count: r.count, Units: r.units})
		}
	}
	return deltas
}

// marksOf returns the marks of rows.
func marksOf(rows []cutRow) exportMarks {
	var m exportMarks
	for _, r := range rows {
		m.orgs, m.starts, m.keys = append(m.orgs, r.org), append(m.starts, r.start), append(m.keys, r.key)
		m.outcomes, m.statuses = append(m.outcomes, r.outcome), append(m.statuses, r.status)
		m.counts, m.extras = append(m.counts, r.toCount), append(m.extras, r.toExtra)
	}
	return m
}

// writeEvents writes the event of each delta into the outbox, due at c.Now.
func writeEvents(ctx context.Context, tx pgx.Tx, c UsageCut, deltas []UsageDelta) error {
	ids, minutes, bodies := make([]string, len(deltas)), make([]time.Time, len(deltas)), make([]string, len(deltas))
	for i, d := range deltas {
		ev, err := c.Encode(d)
		if err != nil {
			return err
		}
		ids[i], minutes[i], bodies[i] = ev.ID, d.Minute, string(ev.Body)
	}
	_, err := tx.Exec(ctx, `INSERT INTO usage_export_events (id, minute, body, next_attempt_at, created_at)
		SELECT id, minute, body, $4, $4 FROM unnest($1::text[], $2::timestamptz[], $3::text[]) AS e (id, minute, body)`,
		ids, minutes, bodies, c.Now)
	return err
}

// OldestUnexported returns the oldest minute up to settled whose counts the receiver
// has not all taken: cut into an event still in the outbox, or not cut yet. ok is false
// when there is none, or no export has started.
func (s *Store) OldestUnexported(ctx context.Context, settled time.Time) (minute time.Time, ok bool, err error) {
	var m *time.Time
	err = s.pool.QueryRow(ctx, `SELECT least(
	(SELECT min(minute) FROM usage_export_events),
	(SELECT start FROM usage_minutes WHERE start >= (SELECT since FROM usage_export) AND start <= $1
	 AND (count > exported OR extra > extra_exported) ORDER BY start LIMIT 1))`, settled).Scan(&m)
	if err != nil {
		return time.Time{}, false, fmt.Errorf("reading the usage export's backlog: %w", err)
	}
	if m == nil {
		return time.Time{}, false, nil
	}
	return m.UTC(), true, nil
}
