package httpapi

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"go.uber.org/zap"

	"github.com/keygate/keygate/upstream/apperr"
	"github.com/keygate/keygate/upstream/password"
	"github.com/keygate/keygate/upstream/store"
)

// SessionCookie is the name of the cookie holding the session token.
const SessionCookie = "session"

// handleLogin answers POST /auth/login {"email","password"} with 204 and a session
// cookie. A wrong password and an unknown email both answer 401 {"error":"invalid
// credentials"}. Both cost one argon2id derivation, so timing does not tell them apart.
// Past the login throttle's limits the answer is 429, with no derivation. A full
// hashing queue is 503.
func (s *Server) handleLogin(w http.ResponseWriter, r *http.Request) error {
	body, err := readBody(w, r)
	if err != nil {
		return err
	}
	in, err := decodeLogin(body)
	if err != nil {
		return err
	}
	if err := s.logIn(w, r, in); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// loginInput is what a login takes, from a JSON body or the dashboard's form.
type loginInput struct {
	Email, Password string
}

// check requires both fields, the email first.
func (in loginInput) check() error {
	switch {
	case in.Email == "":
		return apperr.Invalid("email", "required")
	case in.Password == "":
		return apperr.Invalid("password", "required")
	}
	return nil
}

// logIn checks in against the login throttle, then against the stored hash. When both
// hold, it opens a session and sets its cookie on w. Both doors of the login call it,
// so they throttle, count and answer alike.
func (s *Server) logIn(w http.ResponseWriter, r *http.Request, in loginInput) error {
	client, emailHash := s.clientAddr(r), store.EmailKey(in.Email)
	attempt, wait, err := s.store.ReserveLogin(r.Context(), s.throttle, client, emailHash, s.now())
	switch {
	case err != nil:
		return err
	case wait > 0:
		return apperr.RateLimited(wait)
	}
	userID, err := s.checkPassword(r.Context(), in.Email, in.Password)
	switch {
	case errors.Is(err, apperr.ErrBadCredentials):
		return err
	case err != nil:
		// Not a failure of the caller's, so the attempt must not count against them.
		// The request's context may be over if the client left. The database timeout
		// still bounds the wait.
		if rerr := s.store.ReleaseLogin(context.WithoutCancel(r.Context()), attempt); rerr != nil {
			s.logger.Warn("releasing login attempt failed", zap.Error(rerr))
		}
		return err
	}
	if err := s.store.ForgetLogins(r.Context(), client, emailHash); err != nil {
		return err
	}
	token, err := s.store.CreateSession(r.Context(), userID, s.sessionTTL)
	if err != nil {
		return err
	}
	infoOf(r.Context()).userID = userID
	http.SetCookie(w, &http.Cookie{
		Name:     SessionCookie,
		Value:    token,
		Path:     "/",
		MaxAge:   int(s.sessionTTL / time.Second),
		HttpOnly: true,
		Secure:   s.secureRequest(r),
		SameSite: http.SameSiteLaxMode,
	})
	return nil
}

// decodeLogin decodes a login body {"email","password"}.
func decodeLogin(body []byte) (loginInput, error) {
	var in loginInput
	err := decodeObject(body, func(name string, raw json.RawMessage) error {
		var err error
		switch name {
		case "email":
			in.Email, err = decodeString(name, raw)
		case "password":
			in.Password, err = decodeString(name, raw)
		default:
			err = apperr.Invalid(name, "unknown field")
		}
		return err
	})
	if err == nil {
		err = in.check()
	}
	if err != nil {
		return loginInput{}, err
	}
	return in, nil
}

// checkPassword returns the id of the user with email if pw is their password, and
// apperr.ErrBadCredentials otherwise.
func (s *Server) checkPassword(ctx context.Context, email, pw string) (string, error) {
	userID, encoded, err := s.store.PasswordHash(ctx, email)
	if errors.Is(err, apperr.ErrBadCredentials) {
		if err := s.passwords.Burn(ctx, pw); err != nil {
			return "", fmt.Errorf("hashing for an unknown email: %w", err)
		}
		return "", err
	}
	if err != nil {
		return "", err
	}
	ok, err := s.passwords.Verify(ctx, encoded, pw)
	if errors.Is(err, password.ErrBadHash) {
		// A row the operator must repair. The caller learns no more than from a wrong
		// password.
		s.logger.Error("stored password hash is unusable", zap.String("user_id", userID))
		return "", apperr.ErrBadCredentials
	}
	if err != nil {
		return "", fmt.Errorf("verifying password: %w", err)
	}
	if !ok {
		return "", apperr.ErrBadCredentials
	}
	return userID, nil
}

// handleLogout answers POST /auth/logout with 204, with or without a valid session.
func (s *Server) handleLogout(w http.ResponseWriter, r *http.Request) error {
	if err := s.logOut(w, r); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// logOut deletes r's session, if any, and clears its cookie on w. Both doors of the
// logout call it.
func (s *Server) logOut(w http.ResponseWriter, r *http.Request) error {
	if sum, ok := sessionTokenHash(r); ok {
		if err := s.store.DeleteSession(r.Context(), sum); err != nil {
			return err
		}
	}
	http.SetCookie(w, &http.Cookie{
		Name:     SessionCookie,
		Value:    "",
		Path:     "/",
		MaxAge:   -1,
		HttpOnly: true,
		Secure:   s.secureRequest(r),
		SameSite: http.SameSiteLaxMode,
	})
	return nil
}

// sessionTokenHash returns the SHA-256 of r's session token. It returns false when r
// carries no cookie that could be a session token.
func sessionTokenHash(r *http.Request) ([sha256.Size]byte, bool) {
	c, err := r.Cookie(SessionCookie)
	if err != nil {
		return [sha256.Size]byte{}, false
	}
	raw, err := base64.RawURLEncoding.Strict().DecodeString(c.Value)
	if err != nil || len(raw) != store.SessionTokenBytes {
		return [sha256.Size]byte{}, false
	}
	return sha256.Sum256([]byte(c.Value)), true
}

// authenticate returns the id of the user whose live session r presents, or
// apperr.ErrUnauthenticated.
func (s *Server) authenticate(r *http.Request) (string, error) {
	sum, ok := sessionTokenHash(r)
	if !ok {
		return "", apperr.ErrUnauthenticated
	}
	userID, err := s.store.SessionUser(r.Context(), sum)
	if err != nil {
		return "", err
	}
	infoOf(r.Context()).userID = userID
	return userID, nil
}
