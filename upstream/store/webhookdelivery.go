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
WHERE d.endpoint_id = $1 AND ($2::bigint = 0 OR d.id < $2::bigint)
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

// Shares bound the attempts a claim may put in flight: in the claiming process, and
// across every process, per organisation and per endpoint.
type Shares struct {
	// Slots is the most deliveries to claim now: the claimer's free slots.
	Slots int
	// PerOrg is the most attempts in flight to one organisation's endpoints.
	PerOrg int
	// PerEndpoint is the most attempts in flight to one endpoint.
	PerEndpoint int
}

// ClaimDeliveries takes pending deliveries of enabled endpoints that are due at now,
// up to sh.Slots, and leases each until now + lease: no other dispatcher takes it
// before then, so each attempt is made once. A claim leaves an organisation with at
// most sh.PerOrg attempts in flight, and an endpoint with at most sh.PerEndpoint,
// counting those of every dispatcher, so that a slow receiver holds its share of the
// attempts and never another's. It serves the organisations whose oldest due
// delivery is oldest first, their endpoints in turn, each endpoint's deliveries
// oldest first. A dispatcher that dies leaves its claims to be taken again when their
// leases end.
//
// The organisations served are locked while they are counted and claimed for;
// another dispatcher claiming at the same time skips them (SKIP LOCKED) and serves
// the next ones, so the limits hold across processes.
func (s *Store) ClaimDeliveries(ctx context.Context, now time.Time, lease time.Duration, sh Shares) ([]Claim, error) {
	if sh.Slots < 1 || sh.PerOrg < 1 || sh.PerEndpoint < 1 {
		return nil, nil
	}
	tx, err := pgfailover.Begin(ctx, s.pool, pgfailover.Local)
	if err != nil {
		return nil, fmt.Errorf("beginning transaction: %w", err)
	}
	defer tx.Rollback(ctx)
	// The locks come first, in a statement of their own: counts in the same statement
	// would read the table as it was before a lock was waited for.
	rows, err := tx.Query(ctx, `SELECT o.id::text FROM orgs o JOIN (
	SELECT e.org_id, min(d.next_attempt_at) AS due FROM webhook_deliveries d JOIN webhook_endpoints e ON e.id = d.endpoint_id
	WHERE d.state = 'pending' AND d.next_attempt_at <= $1 AND e.enabled
	GROUP BY e.org_id
) q ON q.org_id = o.id
WHERE (SELECT count(*) FROM webhook_deliveries f JOIN webhook_endpoints fe ON fe.id = f.endpoint_id
       WHERE fe.org_id = o.id AND f.lease IS NOT NULL AND f.state = 'pending' AND f.next_attempt_at > $1) < $3
ORDER BY q.due, o.id LIMIT $2
FOR NO KEY UPDATE OF o SKIP LOCKED`, now, sh.Slots, sh.PerOrg)
	if err != nil {
		return nil, fmt.Errorf("claiming deliveries: %w", err)
	}
	orgs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("claiming deliveries: %w", err)
	}
	if len(orgs) == 0 {
		return nil, nil
	}
	// flying is each endpoint's attempts in flight; due, up to PerEndpoint of each
	// endpoint's due deliveries ranked after them; ranked, those ranked again within
	// the organisation after its attempts in flight, so that its endpoints take turns.
	rows, err = tx.Query(ctx, `WITH flying AS (
	SELECT e.id, e.org_id, (SELECT count(*) FROM webhook_deliveries f
		WHERE f.endpoint_id = e.id AND f.lease IS NOT NULL AND f.state = 'pending' AND f.next_attempt_at > $1) AS n
	FROM webhook_endpoints e WHERE e.org_id = ANY($4::uuid[]) AND e.enabled
), due AS (
	SELECT x.id, fl.org_id, x.next_attempt_at, fl.n + row_number() OVER (PARTITION BY fl.id ORDER BY x.next_attempt_at, x.id) AS turn
	FROM flying fl CROSS JOIN LATERAL (
		SELECT d.id, d.next_attempt_at FROM webhook_deliveries d
		WHERE d.endpoint_id = fl.id AND d.state = 'pending' AND d.next_attempt_at <= $1
		ORDER BY d.next_attempt_at, d.id LIMIT greatest($6 - fl.n, 0)
	) x
), ranked AS (
	SELECT due.id, due.next_attempt_at,
		(SELECT sum(n) FROM flying f WHERE f.org_id = due.org_id) + row_number() OVER (PARTITION BY due.org_id ORDER BY due.turn, due.next_attempt_at, due.id) AS turn
	FROM due
), c AS (
	SELECT id FROM ranked WHERE turn <= $5 ORDER BY turn, next_attempt_at, id LIMIT $3
)
UPDATE webhook_deliveries d SET next_attempt_at = $2, lease = gen_random_uuid()
FROM c, webhook_events ev, webhook_endpoints e
WHERE d.id = c.id AND d.state = 'pending' AND ev.id = d.event_id AND e.id = d.endpoint_id
RETURNING d.id, d.lease::text, d.attempts, d.event_id, ev.body, e.id::text, e.org_id::text, e.url,
	CASE WHEN e.previous_expires_at > $1 THEN ARRAY[e.secret, e.previous_secret] ELSE ARRAY[e.secret] END`,
		now, now.Add(lease), sh.Slots, orgs, sh.PerOrg, sh.PerEndpoint)
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
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("committing claims: %w", err)
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
	// Gone is an answer of 410 Gone: the receiver says the endpoint is no more, and
	// it is disabled at once.
	Gone bool
}

// RecordAttempt records the attempt of c, if c's lease still holds, and moves the
// delivery on: delivered, due again at o.RetryAt, or failed. A delivered attempt ends
// the endpoint's failure streak; a failed one starts it, and an endpoint failing for
// o.DisableAfter, or answering 410 Gone (o.Gone), is disabled and audited as
// webhook.disabled. It reports whether the endpoint was disabled. A lease that ended (another dispatcher took the delivery)
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
		disabled, err = failing(ctx, tx, c.EndpointID, o)
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

// failing records the failed attempt o of the endpoint id within tx. It starts the
// endpoint's failure streak, or disables the endpoint when the streak is
// o.DisableAfter old ('failing') or the receiver answered 410 ('gone'), and then
// reports true.
func failing(ctx context.Context, tx pgx.Tx, id string, o Outcome) (bool, error) {
	var since time.Time
	var enabled bool
	err := tx.QueryRow(ctx, `UPDATE webhook_endpoints SET failing_since = COALESCE(failing_since, $2) WHERE id = $1 RETURNING failing_since, enabled`,
		id, o.At).Scan(&since, &enabled)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && (!enabled || !o.Gone && o.At.Sub(since) < o.DisableAfter)) {
		return false, nil // deleted meanwhile, already disabled, or not failing for long enough
	}
	if err != nil {
		return false, err
	}
	reason := "failing"
	if o.Gone {
		reason = "gone"
	}
	_, err = tx.Exec(ctx, `UPDATE webhook_endpoints SET enabled = false, disabled_reason = $3, updated_at = $2 WHERE id = $1`, id, o.At, reason)
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
