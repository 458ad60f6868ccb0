package gatewayauth

import (
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"time"
)

// Lifetime is how long an assertion is valid after it is issued: at most a minute, so
// that one read from a log is worth little.
const Lifetime = 60 * time.Second

// reuseFor is how long a Signer hands out the same assertion for the same key, org and
// role: half its Lifetime, so that an assertion it hands out has at least 30 s left.
const reuseFor = Lifetime / 2

// maxCached bounds a Signer's cache; past it the cache starts over.
const maxCached = 100_000

// Signer makes the gateway's identity assertions: EdDSA-signed JWTs (RFC 7519, RFC
// 8037) with header typ JWT and kid (the key's RFC 7638 thumbprint) and claims iss
// (Issuer), aud, sub (the API key's id), org_id, role, scope (a scoped key's scopes,
// space-separated; absent for an unscoped key), iat and exp (iat + Lifetime).
// It is safe for concurrent use.
//
// Signing costs tens of microseconds; a Signer signs once per key, org and role and
// hands the same assertion out for half its lifetime, so that signing stays off the
// request path.
type Signer struct {
	priv     ed25519.PrivateKey
	kid      string
	header   string // base64url of the JOSE header, the same for every assertion
	audience string
	now      func() time.Time

	mu    sync.RWMutex
	cache map[string]assertion // by API key id; guarded by mu
}

// assertion is a signed assertion and what it asserts.
type assertion struct {
	org, role string
	scopes    []string
	token     string
	issued    time.Time
}

// NewSigner returns a Signer with priv for audience.
func NewSigner(priv ed25519.PrivateKey, audience string) (*Signer, error) {
	if audience == "" {
		return nil, errors.New("gatewayauth: an audience is required")
	}
	if len(priv) != ed25519.PrivateKeySize {
		return nil, errors.New("gatewayauth: not an Ed25519 private key")
	}
	kid := KeyID(priv.Public().(ed25519.PublicKey))
	h, err := json.Marshal(map[string]string{"alg": "EdDSA", "kid": kid, "typ": "JWT"})
	if err != nil {
		return nil, err
	}
	return &Signer{priv: priv, kid: kid, header: b64(h), audience: audience, now: time.Now, cache: map[string]assertion{}}, nil
}

// KeyID is the kid of the Signer's assertions: KeyID of its public key.
func (s *Signer) KeyID() string { return s.kid }

// signedClaims are the claims a Signer writes.
type signedClaims struct {
	Issuer   string `json:"iss"`
	Audience string `json:"aud"`
	Subject  string `json:"sub"`
	IssuedAt int64  `json:"iat"`
	Expiry   int64  `json:"exp"`
	OrgID    string `json:"org_id"`
	Role     string `json:"role"`
	Scope    string `json:"scope,omitempty"`
}

// Assertion returns an assertion that the request comes with API key keyID of
// organisation orgID with role and scopes (none: an unscoped key), valid for at least
// half of Lifetime.
func (s *Signer) Assertion(keyID, orgID, role string, scopes ...string) (string, error) {
	now := s.now()
	s.mu.RLock()
	a, ok := s.cache[keyID]
	s.mu.RUnlock()
	if ok && a.org == orgID && a.role == role && slices.Equal(a.scopes, scopes) &&
		now.Sub(a.issued) < reuseFor && !now.Before(a.issued) {
		return a.token, nil
	}
	payload, err := json.Marshal(signedClaims{
		Issuer: Issuer, Audience: s.audience, Subject: keyID,
		IssuedAt: now.Unix(), Expiry: now.Add(Lifetime).Unix(),
		OrgID: orgID, Role: role, Scope: strings.Join(scopes, " "),
	})
	if err != nil {
		return "", err
	}
	input := s.header + "." + b64(payload)
	token := input + "." + b64(ed25519.Sign(s.priv, []byte(input)))
	s.mu.Lock()
	if len(s.cache) >= maxCached {
		clear(s.cache)
	}
	s.cache[keyID] = assertion{org: orgID, role: role, scopes: slices.Clone(scopes), token: token, issued: now}
	s.mu.Unlock()
	return token, nil
}
