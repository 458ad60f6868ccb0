package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/upstream/apperr"
)

// keyJSON is a key in the dashboard's list: never its secret, never its hash.
type keyJSON struct {
	ID         string  `json:"id"`
	Name       string  `json:"name"`
	Role       string  `json:"role"`
	CreatedAt  string  `json:"created_at"`
	ExpiresAt  *string `json:"expires_at"`
	RevokedAt  *string `json:"revoked_at"`
	LastUsedAt *string `json:"last_used_at"`
	MaskedKey  string  `json:"masked_key"`
}

// createdKeyJSON is the answer to a key's creation, the only place its full key appears.
type createdKeyJSON struct {
	ID        string  `json:"id"`
	Name      string  `json:"name"`
	Role      string  `json:"role"`
	CreatedAt string  `json:"created_at"`
	ExpiresAt *string `json:"expires_at"`
	Key       string  `json:"key"`
}

// keyWriteBody reads the body of a key creation or roll once the plan's API access is
// checked (403 feature_gated): the checks that follow keyRoute's on both routes.
func (s *Server) keyWriteBody(w http.ResponseWriter, r *http.Request, p principal) ([]byte, error) {
	if err := s.checkAPIAccess(r.Context(), p); err != nil {
		return nil, err
	}
	return readBody(w, r)
}

// checkAPIAccess returns apperr.ErrAPIFeatureGated when p's organisation's plan has no API
// access (api_rate_limit 0): keys can then be neither created nor rolled.
func (s *Server) checkAPIAccess(ctx context.Context, p principal) error {
	rateLimit, err := s.store.APIRateLimit(ctx, p.orgID)
	if err != nil {
		return err
	}
	if rateLimit == 0 {
		return apperr.ErrAPIFeatureGated
	}
	return nil
}

// handleCreateKey answers POST /orgs/{orgId}/api-keys
// {"name","role","expires_at"?}: 201 with the full key. After the checks of keyRoute
// come the plan's API access (403 feature_gated) and then the body (400).
func (s *Server) handleCreateKey(w http.ResponseWriter, r *http.Request, p principal) error {
	body, err := s.keyWriteBody(w, r, p)
	if err != nil {
		return err
	}
	rec, full, err := s.createKey(r.Context(), p, body)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, createdKey(rec, full))
	return nil
}

// createKey decodes a key creation body and creates the key for p: the part of a
// creation that follows the plan check, shared by the JSON route and the dashboard.
func (s *Server) createKey(ctx context.Context, p principal, body []byte) (keystore.Record, string, error) {
	nk, err := s.decodeNewKey(body)
	if err != nil {
		return keystore.Record{}, "", err
	}
	nk.OrgID, nk.CreatedBy = p.orgID, p.userID
	return s.keys.Create(ctx, nk)
}

// createdKey is the answer of a key's creation or roll.
func createdKey(rec keystore.Record, full string) createdKeyJSON {
	return createdKeyJSON{
		ID:        rec.ID,
		Name:      rec.Name,
		Role:      string(rec.Role),
		CreatedAt: timeJSON(rec.CreatedAt),
		ExpiresAt: optionalTimeJSON(rec.ExpiresAt),
		Key:       full,
	}
}

// decodeNewKey decodes and checks a key creation body. expires_at may be absent or
// null for a key that lives until revoked; otherwise it must be in the future.
func (s *Server) decodeNewKey(body []byte) (keystore.NewKey, error) {
	return decodeObjectInto(body, "", []string{"name", "role"}, func(nk *keystore.NewKey, name string, raw json.RawMessage) error {
		var err error
		switch name {
		case "name":
			nk.Name, err = decodeText(name, raw, 1, 100)
		case "role":
			var role string
			role, err = decodeString(name, raw)
			if err == nil && !keystore.Role(role).Valid() {
				err = apperr.Invalid(name, "must be one of Admin, Editor, Viewer")
			}
			nk.Role = keystore.Role(role)
		case "expires_at":
			if string(raw) == "null" {
				return nil
			}
			var t time.Time
			t, err = decodeTime(name, raw)
			if err == nil && !t.After(s.now()) {
				err = apperr.Invalid(name, "must be in the future")
			}
			nk.ExpiresAt = &t
		default:
			err = apperr.Invalid(name, "unknown field")
		}
		return err
	})
}

// handleListKeys answers GET /orgs/{orgId}/api-keys: every key of the org, revoked and
// expired ones included, oldest first, masked.
func (s *Server) handleListKeys(w http.ResponseWriter, r *http.Request, p principal) error {
	recs, err := s.keys.List(r.Context(), p.orgID)
	if err != nil {
		return err
	}
	data := make([]keyJSON, 0, len(recs))
	for _, rec := range recs {
		data = append(data, keyJSON{
			ID:         rec.ID,
			Name:       rec.Name,
			Role:       string(rec.Role),
			CreatedAt:  timeJSON(rec.CreatedAt),
			ExpiresAt:  optionalTimeJSON(rec.ExpiresAt),
			RevokedAt:  optionalTimeJSON(rec.RevokedAt),
			LastUsedAt: optionalTimeJSON(rec.LastUsedAt),
			MaskedKey:  s.format.Mask(rec.ID),
		})
	}
	writeJSON(w, http.StatusOK, struct {
		Data []keyJSON `json:"data"`
	}{data})
	return nil
}

// handleRevokeKey answers DELETE /orgs/{orgId}/api-keys/{id}: 204, also for a key
// already revoked; 404 for an id that is not one of the org's keys. The revocation is
// audited as key.revoked by the caller; revoking again audits nothing.
func (s *Server) handleRevokeKey(w http.ResponseWriter, r *http.Request, p principal) error {
	if err := s.revokeKey(r.Context(), p, r.PathValue("id")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// revokeKey revokes p's organisation's key keyID as p: apperr.ErrNotFound for a key id that is
// not the org's.
func (s *Server) revokeKey(ctx context.Context, p principal, keyID string) error {
	found, err := s.keys.Revoke(ctx, p.orgID, keyID, p.userID)
	if err != nil {
		return err
	}
	if !found {
		return apperr.ErrNotFound
	}
	return nil
}

// errKeyNotLive is the roll of a revoked or expired key.
var errKeyNotLive = &apperr.Error{Code: apperr.ECONFLICT, Message: "the key is revoked or expired and cannot be rolled"}

// handleRollKey answers POST /orgs/{orgId}/api-keys/{id}/roll {"grace_seconds"?}: 201
// with a new key of the old one's name, role and expiry, shown once, while the old key
// expires after the grace (never later than it would have). The checks are those of
// creation (keyRoute, then the plan's API access, then the body); then a key id that is
// not the org's is 404 and a revoked or expired key 409.
func (s *Server) handleRollKey(w http.ResponseWriter, r *http.Request, p principal) error {
	body, err := s.keyWriteBody(w, r, p)
	if err != nil {
		return err
	}
	rec, full, err := s.rollKey(r.Context(), p, r.PathValue("id"), body)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, createdKey(rec, full))
	return nil
}

// rollKey decodes a roll's body and rolls p's organisation's key keyID as p: the part
// of a roll that follows the plan check, shared by the JSON route and the dashboard.
func (s *Server) rollKey(ctx context.Context, p principal, keyID string, body []byte) (keystore.Record, string, error) {
	grace, err := decodeRoll(body)
	if err != nil {
		return keystore.Record{}, "", err
	}
	rec, full, err := s.keys.Roll(ctx, p.orgID, keyID, grace, p.userID)
	switch {
	case errors.Is(err, keystore.ErrNotFound):
		return keystore.Record{}, "", apperr.ErrNotFound
	case errors.Is(err, keystore.ErrNotLive):
		return keystore.Record{}, "", errKeyNotLive
	}
	return rec, full, err
}

// decodeRoll decodes a roll's body, {"grace_seconds": 0..86400}. An empty body, or one
// without grace_seconds, is a grace of 0: the old key stops working at once.
func decodeRoll(body []byte) (time.Duration, error) {
	if len(bytes.TrimSpace(body)) == 0 {
		return 0, nil
	}
	maxSecs := int(keystore.MaxGrace / time.Second)
	var secs int
	err := decodeObject(body, func(name string, raw json.RawMessage) error {
		if name != "grace_seconds" {
			return apperr.Invalid(name, "unknown field")
		}
		n, err := decodeInt(name, raw)
		if err == nil && (n < 0 || n > maxSecs) {
			err = apperr.Invalid(name, "must be an integer from 0 to %d", maxSecs)
		}
		secs = n
		return err
	})
	if err != nil {
		return 0, err
	}
	return time.Duration(secs) * time.Second, nil
}
