package keystore

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keygate/keygate/internal/pgfailover"
)

// This file holds the replay of revocations onto a database restored from a backup
// (docs/operations.md, Backups and disaster recovery). A restore brings back every key
// as it was when the backup was taken: keys revoked, found leaked or rolled since
// work again. The audit trail of the lost database, or an export of it, says which;
// Replay ends them again.

// Ends reports whether action ends a key: key.revoked, key.leaked or key.rolled.
func Ends(action string) bool {
	return action == ActionRevoked || action == ActionLeaked || action == ActionRolled
}

// Revocations returns the events of the audit trail at or after since that ended a
// key (Ends), oldest first. A key.rolled event carries the old key's expiry as this
// database holds it, in ExpiresAt: the roll set it, and nothing but another roll or
// a revocation changes it afterwards.
func (s *Store) Revocations(ctx context.Context, since time.Time) ([]Event, error) {
	rows, err := s.pool.Query(ctx, `SELECT e.id, e.org_id::text, e.action, e.key_id, e.actor, COALESCE(e.new_key_id, ''), COALESCE(e.url, ''), e.at,
	CASE WHEN e.action = $2 THEN k.expires_at END
FROM audit_events e LEFT JOIN api_keys k ON k.key_id = e.key_id
WHERE e.action IN ($2, $3, $4) AND e.at >= $1
ORDER BY e.id`, since, ActionRolled, ActionRevoked, ActionLeaked)
	if err != nil {
		return nil, fmt.Errorf("reading revocations: %w", err)
	}
	events, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Event, error) {
		var e Event
		err := row.Scan(&e.ID, &e.OrgID, &e.Action, &e.KeyID, &e.Actor, &e.NewKeyID, &e.URL, &e.At, &e.ExpiresAt)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("reading revocations: %w", err)
	}
	return events, nil
}

// ReplayReport is what Replay did, by key id.
type ReplayReport struct {
	Revoked   []string // live here, revoked as of its event
	Expired   []string // live here, expiring as its roll said
	Unchanged []string // already revoked here, or expiring no later
	Unknown   []string // no such key here: made after the backup
}

// Replay applies events, each one that ended a key (Ends), oldest first, to the
// database of s, in one transaction, and reports what each did. A key.revoked or
// key.leaked revokes the key as of the event's time. A key.rolled makes the old key
// expire at the event's ExpiresAt, or at its time without one: the grace it had is
// then cut short. Each event that changes a key joins the audit trail again, with its
// actor and time. A key already revoked, or expiring no later, is left as it is and
// nothing is audited, so a replay repeated changes nothing. Events of other actions
// are an error. With dryRun the transaction is rolled back: the report says what
// Replay would do. Otherwise it commits Synced, as a revocation does.
func (s *Store) Replay(ctx context.Context, events []Event, dryRun bool) (ReplayReport, error) {
	var rep ReplayReport
	tx, err := pgfailover.Begin(ctx, s.pool, pgfailover.Synced)
	if err != nil {
		return rep, fmt.Errorf("beginning transaction: %w", err)
	}
	defer tx.Rollback(ctx)
	for _, e := range events {
		changed, found, err := replayOne(ctx, tx, e)
		if err != nil {
			return ReplayReport{}, err
		}
		switch {
		case changed && e.Action == ActionRolled:
			rep.Expired = append(rep.Expired, e.KeyID)
		case changed:
			rep.Revoked = append(rep.Revoked, e.KeyID)
		case found:
			rep.Unchanged = append(rep.Unchanged, e.KeyID)
		default:
			rep.Unknown = append(rep.Unknown, e.KeyID)
		}
	}
	if dryRun {
		return rep, nil
	}
	if err := tx.Commit(ctx); err != nil {
		return ReplayReport{}, fmt.Errorf("committing the replay: %w", err)
	}
	return rep, nil
}

// replayOne applies e within tx: changed when it revoked or expired the key, found
// when the key is there at all.
func replayOne(ctx context.Context, tx pgx.Tx, e Event) (changed, found bool, err error) {
	if !Ends(e.Action) {
		return false, false, fmt.Errorf("replaying %s of key %s: not an event that ends a key", e.Action, e.KeyID)
	}
	if !ValidKeyID(e.KeyID) {
		return false, false, nil
	}
	// The key's state, its change and its audit in one statement, as Revoke does.
	set := `revoked_at = $2`
	live := `revoked_at IS NULL`
	ends := e.At
	if e.Action == ActionRolled {
		set = `expires_at = $2`
		live += ` AND (expires_at IS NULL OR expires_at > $2)`
		if e.ExpiresAt != nil {
			ends = *e.ExpiresAt
		}
	}
	actor := e.Actor
	if actor == "" {
		actor = ActorReplay
	}
	var n int
	err = tx.QueryRow(ctx, `WITH r AS (
	UPDATE api_keys SET `+set+` WHERE key_id = $1 AND `+live+`
	RETURNING org_id, key_id
), a AS (
	INSERT INTO audit_events (org_id, action, key_id, actor, new_key_id, url, at)
	SELECT org_id, $3, key_id, $4, NULLIF($5, ''), NULLIF($6, ''), $7 FROM r
)
SELECT count(*) FROM r`, e.KeyID, ends, e.Action, actor, e.NewKeyID, e.URL, e.At).Scan(&n)
	if err != nil {
		return false, false, fmt.Errorf("replaying %s of key %s: %w", e.Action, e.KeyID, err)
	}
	if n == 1 {
		return true, true, nil
	}
	err = tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM api_keys WHERE key_id = $1)`, e.KeyID).Scan(&found)
	if err != nil {
		return false, false, fmt.Errorf("replaying %s of key %s: %w", e.Action, e.KeyID, err)
	}
	return false, found, nil
}
