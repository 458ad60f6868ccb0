package store

import (
	"context"
	"crypto/sha256"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/keygate/keygate/internal/pgfailover"
)

// LoginThrottle is how many logins may fail in a sliding window. Past it, more are
// refused with 429, and the password is not checked.
type LoginThrottle struct {
	// Window is the length of the sliding window. Default: 15 minutes.
	Window time.Duration
	// PerEmail is the number of failures allowed per (email, client address) in a
	// window. The account's owner, at another address, is not affected. Default: 5.
	PerEmail int
	// PerClient is the number of failures allowed per client address in a window,
	// whatever the emails. It is higher, so people behind one NAT do not lock each
	// other out. Default: 30.
	PerClient int
}

// DefaultLoginThrottle is the throttle of a server whose configuration leaves it zero.
var DefaultLoginThrottle = LoginThrottle{Window: 15 * time.Minute, PerEmail: 5, PerClient: 30}

// The login throttle is a sliding-window log in PostgreSQL. Every upstream instance
// shares it, so spreading guesses over instances gains an attacker nothing. An attempt
// is reserved, as a row in login_attempts, before the password is checked. An advisory
// lock per client address guards the reservation. So concurrent guesses from one
// address cannot all pass before any is counted. A failed attempt keeps its row until
// it leaves the window. A successful login deletes the rows of its (email, address)
// pair. An attempt that could not be judged gives its row back: the hashing queue was
// full, or the database failed.

// EmailKey is how login_attempts stores an email: the SHA-256 of its lower-case form.
func EmailKey(email string) []byte {
	sum := sha256.Sum256([]byte(strings.ToLower(email)))
	return sum[:]
}

// ReserveLogin records a login attempt for (client, email) at now, and returns its id.
// email is an EmailKey. When the failures in t's window already reach one of t's
// limits, it records nothing. It returns how long the caller must wait instead.
func (s *Store) ReserveLogin(ctx context.Context, t LoginThrottle, client string, email []byte, now time.Time) (int64, time.Duration, error) {
	tx, err := pgfailover.Begin(ctx, s.pool, pgfailover.Local)
	if err != nil {
		return 0, 0, fmt.Errorf("reserving login attempt: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, "keygate login "+client); err != nil {
		return 0, 0, fmt.Errorf("locking login attempts: %w", err)
	}
	rows, err := tx.Query(ctx, `SELECT email_hash, at FROM login_attempts WHERE client = $1 AND at > $2 ORDER BY at`,
		client, now.Add(-t.Window))
	if err != nil {
		return 0, 0, fmt.Errorf("reading login attempts: %w", err)
	}
	var byClient, byEmail []time.Time
	for rows.Next() {
		var h []byte
		var at time.Time
		if err := rows.Scan(&h, &at); err != nil {
			rows.Close()
			return 0, 0, fmt.Errorf("reading login attempts: %w", err)
		}
		byClient = append(byClient, at)
		if slices.Equal(h, email) {
			byEmail = append(byEmail, at)
		}
	}
	if err := rows.Err(); err != nil {
		return 0, 0, fmt.Errorf("reading login attempts: %w", err)
	}
	if wait := max(t.wait(byEmail, t.PerEmail, now), t.wait(byClient, t.PerClient, now)); wait > 0 {
		return 0, wait, nil
	}
	var id int64
	if err := tx.QueryRow(ctx, `INSERT INTO login_attempts (client, email_hash, at) VALUES ($1, $2, $3) RETURNING id`,
		client, email, now).Scan(&id); err != nil {
		return 0, 0, fmt.Errorf("recording login attempt: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, 0, fmt.Errorf("recording login attempt: %w", err)
	}
	return id, 0, nil
}

// wait returns how long from now until fewer than limit of the attempts ats remain in
// the window. ats are in ascending order, all inside the window. wait is 0 when fewer
// remain already.
func (t LoginThrottle) wait(ats []time.Time, limit int, now time.Time) time.Duration {
	if len(ats) < limit {
		return 0
	}
	// Once the attempt at index len-limit leaves the window, limit-1 remain.
	return max(ats[len(ats)-limit].Add(t.Window).Sub(now), time.Nanosecond)
}

// ReleaseLogin deletes the attempt id, which turned out not to be a failure.
func (s *Store) ReleaseLogin(ctx context.Context, id int64) error {
	if _, err := pgfailover.Exec(ctx, s.pool, pgfailover.Local, `DELETE FROM login_attempts WHERE id = $1`, id); err != nil {
		return fmt.Errorf("releasing login attempt: %w", err)
	}
	return nil
}

// ForgetLogins deletes the attempts of (client, email) after a successful login.
func (s *Store) ForgetLogins(ctx context.Context, client string, email []byte) error {
	if _, err := pgfailover.Exec(ctx, s.pool, pgfailover.Local, `DELETE FROM login_attempts WHERE client = $1 AND email_hash = $2`, client, email); err != nil {
		return fmt.Errorf("forgetting login attempts: %w", err)
	}
	return nil
}
