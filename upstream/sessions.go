package upstream

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
)

// sessionCookie is the name of the cookie holding the session token.
const sessionCookie = "session"

// sessionTokenBytes is the number of random bytes of a session token, which the cookie
// carries in unpadded base64url.
const sessionTokenBytes = 32

// handleLogin answers POST /auth/login {"email","password"}: 204 with a session cookie,
// or 401 {"error":"invalid credentials"} whether the email is unknown or the password
// wrong; both cost one argon2id derivation, so timing does not tell them apart either.
// Past the login throttle's limits it answers 429 without deriving anything, and 503
// when the hashing queue is full.
func (s *Server) handleLogin(w http.ResponseWriter, r *http.Request) {
	body, err := readBody(w, r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var email, password *string
	err = decodeObject(body, func(name string, raw json.RawMessage) error {
		var err error
		var v string
		switch name {
		case "email":
			v, err = decodeString(name, raw)
			email = &v
		case "password":
			v, err = decodeString(name, raw)
			password = &v
		default:
			err = invalid(name, "unknown field")
		}
		return err
	})
	switch {
	case err != nil:
		s.writeError(w, r, err)
		return
	case email == nil || *email == "":
		s.writeError(w, r, invalid("email", "required"))
		return
	case password == nil || *password == "":
		s.writeError(w, r, invalid("password", "required"))
		return
	}

	client, emailHash := s.clientAddr(r), emailKey(*email)
	attempt, wait, err := s.reserveLogin(r.Context(), client, emailHash, s.now())
	switch {
	case err != nil:
		s.writeError(w, r, err)
		return
	case wait > 0:
		s.writeError(w, r, rateLimited(wait))
		return
	}
	userID, err := s.checkPassword(r.Context(), *email, *password)
	switch {
	case errors.Is(err, errBadCredentials):
		s.writeError(w, r, err)
		return
	case err != nil:
		// Not a failure of the caller's: the attempt must not count against them. The
		// request's context may be over (the client left); the database timeout still
		// bounds the wait.
		if rerr := s.releaseLogin(context.WithoutCancel(r.Context()), attempt); rerr != nil {
			s.logger.Warn("releasing login attempt failed", zap.Error(rerr))
		}
		s.writeError(w, r, err)
		return
	}
	if err := s.forgetLogins(r.Context(), client, emailHash); err != nil {
		s.writeError(w, r, err)
		return
	}
	token, err := s.createSession(r.Context(), userID)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	infoOf(r.Context()).userID = userID
	http.SetCookie(w, &http.Cookie{
		Name:     sessionCookie,
		Value:    token,
		Path:     "/",
		MaxAge:   int(s.sessionTTL / time.Second),
		HttpOnly: true,
		Secure:   s.secureRequest(r),
		SameSite: http.SameSiteLaxMode,
	})
	w.WriteHeader(http.StatusNoContent)
}

// checkPassword returns the id of the user with email if password is theirs, and
// errBadCredentials otherwise.
func (s *Server) checkPassword(ctx context.Context, email, password string) (string, error) {
	var userID, encoded string
	err := s.pool.QueryRow(ctx, `SELECT id::text, password_hash FROM users WHERE lower(email) = lower($1)`,
		email).Scan(&userID, &encoded)
	if errors.Is(err, pgx.ErrNoRows) {
		if err := s.passwords.burn(ctx, password); err != nil {
			return "", fmt.Errorf("hashing for an unknown email: %w", err)
		}
		return "", errBadCredentials
	}
	if err != nil {
		return "", fmt.Errorf("looking up user: %w", err)
	}
	ok, err := s.passwords.verify(ctx, encoded, password)
	if errors.Is(err, errBadHash) {
		// A row the operator must repair; the caller learns nothing more than from a
		// wrong password.
		s.logger.Error("stored password hash is unusable", zap.String("user_id", userID))
		return "", errBadCredentials
	}
	if err != nil {
		return "", fmt.Errorf("verifying password: %w", err)
	}
	if !ok {
		return "", errBadCredentials
	}
	return userID, nil
}

// createSession stores a new session of userID and returns its token. Only the token's
// SHA-256 is stored. The user's expired sessions are deleted on the way.
func (s *Server) createSession(ctx context.Context, userID string) (string, error) {
	var raw [sessionTokenBytes]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", fmt.Errorf("reading random bytes: %w", err)
	}
	token := base64.RawURLEncoding.EncodeToString(raw[:])
	sum := sha256.Sum256([]byte(token))
	batch := &pgx.Batch{}
	batch.Queue(`DELETE FROM sessions WHERE user_id = $1 AND expires_at <= now()`, userID)
	batch.Queue(`INSERT INTO sessions (token_hash, user_id, expires_at) VALUES ($1, $2, now() + $3::interval)`,
		sum[:], userID, s.sessionTTL)
	if err := s.pool.SendBatch(ctx, batch).Close(); err != nil {
		return "", fmt.Errorf("creating session: %w", err)
	}
	return token, nil
}

// handleLogout answers POST /auth/logout: the session, if any, is deleted and the
// cookie cleared. It answers 204 with or without a valid session.
func (s *Server) handleLogout(w http.ResponseWriter, r *http.Request) {
	if sum, ok := sessionTokenHash(r); ok {
		if _, err := s.pool.Exec(r.Context(), `DELETE FROM sessions WHERE token_hash = $1`, sum[:]); err != nil {
			s.writeError(w, r, fmt.Errorf("deleting session: %w", err))
			return
		}
	}
	http.SetCookie(w, &http.Cookie{
		Name:     sessionCookie,
		Value:    "",
		Path:     "/",
		MaxAge:   -1,
		HttpOnly: true,
		Secure:   s.secureRequest(r),
		SameSite: http.SameSiteLaxMode,
	})
	w.WriteHeader(http.StatusNoContent)
}

// sessionTokenHash returns the SHA-256 of r's session token, and false when r carries no
// cookie that could be a session token.
func sessionTokenHash(r *http.Request) ([sha256.Size]byte, bool) {
	c, err := r.Cookie(sessionCookie)
	if err != nil {
		return [sha256.Size]byte{}, false
	}
	raw, err := base64.RawURLEncoding.Strict().DecodeString(c.Value)
	if err != nil || len(raw) != sessionTokenBytes {
		return [sha256.Size]byte{}, false
	}
	return sha256.Sum256([]byte(c.Value)), true
}

// authenticate returns the id of the user whose live session r presents, or
// errUnauthenticated.
func (s *Server) authenticate(r *http.Request) (string, error) {
	sum, ok := sessionTokenHash(r)
	if !ok {
		return "", errUnauthenticated
	}
	var userID string
	err := s.pool.QueryRow(r.Context(), `SELECT user_id::text FROM sessions WHERE token_hash = $1 AND expires_at > now()`,
		sum[:]).Scan(&userID)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", errUnauthenticated
	}
	if err != nil {
		return "", fmt.Errorf("looking up session: %w", err)
	}
	infoOf(r.Context()).userID = userID
	return userID, nil
}
