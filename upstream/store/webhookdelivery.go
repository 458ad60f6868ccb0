package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keygate/keygate/internal/pgfailover"
)

// The states of a delivery.
const (
	DeliveryPending   = "pending"
	DeliveryDelivered = "delivered"
	DeliveryFailed    = "failed"
)

// Delivery is one event for one endpoint, with its attempts, oldest first.
type Delivery struct {
	ID        int64
	EventID   string
	EventType string
	// Body is the event's body, as every attempt sent it.
	Body          string
	State         string
	NextAttemptAt *time.Time // pending only
	CreatedAt     time.Time
	Attempts      []Attempt
}

// Attempt is one POST of a delivery: the status it got, or why it got none.
type Attempt struct {
	At         time.Time
	StatusCode int    // 0 when Error is set
	Error      string // "" when StatusCode is set
	Duration   time.Duration
}

// Deliveries returns up to limit deliveries of orgID's endpoint id, newest first, with
// their attempts. When before > 0, it returns those with an id below before.
func (s *Store) Deliveries(ctx context.Context, orgID, id string, before int64, limit int) ([]Delivery, error) {
	if _, err := s.Webhook(ctx, orgID, id); err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, `SELECT d.id, d.event_id, ev.type, ev.body, d.state,
	CASE WHEN d.state = 'pending' THEN d.next_attempt_at END, d.created_at,
	COALESCE((SELECT jsonb_agg(jsonb_build_object('at', a.at, 'status_code', a.status_code, 'error', a.error, 'ms', a.duration_ms) ORDER BY a.id)
	          FROM webhook_attempts a WHERE a.delivery_id = d.id), '[]')
FROM webhook_deliveries d JOIN webhook_events ev ON ev.id = d.event_id
WHERE d.endpoint_id = $1 AND ($2 = 0 OR d.id < $2)
ORDER BY d.id DESC LIMIT $3`, id, before, limit)
	if err != nil {
		return nil, fmt.Errorf("listing deliveries: %w", err)
	}
	type attemptRow struct {
		At         time.Time `json:"at"`
		StatusCode *int      `json:"status_code"`
		Error      *string   `json:"error"`
		MS         int64     `json:"ms"`
	}
	list, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Delivery, error) {
		var d Delivery
		var attempts []attemptRow
		if err := row.Scan(&d.ID, &d.EventID, &d.EventType, &d.Body, &d.State, &d.NextAttemptAt, &d.CreatedAt, &attempts); err != nil {
			return d, err
		}
		for _, a := range attempts {
			at := Attempt{At: a.At.UTC(), Duration: time.Duration(a.MS) * time.Millisecond}
			if a.StatusCode != nil {
				at.StatusCode = *a.StatusCode
			}
			if a.Error != nil {
				at.Error = *a.Error
			}
			d.Attempts = append(d.Attempts, at)
		}
		d.CreatedAt = d.CreatedAt.UTC()
		return d, nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing deliveries: %w", err)
	}
	return list, nil
}

// RetryDelivery makes orgID's delivery id of endpoint webhookID due at now. A pending
// delivery keeps its place in the schedule; a delivered or failed one gets one more
// attempt (attempts is set to lastAttempt, the dispatcher's last before failing).
func (s *Store) RetryDelivery(ctx context.Context, orgID, webhookID string, id int64, lastAttempt int, now time.Time) error {
	if !ValidUUID(webhookID) {
		return ErrDeliveryNotFound
	}
	tag, err := pgfailover.Exec(ctx, s.pool, pgfailover.Local, `UPDATE webhook_deliveries d SET
	next_attempt_at = $4,
	attempts = CASE WHEN d.state = 'pending' THEN d.attempts ELSE GREATEST(d.attempts, $5) END,
	state = 'pending', lease = NULL, finished_at = NULL
FROM webhook_endpoints e
WHERE d.id = $3 AND d.endpoint_id = $2 AND e.id = d.endpoint_id AND e.org_id = $1`, orgID, webhookID, id, now, lastAttempt)
	if err != nil {
		return fmt.Errorf("retrying delivery: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return ErrDeliveryNotFound
	}
	return nil
}

// Claim is a delivery a dispatcher holds until its lease ends: what it sends, and
// where.
type Claim struct {
	DeliveryID int64
	Lease      string
	Attempts   int // attempts made before this one
	EventID    string
	Body       []byte
	EndpointID string
	OrgID      string
	URL        string
	// Secrets sign the attempt: the endpoint's secret, and the one it replaced while
	// that still signs.
	Secrets []string
}

// ClaimDeliveries takes up to limit pending deliveries of enabled endpoints that are
// due at now, oldest first. Each is leased until now + lease: no other dispatcher
// takes it before then, so each attempt is made once. Rows another dispatcher is
// claiming are skipped, not waited for (FOR UPDATE SKIP LOCKED). A dispatcher that
// dies leaves its claims to be taken again when their leases end.
func (s *Store) ClaimDeliveries(ctx context.Context, now time.Time, lease time.Duration, limit int) ([]Claim, error) {
	rows, err := pgfailover.Query(ctx, s.pool, pgfailover.Local, `WITH c AS (
	SELECT d.id FROM webhook_deliveries d JOIN webhook_endpoints e ON e.id = d.endpoint_id
	WHERE d.state = 'pending' AND d.next_attempt_at <= $1 AND e.enabled
	ORDER BY d.next_attempt_at, d.id LIMIT $3
	FOR UPDATE OF d SKIP LOCKED
)
UPDATE webhook_deliveries d SET next_attempt_at = $2, lease = gen_random_uuid()
FROM c, webhook_events ev, webhook_endpoints e
WHERE d.id = c.id AND ev.id = d.event_id AND e.id = d.endpoint_id
RETURNING d.id, d.lease::text, d.attempts, d.event_id, ev.body, e.id::text, e.org_id::text, e.url,
	CASE WHEN e.previous_expires_at > $1 THEN ARRAY[e.secret, e.previous_secret] ELSE ARRAY[e.secret] END`,
		now, now.Add(lease), limit)
	if err != nil {
		return nil, fmt.Errorf("claiming deliveries: %w", err)
	}
	claims, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Claim, error) {
		var c Claim
		var body string
		err := row.Scan(&c.DeliveryID, &c.Lease, &c.Attempts, &c.EventID, &body, &c.EndpointID, &c.OrgID, &c.URL, &c.Secrets)
		c.Body = []byte(body)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("claiming deliveries: %w", err)
	}
	return claims, nil
}

// Outcome is what became of an attempt.
type Outcome struct {
	Attempt
	// Delivered is a 2xx answer in time.
	Delivered bool
	// RetryAt is when to try again; zero when the delivery has failed for good.
	RetryAt time.Time
	// DisableAfter is how long an endpoint may fail before it is disabled.
	DisableAfter time.Duration
}

// RecordAttempt records the attempt of c, if c's lease still holds, and moves the
// delivery on: delivered, due again at o.RetryAt, or failed. A delivered attempt ends
// the endpoint's failure streak; a failed one starts it, and an endpoint failing for
// o.DisableAfter is disabled and audited as webhook.disabled. It reports whether the
// endpoint was disabled. A lease that ended (another dispatcher took the delivery)
// records nothing.
func (s *Store) RecordAttempt(ctx context.Context, c Claim, o Outcome) (disabled bool, err error) {
	tx, err := pgfailover.Begin(ctx, s.pool, pgfailover.Local)
	if err != nil {
		return false, fmt.Errorf("beginning transaction: %w", err)
	}
	defer tx.Rollback(ctx)
	state, next := DeliveryFailed, (*time.Time)(nil)
	switch {
	case o.Delivered:
		state = DeliveryDelivered
	case !o.RetryAt.IsZero():
		state, next = DeliveryPending, &o.RetryAt
	}
	tag, err := tx.Exec(ctx, `UPDATE webhook_deliveries SET attempts = attempts + 1, state = $3, lease = NULL,
	next_attempt_at = COALESCE($4, next_attempt_at), finished_at = CASE WHEN $3 = 'pending' THEN NULL ELSE $5::timestamptz END
WHERE id = $1 AND lease = $2`, c.DeliveryID, c.Lease, state, next, o.At)
	if err != nil {
		return false, fmt.Errorf("recording attempt: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return false, nil
	}
	var code *int
	var msg *string
	if o.Error != "" {
		msg = &o.Error
	} else {
		code = &o.StatusCode
	}
	if _, err := tx.Exec(ctx, `INSERT INTO webhook_attempts (delivery_id, at, status_code, error, duration_ms) VALUES ($1, $2, $3, $4, $5)`,
		c.DeliveryID, o.At, code, msg, o.Duration.Milliseconds()); err != nil {
		return false, fmt.Errorf("recording attempt: %w", err)
	}
	if o.Delivered {
		_, err = tx.Exec(ctx, `UPDATE webhook_endpoints SET failing_since = NULL WHERE id = $1 AND failing_since IS NOT NULL`, c.EndpointID)
	} else {
		disabled, err = failing(ctx, tx, c.EndpointID, o.At, o.DisableAfter)
	}
	if err != nil {
		return false, fmt.Errorf("recording endpoint health: %w", err)
	}
	if disabled {
		// Audited once: the endpoint is disabled now, and a disabled endpoint's
		// deliveries are not claimed, so no later attempt comes here.
		if err := auditWebhook(ctx, tx, c.OrgID, ActionWebhookDisabled, c.EndpointID, ActorDispatcher); err != nil {
			return false, err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("committing attempt: %w", err)
	}
	return disabled, nil
}

// failing records a failed attempt at at of the endpoint id within tx. It starts the
// endpoint's failure streak, or disables the endpoint when the streak is disableAfter
// old, and then reports true.
func failing(ctx context.Context, tx pgx.Tx, id string, at time.Time, disableAfter time.Duration) (bool, error) {
	var since time.Time
	var enabled bool
	err := tx.QueryRow(ctx, `UPDATE webhook_endpoints SET failing_since = COALESCE(failing_since, $2) WHERE id = $1 RETURNING failing_since, enabled`,
		id, at).Scan(&since, &enabled)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && (!enabled || at.Sub(since) < disableAfter)) {
		return false, nil // deleted meanwhile, already disabled, or not failing for long enough
	}
	if err != nil {
		return false, err
	}
	_, err = tx.Exec(ctx, `UPDATE webhook_endpoints SET enabled = false, disabled_reason = 'failing', updated_at = $2 WHERE id = $1`, id, at)
	return err == nil, err
}

// ReleaseClaim gives c back unattempted, due at now, if its lease still holds: a
// dispatcher that stops gives back what it has not delivered.
func (s *Store) ReleaseClaim(ctx context.Context, c Claim, now time.Time) error {
	if _, err := pgfailover.Exec(ctx, s.pool, pgfailover.Local, `UPDATE webhook_deliveries SET lease = NULL, next_attempt_at = $3 WHERE id = $1 AND lease = $2`,
		c.DeliveryID, c.Lease, now); err != nil {
		return fmt.Errorf("releasing delivery: %w", err)
	}
	return nil
}

// OldestUndelivered returns the age at now of the oldest pending delivery of an
// enabled endpoint, or 0 when there is none.
func (s *Store) OldestUndelivered(ctx context.Context, now time.Time) (time.Duration, error) {
	var oldest *time.Time
	err := s.pool.QueryRow(ctx, `SELECT min(d.created_at) FROM webhook_deliveries d JOIN webhook_endpoints e ON e.id = d.endpoint_id
WHERE d.state = 'pending' AND e.enabled`).Scan(&oldest)
	if err != nil {
		return 0, fmt.Errorf("reading the outbox: %w", err)
	}
	if oldest == nil {
		return 0, nil
	}
	return max(now.Sub(*oldest), 0), nil
}
