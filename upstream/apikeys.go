package upstream

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keygate/keygate/keystore"
)

// keyJSON is a key in the dashboard's list: never its secret, never its hash.
type keyJSON struct {
	ID        string  `json:"id"`
	Name      string  `json:"name"`
	Role      string  `json:"role"`
	CreatedAt string  `json:"created_at"`
	ExpiresAt *string `json:"expires_at"`
	RevokedAt *string `json:"revoked_at"`
	MaskedKey string  `json:"masked_key"`
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

// keyManager runs the checks every dashboard key route starts with, in the contract's
// order: session (401), membership (404), api_key:manage (403).
func (s *Server) keyManager(r *http.Request) (principal, error) {
	p, err := s.member(r)
	if err != nil {
		return principal{}, err
	}
	if !p.canManageKeys() {
		return principal{}, errForbidden
	}
	return p, nil
}

// handleCreateKey answers POST /orgs/{orgId}/api-keys
// {"name","role","expires_at"?}: 201 with the full key. After the checks of keyManager
// come the plan's API access (403 feature_gated) and then the body (400).
func (s *Server) handleCreateKey(w http.ResponseWriter, r *http.Request) {
	p, err := s.keyManager(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var rateLimit int
	err = s.pool.QueryRow(r.Context(), `SELECT p.api_rate_limit FROM orgs o JOIN plans p ON p.name = o.plan WHERE o.id = $1`,
		p.orgID).Scan(&rateLimit)
	if errors.Is(err, pgx.ErrNoRows) {
		// The org was deleted since the membership was read.
		s.writeError(w, r, errNotFound)
		return
	}
	if err != nil {
		s.writeError(w, r, fmt.Errorf("looking up plan: %w", err))
		return
	}
	if rateLimit == 0 {
		s.writeError(w, r, errAPIFeatureGated)
		return
	}

	body, err := readBody(w, r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	nk, err := s.decodeNewKey(body)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	nk.OrgID, nk.CreatedBy = p.orgID, p.userID
	rec, full, err := s.keys.Create(r.Context(), nk)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, createdKeyJSON{
		ID:        rec.ID,
		Name:      rec.Name,
		Role:      string(rec.Role),
		CreatedAt: timeJSON(rec.CreatedAt),
		ExpiresAt: optionalTimeJSON(rec.ExpiresAt),
		Key:       full,
	})
}

// decodeNewKey decodes and checks a key creation body. expires_at may be absent or
// null for a key that lives until revoked; otherwise it must be in the future.
func (s *Server) decodeNewKey(body []byte) (keystore.NewKey, error) {
	var nk keystore.NewKey
	var haveName, haveRole bool
	err := decodeObject(body, func(name string, raw json.RawMessage) error {
		var err error
		switch name {
		case "name":
			nk.Name, err = decodeText(name, raw, 1, 100)
			haveName = true
		case "role":
			var role string
			role, err = decodeString(name, raw)
			if err == nil && !keystore.Role(role).Valid() {
				err = invalid(name, "must be one of Admin, Editor, Viewer")
			}
			nk.Role = keystore.Role(role)
			haveRole = true
		case "expires_at":
			if string(raw) == "null" {
				return nil
			}
			var t time.Time
			t, err = decodeTime(name, raw)
			if err == nil && !t.After(s.now()) {
				err = invalid(name, "must be in the future")
			}
			nk.ExpiresAt = &t
		default:
			err = invalid(name, "unknown field")
		}
		return err
	})
	switch {
	case err != nil:
		return keystore.NewKey{}, err
	case !haveName:
		return keystore.NewKey{}, invalid("name", "required")
	case !haveRole:
		return keystore.NewKey{}, invalid("role", "required")
	}
	return nk, nil
}

// handleListKeys answers GET /orgs/{orgId}/api-keys: every key of the org, revoked and
// expired ones included, oldest first, masked.
func (s *Server) handleListKeys(w http.ResponseWriter, r *http.Request) {
	p, err := s.keyManager(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	recs, err := s.keys.List(r.Context(), p.orgID)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	data := make([]keyJSON, 0, len(recs))
	for _, rec := range recs {
		data = append(data, keyJSON{
			ID:        rec.ID,
			Name:      rec.Name,
			Role:      string(rec.Role),
			CreatedAt: timeJSON(rec.CreatedAt),
			ExpiresAt: optionalTimeJSON(rec.ExpiresAt),
			RevokedAt: optionalTimeJSON(rec.RevokedAt),
			MaskedKey: s.format.Mask(rec.ID),
		})
	}
	writeJSON(w, http.StatusOK, struct {
		Data []keyJSON `json:"data"`
	}{data})
}

// handleRevokeKey answers DELETE /orgs/{orgId}/api-keys/{id}: 204, also for a key
// already revoked; 404 for an id that is not one of the org's keys.
func (s *Server) handleRevokeKey(w http.ResponseWriter, r *http.Request) {
	p, err := s.keyManager(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	found, err := s.keys.Revoke(r.Context(), p.orgID, r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if !found {
		s.writeError(w, r, errNotFound)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
