package store

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keygate/keygate/internal/pgfailover"
	"github.com/keygate/keygate/upstream/apperr"
)

// Monitor is a monitor as the API returns it. Its config, assertions, config_version,
// paused_reason, org_id and deleted_at are never even read.
type Monitor struct {
	ID              string    `json:"id"`
	Name            string    `json:"name"`
	Type            string    `json:"type"`
	Target          string    `json:"target"`
	IntervalSeconds int       `json:"interval_seconds"`
	Locations       []string  `json:"locations"`
	Paused          bool      `json:"paused"`
	CreatedAt       time.Time `json:"created_at"`
	UpdatedAt       time.Time `json:"updated_at"`
}

// monitorColumns are the columns scanned by scanMonitor, in its order.
const monitorColumns = `m.id::text, m.name, m.type, m.target, m.interval_seconds, m.locations, m.paused, m.created_at, m.updated_at`

// scanMonitor scans monitorColumns (and any extra destinations after them) from row.
func scanMonitor(row pgx.Row, extra ...any) (Monitor, error) {
	var m Monitor
	dest := append([]any{&m.ID, &m.Name, &m.Type, &m.Target, &m.IntervalSeconds, &m.Locations, &m.Paused,
		&m.CreatedAt, &m.UpdatedAt}, extra...)
	err := row.Scan(dest...)
	m.CreatedAt, m.UpdatedAt = m.CreatedAt.UTC(), m.UpdatedAt.UTC()
	return m, err
}

// CreateMonitor inserts a monitor for orgID once it passes the plan's gates. w must
// have been through ForCreate. The org's row is locked for the whole transaction, so
// concurrent creates in one org count and insert one at a time. Two creates at
// max_monitors - 1 cannot both succeed. The lock is FOR NO KEY UPDATE, which leaves
// other tables' foreign-key checks alone.
func (s *Store) CreateMonitor(ctx context.Context, orgID string, w MonitorWrite) (Monitor, error) {
	tx, err := pgfailover.Begin(ctx, s.pool, pgfailover.Local)
	if err != nil {
		return Monitor{}, fmt.Errorf("beginning transaction: %w", err)
	}
	defer tx.Rollback(ctx)

	var p planLimits
	err = tx.QueryRow(ctx, `SELECT p.max_monitors, p.min_interval_seconds, p.locations, p.check_types
FROM orgs o JOIN plans p ON p.name = o.plan
WHERE o.id = $1
FOR NO KEY UPDATE OF o`, orgID).Scan(&p.maxMonitors, &p.minInterval, &p.locations, &p.checkTypes)
	if errors.Is(err, pgx.ErrNoRows) {
		return Monitor{}, apperr.ErrNotFound
	}
	if err != nil {
		return Monitor{}, fmt.Errorf("locking org: %w", err)
	}
	live := skipMonitorQuota
	if p.maxMonitors >= 0 {
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM monitors WHERE org_id = $1 AND deleted_at IS NULL`,
			orgID).Scan(&live); err != nil {
			return Monitor{}, fmt.Errorf("counting monitors: %w", err)
		}
	}
	if err := planGate(p, w, live); err != nil {
		return Monitor{}, err
	}
	m, err := scanMonitor(tx.QueryRow(ctx, `INSERT INTO monitors AS m
	(org_id, name, type, target, interval_seconds, locations, paused, config, assertions)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
RETURNING `+monitorColumns,
		orgID, *w.Name, *w.Type, *w.Target, *w.IntervalSeconds, w.Locations, *w.Paused, w.Config, w.Assertions))
	if err != nil {
		return Monitor{}, fmt.Errorf("inserting monitor: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return Monitor{}, fmt.Errorf("committing monitor: %w", err)
	}
	return m, nil
}

// PatchMonitor applies w to the live monitor id of orgID. The resulting target must
// suit the resulting type. The fields w sets must pass the plan's gates.
// config_version grows by one when the stored config or assertions change. They are
// compared as jsonb, so key order and white space do not count. A w that sets nothing
// changes nothing, updated_at included.
func (s *Store) PatchMonitor(ctx context.Context, orgID, id string, w MonitorWrite) (Monitor, error) {
	tx, err := pgfailover.Begin(ctx, s.pool, pgfailover.Local)
	if err != nil {
		return Monitor{}, fmt.Errorf("beginning transaction: %w", err)
	}
	defer tx.Rollback(ctx)

	var p planLimits
	cur, err := scanMonitor(tx.QueryRow(ctx, `SELECT `+monitorColumns+`, p.max_monitors, p.min_interval_seconds, p.locations, p.check_types
FROM monitors m JOIN orgs o ON o.id = m.org_id JOIN plans p ON p.name = o.plan
WHERE m.id = $1 AND m.org_id = $2 AND m.deleted_at IS NULL
FOR UPDATE OF m`, id, orgID), &p.maxMonitors, &p.minInterval, &p.locations, &p.checkTypes)
	if errors.Is(err, pgx.ErrNoRows) {
		return Monitor{}, apperr.ErrMonitorNotFound
	}
	if err != nil {
		return Monitor{}, fmt.Errorf("reading monitor: %w", err)
	}
	if w.Type != nil || w.Target != nil {
		typ, target := cur.Type, cur.Target
		if w.Type != nil {
			typ = *w.Type
		}
		if w.Target != nil {
			target = *w.Target
		}
		if err := CheckTarget(typ, target); err != nil {
			return Monitor{}, err
		}
	}
	if err := planGate(p, w, skipMonitorQuota); err != nil {
		return Monitor{}, err
	}
	if w.empty() {
		return cur, nil
	}
	m, err := scanMonitor(tx.QueryRow(ctx, `UPDATE monitors AS m SET
	name             = COALESCE($3, m.name),
	type             = COALESCE($4, m.type),
	target           = COALESCE($5, m.target),
	interval_seconds = COALESCE($6, m.interval_seconds),
	locations        = COALESCE($7, m.locations),
	paused           = COALESCE($8, m.paused),
	config           = COALESCE($9::jsonb, m.config),
	assertions       = COALESCE($10::jsonb, m.assertions),
	config_version   = m.config_version + CASE
		WHEN COALESCE($9::jsonb, m.config) IS DISTINCT FROM m.config
		  OR COALESCE($10::jsonb, m.assertions) IS DISTINCT FROM m.assertions THEN 1 ELSE 0 END,
	updated_at       = now()
WHERE m.id = $1 AND m.org_id = $2
RETURNING `+monitorColumns,
		id, orgID, w.Name, w.Type, w.Target, w.IntervalSeconds, w.Locations, w.Paused, w.Config, w.Assertions))
	if err != nil {
		return Monitor{}, fmt.Errorf("updating monitor: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return Monitor{}, fmt.Errorf("committing monitor: %w", err)
	}
	return m, nil
}

// GetMonitor returns the live monitor id of orgID, or apperr.ErrMonitorNotFound.
func (s *Store) GetMonitor(ctx context.Context, orgID, id string) (Monitor, error) {
	m, err := scanMonitor(s.pool.QueryRow(ctx, `SELECT `+monitorColumns+`
FROM monitors m WHERE m.id = $1 AND m.org_id = $2 AND m.deleted_at IS NULL`, id, orgID))
	if errors.Is(err, pgx.ErrNoRows) {
		return Monitor{}, apperr.ErrMonitorNotFound
	}
	if err != nil {
		return Monitor{}, fmt.Errorf("reading monitor: %w", err)
	}
	return m, nil
}

// DeleteMonitor marks the live monitor id of orgID deleted. It is not found again.
// A monitor not found is apperr.ErrMonitorNotFound.
func (s *Store) DeleteMonitor(ctx context.Context, orgID, id string) error {
	tag, err := pgfailover.Exec(ctx, s.pool, pgfailover.Local, `UPDATE monitors SET deleted_at = now(), updated_at = now()
WHERE id = $1 AND org_id = $2 AND deleted_at IS NULL`, id, orgID)
	if err != nil {
		return fmt.Errorf("deleting monitor: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return apperr.ErrMonitorNotFound
	}
	return nil
}

// Cursor is a position in an org's monitor list: the (created_at, id) of a page's last
// monitor. Clients see it only as an opaque string.
type Cursor struct {
	CreatedAt time.Time
	ID        string
}

// Encode returns c as the base64url text of "<unix microseconds>,<id>". PostgreSQL
// keeps microseconds, so the position is exact.
func (c Cursor) Encode() string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(c.CreatedAt.UnixMicro(), 10) + "," + c.ID))
}

// DecodeCursor is the inverse of Encode. Anything else is an EINVALID error naming
// "cursor".
func DecodeCursor(s string) (Cursor, error) {
	bad := apperr.Invalid("cursor", "is not a cursor this API returned")
	raw, err := base64.RawURLEncoding.Strict().DecodeString(s)
	if err != nil {
		return Cursor{}, bad
	}
	micros, id, ok := strings.Cut(string(raw), ",")
	if !ok || !ValidUUID(id) {
		return Cursor{}, bad
	}
	us, err := strconv.ParseInt(micros, 10, 64)
	if err != nil {
		return Cursor{}, bad
	}
	return Cursor{CreatedAt: time.UnixMicro(us), ID: id}, nil
}

// ListMonitors returns up to limit live monitors of orgID, ordered by (created_at, id).
// They start after the position after, or from the start when after is nil. It also
// returns the cursor of the next page, nil at the end.
func (s *Store) ListMonitors(ctx context.Context, orgID string, limit int, after *Cursor) ([]Monitor, *Cursor, error) {
	var (
		rows pgx.Rows
		err  error
	)
	if after == nil {
		rows, err = s.pool.Query(ctx, `SELECT `+monitorColumns+` FROM monitors m
WHERE m.org_id = $1 AND m.deleted_at IS NULL
ORDER BY m.created_at, m.id LIMIT $2`, orgID, limit+1)
	} else {
		rows, err = s.pool.Query(ctx, `SELECT `+monitorColumns+` FROM monitors m
WHERE m.org_id = $1 AND m.deleted_at IS NULL AND (m.created_at, m.id) > ($3::timestamptz, $4::uuid)
ORDER BY m.created_at, m.id LIMIT $2`, orgID, limit+1, after.CreatedAt, after.ID)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("listing monitors: %w", err)
	}
	ms, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Monitor, error) { return scanMonitor(row) })
	if err != nil {
		return nil, nil, fmt.Errorf("listing monitors: %w", err)
	}
	if len(ms) <= limit {
		return ms, nil, nil
	}
	ms = ms[:limit]
	last := ms[limit-1]
	return ms, &Cursor{CreatedAt: last.CreatedAt, ID: last.ID}, nil
}
