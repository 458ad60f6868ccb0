package store

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keygate/keygate/internal/pgfailover"
)

// The usage export's outbox: the events CutUsage wrote, until the receiver takes them.
// Exporters claim due events in batches, each batch under a lease of its own, as the
// webhook dispatchers claim deliveries (ClaimDeliveries).

// ClaimExportEvents takes up to limit events due at now, oldest due first, and leases
// them until now + lease: no other exporter takes them before then, so each attempt is
// made once. Rows another exporter is claiming are skipped, not waited for (FOR UPDATE
// SKIP LOCKED). It returns the claim's lease and its events, ordered by minute and id.
// An exporter that dies leaves its claims to be taken again when their lease ends.
func (s *Store) ClaimExportEvents(ctx context.Context, now time.Time, lease time.Duration, limit int) (string, []ExportEvent, error) {
	rows, err := pgfailover.Query(ctx, s.pool, pgfailover.Local, `WITH c AS (
	SELECT id FROM usage_export_events WHERE next_attempt_at <= $1
	ORDER BY next_attempt_at, minute, id LIMIT $3
	FOR UPDATE SKIP LOCKED
), l AS (SELECT gen_random_uuid() AS lease)
UPDATE usage_export_events e SET next_attempt_at = $2, lease = l.lease
FROM c, l WHERE e.id = c.id
RETURNING e.lease::text, e.id, e.minute, e.body, e.attempts`, now, now.Add(lease), limit)
	if err != nil {
		return "", nil, fmt.Errorf("claiming usage events: %w", err)
	}
	var leaseID string
	events, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (ExportEvent, error) {
		var ev ExportEvent
		var body string
		err := row.Scan(&leaseID, &ev.ID, &ev.Minute, &body, &ev.Attempts)
		ev.Minute, ev.Body = ev.Minute.UTC(), []byte(body)
		return ev, err
	})
	if err != nil {
		return "", nil, fmt.Errorf("claiming usage events: %w", err)
	}
	slices.SortFunc(events, func(a, b ExportEvent) int {
		return cmp.Or(a.Minute.Compare(b.Minute), strings.Compare(a.ID, b.ID))
	})
	return leaseID, events, nil
}

// ExportDelivered deletes the events of lease, which the receiver took, if the lease
// still holds. It returns how many it deleted.
func (s *Store) ExportDelivered(ctx context.Context, lease string) (int64, error) {
	tag, err := pgfailover.Exec(ctx, s.pool, pgfailover.Local, `DELETE FROM usage_export_events WHERE lease = $1`, lease)
	if err != nil {
		return 0, fmt.Errorf("recording usage events delivered: %w", err)
	}
	return tag.RowsAffected(), nil
}

// ExportFailed records a failed attempt at now of the events of lease, if the lease
// still holds, with why. An event that has failed n times is due again after
// backoff × 2^(n-1), at most max.
func (s *Store) ExportFailed(ctx context.Context, lease string, now time.Time, backoff, max time.Duration, why string) error {
	_, err := pgfailover.Exec(ctx, s.pool, pgfailover.Local, `UPDATE usage_export_events SET attempts = attempts + 1, lease = NULL, last_error = $5,
	next_attempt_at = $2::timestamptz + least($4::interval, $3::interval * power(2, least(attempts, 40)))
WHERE lease = $1`, lease, now, backoff, max, why)
	if err != nil {
		return fmt.Errorf("recording a usage export attempt: %w", err)
	}
	return nil
}

// ReleaseExportEvents gives the events of lease back unattempted, due at now, if the
// lease still holds: an exporter that stops gives back what it has not delivered.
func (s *Store) ReleaseExportEvents(ctx context.Context, lease string, now time.Time) error {
	if _, err := pgfailover.Exec(ctx, s.pool, pgfailover.Local, `UPDATE usage_export_events SET lease = NULL, next_attempt_at = $2 WHERE lease = $1`,
		lease, now); err != nil {
		return fmt.Errorf("releasing usage events: %w", err)
	}
	return nil
}
