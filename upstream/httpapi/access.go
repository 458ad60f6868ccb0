package httpapi

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"

	"go.uber.org/zap"

	"github.com/keygate/keygate/gatewayauth"
	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/upstream/apperr"
	"github.com/keygate/keygate/upstream/store"
)

// principal is who a request acts for, whichever door it came through. It is an
// organisation and a role in it. A user (dashboard) or a key (gateway) stands behind it.
type principal struct {
	orgID  string
	role   string
	userID string
	keyID  string
}

// canWriteMonitors reports whether p may create, change and delete monitors.
func (p principal) canWriteMonitors() bool {
	return p.role == store.RoleOwner || p.role == store.RoleAdmin || p.role == store.RoleEditor
}

// canManageKeys reports whether p holds api_key:manage.
func (p principal) canManageKeys() bool {
	return p.role == store.RoleOwner || p.role == store.RoleAdmin
}

// member checks r's session, then its user's membership of the path's {orgId}. No live
// session is apperr.ErrUnauthenticated (401). An orgId that is malformed, unknown or not
// the user's is apperr.ErrNotFound (404), so an outsider learns nothing.
func (s *Server) member(r *http.Request) (principal, error) {
	userID, err := s.authenticate(r)
	if err != nil {
		return principal{}, err
	}
	orgID := r.PathValue("orgId")
	if !store.ValidUUID(orgID) {
		return principal{}, apperr.ErrNotFound
	}
	role, err := s.store.MemberRole(r.Context(), orgID, userID)
	if err != nil {
		return principal{}, err
	}
	infoOf(r.Context()).orgID = orgID
	return principal{orgID: orgID, role: role, userID: userID}, nil
}

// principalHandler is a route acting for p. Its door (memberRoute, gatewayRoute) has
// authenticated and authorised p. It writes its answer or returns the error to answer
// with.
type principalHandler func(w http.ResponseWriter, r *http.Request, p principal) error

// anyRole lets every principal through: the routes that only read.
func anyRole(principal) bool { return true }

// memberRoute serves h to the members of the path's organisation whose role may pass.
// It checks the session (401), the membership (404), then the role (403).
func (s *Server) memberRoute(may func(principal) bool, h principalHandler) http.HandlerFunc {
	return s.handle(func(w http.ResponseWriter, r *http.Request) error {
		p, err := s.member(r)
		if err != nil {
			return err
		}
		if !may(p) {
			return apperr.ErrForbidden
		}
		return h(w, r, p)
	})
}

// keyRoute is memberRoute for the routes of keys and their audit trail. The member
// must hold api_key:manage.
func (s *Server) keyRoute(h principalHandler) http.HandlerFunc {
	return s.memberRoute(principal.canManageKeys, h)
}

// gatewayRoute serves h to the key gatewayAuth put in r's context, if its role may
// pass. A Viewer key's write is 403 here too, though the gateway refuses it first.
func (s *Server) gatewayRoute(may func(principal) bool, h principalHandler) http.HandlerFunc {
	return s.handle(func(w http.ResponseWriter, r *http.Request) error {
		p, ok := r.Context().Value(principalKey{}).(principal)
		if !ok {
			// gatewayAuth runs before every /v1 route; this is a wiring mistake.
			return apperr.ErrKeyUnauth
		}
		if !may(p) {
			return apperr.ErrForbidden
		}
		return h(w, r, p)
	})
}

type principalKey struct{}

// The headers the gateway sets on every request it proxies (README.md, "The picture").
const (
	HeaderSecret  = "X-Gateway-Secret"
	HeaderOrgID   = "X-Gateway-Org-Id"
	HeaderKeyID   = "X-Gateway-Key-Id"
	HeaderKeyRole = "X-Gateway-Key-Role"
)

// gatewayAuth admits a /v1 request only when gatewayPrincipal finds who the gateway
// says is calling. Anything else is 401 {"error":"api key unauthenticated"}, before any
// route is looked up. While the gateway's keys cannot be fetched it is 503: the service
// is at fault, not the caller. Why is logged, at most once a minute. A gateway whose
// credentials are refused (a wrong identity_audience, key or secret) fails every
// request the same way.
func (s *Server) gatewayAuth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, err := s.gatewayPrincipal(r.Context(), r.Header)
		if errors.Is(err, gatewayauth.ErrKeysUnavailable) {
			s.refusals.Error("the gateway's keys cannot be fetched; answering /v1 with 503", zap.Error(err))
			s.writeError(w, r, apperr.ErrUnavailable)
			return
		}
		if err != nil {
			s.refusals.Warn("refusing the gateway's credentials; answering /v1 with 401",
				zap.String("path", keystore.Redact(r.URL.Path)), zap.Error(err))
			// The same challenge as the gateway's own 401.
			w.Header().Set("WWW-Authenticate", "Bearer")
			s.writeError(w, r, apperr.ErrKeyUnauth)
			return
		}
		info := infoOf(r.Context())
		info.orgID, info.keyID = p.orgID, p.keyID
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, p)))
	})
}

// gatewayPrincipal checks the gateway's headers and returns the identity they assert.
// With a secret configured, it wants exactly one X-Gateway-Secret equal to it. The two
// are compared as SHA-256 digests in constant time, so timing leaks neither content
// nor length. With a verifier configured, it wants exactly one valid
// X-Gateway-Identity, which names the caller (docs/security.md, "Signed identity").
// Otherwise the X-Gateway-* headers name the caller.
// Its error says why not, without the secret.
func (s *Server) gatewayPrincipal(ctx context.Context, h http.Header) (principal, error) {
	if s.secretSet {
		secrets := h.Values(HeaderSecret)
		presented := ""
		if len(secrets) == 1 {
			presented = secrets[0]
		}
		sum := sha256.Sum256([]byte(presented))
		if subtle.ConstantTimeCompare(sum[:], s.secretSum[:]) != 1 || len(secrets) != 1 {
			return principal{}, fmt.Errorf("%d %s headers, or not GATEWAY_SECRET", len(secrets), HeaderSecret)
		}
	}
	if s.identity != nil {
		assertions := h.Values(gatewayauth.Header)
		if len(assertions) != 1 {
			return principal{}, fmt.Errorf("%d %s headers, not one", len(assertions), gatewayauth.Header)
		}
		id, err := s.identity.Verify(ctx, assertions[0])
		switch {
		case err != nil:
			return principal{}, err
		case !store.ValidUUID(id.OrgID) || !keystore.ValidKeyID(id.KeyID):
			return principal{}, errors.New("the assertion's org_id is not a UUID, or its sub not a key id")
		}
		return principal{orgID: id.OrgID, keyID: id.KeyID, role: id.Role}, nil
	}
	orgIDs, keyIDs, roles := h.Values(HeaderOrgID), h.Values(HeaderKeyID), h.Values(HeaderKeyRole)
	p := principal{}
	if len(orgIDs) == 1 && len(keyIDs) == 1 && len(roles) == 1 {
		p = principal{orgID: orgIDs[0], keyID: keyIDs[0], role: roles[0]}
	}
	if !store.ValidUUID(p.orgID) || !keystore.ValidKeyID(p.keyID) || !keystore.Role(p.role).Valid() {
		return principal{}, errors.New("no single valid X-Gateway-Org-Id, X-Gateway-Key-Id and X-Gateway-Key-Role")
	}
	return p, nil
}
