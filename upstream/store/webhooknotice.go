package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keygate/keygate/internal/pgfailover"
	"github.com/keygate/keygate/keystore"
)

// ExpiryNotices writes, once per key, the events of its expiry that are due at now:
// key.expiring 7 days before expires_at, key.expiring again 1 day before, and
// key.expired. A key whose expiry is nearer than a notice's lead gets only the
// nearest notice. A key that expired more than a day before now gets none: the
// notices are news, not history. It returns the events written.
func (s *Store) ExpiryNotices(ctx context.Context, now time.Time) (int, error) {
	var n int
	err := pgfailover.QueryRow(ctx, s.pool, pgfailover.Local, `WITH due AS (
	SELECT k.org_id, k.key_id, k.name, k.role, k.expires_at,
		CASE WHEN k.expires_at <= $1 THEN 'key.expired'
		     WHEN k.expires_at <= $1 + interval '1 day' THEN 'key.expiring.1d'
		     ELSE 'key.expiring.7d' END AS kind
	FROM api_keys k
	WHERE k.revoked_at IS NULL AND k.expires_at > $1 - interval '1 day' AND k.expires_at <= $1 + interval '7 days'
), fresh AS (
	INSERT INTO webhook_notices (org_id, kind, subject, at)
	SELECT org_id, kind, key_id, $1 FROM due
	ON CONFLICT DO NOTHING
	RETURNING org_id, kind, subject
)
SELECT count(webhook_enqueue(d.org_id, split_part(d.kind, '.', 1) || '.' || split_part(d.kind, '.', 2),
	jsonb_build_object('org_id', d.org_id, 'key_id', d.key_id, 'name', d.name, 'role', d.role,
		'expires_at', to_char(d.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))
	|| CASE WHEN d.kind = 'key.expired' THEN '{}'::jsonb ELSE jsonb_build_object('notice', split_part(d.kind, '.', 3)) END,
	$1))
FROM fresh f JOIN due d ON d.org_id = f.org_id AND d.key_id = f.subject AND d.kind = f.kind`, now).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("writing expiry notices: %w", err)
	}
	return n, nil
}

// QuotaOrg is an organisation whose plan has a monthly quota and which has an
// enabled webhook endpoint: the orgs whose quota thresholds are watched.
type QuotaOrg struct {
	ID    string
	Limit int64 // api_requests_per_month
	// Refused is whether the usage record holds a request of the month that the quota
	// refused (outcome quota_exceeded).
	Refused bool
}

// QuotaOrgs returns the organisations whose thresholds are watched, with whether
// the quota refused any of their requests in the UTC month of now.
func (s *Store) QuotaOrgs(ctx context.Context, now time.Time) ([]QuotaOrg, error) {
	from := time.Date(now.UTC().Year(), now.UTC().Month(), 1, 0, 0, 0, 0, time.UTC)
	rows, err := s.pool.Query(ctx, `SELECT o.id::text, p.api_requests_per_month,
	EXISTS (SELECT 1 FROM usage_minutes m WHERE m.org_id = o.id AND m.start >= $1 AND m.start < $2 AND m.outcome = $3)
	OR EXISTS (SELECT 1 FROM usage_days u WHERE u.org_id = o.id AND u.start >= $1 AND u.start < $2 AND u.outcome = $3)
FROM orgs o JOIN plans p ON p.name = o.plan
WHERE p.api_requests_per_month > 0 AND EXISTS (SELECT 1 FROM webhook_endpoints e WHERE e.org_id = o.id AND e.enabled)
ORDER BY o.id`, from, from.AddDate(0, 1, 0), keystore.OutcomeQuotaExceeded.String())
	if err != nil {
		return nil, fmt.Errorf("listing quota orgs: %w", err)
	}
	orgs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[QuotaOrg])
	if err != nil {
		return nil, fmt.Errorf("listing quota orgs: %w", err)
	}
	return orgs, nil
}

// QuotaThresholds are the shares of the monthly quota, in percent, whose crossing is
// an event.
var QuotaThresholds = []int{80, 100}

// QuotaNotices writes a quota.threshold event of org for each threshold that used
// reaches in the UTC month of now and that has not fired this month. The month's
// first refusal by the quota (org.Refused) reaches 100 %, whatever used is: a request
// that costs more than what is left is refused below it. It returns the events
// written.
func (s *Store) QuotaNotices(ctx context.Context, org QuotaOrg, used int64, now time.Time) (int, error) {
	month := now.UTC().Format("2006-01")
	written := 0
	for _, pct := range QuotaThresholds {
		if used*100 < org.Limit*int64(pct) && !(pct == 100 && org.Refused) {
			continue
		}
		var n int
		err := pgfailover.QueryRow(ctx, s.pool, pgfailover.Local, `WITH fresh AS (
	INSERT INTO webhook_notices (org_id, kind, subject, at) VALUES ($1, $2, $3, $4)
	ON CONFLICT DO NOTHING RETURNING org_id
)
SELECT count(webhook_enqueue(org_id, 'quota.threshold', jsonb_build_object('org_id', org_id, 'month', $3::text,
	'threshold_percent', $5::int, 'used', $6::bigint, 'limit', $7::bigint), $4)) FROM fresh`,
			org.ID, fmt.Sprintf("quota.%d", pct), month, now, pct, used, org.Limit).Scan(&n)
		if err != nil {
			return written, fmt.Errorf("writing quota notice: %w", err)
		}
		written += n
	}
	return written, nil
}

// WebhookRetention is how long a delivered or failed event, with its deliveries and
// attempts, is kept for the deliveries list.
const WebhookRetention = 30 * 24 * time.Hour

// PurgeWebhooks deletes the events older than WebhookRetention at now whose
// deliveries have all finished, with their deliveries and attempts, and the notices
// older than twice that, whose subjects can no longer fire. It returns the events
// deleted.
func (s *Store) PurgeWebhooks(ctx context.Context, now time.Time) (int64, error) {
	tag, err := pgfailover.Exec(ctx, s.pool, pgfailover.Local, `DELETE FROM webhook_events ev WHERE ev.created_at < $1
AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.event_id = ev.id AND d.state = 'pending')`, now.Add(-WebhookRetention))
	if err != nil {
		return 0, fmt.Errorf("purging webhook events: %w", err)
	}
	if _, err := pgfailover.Exec(ctx, s.pool, pgfailover.Local, `DELETE FROM webhook_notices WHERE at < $1`, now.Add(-2*WebhookRetention)); err != nil {
		return 0, fmt.Errorf("purging webhook notices: %w", err)
	}
	return tag.RowsAffected(), nil
}
