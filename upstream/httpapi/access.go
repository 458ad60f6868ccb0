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
	return p.role == store.RoleOwner || p.role == store.RoleAdmin || p.role == store.RoleEditor
}

// canManageKeys reports whether p holds api_key:manage.
func (p principal) canManageKeys() bool {
	return p.role == store.RoleOwner || p.role == store.RoleAdmin
}

// member authenticates r's session and its membership of the path's {orgId}, in the
// contract's order: no live session is apperr.ErrUnauthenticated (401); an orgId that is
// malformed, unknown or not the user's is apperr.ErrNotFound (404).
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

// principalHandler is a route acting for p, whom its door (memberRoute,
// gatewayRoute) has authenticated and authorised: it writes its answer or returns the
// error to answer with.
type principalHandler func(w http.ResponseWriter, r *http.Request, p principal) error

// anyRole lets every principal through: the routes that only read.
func anyRole(principal) bool { return true }

// memberRoute serves h to members of the path's organisation whose role may pass, in
// the contract's order: session (401), then membership (404), then role (403).
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

// keyRoute is the preamble of every dashboard key route: a member holding
// api_key:manage (session 401, membership 404, role 403).
func (s *Server) keyRoute(h principalHandler) http.HandlerFunc {
	return s.memberRoute(principal.canManageKeys, h)
}

// gatewayRoute serves h to the key that gatewayAuth found in r's context whose role may
// pass; a write by a Viewer key is refused with 403, although the gateway refuses it
// first.
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

// The headers of CONTRACT §3, set by the gateway on every request it proxies.
const (
	HeaderSecret  = "X-Gateway-Secret"
	HeaderOrgID   = "X-Gateway-Org-Id"
	HeaderKeyID   = "X-Gateway-Key-Id"
	HeaderKeyRole = "X-Gateway-Key-Role"
)

// gatewayAuth admits a /v1 request only when gatewayPrincipal finds who the gateway
// says is calling; anything else is 401 {"error":"api key unauthenticated"}, before
// any route is looked up, or 503 while the gateway's keys cannot be fetched (the
// service is at fault, not the caller). Why is logged, at most once a minute: a
// gateway whose credentials are refused (a wrong identity_audience, key or secret)
// fails every request the same way.
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
				zap.String("path", r.URL.Path), zap.Error(err))
			// The same challenge as the gateway's own 401 (CONTRACT §2).
			w.Header().Set("WWW-Authenticate", "Bearer")
			s.writeError(w, r, apperr.ErrKeyUnauth)
			return
		}
		info := infoOf(r.Context())
		info.orgID, info.keyID = p.orgID, p.keyID
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, p)))
	})
}

// gatewayPrincipal checks the gateway's headers and returns the identity they assert:
// exactly one X-Gateway-Secret equal to the configured secret, when one is configured
// (compared as SHA-256 digests in constant time, so neither its content nor its length
// leaks through timing), and exactly one valid X-Gateway-Identity when a verifier is,
// which then names the caller (CONTRACT §15); otherwise the X-Gateway-* headers do.
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
