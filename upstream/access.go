package upstream

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"

	"github.com/jackc/pgx/v5"

	"github.com/keygate/keygate/keystore"
)

// Member roles. Owner exists only for people; keys are Admin, Editor or Viewer.
const (
	roleOwner  = "Owner"
	roleAdmin  = "Admin"
	roleEditor = "Editor"
	roleViewer = "Viewer"
)

// validMemberRole reports whether role is a membership role.
func validMemberRole(role string) bool {
	return role == roleOwner || role == roleAdmin || role == roleEditor || role == roleViewer
}

// principal is who a request acts for, whichever door it came through: an organisation
// and a role in it, with the user (dashboard) or key (gateway) behind it.
type principal struct {
	orgID  string
	role   string
	userID string
	keyID  string
}

// canWriteMonitors reports whether p may create, change and delete monitors.
func (p principal) canWriteMonitors() bool {
	return p.role == roleOwner || p.role == roleAdmin || p.role == roleEditor
}

// canManageKeys reports whether p holds api_key:manage.
func (p principal) canManageKeys() bool {
	return p.role == roleOwner || p.role == roleAdmin
}

// member authenticates r's session and its membership of the path's {orgId}, in the
// contract's order: no live session is errUnauthenticated (401); an orgId that is
// malformed, unknown or not the user's is errNotFound (404).
func (s *Server) member(r *http.Request) (principal, error) {
	userID, err := s.authenticate(r)
	if err != nil {
		return principal{}, err
	}
	orgID := r.PathValue("orgId")
	if !validUUID(orgID) {
		return principal{}, errNotFound
	}
	var role string
	err = s.pool.QueryRow(r.Context(), `SELECT role FROM memberships WHERE org_id = $1 AND user_id = $2`,
		orgID, userID).Scan(&role)
	if errors.Is(err, pgx.ErrNoRows) {
		return principal{}, errNotFound
	}
	if err != nil {
		return principal{}, fmt.Errorf("looking up membership: %w", err)
	}
	infoOf(r.Context()).orgID = orgID
	return principal{orgID: orgID, role: role, userID: userID}, nil
}

// monitorHandler is a monitor route's implementation, shared by both doors: it acts for
// p, who has been authenticated and, for writes, authorised.
type monitorHandler func(w http.ResponseWriter, r *http.Request, p principal)

// dashboardDoor serves h to members of the path's organisation: session (401), then
// membership (404), then, for a write, a role that may write (Viewer: 403).
func (s *Server) dashboardDoor(write bool, h monitorHandler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p, err := s.member(r)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		if write && !p.canWriteMonitors() {
			s.writeError(w, r, errForbidden)
			return
		}
		h(w, r, p)
	}
}

// gatewayDoor serves h to the key that gatewayAuth found in r's context; a write by a
// Viewer key is refused with 403, although the gateway refuses it first.
func (s *Server) gatewayDoor(write bool, h monitorHandler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p, ok := r.Context().Value(principalKey{}).(principal)
		if !ok {
			// gatewayAuth runs before every /v1 route; this is a wiring mistake.
			s.writeError(w, r, errKeyUnauth)
			return
		}
		if write && !p.canWriteMonitors() {
			s.writeError(w, r, errForbidden)
			return
		}
		h(w, r, p)
	}
}

type principalKey struct{}

// The headers of CONTRACT §3, set by the gateway on every request it proxies.
const (
	headerSecret  = "X-Gateway-Secret"
	headerOrgID   = "X-Gateway-Org-Id"
	headerKeyID   = "X-Gateway-Key-Id"
	headerKeyRole = "X-Gateway-Key-Role"
)

// gatewayAuth admits a /v1 request only when it carries exactly one X-Gateway-Secret
// equal to the configured secret, and well-formed identity headers; anything else is
// 401 {"error":"api key unauthenticated"}, before any route is looked up. The secret is
// compared as SHA-256 digests in constant time, so neither its content nor its length
// leaks through timing.
func (s *Server) gatewayAuth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, ok := s.gatewayPrincipal(r.Header)
		if !ok {
			// The same challenge as the gateway's own 401 (CONTRACT §2).
			w.Header().Set("WWW-Authenticate", "Bearer")
			s.writeError(w, r, errKeyUnauth)
			return
		}
		info := infoOf(r.Context())
		info.orgID, info.keyID = p.orgID, p.keyID
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, p)))
	})
}

// gatewayPrincipal checks the gateway's headers and returns the identity they assert.
func (s *Server) gatewayPrincipal(h http.Header) (principal, bool) {
	secrets := h.Values(headerSecret)
	presented := ""
	if len(secrets) == 1 {
		presented = secrets[0]
	}
	sum := sha256.Sum256([]byte(presented))
	if subtle.ConstantTimeCompare(sum[:], s.secretSum[:]) != 1 || len(secrets) != 1 {
		return principal{}, false
	}
	orgIDs, keyIDs, roles := h.Values(headerOrgID), h.Values(headerKeyID), h.Values(headerKeyRole)
	if len(orgIDs) != 1 || len(keyIDs) != 1 || len(roles) != 1 {
		return principal{}, false
	}
	p := principal{orgID: orgIDs[0], keyID: keyIDs[0], role: roles[0]}
	if !validUUID(p.orgID) || !keystore.ValidKeyID(p.keyID) || !keystore.Role(p.role).Valid() {
		return principal{}, false
	}
	return p, true
}

// validUUID reports whether s is a UUID in its canonical textual form,
// 8-4-4-4-12 hexadecimal digits of either case.
func validUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
				return false
			}
		}
	}
	return true
}
