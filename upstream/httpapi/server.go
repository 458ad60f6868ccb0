// Package httpapi is the HTTP interface of the upstream, the monitoring service behind
// the keygate gateway. It serves sessions, the organisations' API keys, and monitors
// with their plan gates. A person reads them as the dashboard's pages, a program as
// JSON. The admin endpoints are apart (AdminHandler). Package store holds the data.
// Package cli serves all this from the command line.
//
// Monitors have two doors onto one implementation. /orgs/{orgId}/monitors… takes a
// session cookie and a membership. /v1/monitors… takes the gateway's word: its shared
// secret and the identity headers it adds (README.md, "The picture").
//
// Every error body is JSON with a string member "error" (errors.go). Unknown routes,
// wrong methods and panics answer so too.
package httpapi

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/keygate/keygate/gatewayauth"
	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/openapi"
	"github.com/keygate/keygate/upstream/apperr"
	"github.com/keygate/keygate/upstream/password"
	"github.com/keygate/keygate/upstream/store"
	"github.com/keygate/keygate/upstream/tracing"
	"github.com/keygate/keygate/upstream/webhook"
)

// maxBodyBytes is the largest request body accepted; larger bodies answer 413.
const maxBodyBytes = 1 << 20

// DefaultSessionTTL is how long a session lives when Config.SessionTTL is zero.
const DefaultSessionTTL = 7 * 24 * time.Hour

// Config is what a Server needs. Pool, Logger and KeyFormat are required, and so is
// GatewaySecret or Identity.
type Config struct {
	// Pool is the PostgreSQL pool. It holds the schema of package schema.
	Pool *pgxpool.Pool
	// Logger receives the request log and internal errors.
	Logger *zap.Logger
	// GatewaySecret is the shared secret every /v1 request must carry in
	// X-Gateway-Secret. Default: none, when Identity is set.
	GatewaySecret string
	// Identity, if set, verifies the gateway's signed identity (X-Gateway-Identity) on
	// every /v1 request. The assertion then names the caller, not the X-Gateway-*
	// headers. With GatewaySecret as well, both must hold. Default: none.
	Identity *gatewayauth.Verifier
	// KeyFormat is the format of the API keys the dashboard creates. The gateway must
	// have the same prefix.
	KeyFormat keystore.Format
	// SessionTTL is the lifetime of a session. Default: 7 days.
	SessionTTL time.Duration
	// SecureCookies marks the session cookie Secure on every response. It is for a
	// server behind a proxy that terminates TLS. Without it, the cookie is Secure only
	// on requests that came over TLS (secureRequest). Default: false.
	SecureCookies bool
	// Metrics, if set, counts requests by route and plan-gate refusals (see Metrics and
	// AdminHandler). Default: none.
	Metrics *Metrics
	// TrustedProxies are the networks of the proxies whose X-Forwarded-For and
	// X-Forwarded-Proto are believed, such as the gateway's. Default: none.
	TrustedProxies []netip.Prefix
	// LoginThrottle bounds failed logins per (email, client address) and per client
	// address. Its zero fields take those of store.DefaultLoginThrottle.
	LoginThrottle store.LoginThrottle
	// LeakReportToken, if set, mounts POST /security/leaked-keys for secret scanners
	// (docs/security.md). They send it as a bearer token. It has at least
	// MinLeakReportToken characters. Default: the route is absent.
	LeakReportToken string
	// Webhooks is what the operator allows of a webhook endpoint's URL
	// (docs/webhooks.md). Default: https, public addresses only.
	Webhooks webhook.Policy
	// Now is the clock of the checks made in Go: a key's expiry and the login
	// throttle's window. Default: time.Now.
	Now func() time.Time
	// Traces, if set, gives each request a server span named by its route
	// (docs/operations.md, Tracing). Default: none.
	Traces *tracing.Traces
}

// Server is the upstream's HTTP handler. Build it with NewServer; it is safe for
// concurrent use.
type Server struct {
	store      *store.Store
	logger     *zap.Logger
	refusals   *zap.Logger // logger, at most one entry a minute per message: refused gateway credentials
	keys       *keystore.Store
	format     keystore.Format
	secretSum  [sha256.Size]byte
	secretSet  bool                  // GatewaySecret is set
	identity   *gatewayauth.Verifier // may be nil
	sessionTTL time.Duration
	secure     bool
	now        func() time.Time
	// trustedProxies and throttle are Config's TrustedProxies and LoginThrottle.
	trustedProxies []netip.Prefix
	throttle       store.LoginThrottle
	passwords      *password.Hasher
	// leakTokenSum is the SHA-256 of Config.LeakReportToken. leakReports is whether
	// it is set.
	leakTokenSum [sha256.Size]byte
	leakReports  bool
	metrics      *Metrics // may be nil
	webhooks     webhook.Policy
	handler      http.Handler
}

// NewServer checks cfg and returns a Server.
func NewServer(cfg Config) (*Server, error) {
	switch {
	case cfg.Pool == nil:
		return nil, errors.New("upstream: Config.Pool is required")
	case cfg.Logger == nil:
		return nil, errors.New("upstream: Config.Logger is required")
	case cfg.GatewaySecret == "" && cfg.Identity == nil:
		return nil, errors.New("upstream: Config.GatewaySecret or Config.Identity is required")
	case cfg.KeyFormat.Prefix() == "":
		return nil, errors.New("upstream: Config.KeyFormat is required")
	case cfg.SessionTTL < 0:
		return nil, errors.New("upstream: Config.SessionTTL must not be negative")
	case cfg.LeakReportToken != "" && len(cfg.LeakReportToken) < MinLeakReportToken:
		return nil, fmt.Errorf("upstream: Config.LeakReportToken must be at least %d characters", MinLeakReportToken)
	}
	s := &Server{
		store:      store.New(cfg.Pool),
		logger:     cfg.Logger,
		keys:       keystore.New(cfg.Pool, cfg.KeyFormat),
		format:     cfg.KeyFormat,
		secretSum:  sha256.Sum256([]byte(cfg.GatewaySecret)),
		secretSet:  cfg.GatewaySecret != "",
		identity:   cfg.Identity,
		sessionTTL: cfg.SessionTTL,
		secure:     cfg.SecureCookies,
		now:        cfg.Now,
		passwords:  password.NewHasher(),
		metrics:    cfg.Metrics,
		webhooks:   cfg.Webhooks,
		refusals: cfg.Logger.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
			return zapcore.NewSamplerWithOptions(c, time.Minute, 1, 0)
		})),

		trustedProxies: cfg.TrustedProxies,
		throttle:       cfg.LoginThrottle,
		leakTokenSum:   sha256.Sum256([]byte(cfg.LeakReportToken)),
		leakReports:    cfg.LeakReportToken != "",
	}
	if s.throttle.Window <= 0 {
		s.throttle.Window = store.DefaultLoginThrottle.Window
	}
	if s.throttle.PerEmail <= 0 {
		s.throttle.PerEmail = store.DefaultLoginThrottle.PerEmail
	}
	if s.throttle.PerClient <= 0 {
		s.throttle.PerClient = store.DefaultLoginThrottle.PerClient
	}
	if s.sessionTTL == 0 {
		s.sessionTTL = DefaultSessionTTL
	}
	if s.now == nil {
		s.now = time.Now
	}
	s.passwords.PrepareDummy()
	s.handler = cfg.Traces.Handler(s.logRequests(s.recoverPanics(s.routes())))
	return s, nil
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.handler.ServeHTTP(w, r)
}

// routes builds the route table. A /v1 request passes the gateway check before any
// route is looked up. So without the secret, even an unknown /v1 path answers 401. Any
// other request passes Go's cross-origin protection. It refuses the state-changing
// requests a browser sends from another origin. Safe methods pass, and so do requests
// without Sec-Fetch-Site or Origin, such as curl's.
func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()

	for _, name := range openapi.Names {
		mux.HandleFunc("GET /openapi/"+name, serveDocument(name))
	}

	// The sessions, the keys, the usage and the dashboard's pages, each through its
	// adapter. handle checks nothing. keyRoute wants a member who may manage keys,
	// memberRoute with anyRole any member. page (dashboard.go) shows errors on pages.
	for _, rt := range []struct {
		pattern string
		handler http.HandlerFunc
	}{
		{"POST /auth/login", s.handle(s.handleLogin)},
		{"POST /auth/logout", s.handle(s.handleLogout)},
		{"POST /orgs/{orgId}/api-keys", s.keyRoute(s.handleCreateKey)},
		{"GET /orgs/{orgId}/api-keys", s.keyRoute(s.handleListKeys)},
		{"DELETE /orgs/{orgId}/api-keys/{id}", s.keyRoute(s.handleRevokeKey)},
		{"PATCH /orgs/{orgId}/api-keys/{id}", s.keyRoute(s.handleUpdateKey)},
		{"POST /orgs/{orgId}/api-keys/{id}/roll", s.keyRoute(s.handleRollKey)},
		{"GET /orgs/{orgId}/audit-events", s.keyRoute(s.handleListAuditEvents)},
		{"GET /orgs/{orgId}/usage", s.memberRoute(anyRole, s.handleUsage)},
		{"POST /orgs/{orgId}/webhooks", s.keyRoute(s.handleCreateWebhook)},
		{"GET /orgs/{orgId}/webhooks", s.keyRoute(s.handleListWebhooks)},
		{"GET /orgs/{orgId}/webhooks/{id}", s.keyRoute(s.handleGetWebhook)},
		{"PATCH /orgs/{orgId}/webhooks/{id}", s.keyRoute(s.handleUpdateWebhook)},
		{"DELETE /orgs/{orgId}/webhooks/{id}", s.keyRoute(s.handleDeleteWebhook)},
		{"POST /orgs/{orgId}/webhooks/{id}/test", s.keyRoute(s.handleTestWebhook)},
		{"POST /orgs/{orgId}/webhooks/{id}/rotate-secret", s.keyRoute(s.handleRotateWebhookSecret)},
		{"GET /orgs/{orgId}/webhooks/{id}/deliveries", s.keyRoute(s.handleListDeliveries)},
		{"POST /orgs/{orgId}/webhooks/{id}/deliveries/{deliveryId}/retry", s.keyRoute(s.handleRetryDelivery)},
		{"GET /dashboard", s.page(s.pageHome)},
		{"POST /dashboard/login", s.page(s.pageLogin)},
		{"POST /dashboard/logout", s.page(s.pageLogout)},
		{"GET /dashboard/orgs/{orgId}", s.page(s.pageKeys)},
		{"POST /dashboard/orgs/{orgId}/keys", s.page(s.pageCreateKey)},
		{"GET /dashboard/orgs/{orgId}/keys/{id}/revoke", s.page(s.pageConfirmRevoke)},
		{"POST /dashboard/orgs/{orgId}/keys/{id}/revoke", s.page(s.pageRevoke)},
		{"POST /dashboard/orgs/{orgId}/keys/{id}/roll", s.page(s.pageRoll)},
		{"POST /dashboard/orgs/{orgId}/keys/{id}/settings", s.page(s.pageUpdateKey)},
		{"GET /dashboard/orgs/{orgId}/audit", s.page(s.pageAudit)},
		{"GET /dashboard/orgs/{orgId}/audit/export", s.page(s.pageAuditExport)},
		{"GET /dashboard/orgs/{orgId}/usage", s.page(s.pageUsage)},
		{"GET /dashboard/orgs/{orgId}/webhooks", s.page(s.pageWebhooks)},
		{"POST /dashboard/orgs/{orgId}/webhooks", s.page(s.pageCreateWebhook)},
		{"GET /dashboard/orgs/{orgId}/webhooks/{id}", s.page(s.pageWebhookDeliveries)},
		{"POST /dashboard/orgs/{orgId}/webhooks/{id}/test", s.page(s.pageTestWebhook)},
		{"POST /dashboard/orgs/{orgId}/webhooks/{id}/rotate", s.page(s.pageRotateWebhook)},
		{"POST /dashboard/orgs/{orgId}/webhooks/{id}/enabled", s.page(s.pageEnableWebhook)},
		{"POST /dashboard/orgs/{orgId}/webhooks/{id}/edit", s.page(s.pageEditWebhook)},
		{"POST /dashboard/orgs/{orgId}/webhooks/{id}/delete", s.page(s.pageDeleteWebhook)},
		{"POST /dashboard/orgs/{orgId}/webhooks/{id}/deliveries/{deliveryId}/retry", s.page(s.pageRetryDelivery)},
		{"GET /dashboard/static/{file}", s.page(s.pageStatic)},
	} {
		mux.HandleFunc(rt.pattern, rt.handler)
	}
	if s.leakReports {
		mux.HandleFunc("POST /security/leaked-keys", s.handle(s.handleLeakReport))
	}

	read, write := anyRole, principal.canWriteMonitors
	for _, door := range []struct {
		prefix string
		route  func(may func(principal) bool, h principalHandler) http.HandlerFunc
	}{
		{"/orgs/{orgId}/monitors", s.memberRoute},
		{"/v1/monitors", s.gatewayRoute},
	} {
		mux.HandleFunc("GET "+door.prefix, door.route(read, s.handleListMonitors))
		mux.HandleFunc("POST "+door.prefix, door.route(write, s.handleCreateMonitor))
		mux.HandleFunc("GET "+door.prefix+"/{id}", door.route(read, monitorRoute(s.handleGetMonitor)))
		mux.HandleFunc("PATCH "+door.prefix+"/{id}", door.route(write, monitorRoute(s.handlePatchMonitor)))
		mux.HandleFunc("DELETE "+door.prefix+"/{id}", door.route(write, monitorRoute(s.handleDeleteMonitor)))
	}

	routed := s.jsonFallbacks(mux)
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(s.handle(func(http.ResponseWriter, *http.Request) error { return apperr.ErrForbidden }))
	dashboard := cop.Handler(routed)
	v1 := s.gatewayAuth(routed)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if isV1(r.URL.Path) {
			v1.ServeHTTP(w, r)
			return
		}
		dashboard.ServeHTTP(w, r)
	})
}

// serveDocument answers with the OpenAPI document name of package openapi, byte for
// byte. Anyone may read it: it describes the interface and grants nothing.
func serveDocument(name string) http.HandlerFunc {
	b, err := openapi.Files.ReadFile(name)
	if err != nil {
		panic(fmt.Sprintf("openapi: %s is not embedded", name)) // a build error, not a request's
	}
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/yaml")
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		w.WriteHeader(http.StatusOK)
		if r.Method != http.MethodHead {
			w.Write(b)
		}
	}
}

// handlerFunc is a route. It writes its answer, or it returns the error to answer with
// and writes nothing.
type handlerFunc func(w http.ResponseWriter, r *http.Request) error

// handle adapts h to net/http. It is the one place where a route's error becomes a
// response (writeError).
func (s *Server) handle(h handlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := h(w, r); err != nil {
			s.writeError(w, r, err)
		}
	}
}

// isV1 reports whether path is under /v1, the gateway's side.
func isV1(path string) bool {
	return path == "/v1" || strings.HasPrefix(path, "/v1/")
}

// jsonFallbacks answers with JSON the requests mux has no route for. A path known
// under other methods is 405 {"error":"method not allowed"}, with mux's Allow header.
// Any other is 404 {"error":"not found"}. So is a path with empty or dot segments.
// mux would redirect it to its clean form, with HTML. No answer of this API is a
// redirect.
func (s *Server) jsonFallbacks(mux *http.ServeMux) http.Handler {
	return s.handle(func(w http.ResponseWriter, r *http.Request) error {
		if !cleanPath(r.URL.Path) {
			return apperr.ErrNotFound
		}
		h, pattern := mux.Handler(r)
		if pattern != "" {
			infoOf(r.Context()).route = pattern // for Metrics
			mux.ServeHTTP(w, r)
			return nil
		}
		// mux's own 404 and 405 handlers run against a scratch writer. They tell which
		// of the two applies, and the Allow header of a 405.
		probe := &headerProbe{header: make(http.Header)}
		h.ServeHTTP(probe, r)
		if probe.status == http.StatusMethodNotAllowed {
			w.Header().Set("Allow", probe.header.Get("Allow"))
			return apperr.ErrMethodNotAllowed
		}
		return apperr.ErrNotFound
	})
}

// cleanPath reports whether path is absolute, with no dot segment and no empty one.
// A final empty segment, a trailing slash, is allowed.
func cleanPath(path string) bool {
	if !strings.HasPrefix(path, "/") {
		return false
	}
	segs := strings.Split(path[1:], "/")
	for i, seg := range segs {
		if seg == "." || seg == ".." || (seg == "" && i < len(segs)-1) {
			return false
		}
	}
	return true
}

// headerProbe is a ResponseWriter that keeps the status and headers and drops the body.
type headerProbe struct {
	header http.Header
	status int
}

func (p *headerProbe) Header() http.Header { return p.header }
func (p *headerProbe) Write(b []byte) (int, error) {
	if p.status == 0 {
		p.status = http.StatusOK
	}
	return len(b), nil
}
func (p *headerProbe) WriteHeader(status int) {
	if p.status == 0 {
		p.status = status
	}
}

// writeJSON answers with status and v as JSON. Responses are never compressed, since
// the gateway filters JSON bodies. Nor are they cached: they are per caller, and one of
// them holds a full API key.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		// Every value passed here is built by this package and marshals; this is a bug.
		b = []byte(`{"error":"internal"}`)
		status = http.StatusInternalServerError
	}
	b = append(b, '\n')
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// readBody reads r's body up to maxBodyBytes, answering apperr.ETOOLARGE beyond.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return nil, apperr.ErrRequestTooLarge
	case err != nil:
		// The client went away or sent a broken chunked body.
		return nil, apperr.Invalid("body", "could not be read")
	}
	return b, nil
}

// timeJSON formats t as the API writes times: RFC 3339 in UTC.
func timeJSON(t time.Time) string {
	return t.UTC().Format(time.RFC3339Nano)
}

// optionalTimeJSON is timeJSON for a time that may be absent (JSON null).
func optionalTimeJSON(t *time.Time) *string {
	if t == nil {
		return nil
	}
	s := timeJSON(*t)
	return &s
}
