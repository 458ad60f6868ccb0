// Package gatewayauth lets a service behind the keygate gateway know who is calling
// without trusting a shared secret: the gateway signs the caller's identity (the API
// key's id, its organisation and role) into an EdDSA JWT in the X-Gateway-Identity
// header of every request it passes on, and the service verifies it with the gateway's
// public key, published as a JWKS.
//
// A shared secret lets every service that holds it, and anyone who reads it from a log
// or an environment dump, impersonate any organisation to every other service; a
// public key lets them impersonate no one. Keys rotate without redeploying anything:
// the gateway publishes the old key beside the new one while the old one's assertions
// expire (a minute at most).
//
// Use it as middleware:
//
//	v, err := gatewayauth.New(gatewayauth.Config{JWKSURL: "https://gateway.internal/.well-known/jwks.json"})
//	…
//	http.Handle("/v1/", v.Middleware(handler)) // 401 {"error":"api key unauthenticated"} without a valid assertion
//
// and read the caller in the handler with FromContext.
//
// Only EdDSA (Ed25519) is accepted: an assertion with alg "none", an HMAC algorithm
// (keyed with the public key, the classic confusion) or any other is refused before
// its signature is looked at. The JOSE parsing and signature checks are go-jose's
// (github.com/go-jose/go-jose/v4): maintained, used by Caddy itself and by most Go
// JWT consumers, and it takes the list of acceptable algorithms up front.
package gatewayauth

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
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

// DefaultRefreshInterval is how often at most a Verifier refetches its JWKS on meeting
// an unknown kid.
const DefaultRefreshInterval = 5 * time.Second

// retryAfterFailure is how often at most a Verifier tries again to fetch a JWKS it
// could not fetch (a service started before its gateway, say), if RefreshInterval is
// longer: an outage of the JWKS should cost a second of 401s, not a whole interval.
const retryAfterFailure = time.Second

// fetchTimeout bounds a fetch that an assertion waits on, whatever Config.Client's own
// timeout is: while it lasts, assertions of unknown kids wait for it.
const fetchTimeout = 5 * time.Second

// ErrUnauthenticated is what Verify's errors wrap: the request carries no valid
// assertion.
var ErrUnauthenticated = errors.New("gatewayauth: no valid identity assertion")

// Identity is who the gateway says is calling.
type Identity struct {
	KeyID string // the API key's id (sub)
	OrgID string // its organisation (org_id)
	Role  string // Admin, Editor or Viewer (role)
}

// Config says where a Verifier finds the gateway's public keys. Exactly one of
// JWKSURL and KeyFile is required.
type Config struct {
	// JWKSURL is the gateway's JWKS (v1_gateway_jwks). It is fetched when the first
	// assertion comes, and again when an assertion names a kid it lacks, at most once
	// per RefreshInterval (once a second after a fetch that failed), so that a service
	// may start before its gateway. Assertions of known keys never wait on a fetch.
	JWKSURL string
	// KeyFile is a PEM file of the gateway's public keys (or private keys, whose public
	// halves are used), read once at New.
	KeyFile string
	// Audience is the aud an assertion must carry. Default: DefaultAudience.
	Audience string
	// Leeway is the clock skew allowed on exp and iat, at most MaxLeeway.
	// Default: MaxLeeway.
	Leeway time.Duration
	// RefreshInterval bounds how often the JWKS is refetched. Default:
	// DefaultRefreshInterval.
	RefreshInterval time.Duration
	// Client fetches the JWKS. Default: a client with a 5 s timeout.
	Client *http.Client
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
	fetchedAt time.Time // when the last fetch began
	failed    bool      // the last fetch failed
}

// New returns a Verifier for cfg. A key file that cannot be read is an error here; a
// JWKS URL is fetched on first use (call Refresh to fetch it now).
func New(cfg Config) (*Verifier, error) {
	switch {
	case (cfg.JWKSURL == "") == (cfg.KeyFile == ""):
		return nil, errors.New("gatewayauth: exactly one of JWKSURL and KeyFile is required")
	case cfg.Leeway < 0 || cfg.Leeway > MaxLeeway:
		return nil, fmt.Errorf("gatewayauth: Leeway must be 0..%s", MaxLeeway)
	}
	if cfg.Audience == "" {
		cfg.Audience = DefaultAudience
	}
	if cfg.Leeway == 0 {
		cfg.Leeway = MaxLeeway
	}
	if cfg.RefreshInterval <= 0 {
		cfg.RefreshInterval = DefaultRefreshInterval
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Timeout: 5 * time.Second}
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
	}
	return v, nil
}

// Refresh fetches the JWKS now, whatever RefreshInterval says: at a service's start,
// to learn early that the URL is wrong. A Refresh that fails does not hold back the
// fetch of the next assertion. It does nothing with a KeyFile.
func (v *Verifier) Refresh(ctx context.Context) error {
	if v.cfg.JWKSURL == "" {
		return nil
	}
	v.fetching.Lock()
	defer v.fetching.Unlock()
	err := v.fetch(ctx)
	if err != nil {
		v.fetchedAt = time.Time{}
	}
	return err
}

// fetch replaces the keys with those of the JWKS. It must be called with fetching
// held.
func (v *Verifier) fetch(ctx context.Context) error {
	v.fetchedAt, v.failed = v.now(), true
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, v.cfg.JWKSURL, nil)
	if err != nil {
		return fmt.Errorf("gatewayauth: JWKS URL: %v", err)
	}
	res, err := v.cfg.Client.Do(req)
	if err != nil {
		return fmt.Errorf("gatewayauth: fetching the JWKS: %v", err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("gatewayauth: fetching the JWKS: %s", res.Status)
	}
	var set jose.JSONWebKeySet
	if err := json.NewDecoder(io.LimitReader(res.Body, 1<<20)).Decode(&set); err != nil {
		return fmt.Errorf("gatewayauth: reading the JWKS: %v", err)
	}
	keys := map[string]ed25519.PublicKey{}
	for _, k := range set.Keys {
		if pub, ok := k.Key.(ed25519.PublicKey); ok && k.IsPublic() {
			keys[KeyID(pub)] = pub // the thumbprint, whatever kid the set says
		}
	}
	v.mu.Lock()
	v.keys, v.failed = keys, false
	v.mu.Unlock()
	return nil
}

// known returns the public key of kid if v has it.
func (v *Verifier) known(kid string) (ed25519.PublicKey, bool) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	k, ok := v.keys[kid]
	return k, ok
}

// key returns the public key of kid, refetching the JWKS once if it is unknown and the
// last fetch began RefreshInterval ago (or a second ago, if it failed).
func (v *Verifier) key(ctx context.Context, kid string) (ed25519.PublicKey, bool) {
	if k, ok := v.known(kid); ok || v.cfg.JWKSURL == "" {
		return k, ok
	}
	v.fetching.Lock()
	defer v.fetching.Unlock()
	if k, ok := v.known(kid); ok { // the fetch this call waited on brought it
		return k, true
	}
	wait := v.cfg.RefreshInterval
	if v.failed {
		wait = min(wait, retryAfterFailure)
	}
	if v.now().Sub(v.fetchedAt) < wait || v.fetchFor(ctx) != nil {
		return nil, false
	}
	return v.known(kid)
}

// fetchFor fetches the JWKS on behalf of a request: the fetch serves every assertion
// that waits on it, so it goes on when the request that began it is cancelled (a
// client that hung up would otherwise fail it for all, and hold the next fetch back
// for a second), bounded by fetchTimeout rather than by that request. It must be
// called with fetching held.
func (v *Verifier) fetchFor(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), fetchTimeout)
	defer cancel()
	return v.fetch(ctx)
}

// Verify checks an assertion: EdDSA, signed by a known key, issued by Issuer for the
// audience, within exp and iat (with the leeway), and naming a key, an organisation and
// a role. Its errors wrap ErrUnauthenticated.
func (v *Verifier) Verify(ctx context.Context, token string) (Identity, error) {
	tok, err := jwt.ParseSigned(token, []jose.SignatureAlgorithm{jose.EdDSA})
	if err != nil {
		return Identity{}, fmt.Errorf("%w: %v", ErrUnauthenticated, err)
	}
	if len(tok.Headers) != 1 {
		return Identity{}, fmt.Errorf("%w: %d signatures", ErrUnauthenticated, len(tok.Headers))
	}
	pub, ok := v.key(ctx, tok.Headers[0].KeyID)
	if !ok {
		return Identity{}, fmt.Errorf("%w: unknown kid %q", ErrUnauthenticated, tok.Headers[0].KeyID)
	}
	var c claims
	if err := tok.Claims(pub, &c); err != nil {
		return Identity{}, fmt.Errorf("%w: %v", ErrUnauthenticated, err)
	}
	now := v.now()
	if err := c.ValidateWithLeeway(jwt.Expected{Issuer: Issuer, AnyAudience: jwt.Audience{v.cfg.Audience}, Time: now}, v.cfg.Leeway); err != nil {
		return Identity{}, fmt.Errorf("%w: %v", ErrUnauthenticated, err)
	}
	switch {
	case c.Expiry == nil || c.IssuedAt == nil:
		return Identity{}, fmt.Errorf("%w: no exp or iat", ErrUnauthenticated)
	case c.Expiry.Time().Sub(c.IssuedAt.Time()) > Lifetime:
		return Identity{}, fmt.Errorf("%w: valid for more than %s", ErrUnauthenticated, Lifetime)
	case c.Subject == "" || c.OrgID == "" || !validRole(c.Role):
		return Identity{}, fmt.Errorf("%w: no key, organisation or role", ErrUnauthenticated)
	}
	return Identity{KeyID: c.Subject, OrgID: c.OrgID, Role: c.Role}, nil
}

func validRole(r string) bool { return r == "Admin" || r == "Editor" || r == "Viewer" }

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

// unauthenticated is the answer to a request without a valid assertion: the gateway's
// own 401 for a bad API key, so a client cannot tell the two apart.
var unauthenticated = []byte(`{"error":"api key unauthenticated"}`)

// Middleware passes on the requests whose X-Gateway-Identity verifies, with the
// Identity in their context (FromContext), and answers every other one 401
// {"error":"api key unauthenticated"}.
func (v *Verifier) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var (
			id  Identity
			err = ErrUnauthenticated
		)
		if vals := r.Header.Values(Header); len(vals) == 1 {
			id, err = v.Verify(r.Context(), strings.TrimSpace(vals[0]))
		}
		if err != nil {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Cache-Control", "no-store")
			w.WriteHeader(http.StatusUnauthorized)
			w.Write(unauthenticated)
			return
		}
		next.ServeHTTP(w, r.WithContext(NewContext(r.Context(), id)))
	})
}
