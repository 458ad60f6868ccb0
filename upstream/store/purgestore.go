package store

import (
	"context"
	"fmt"
	"time"

	"github.com/keygate/keygate/internal/pgfailover"
)

// purgeBatch is the most rows one purge statement deletes. So a purge after a long
// outage never holds locks, or runs, for long.
const purgeBatch = 5000

// PurgeExpired deletes, in batches, the expired sessions and the login attempts that
// left the throttle's window by now. The database's clock judges sessions, as in
// SessionUser. It returns how many of each it deleted.
func (s *Store) PurgeExpired(ctx context.Context, now time.Time, window time.Duration) (sessions, attempts int64, err error) {
	for _, p := range []struct {
		sql  string
		args []any
		n    *int64
	}{
		{`DELETE FROM sessions WHERE token_hash IN
			(SELECT token_hash FROM sessions WHERE expires_at <= now() LIMIT $1)`, []any{purgeBatch}, &sessions},
		{`DELETE FROM login_attempts WHERE id IN
			(SELECT id FROM login_attempts WHERE at <= $1 LIMIT $2)`, []any{now.Add(-window), purgeBatch}, &attempts},
	} {
		for {
			tag, err := pgfailover.Exec(ctx, s.pool, pgfailover.Local, p.sql, p.args...)
			if err != nil {
				return sessions, attempts, fmt.Errorf("purging: %w", err)
			}
			*p.n += tag.RowsAffected()
			if tag.RowsAffected() < purgeBatch {
				break
			}
		}
	}
	return sessions, attempts, nil
}
