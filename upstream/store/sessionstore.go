package store

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keygate/keygate/internal/pgfailover"
	"github.com/keygate/keygate/upstream/apperr"
)

// The queries of users' passwords and sessions. A session is stored as the SHA-256 of
// its token, never as the token.

// SessionTokenBytes is the number of random bytes of a session token. The cookie
// carries them in unpadded base64url.
const SessionTokenBytes = 32

// PasswordHash returns the id and stored password hash of the user with email, in any
// case. It returns apperr.ErrBadCredentials when there is none.
func (s *Store) PasswordHash(ctx context.Context, email string) (userID, encoded string, err error) {
	err = s.pool.QueryRow(ctx, `SELECT id::text, password_hash FROM users WHERE lower(email) = lower($1)`,
		email).Scan(&userID, &encoded)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", "", apperr.ErrBadCredentials
	}
	if err != nil {
		return "", "", fmt.Errorf("looking up user: %w", err)
	}
	return userID, encoded, nil
}

// CreateSession stores a new session of userID that lives for ttl, and returns its
// token. The user's expired sessions are deleted on the way.
func (s *Store) CreateSession(ctx context.Context, userID string, ttl time.Duration) (string, error) {
	var raw [SessionTokenBytes]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", fmt.Errorf("reading random bytes: %w", err)
	}
	token := base64.RawURLEncoding.EncodeToString(raw[:])
	sum := sha256.Sum256([]byte(token))
	batch := pgfailover.NewBatch(pgfailover.Local)
	batch.Queue(`DELETE FROM sessions WHERE user_id = $1 AND expires_at <= now()`, userID)
	batch.Queue(`INSERT INTO sessions (token_hash, user_id, expires_at) VALUES ($1, $2, now() + $3::interval)`,
		sum[:], userID, ttl)
	if err := s.pool.SendBatch(ctx, batch).Close(); err != nil {
		return "", fmt.Errorf("creating session: %w", err)
	}
	return token, nil
}

// SessionUser returns the user of the live session whose token hashes to sum, or
// apperr.ErrUnauthenticated. The database's clock judges expiry.
func (s *Store) SessionUser(ctx context.Context, sum [sha256.Size]byte) (string, error) {
	var userID string
	err := s.pool.QueryRow(ctx, `SELECT user_id::text FROM sessions WHERE token_hash = $1 AND expires_at > now()`,
		sum[:]).Scan(&userID)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", apperr.ErrUnauthenticated
	}
	if err != nil {
		return "", fmt.Errorf("looking up session: %w", err)
	}
	return userID, nil
}

// DeleteSession deletes the session whose token hashes to sum, if there is one.
func (s *Store) DeleteSession(ctx context.Context, sum [sha256.Size]byte) error {
	if _, err := pgfailover.Exec(ctx, s.pool, pgfailover.Local, `DELETE FROM sessions WHERE token_hash = $1`, sum[:]); err != nil {
		return fmt.Errorf("deleting session: %w", err)
	}
	return nil
}
