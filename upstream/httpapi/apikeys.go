package httpapi

import (
	"context"
	"errors"
	"net/http"
	"net/netip"

	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/upstream/apperr"
)

// keyJSON is a key in the list. It never holds the key's secret or hash.
type keyJSON struct {
	ID         string  `json:"id"`
	Name       string  `json:"name"`
	Role       string  `json:"role"`
	CreatedAt  string  `json:"created_at"`
	ExpiresAt  *string `json:"expires_at"`
	RevokedAt  *string `json:"revoked_at"`
	LastUsedAt *string `json:"last_used_at"`
	MaskedKey  string  `json:"masked_key"`
	keySettingsJSON
}

// keySettingsJSON is a key's own settings, as every answer with a key shows them.
type keySettingsJSON struct {
	// RateLimit and the windows' limits are null for the plan's.
	RateLimit          *int `json:"rate_limit"`
	RateLimitPerSecond *int `json:"rate_limit_per_second"`
	RateLimitPerHour   *int `json:"rate_limit_per_hour"`
	RateLimitPerDay    *int `json:"rate_limit_per_day"`
	// AllowedCIDRs is [] for anywhere, never null.
	AllowedCIDRs []netip.Prefix `json:"allowed_cidrs"`
	// Scopes is null for everything the role allows.
	Scopes []string `json:"scopes"`
}

// createdKeyJSON is the answer to a key's creation or roll. It is the one answer with
// a full key.
type createdKeyJSON struct {
	ID        string  `json:"id"`
	Name      string  `json:"name"`
	Role      string  `json:"role"`
	CreatedAt string  `json:"created_at"`
	ExpiresAt *string `json:"expires_at"`
	Key       string  `json:"key"`
	keySettingsJSON
}

// keySettings returns rec's settings as the answers show them.
func keySettings(rec keystore.Record) keySettingsJSON {
	cidrs := rec.AllowedCIDRs
	if cidrs == nil {
		cidrs = []netip.Prefix{}
	}
	w := rec.WindowLimits
	return keySettingsJSON{RateLimit: rec.RateLimit, RateLimitPerSecond: w[keystore.PerSecond], RateLimitPerHour: w[keystore.PerHour],
		RateLimitPerDay: w[keystore.PerDay], AllowedCIDRs: cidrs, Scopes: rec.Scopes}
}

// checkAPIAccess returns apperr.ErrAPIFeatureGated when the plan of p's organisation
// has no API access (api_rate_limit 0). Keys can then be neither created nor rolled.
// Both doors check it after the member and before the input (docs/openapi.md).
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

// keyWriteBody checks the plan's API access, then reads the body of a key's creation
// or roll.
func (s *Server) keyWriteBody(w http.ResponseWriter, r *http.Request, p principal) ([]byte, error) {
	if err := s.checkAPIAccess(r.Context(), p); err != nil {
		return nil, err
	}
	return readBody(w, r)
}

// handleCreateKey answers POST /orgs/{orgId}/api-keys with 201 and the full key.
func (s *Server) handleCreateKey(w http.ResponseWriter, r *http.Request, p principal) error {
	body, err := s.keyWriteBody(w, r, p)
	if err != nil {
		return err
	}
	in, err := decodeCreateKey(body, s.now())
	if err != nil {
		return err
	}
	rec, full, err := s.createKey(r.Context(), p, in)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, createdKey(rec, full))
	return nil
}

// createKey creates a key of p's organisation, as p. It returns the key's record and
// its full text.
func (s *Server) createKey(ctx context.Context, p principal, in createKeyInput) (keystore.Record, string, error) {
	rec, full, err := s.keys.Create(ctx, keystore.NewKey{
		OrgID: p.orgID, CreatedBy: p.userID, Name: in.Name, Role: in.Role, ExpiresAt: in.ExpiresAt,
		RateLimit: in.RateLimit, WindowLimits: in.WindowLimits, AllowedCIDRs: in.AllowedCIDRs, Scopes: in.Scopes,
	})
	return rec, full, settingError(err)
}

// createdKey is the answer to a key's creation or roll.
func createdKey(rec keystore.Record, full string) createdKeyJSON {
	return createdKeyJSON{
		ID:        rec.ID,
		Name:      rec.Name,
		Role:      string(rec.Role),
		CreatedAt: timeJSON(rec.CreatedAt),
		ExpiresAt: optionalTimeJSON(rec.ExpiresAt),
		Key:       full,

		keySettingsJSON: keySettings(rec),
	}
}

// handleListKeys answers GET /orgs/{orgId}/api-keys with every key of the org, masked
// and oldest first. Revoked and expired keys are listed too.
func (s *Server) handleListKeys(w http.ResponseWriter, r *http.Request, p principal) error {
	recs, err := s.keys.List(r.Context(), p.orgID)
	if err != nil {
		return err
	}
	data := make([]keyJSON, 0, len(recs))
	for _, rec := range recs {
		data = append(data, s.keyJSON(rec))
	}
	writeJSON(w, http.StatusOK, struct {
		Data []keyJSON `json:"data"`
	}{data})
	return nil
}

// keyJSON is rec as the list shows it.
func (s *Server) keyJSON(rec keystore.Record) keyJSON {
	return keyJSON{
		ID:         rec.ID,
		Name:       rec.Name,
		Role:       string(rec.Role),
		CreatedAt:  timeJSON(rec.CreatedAt),
		ExpiresAt:  optionalTimeJSON(rec.ExpiresAt),
		RevokedAt:  optionalTimeJSON(rec.RevokedAt),
		LastUsedAt: optionalTimeJSON(rec.LastUsedAt),
		MaskedKey:  s.format.Mask(rec.ID),

		keySettingsJSON: keySettings(rec),
	}
}

// handleUpdateKey answers PATCH /orgs/{orgId}/api-keys/{id} with 200 and the key as
// the list shows it. The body sets at least one of rate_limit, allowed_cidrs and
// scopes. A bad value is 400, checked before the key; a key that is not the org's is 404, a revoked or
// expired one 409.
func (s *Server) handleUpdateKey(w http.ResponseWriter, r *http.Request, p principal) error {
	body, err := readBody(w, r)
	if err != nil {
		return err
	}
	u, err := decodeUpdateKey(body)
	if err != nil {
		return err
	}
	rec, err := s.updateKey(r.Context(), p, r.PathValue("id"), u)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, s.keyJSON(rec))
	return nil
}

// errKeyNotChangeable is the update of a revoked or expired key.
var errKeyNotChangeable = &apperr.Error{Code: apperr.ECONFLICT, Message: "the key is revoked or expired and cannot be changed"}

// updateKey changes the settings u sets of the key keyID of p's organisation, as p,
// audited as key.updated when something changes. The rate limit is checked against
// the plan of the moment. A key that is not the org's is apperr.ErrNotFound; a revoked
// or expired one is errKeyNotChangeable.
func (s *Server) updateKey(ctx context.Context, p principal, keyID string, u keystore.Update) (keystore.Record, error) {
	rec, err := s.keys.Update(ctx, p.orgID, keyID, u, p.userID)
	switch {
	case errors.Is(err, keystore.ErrNotFound):
		return keystore.Record{}, apperr.ErrNotFound
	case errors.Is(err, keystore.ErrNotLive):
		return keystore.Record{}, errKeyNotChangeable
	case errors.Is(err, keystore.ErrNoChange):
		return keystore.Record{}, errNoSetting
	}
	return rec, settingError(err)
}

// handleRevokeKey answers DELETE /orgs/{orgId}/api-keys/{id} with 204, also for a key
// already revoked. An id that is not one of the org's keys is 404.
func (s *Server) handleRevokeKey(w http.ResponseWriter, r *http.Request, p principal) error {
	if err := s.revokeKey(r.Context(), p, r.PathValue("id")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// revokeKey revokes the key keyID of p's organisation, as p. The audit trail records
// key.revoked once: revoking again records nothing. A key that is not the org's is
// apperr.ErrNotFound.
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

// handleRollKey answers POST /orgs/{orgId}/api-keys/{id}/roll with 201 and the new
// key. A key that is not the org's is 404, a revoked or expired one 409.
func (s *Server) handleRollKey(w http.ResponseWriter, r *http.Request, p principal) error {
	body, err := s.keyWriteBody(w, r, p)
	if err != nil {
		return err
	}
	in, err := decodeRollKey(body)
	if err != nil {
		return err
	}
	rec, full, err := s.rollKey(r.Context(), p, r.PathValue("id"), in)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, createdKey(rec, full))
	return nil
}

// rollKey rolls the key keyID of p's organisation, as p. The new key takes the old
// one's name, role, expiry, rate limit, allowed networks and scopes. The old key
// expires after the grace, never later than it would have. A key that is not the org's is apperr.ErrNotFound; a revoked or
// expired one is errKeyNotLive.
func (s *Server) rollKey(ctx context.Context, p principal, keyID string, in rollKeyInput) (keystore.Record, string, error) {
	rec, full, err := s.keys.Roll(ctx, p.orgID, keyID, in.Grace, p.userID)
	switch {
	case errors.Is(err, keystore.ErrNotFound):
		return keystore.Record{}, "", apperr.ErrNotFound
	case errors.Is(err, keystore.ErrNotLive):
		return keystore.Record{}, "", errKeyNotLive
	}
	return rec, full, err
}
