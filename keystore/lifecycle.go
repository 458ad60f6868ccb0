package keystore

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keygate/keygate/internal/pgfailover"
)

// The actions of the audit trail, the values of audit_events.action.
const (
	ActionCreated = "key.created"
	ActionRolled  = "key.rolled"
	ActionRevoked = "key.revoked"
	ActionLeaked  = "key.leaked"
	ActionUpdated = "key.updated"
)

// ActorLeakReport is the actor of the key.leaked events: a leak report, not a person.
const ActorLeakReport = "leak-report"

// ActorReplay is the actor of an event Replay writes again when its source named
// none (a webhook's body does not).
const ActorReplay = "replay"

// MaxGrace is the longest a rolled key may keep working.
const MaxGrace = 24 * time.Hour

// Errors of Roll.
var (
	// ErrNotFound is a key id that is not one of the organisation's keys.
	ErrNotFound = errors.New("keystore: no such key")
	// ErrNotLive is a key that is revoked or has expired.
	ErrNotLive = errors.New("keystore: the key is revoked or expired")
)

// Event is one row of the audit trail: what happened to which key, and who did it.
type Event struct {
	ID     int64
	OrgID  string
	Action string
	// KeyID is the key of a key.* action; WebhookID the endpoint of a webhook.* one.
	KeyID     string
	WebhookID string
	// Actor is the acting user's id, ActorLeakReport, or another program's name: the
	// webhook dispatcher's, an operator's command's.
	Actor string
	// NewKeyID is the key a roll created (ActionRolled only).
	NewKeyID string
	// URL is where a leaked key was found (ActionLeaked only).
	URL string
	// Changes is what an update changed (ActionUpdated), or an organisation's plan
	// (org.plan_changed).
	Changes *Changes
	At      time.Time
	// ExpiresAt is the old key's expiry a roll set (ActionRolled, read by Revocations
	// only; nil where it is not known).
	ExpiresAt *time.Time
}

// audit appends e to the audit trail within tx. The changes travel as JSON text cast in
// SQL: through PgBouncer the exec and simple_protocol modes send parameters without a
// described type, and pgx can encode a struct only against one.
func audit(ctx context.Context, tx pgx.Tx, e Event) error {
	var changes *string
	if e.Changes != nil {
		b, err := json.Marshal(e.Changes)
		if err != nil {
			return fmt.Errorf("auditing %s: %w", e.Action, err)
		}
		changes = new(string(b))
	}
	_, err := tx.Exec(ctx, `INSERT INTO audit_events (org_id, action, key_id, actor, new_key_id, url, changes)
VALUES ($1, $2, $3, $4, NULLIF($5, ''), NULLIF($6, ''), $7::text::jsonb)`, e.OrgID, e.Action, e.KeyID, e.Actor, e.NewKeyID, e.URL, changes)
	if err != nil {
		return fmt.Errorf("auditing %s: %w", e.Action, err)
	}
	return nil
}

// Roll replaces the live key keyID of orgID: it creates a key of the same name, role,
// expiry, rate limit, allowed networks and scopes, and makes the old key expire after
// grace (0..MaxGrace), never later than it already would, auditing key.rolled by
// actor, all in one transaction. It answers ErrNotFound for a key id the organisation
// does not have and ErrNotLive for a revoked or expired key.
//
// The old key's row is locked first, so concurrent rolls of one key run one after the
// other: the second finds the key expired (grace 0) or rolls it again, which can only
// bring its expiry closer. A roll commits Synced, as a revocation does: it sets the
// old key's end.
func (s *Store) Roll(ctx context.Context, orgID, keyID string, grace time.Duration, actor string) (Record, string, error) {
	if grace < 0 || grace > MaxGrace {
		return Record{}, "", fmt.Errorf("grace %v is not within 0..%v", grace, MaxGrace)
	}
	if !ValidKeyID(keyID) {
		return Record{}, "", ErrNotFound
	}
	tx, err := pgfailover.Begin(ctx, s.pool, pgfailover.Synced)
	if err != nil {
		return Record{}, "", fmt.Errorf("beginning transaction: %w", err)
	}
	defer tx.Rollback(ctx)

	nk := NewKey{OrgID: orgID, CreatedBy: actor}
	var role string
	w := &nk.WindowLimits
	err = tx.QueryRow(ctx, `SELECT name, role, expires_at, rate_limit, allowed_cidrs, scopes, rate_limit_per_second, rate_limit_per_hour, rate_limit_per_day
FROM api_keys WHERE org_id = $1 AND key_id = $2 FOR UPDATE`,
		orgID, keyID).Scan(&nk.Name, &role, &nk.ExpiresAt, &nk.RateLimit, &nk.AllowedCIDRs, &nk.Scopes, &w[PerSecond], &w[PerHour], &w[PerDay])
	if errors.Is(err, pgx.ErrNoRows) {
		return Record{}, "", ErrNotFound
	}
	if err != nil {
		return Record{}, "", fmt.Errorf("locking key: %w", err)
	}
	nk.Role = Role(role)
	// clock_timestamp(), not now(): the lock may have been waited for. A key that
	// expired meanwhile, by a concurrent roll with no grace, must not be rolled again.
	tag, err := tx.Exec(ctx, `UPDATE api_keys
SET expires_at = LEAST(COALESCE(expires_at, 'infinity'), clock_timestamp() + $3 * interval '1 microsecond')
WHERE org_id = $1 AND key_id = $2 AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > clock_timestamp())`,
		orgID, keyID, grace.Microseconds())
	if err != nil {
		return Record{}, "", fmt.Errorf("expiring rolled key: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return Record{}, "", ErrNotLive
	}
	r, full, err := s.insertKey(ctx, tx, nk)
	if err != nil {
		return Record{}, "", err
	}
	if err := audit(ctx, tx, Event{OrgID: orgID, Action: ActionRolled, KeyID: keyID, Actor: actor, NewKeyID: r.ID}); err != nil {
		return Record{}, "", err
	}
	if err := tx.Commit(ctx); err != nil {
		return Record{}, "", fmt.Errorf("committing roll: %w", err)
	}
	return r, full, nil
}

// LeakReport is a string found somewhere public, and where.
type LeakReport struct {
	Token string
	URL   string
}

// The outcomes of a leak report.
const (
	// LeakRevoked is a live key of this service, revoked by the report.
	LeakRevoked = "revoked"
	// LeakAlreadyRevoked is a key of this service that was already revoked or expired.
	LeakAlreadyRevoked = "already_revoked"
	// LeakUnknown is anything else: not a key of this format, no such key, a wrong secret.
	LeakUnknown = "unknown"
)

// RevokeLeaked revokes every live key among the reports' tokens. In the same
// statement, it audits each as key.leaked by ActorLeakReport, with the URL of its first
// report, in which the secret of any key is redacted (Redact): the URL is kept in the
// audit trail and sent in the key.leaked event. It returns one outcome per report, in order. It reads all the keys with one
// query, and revokes with one more. A key reported twice counts once, with the same
// outcome both times. Reporting again answers LeakAlreadyRevoked and changes nothing.
func (s *Store) RevokeLeaked(ctx context.Context, reports []LeakReport) ([]string, error) {
	type parsed struct {
		keyID string
		sum   [32]byte
	}
	keys := make([]parsed, len(reports))
	var ids []string
	for i, rep := range reports {
		keyID, secret, ok := s.format.Parse(rep.Token)
		if !ok {
			continue
		}
		keys[i] = parsed{keyID, HashSecret(secret)}
		ids = append(ids, keyID)
	}
	outcomes := make([]string, len(reports))
	for i := range outcomes {
		outcomes[i] = LeakUnknown
	}
	if len(ids) == 0 {
		return outcomes, nil
	}

	type stored struct {
		hash []byte
		live bool
	}
	found := make(map[string]stored, len(ids))
	rows, err := s.pool.Query(ctx, `SELECT key_id, secret_hash, revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())
FROM api_keys WHERE key_id = ANY($1)`, ids)
	if err != nil {
		return nil, fmt.Errorf("looking up leaked keys: %w", err)
	}
	var (
		id   string
		hash []byte
		live bool
	)
	if _, err := pgx.ForEachRow(rows, []any{&id, &hash, &live}, func() error {
		found[id] = stored{hash: hash, live: live}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("looking up leaked keys: %w", err)
	}

	// matched: the report's key id exists and its secret is the key's. The secrets
	// are compared in constant time, against dummyHash for an unknown key id.
	matched := make([]bool, len(reports))
	var liveIDs, liveURLs []string
	for i, k := range keys {
		if k.keyID == "" {
			continue
		}
		st, ok := found[k.keyID]
		want := st.hash
		if !ok {
			want = dummyHash[:]
		}
		matched[i] = subtle.ConstantTimeCompare(k.sum[:], want) == 1 && ok
		if matched[i] && st.live {
			liveIDs, liveURLs = append(liveIDs, k.keyID), append(liveURLs, Redact(reports[i].URL))
			st.live = false // its first report's URL is the one audited
			found[k.keyID] = st
		}
	}

	revoked, err := s.revokeLeaked(ctx, liveIDs, liveURLs)
	if err != nil {
		return nil, err
	}
	for i, k := range keys {
		switch {
		case !matched[i]:
		case revoked[k.keyID]:
			outcomes[i] = LeakRevoked
		default:
			outcomes[i] = LeakAlreadyRevoked
		}
	}
	return outcomes, nil
}

// revokeLeaked revokes the live keys among ids, auditing each as key.leaked with the
// url of the same index, and returns those it revoked. A key revoked since the
// lookup is neither updated nor audited. It is answered as already revoked. The
// revocation commits Synced.
func (s *Store) revokeLeaked(ctx context.Context, ids, urls []string) (map[string]bool, error) {
	revoked := make(map[string]bool, len(ids))
	if len(ids) == 0 {
		return revoked, nil
	}
	tx, err := pgfailover.Begin(ctx, s.pool, pgfailover.Synced)
	if err != nil {
		return nil, fmt.Errorf("revoking leaked keys: %w", err)
	}
	defer tx.Rollback(ctx)
	rows, err := tx.Query(ctx, `WITH r AS (
	UPDATE api_keys k SET revoked_at = now()
	FROM unnest($1::text[], $2::text[]) AS u (key_id, url)
	WHERE k.key_id = u.key_id AND k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > now())
	RETURNING k.org_id, k.key_id, u.url
)
INSERT INTO audit_events (org_id, action, key_id, actor, url)
SELECT org_id, $3, key_id, $4, url FROM r
RETURNING key_id`, ids, urls, ActionLeaked, ActorLeakReport)
	if err != nil {
		return nil, fmt.Errorf("revoking leaked keys: %w", err)
	}
	var id string
	if _, err := pgx.ForEachRow(rows, []any{&id}, func() error {
		revoked[id] = true
		return nil
	}); err != nil {
		return nil, fmt.Errorf("revoking leaked keys: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("revoking leaked keys: %w", err)
	}
	return revoked, nil
}

// Events returns up to limit events of orgID's audit trail, newest first. When
// before > 0, it returns those with an id below before.
func (s *Store) Events(ctx context.Context, orgID string, before int64, limit int) ([]Event, error) {
	return s.EventsOf(ctx, orgID, EventFilter{}, before, limit)
}

// EventFilter narrows an audit trail. Its zero value keeps every event.
type EventFilter struct {
	Action string // only events of this action; "": every one
	// KeyID keeps only the events of this key: its own, and the roll that made it.
	// "": every key's, and the webhooks'.
	KeyID string
}

// EventsOf is Events of the events f keeps.
func (s *Store) EventsOf(ctx context.Context, orgID string, f EventFilter, before int64, limit int) ([]Event, error) {
	rows, err := s.pool.Query(ctx, `SELECT id, org_id::text, action, COALESCE(key_id, ''), COALESCE(webhook_id::text, ''), actor, COALESCE(new_key_id, ''), COALESCE(url, ''), changes, at
FROM audit_events
WHERE org_id = $1 AND ($2::bigint = 0 OR id < $2::bigint)
  AND ($4::text = '' OR action = $4::text) AND ($5::text = '' OR key_id = $5::text OR new_key_id = $5::text)
ORDER BY id DESC LIMIT $3`, orgID, before, limit, f.Action, f.KeyID)
	if err != nil {
		return nil, fmt.Errorf("listing audit events: %w", err)
	}
	events, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Event, error) {
		var e Event
		err := row.Scan(&e.ID, &e.OrgID, &e.Action, &e.KeyID, &e.WebhookID, &e.Actor, &e.NewKeyID, &e.URL, &e.Changes, &e.At)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("listing audit events: %w", err)
	}
	return events, nil
}

// Rolled returns the keys of orgID that a roll replaced, as a set of key ids.
func (s *Store) Rolled(ctx context.Context, orgID string) (map[string]bool, error) {
	rows, err := s.pool.Query(ctx, `SELECT key_id FROM audit_events WHERE org_id = $1 AND action = $2`, orgID, ActionRolled)
	if err != nil {
		return nil, fmt.Errorf("listing rolled keys: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("listing rolled keys: %w", err)
	}
	rolled := make(map[string]bool, len(ids))
	for _, id := range ids {
		rolled[id] = true
	}
	return rolled, nil
}
