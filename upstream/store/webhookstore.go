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

// MaxWebhookEndpoints is the most endpoints an organisation may have.
const MaxWebhookEndpoints = 10

// SecretOverlap is how long a rotated secret keeps signing beside the new one.
const SecretOverlap = 24 * time.Hour

// The audit actions of webhook endpoints.
const (
	ActionWebhookCreated  = "webhook.created"
	ActionWebhookUpdated  = "webhook.updated"
	ActionWebhookDeleted  = "webhook.deleted"
	ActionWebhookRotated  = "webhook.secret_rotated"
	ActionWebhookDisabled = "webhook.disabled"
)

// ActorDispatcher is the audit actor of an endpoint disabled for failing.
const ActorDispatcher = "webhook-dispatcher"

// ErrTooManyWebhooks is the creation of an org's eleventh endpoint.
var ErrTooManyWebhooks = apperr.Errorf(apperr.ECONFLICT, "an organisation has at most %d webhook endpoints", MaxWebhookEndpoints)

// ErrWebhookNotFound is an endpoint id that is not the org's.
var ErrWebhookNotFound = &apperr.Error{Code: apperr.ENOTFOUND, Message: "webhook not found"}

// ErrDeliveryNotFound is a delivery id that is not one of the org's.
var ErrDeliveryNotFound = &apperr.Error{Code: apperr.ENOTFOUND, Message: "delivery not found"}

// Webhook is an endpoint. Secret is the current secret; only its creation and a
// rotation show it to the org.
type Webhook struct {
	ID          string
	OrgID       string
	URL         string
	Description string
	Events      []string
	Secret      string
	Enabled     bool
	// DisabledReason is "user", "failing" or "" while enabled.
	DisabledReason string
	FailingSince   *time.Time
	CreatedAt      time.Time
	UpdatedAt      time.Time
}

// WebhookWrite is an endpoint's creation or change. A nil field is left alone by a
// change.
type WebhookWrite struct {
	URL         *string
	Description *string
	Events      []string // nil: unchanged; empty: every type
	Enabled     *bool
}

const webhookColumns = `id::text, org_id::text, url, description, events, secret, enabled, COALESCE(disabled_reason, ''), failing_since, created_at, updated_at`

func scanWebhook(row pgx.Row) (Webhook, error) {
	var w Webhook
	err := row.Scan(&w.ID, &w.OrgID, &w.URL, &w.Description, &w.Events, &w.Secret, &w.Enabled, &w.DisabledReason,
		&w.FailingSince, &w.CreatedAt, &w.UpdatedAt)
	w.CreatedAt, w.UpdatedAt = w.CreatedAt.UTC(), w.UpdatedAt.UTC()
	return w, err
}

// auditWebhook appends a webhook action to orgID's audit trail within tx.
func auditWebhook(ctx context.Context, tx pgx.Tx, orgID, action, webhookID, actor string) error {
	_, err := tx.Exec(ctx, `INSERT INTO audit_events (org_id, action, webhook_id, actor) VALUES ($1, $2, $3, $4)`,
		orgID, action, webhookID, actor)
	if err != nil {
		return fmt.Errorf("auditing %s: %w", action, err)
	}
	return nil
}

// commitWebhook audits action by actor on orgID's endpoint id within tx and commits
// tx, so that a change is never without its audit row.
func commitWebhook(ctx context.Context, tx pgx.Tx, orgID, action, id, actor string) error {
	if err := auditWebhook(ctx, tx, orgID, action, id, actor); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("committing webhook: %w", err)
	}
	return nil
}

// changeWebhook runs query on orgID's endpoint id and audits it as action by actor,
// in one transaction. query takes orgID as $1, id as $2 and args from $3 on, and
// returns the endpoint's webhookColumns. An id that is not the org's, or that query
// finds no row for, is ErrWebhookNotFound. doing names the change in its errors.
func (s *Store) changeWebhook(ctx context.Context, orgID, id, actor, action, doing, query string, args ...any) (Webhook, error) {
	if !ValidUUID(id) {
		return Webhook{}, ErrWebhookNotFound
	}
	tx, err := pgfailover.Begin(ctx, s.pool, pgfailover.Local)
	if err != nil {
		return Webhook{}, fmt.Errorf("beginning transaction: %w", err)
	}
	defer tx.Rollback(ctx)
	wh, err := scanWebhook(tx.QueryRow(ctx, query, append([]any{orgID, id}, args...)...))
	if errors.Is(err, pgx.ErrNoRows) {
		return Webhook{}, ErrWebhookNotFound
	}
	if err != nil {
		return Webhook{}, fmt.Errorf("%s: %w", doing, err)
	}
	if err := commitWebhook(ctx, tx, orgID, action, id, actor); err != nil {
		return Webhook{}, err
	}
	return wh, nil
}

// CreateWebhook adds an endpoint to orgID with secret, audited as webhook.created by
// actor. w's URL and events must have been checked. The org's row is locked, so that
// concurrent creations count one at a time: the eleventh is ErrTooManyWebhooks.
func (s *Store) CreateWebhook(ctx context.Context, orgID, actor string, w WebhookWrite, secret string) (Webhook, error) {
	tx, err := pgfailover.Begin(ctx, s.pool, pgfailover.Local)
	if err != nil {
		return Webhook{}, fmt.Errorf("beginning transaction: %w", err)
	}
	defer tx.Rollback(ctx)
	// The lock comes first, in a statement of its own: a count in the same statement
	// would read the table as it was before the lock was waited for.
	tag, err := tx.Exec(ctx, `SELECT 1 FROM orgs WHERE id = $1 FOR NO KEY UPDATE`, orgID)
	if err != nil {
		return Webhook{}, fmt.Errorf("locking org: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return Webhook{}, apperr.ErrNotFound
	}
	var n int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM webhook_endpoints WHERE org_id = $1`, orgID).Scan(&n); err != nil {
		return Webhook{}, fmt.Errorf("counting webhooks: %w", err)
	}
	if n >= MaxWebhookEndpoints {
		return Webhook{}, ErrTooManyWebhooks
	}
	events := w.Events
	if events == nil {
		events = []string{}
	}
	desc := ""
	if w.Description != nil {
		desc = *w.Description
	}
	wh, err := scanWebhook(tx.QueryRow(ctx, `INSERT INTO webhook_endpoints (org_id, url, description, events, secret)
VALUES ($1, $2, $3, $4, $5) RETURNING `+webhookColumns, orgID, *w.URL, desc, events, secret))
	if err != nil {
		return Webhook{}, fmt.Errorf("creating webhook: %w", err)
	}
	if err := commitWebhook(ctx, tx, orgID, ActionWebhookCreated, wh.ID, actor); err != nil {
		return Webhook{}, err
	}
	return wh, nil
}

// Webhooks returns orgID's endpoints, oldest first.
func (s *Store) Webhooks(ctx context.Context, orgID string) ([]Webhook, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+webhookColumns+` FROM webhook_endpoints WHERE org_id = $1 ORDER BY created_at, id`, orgID)
	if err != nil {
		return nil, fmt.Errorf("listing webhooks: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Webhook, error) { return scanWebhook(row) })
	if err != nil {
		return nil, fmt.Errorf("listing webhooks: %w", err)
	}
	return list, nil
}

// Webhook returns orgID's endpoint id, or ErrWebhookNotFound.
func (s *Store) Webhook(ctx context.Context, orgID, id string) (Webhook, error) {
	if !ValidUUID(id) {
		return Webhook{}, ErrWebhookNotFound
	}
	wh, err := scanWebhook(s.pool.QueryRow(ctx, `SELECT `+webhookColumns+` FROM webhook_endpoints WHERE org_id = $1 AND id = $2`, orgID, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Webhook{}, ErrWebhookNotFound
	}
	if err != nil {
		return Webhook{}, fmt.Errorf("reading webhook: %w", err)
	}
	return wh, nil
}

// UpdateWebhook changes what w sets of orgID's endpoint id, audited as
// webhook.updated by actor. Enabling an endpoint clears its failure streak; disabling
// one records that a person did.
func (s *Store) UpdateWebhook(ctx context.Context, orgID, id, actor string, w WebhookWrite) (Webhook, error) {
	return s.changeWebhook(ctx, orgID, id, actor, ActionWebhookUpdated, "updating webhook", `UPDATE webhook_endpoints SET
	url = COALESCE($3, url),
	description = COALESCE($4, description),
	events = COALESCE($5, events),
	enabled = COALESCE($6, enabled),
	disabled_reason = CASE WHEN $6::boolean IS NULL THEN disabled_reason WHEN $6 THEN NULL ELSE COALESCE(disabled_reason, 'user') END,
	failing_since = CASE WHEN $6::boolean THEN NULL ELSE failing_since END,
	updated_at = now()
WHERE org_id = $1 AND id = $2 RETURNING `+webhookColumns, w.URL, w.Description, w.Events, w.Enabled)
}

// DeleteWebhook deletes orgID's endpoint id and its deliveries, audited as
// webhook.deleted by actor.
func (s *Store) DeleteWebhook(ctx context.Context, orgID, id, actor string) error {
	_, err := s.changeWebhook(ctx, orgID, id, actor, ActionWebhookDeleted, "deleting webhook",
		`DELETE FROM webhook_endpoints WHERE org_id = $1 AND id = $2 RETURNING `+webhookColumns)
	return err
}

// RotateWebhookSecret gives orgID's endpoint id the secret next, audited as
// webhook.secret_rotated by actor. The secret it had signs beside next until
// SecretOverlap after now.
func (s *Store) RotateWebhookSecret(ctx context.Context, orgID, id, actor, next string, now time.Time) (Webhook, error) {
	return s.changeWebhook(ctx, orgID, id, actor, ActionWebhookRotated, "rotating webhook secret", `UPDATE webhook_endpoints
SET previous_secret = secret, previous_expires_at = $4, secret = $3, updated_at = now()
WHERE org_id = $1 AND id = $2 RETURNING `+webhookColumns, next, now.Add(SecretOverlap))
}

// TestsPerMinute is the most webhook.test events one endpoint takes in a minute.
const TestsPerMinute = 5

// TestWebhook writes a webhook.test event for orgID's endpoint id alone, whatever
// types it takes, and returns the event's id. A disabled endpoint is apperr
// ECONFLICT: nothing would deliver it. An endpoint takes TestsPerMinute tests in the
// minute from its first; more is apperr ERATELIMITED until that minute ends.
func (s *Store) TestWebhook(ctx context.Context, orgID, id string, now time.Time) (string, error) {
	if !ValidUUID(id) {
		return "", ErrWebhookNotFound
	}
	tx, err := pgfailover.Begin(ctx, s.pool, pgfailover.Local)
	if err != nil {
		return "", fmt.Errorf("beginning transaction: %w", err)
	}
	defer tx.Rollback(ctx)
	var enabled bool
	var since time.Time
	var sent int
	err = tx.QueryRow(ctx, `UPDATE webhook_endpoints SET
	tests_since = CASE WHEN tests_since > $3::timestamptz - interval '1 minute' THEN tests_since ELSE $3 END,
	tests_sent = CASE WHEN tests_since > $3::timestamptz - interval '1 minute' THEN tests_sent + 1 ELSE 1 END
WHERE org_id = $1 AND id = $2 RETURNING enabled, tests_since, tests_sent`, orgID, id, now).Scan(&enabled, &since, &sent)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return "", ErrWebhookNotFound
	case err != nil:
		return "", fmt.Errorf("counting test events: %w", err)
	case !enabled:
		return "", apperr.Errorf(apperr.ECONFLICT, "the webhook is disabled")
	case sent > TestsPerMinute:
		wait := since.Add(time.Minute).Sub(now)
		return "", &apperr.Error{Code: apperr.ERATELIMITED, Message: "too many test events",
			RetryAfter: max(int((wait+time.Second-1)/time.Second), 1)}
	}
	var eventID *string
	err = tx.QueryRow(ctx, `SELECT webhook_enqueue($1::uuid, 'webhook.test', jsonb_build_object('org_id', $1::text, 'webhook_id', $2::text), $3::timestamptz, $2::uuid)`,
		orgID, id, now).Scan(&eventID)
	if err != nil {
		return "", fmt.Errorf("writing test event: %w", err)
	}
	if eventID == nil {
		return "", apperr.Errorf(apperr.ECONFLICT, "the webhook is disabled")
	}
	if err := tx.Commit(ctx); err != nil {
		return "", fmt.Errorf("committing test event: %w", err)
	}
	return *eventID, nil
}
