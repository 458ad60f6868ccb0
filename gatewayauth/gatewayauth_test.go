package gatewayauth_test

import (
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/keygate/keygate/gatewayauth"
)

// newKey returns a fresh Ed25519 key and the PKCS#8 PEM file holding it.
func newKey(t *testing.T) (ed25519.PrivateKey, string) {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "identity.pem")
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return priv, file
}

// jwksServer serves the JWKS of files and counts its fetches.
func jwksServer(t *testing.T, files ...string) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var fetches atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fetches.Add(1)
		b, err := gatewayauth.JWKS(files...)
		if err != nil {
			t.Error(err)
		}
		w.Write(b)
	}))
	t.Cleanup(srv.Close)
	return srv, &fetches
}

// claims are an assertion's claims, for tokens made by hand.
type claims struct {
	jwt.Claims
	OrgID string `json:"org_id,omitempty"`
	Role  string `json:"role,omitempty"`
}

func goodClaims(now time.Time) claims {
	return claims{
		Claims: jwt.Claims{Issuer: gatewayauth.Issuer, Audience: jwt.Audience{gatewayauth.DefaultAudience}, Subject: "key1234567890abcdef",
			IssuedAt: jwt.NewNumericDate(now), Expiry: jwt.NewNumericDate(now.Add(gatewayauth.Lifetime))},
		OrgID: "0b8e0f0a-5d5e-4c4e-9a57-2f1d9b2c9e11", Role: "Editor",
	}
}

// sign signs c with priv, naming kid.
func sign(t *testing.T, priv ed25519.PrivateKey, kid string, c claims) string {
	t.Helper()
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.EdDSA, Key: priv},
		(&jose.SignerOptions{}).WithType("JWT").WithHeader(jose.HeaderKey("kid"), kid))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := jwt.Signed(s).Claims(c).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// unsigned builds a token with the given header and claims and signature bytes.
func unsigned(t *testing.T, header map[string]any, c claims, sig func(signingInput string) []byte) string {
	t.Helper()
	h, _ := json.Marshal(header)
	p, _ := json.Marshal(c)
	in := base64.RawURLEncoding.EncodeToString(h) + "." + base64.RawURLEncoding.EncodeToString(p)
	return in + "." + base64.RawURLEncoding.EncodeToString(sig(in))
}

// through sends a request with headers to Middleware around a handler that answers
// 200 with the identity it found.
func through(v *gatewayauth.Verifier, header []string) (int, string) {
	h := v.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, _ := gatewayauth.FromContext(r.Context())
		w.Write([]byte(id.KeyID + " " + id.OrgID + " " + id.Role))
	}))
	req := httptest.NewRequest("GET", "/v1/monitors", nil)
	for _, v := range header {
		req.Header.Add(gatewayauth.Header, v)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code, rec.Body.String()
}

func TestMiddlewareAcceptsOnlyAValidAssertion(t *testing.T) {
	priv, file := newKey(t)
	other, _ := newKey(t)
	pub := priv.Public().(ed25519.PublicKey)
	kid := gatewayauth.KeyID(pub)
	srv, _ := jwksServer(t, file)
	v, err := gatewayauth.New(gatewayauth.Config{JWKSURL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	with := func(edit func(*claims)) claims {
		c := goodClaims(now)
		edit(&c)
		return c
	}
	for _, tc := range []struct {
		name   string
		header []string
		ok     bool
	}{
		{"valid", []string{sign(t, priv, kid, goodClaims(now))}, true},
		{"absent", nil, false},
		{"empty", []string{""}, false},
		{"garbage", []string{"not.a.jwt"}, false},
		{"two assertions", []string{sign(t, priv, kid, goodClaims(now)), sign(t, priv, kid, goodClaims(now))}, false},
		{"signed by another key under its own kid", []string{sign(t, other, gatewayauth.KeyID(other.Public().(ed25519.PublicKey)), goodClaims(now))}, false},
		{"signed by another key under the gateway's kid", []string{sign(t, other, kid, goodClaims(now))}, false},
		{"expired", []string{sign(t, priv, kid, with(func(c *claims) {
			c.IssuedAt, c.Expiry = jwt.NewNumericDate(now.Add(-90*time.Second)), jwt.NewNumericDate(now.Add(-30*time.Second))
		}))}, false},
		{"expired within the leeway", []string{sign(t, priv, kid, with(func(c *claims) {
			c.IssuedAt, c.Expiry = jwt.NewNumericDate(now.Add(-63*time.Second)), jwt.NewNumericDate(now.Add(-3*time.Second))
		}))}, true},
		{"issued in the future past the leeway", []string{sign(t, priv, kid, with(func(c *claims) {
			c.IssuedAt, c.Expiry = jwt.NewNumericDate(now.Add(10*time.Second)), jwt.NewNumericDate(now.Add(40*time.Second))
		}))}, false},
		{"valid for more than a minute", []string{sign(t, priv, kid, with(func(c *claims) {
			c.Expiry = jwt.NewNumericDate(now.Add(time.Hour))
		}))}, false},
		{"another audience", []string{sign(t, priv, kid, with(func(c *claims) { c.Audience = jwt.Audience{"billing"} }))}, false},
		{"another issuer", []string{sign(t, priv, kid, with(func(c *claims) { c.Issuer = "someone" }))}, false},
		{"no organisation", []string{sign(t, priv, kid, with(func(c *claims) { c.OrgID = "" }))}, false},
		{"a role that is not one", []string{sign(t, priv, kid, with(func(c *claims) { c.Role = "Owner" }))}, false},
		{"alg none", []string{unsigned(t, map[string]any{"alg": "none", "kid": kid}, goodClaims(now),
			func(string) []byte { return nil })}, false},
		{"HS256 keyed with the public key", []string{unsigned(t, map[string]any{"alg": "HS256", "typ": "JWT", "kid": kid}, goodClaims(now),
			func(in string) []byte {
				m := hmac.New(sha256.New, pub)
				m.Write([]byte(in))
				return m.Sum(nil)
			})}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body := through(v, tc.header)
			switch {
			case tc.ok && (status != 200 || body != "key1234567890abcdef 0b8e0f0a-5d5e-4c4e-9a57-2f1d9b2c9e11 Editor"):
				t.Errorf("answered %d %q, want 200 with the identity", status, body)
			case !tc.ok && (status != 401 || body != `{"error":"api key unauthenticated"}`):
				t.Errorf("answered %d %q, want 401 api key unauthenticated", status, body)
			}
		})
	}
}

func TestAnUnknownKidRefetchesTheJWKSAtMostOncePerInterval(t *testing.T) {
	_, file := newKey(t)
	newer, newerFile := newKey(t)
	published := []string{file}
	var fetches atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fetches.Add(1)
		b, _ := gatewayauth.JWKS(published...)
		w.Write(b)
	}))
	defer srv.Close()
	v, err := gatewayauth.New(gatewayauth.Config{JWKSURL: srv.URL, RefreshInterval: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	tok := sign(t, newer, gatewayauth.KeyID(newer.Public().(ed25519.PublicKey)), goodClaims(time.Now()))
	for range 20 {
		if status, _ := through(v, []string{tok}); status != 401 {
			t.Fatalf("an unpublished key's assertion answered %d", status)
		}
	}
	if n := fetches.Load(); n != 1 {
		t.Errorf("%d fetches for 20 assertions of an unknown kid within the interval, want 1 (the first)", n)
	}
	// The gateway publishes the new key; after the interval the next unknown kid
	// fetches again and finds it.
	published = []string{file, newerFile}
	time.Sleep(350 * time.Millisecond)
	if status, _ := through(v, []string{tok}); status != 200 {
		t.Errorf("after the new key was published: %d, want 200", status)
	}
	if n := fetches.Load(); n != 2 {
		t.Errorf("%d fetches, want 2", n)
	}
}

func TestRotationKeepsTheOldKeysAssertionsValidUntilTheyExpire(t *testing.T) {
	oldKey, oldFile := newKey(t)
	newKeyPriv, newFile := newKey(t)
	srv, _ := jwksServer(t, newFile, oldFile) // the new key signs, the old one is still published
	v, err := gatewayauth.New(gatewayauth.Config{JWKSURL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	oldSigner, _ := gatewayauth.NewSigner(oldKey, gatewayauth.DefaultAudience)
	newSigner, _ := gatewayauth.NewSigner(newKeyPriv, gatewayauth.DefaultAudience)
	for name, s := range map[string]*gatewayauth.Signer{"old": oldSigner, "new": newSigner} {
		tok, err := s.Assertion("key1234567890abcdef", "0b8e0f0a-5d5e-4c4e-9a57-2f1d9b2c9e11", "Viewer")
		if err != nil {
			t.Fatal(err)
		}
		if status, body := through(v, []string{tok}); status != 200 {
			t.Errorf("the %s key's assertion during the rotation: %d %s", name, status, body)
		}
	}
	// An old assertion past its expiry is refused even while its key is published.
	expired := sign(t, oldKey, gatewayauth.KeyID(oldKey.Public().(ed25519.PublicKey)), func() claims {
		c := goodClaims(time.Now().Add(-2 * time.Minute))
		return c
	}())
	if status, _ := through(v, []string{expired}); status != 401 {
		t.Errorf("an expired assertion of the old key answered %d, want 401", status)
	}
}

func TestTheJWKSHasNoPrivatePart(t *testing.T) {
	priv, file := newKey(t)
	b, err := gatewayauth.JWKS(file)
	if err != nil {
		t.Fatal(err)
	}
	var set struct {
		Keys []map[string]any `json:"keys"`
	}
	if err := json.Unmarshal(b, &set); err != nil {
		t.Fatal(err)
	}
	if len(set.Keys) != 1 {
		t.Fatalf("keys %v, want one", set.Keys)
	}
	k := set.Keys[0]
	if _, ok := k["d"]; ok {
		t.Errorf("the JWKS carries the private part d: %s", b)
	}
	if k["kty"] != "OKP" || k["crv"] != "Ed25519" || k["alg"] != "EdDSA" || k["use"] != "sig" ||
		k["kid"] != gatewayauth.KeyID(priv.Public().(ed25519.PublicKey)) {
		t.Errorf("key %v", k)
	}
	seed := base64.RawURLEncoding.EncodeToString(priv.Seed())
	if strings.Contains(string(b), seed) {
		t.Error("the JWKS holds the private key's seed")
	}
}

func TestASignerReusesAnAssertionForHalfItsLifetime(t *testing.T) {
	priv, _ := newKey(t)
	s, _ := gatewayauth.NewSigner(priv, gatewayauth.DefaultAudience)
	a, _ := s.Assertion("k1", "org", "Admin")
	b, _ := s.Assertion("k1", "org", "Admin")
	if a != b {
		t.Error("a second assertion for the same key, org and role was signed anew")
	}
	if c, _ := s.Assertion("k1", "org", "Viewer"); c == a {
		t.Error("a changed role kept the old assertion")
	}
	if d, _ := s.Assertion("k2", "org", "Admin"); d == a {
		t.Error("another key got the same assertion")
	}
}
