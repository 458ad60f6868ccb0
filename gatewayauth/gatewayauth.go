// Package gatewayauth lets a service behind the keygate gateway know who is calling
// without trusting a shared secret: the gateway signs the caller's identity (the API
// key's id, its organisation and role) into an EdDSA JWT in the X-Gateway-Identity
// header of every request it passes on, and the service verifies it with the gateway's
// public key, published as a JWKS.
//
// A shared secret lets every service that holds it, and anyone who reads it from a log
// or an environment dump, impersonate any organisation to every other service; a
// public key lets them impersonate no one. Keys rotate without redeploying anything:
// the gateway publishes the new key, then signs with it, and drops the old one once
// its assertions have expired (a minute at most).
//
// Use it as middleware:
//
//	v, err := gatewayauth.New(gatewayauth.Config{JWKSURL: "https://gateway.internal/.well-known/jwks.json"})
//	…
//	http.Handle("/v1/", v.Middleware(handler))
//
// and read the caller in the handler with FromContext. A request without a valid
// assertion gets 401 {"error":"api key unauthenticated"}, the gateway's own answer to a
// bad API key; while the gateway's keys cannot be fetched, 503
// {"error":"service_unavailable"}. Config.ErrorHandler logs or shapes those answers.
//
// Only EdDSA (Ed25519) is accepted: an assertion with alg "none", an HMAC algorithm
// (keyed with the public key, the classic confusion) or any other is refused before
// its signature is looked at. The package is the standard library's crypto/ed25519
// and encoding/json and nothing else, so that importing it adds one module and no
// dependency to a service.
//
// The package is its own module, github.com/keygate/keygate/gatewayauth, which
// requires nothing but the standard library (Go 1.22 or later):
//
//	go get github.com/keygate/keygate/gatewayauth@latest
//
// or, from a checkout of the keygate repository beside the service's own:
//
//	go mod edit -replace=github.com/keygate/keygate/gatewayauth=../keygate/gatewayauth
//	go mod tidy
package gatewayauth

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

// Header is the request header that carries the assertion.
const Header = "X-Gateway-Identity"

// Issuer is the iss of every assertion.
const Issuer = "keygate"

// DefaultAudience is the aud of the gateway's assertions unless it is configured
// otherwise (v1_gateway's identity_audience).
const DefaultAudience = "keygate-upstream"

// MaxLeeway is the most clock skew a Verifier allows on exp and iat.
const MaxLeeway = 5 * time.Second

// ErrUnauthenticated is what Verify's errors wrap when the request carries no valid
// assertion: Middleware answers 401.
var ErrUnauthenticated = errors.New("gatewayauth: no valid identity assertion")

// ErrKeysUnavailable is what Verify's errors wrap when the gateway's keys could not be
// fetched, so that the assertion could not be checked: Middleware answers 503. The
// error also wraps the fetch's cause.
var ErrKeysUnavailable = errors.New("gatewayauth: the gateway's keys are unavailable")

// Identity is who the gateway says is calling.
type Identity struct {
	KeyID string // the API key's id (sub)
	OrgID string // its organisation (org_id)
	Role  string // Admin, Editor or Viewer (role)
	// Scope is the key's scopes, space-separated as RFC 8693's scope claim (scope):
	// "" for an unscoped key, which may do everything its role allows.
	Scope string
}

// Scopes returns the key's scopes, or nil for an unscoped key.
func (id Identity) Scopes() []string {
	if id.Scope == "" {
		return nil
	}
	return strings.Fields(id.Scope)
}

// HasScope reports whether the key may act within scope: it is unscoped, bounded by
// its role alone, or it carries scope. The gateway has already checked the route's
// scope; a service checks finer with it, for example per resource. It says nothing of
// the role, which a service checks as well.
func (id Identity) HasScope(scope string) bool {
	if id.Scope == "" {
		return true
	}
	for _, s := range strings.Fields(id.Scope) {
		if s == scope {
			return true
		}
	}
	return false
}

// Config says where a Verifier finds the gateway's public keys. Exactly one of
// JWKSURL and KeyFile is required.
type Config struct {
	// JWKSURL is the gateway's JWKS (v1_gateway_jwks), an absolute http or https URL.
	// New starts fetching it in the background, and fetches it again when its
	// Cache-Control max-age runs out (bounded to a minute..an hour; 5 minutes without
	// one), so that a key removed from it stops being accepted within that time. An
	// assertion naming a kid the Verifier lacks waits for a fetch at once (at most
	// one a second), so that a key the gateway published before signing with it is
	// never refused. Assertions of known keys never wait on a fetch.
	JWKSURL string
	// KeyFile is a PEM file of the gateway's public keys (or private keys, whose public
	// halves are used), read once at New.
	KeyFile string
	// Audience is the aud an assertion must carry. Default: DefaultAudience.
	Audience string
	// Leeway is the clock skew allowed on exp and iat, at most MaxLeeway.
	// Default: MaxLeeway.
	Leeway time.Duration
	// Client fetches the JWKS. Default: a client with a 5 s timeout.
	Client *http.Client
	// ErrorHandler answers the requests Middleware refuses, with the error Verify
	// returned (or ErrUnauthenticated for a request with no assertion, or more than
	// one): to log why, or to answer in the service's own way. It may call WriteError
	// for the default answer. Default: WriteError.
	ErrorHandler func(w http.ResponseWriter, r *http.Request, err error)
}

// Verifier checks identity assertions. Build it with New; it is safe for concurrent
// use.
type Verifier struct {
	cfg Config
	now func() time.Time

	mu   sync.RWMutex
	keys map[string]ed25519.PublicKey // by kid; guarded by mu

	// fetching is held by the one fetch under way, and guards the fields below. A
	// fetch never holds mu while it waits on the network, so that assertions of
	// known keys never wait on it.
	fetching  sync.Mutex
	fetchedAt time.Time // when the last fetch began; zero before the first
	fetchErr  error     // the last fetch's error, nil if it succeeded
	staleAt   time.Time // when the keys of the last successful fetch are due again
	failures  int       // fetches that failed in a row

	life context.Context    // the background refresh's, ended by Close
	stop context.CancelFunc // ends life
	done chan struct{}      // closed when the background refresh has stopped
}

// New returns a Verifier for cfg, or an error saying what in cfg cannot work. A key
// file is read here; a JWKS URL is fetched in the background from now on (call
// Refresh to wait for a fetch, and Close to stop).
func New(cfg Config) (*Verifier, error) {
	switch {
	case cfg.JWKSURL == "" && cfg.KeyFile == "":
		return nil, errors.New("gatewayauth: Config.JWKSURL or Config.KeyFile is required")
	case cfg.JWKSURL != "" && cfg.KeyFile != "":
		return nil, errors.New("gatewayauth: Config.JWKSURL and Config.KeyFile are both set; set one")
	case cfg.Leeway < 0 || cfg.Leeway > MaxLeeway:
		return nil, fmt.Errorf("gatewayauth: Config.Leeway %s is not within 0..%s", cfg.Leeway, MaxLeeway)
	}
	if cfg.JWKSURL != "" {
		if err := checkURL(cfg.JWKSURL); err != nil {
			return nil, err
		}
	}
	if cfg.Audience == "" {
		cfg.Audience = DefaultAudience
	}
	if cfg.Leeway == 0 {
		cfg.Leeway = MaxLeeway
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Timeout: fetchTimeout}
	}
	if cfg.ErrorHandler == nil {
		cfg.ErrorHandler = func(w http.ResponseWriter, _ *http.Request, err error) { WriteError(w, err) }
	}
	v := &Verifier{cfg: cfg, now: time.Now, keys: map[string]ed25519.PublicKey{}}
	if cfg.KeyFile != "" {
		keys, err := ReadPublicKeys(cfg.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("gatewayauth: %v", err)
		}
		for _, k := range keys {
			v.keys[KeyID(k)] = k
		}
		return v, nil
	}
	v.life, v.stop = context.WithCancel(context.Background())
	v.done = make(chan struct{})
	go v.refreshLoop()
	return v, nil
}

// checkURL refuses a JWKS URL that cannot be fetched: relative, without a host, or of
// a scheme other than http and https.
func checkURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("gatewayauth: Config.JWKSURL: %v", err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("gatewayauth: Config.JWKSURL %q is not an absolute http or https URL", raw)
	}
	return nil
}

// Close stops the background refresh of the JWKS. A Verifier used for the life of
// the program need not be closed. Verify still works after Close, on the keys it has
// and with fetches for new kids.
func (v *Verifier) Close() {
	if v.stop == nil {
		return
	}
	v.stop()
	<-v.done
}

// Verify checks an assertion: EdDSA, signed by a known key, issued by Issuer for the
// audience, within exp and iat (with the leeway), and naming a key, an organisation and
// a role. Its errors wrap ErrUnauthenticated, or ErrKeysUnavailable when the assertion
// names a key the Verifier lacks and the JWKS could not be fetched.
func (v *Verifier) Verify(ctx context.Context, token string) (Identity, error) {
	s, err := parse(token)
	if err != nil {
		return Identity{}, fmt.Errorf("%w: %v", ErrUnauthenticated, err)
	}
	pub, err := v.key(ctx, s.header.Kid)
	if err != nil {
		return Identity{}, err
	}
	c, err := s.verify(pub)
	if err != nil {
		return Identity{}, fmt.Errorf("%w: %v", ErrUnauthenticated, err)
	}
	if err := c.check(v.now(), v.cfg.Audience, v.cfg.Leeway); err != nil {
		return Identity{}, fmt.Errorf("%w: %v", ErrUnauthenticated, err)
	}
	return Identity{KeyID: c.Subject, OrgID: c.OrgID, Role: c.Role, Scope: c.Scope}, nil
}

// identityKey is the context key of the Identity Middleware found.
type identityKey struct{}

// FromContext returns the Identity that Middleware put in ctx.
func FromContext(ctx context.Context) (Identity, bool) {
	id, ok := ctx.Value(identityKey{}).(Identity)
	return id, ok
}

// NewContext returns ctx carrying id, as Middleware does.
func NewContext(ctx context.Context, id Identity) context.Context {
	return context.WithValue(ctx, identityKey{}, id)
}

// Middleware passes on the requests whose one X-Gateway-Identity verifies, with the
// Identity in their context (FromContext), and hands every other one to
// Config.ErrorHandler.
func (v *Verifier) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var (
			id  Identity
			err = fmt.Errorf("%w: no %s header, or more than one", ErrUnauthenticated, Header)
		)
		if vals := r.Header.Values(Header); len(vals) == 1 {
			id, err = v.Verify(r.Context(), strings.TrimSpace(vals[0]))
		}
		if err != nil {
			v.cfg.ErrorHandler(w, r, err)
			return
		}
		next.ServeHTTP(w, r.WithContext(NewContext(r.Context(), id)))
	})
}

// The answers of WriteError: those of the gateway itself to a bad API key and to a
// dependency it cannot reach, so that a client cannot tell the service's refusal from
// the gateway's.
var (
	unauthenticated    = []byte(`{"error":"api key unauthenticated"}`)
	serviceUnavailable = []byte(`{"error":"service_unavailable"}`)
)

// WriteError writes Middleware's default answer to a refused request: 503
// {"error":"service_unavailable"} when err wraps ErrKeysUnavailable (the service, not
// the caller, is at fault), and 401 {"error":"api key unauthenticated"} otherwise.
func WriteError(w http.ResponseWriter, err error) {
	status, body := http.StatusUnauthorized, unauthenticated
	if errors.Is(err, ErrKeysUnavailable) {
		status, body = http.StatusServiceUnavailable, serviceUnavailable
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	w.Write(body)
}
