// Package gatewayauthtest makes identity keys and assertions for tests: good ones, as
// the gateway signs them, and the forgeries a verifier must refuse. A service behind
// the gateway can use it in its own tests. It builds its tokens by hand, with the
// standard library, rather than with gatewayauth's Signer, so that a test of the
// verifier does not check the package against itself.
package gatewayauthtest

import (
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/keygate/keygate/gatewayauth"
)

// NewKey returns a fresh Ed25519 key and the PKCS#8 PEM file holding it.
func NewKey(t testing.TB) (ed25519.PrivateKey, string) {
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

// KeyID is gatewayauth.KeyID of priv's public half.
func KeyID(priv ed25519.PrivateKey) string {
	return gatewayauth.KeyID(priv.Public().(ed25519.PublicKey))
}

// Claims are an assertion's claims (RFC 7519 §4); iat and exp are seconds since the
// epoch.
type Claims struct {
	Issuer   string   `json:"iss,omitempty"`
	Audience []string `json:"aud,omitempty"`
	Subject  string   `json:"sub,omitempty"`
	IssuedAt int64    `json:"iat,omitempty"`
	Expiry   int64    `json:"exp,omitempty"`
	OrgID    string   `json:"org_id,omitempty"`
	Role     string   `json:"role,omitempty"`
}

// Good returns the claims the gateway would sign at now for id, for the default
// audience.
func Good(now time.Time, id gatewayauth.Identity) Claims {
	return Claims{
		Issuer: gatewayauth.Issuer, Audience: []string{gatewayauth.DefaultAudience}, Subject: id.KeyID,
		IssuedAt: now.Unix(), Expiry: now.Add(gatewayauth.Lifetime).Unix(),
		OrgID: id.OrgID, Role: id.Role,
	}
}

// Sign signs c with priv, naming kid, as the gateway does.
func Sign(t testing.TB, priv ed25519.PrivateKey, kid string, c Claims) string {
	t.Helper()
	return SignHeader(priv, map[string]any{"alg": "EdDSA", "typ": "JWT", "kid": kid}, c)
}

// SignHeader signs c with priv under the JOSE header h, whatever h says.
func SignHeader(priv ed25519.PrivateKey, h map[string]any, c Claims) string {
	return handMade(h, c, func(in string) []byte { return ed25519.Sign(priv, []byte(in)) })
}

// handMade builds a token of header and c with the signature sig makes of its
// signing input, as an attacker would, without a JOSE library's checks.
func handMade(header map[string]any, c Claims, sig func(signingInput string) []byte) string {
	h, _ := json.Marshal(header)
	p, _ := json.Marshal(c)
	in := base64.RawURLEncoding.EncodeToString(h) + "." + base64.RawURLEncoding.EncodeToString(p)
	return in + "." + base64.RawURLEncoding.EncodeToString(sig(in))
}

// Forgery is an assertion a verifier of the gateway's key must refuse.
type Forgery struct {
	Name   string
	Header []string // the X-Gateway-Identity values sent; none for an absent one
}

// Forgeries returns, for the gateway key priv and the identity id, every way of
// claiming id without a valid assertion: absent, two, signed by another key (under its
// own kid and under the gateway's), expired, issued in the future, valid too long, for
// another audience or issuer, alg "none", HS256 keyed with the public key, and tokens
// the gateway's key signed that are not its assertions (another typ, a critical
// extension).
func Forgeries(t testing.TB, priv ed25519.PrivateKey, id gatewayauth.Identity) []Forgery {
	t.Helper()
	kid := KeyID(priv)
	other, _ := NewKey(t)
	now := time.Now()
	with := func(edit func(*Claims)) Claims {
		c := Good(now, id)
		edit(&c)
		return c
	}
	pub := priv.Public().(ed25519.PublicKey)
	good := Sign(t, priv, kid, Good(now, id))
	return []Forgery{
		{"absent", nil},
		{"empty", []string{""}},
		{"garbage", []string{"not.a.jwt"}},
		{"two assertions", []string{good, good}},
		{"signed by another key under its own kid", []string{Sign(t, other, KeyID(other), Good(now, id))}},
		{"signed by another key under the gateway's kid", []string{Sign(t, other, kid, Good(now, id))}},
		{"expired", []string{Sign(t, priv, kid, with(func(c *Claims) {
			c.IssuedAt, c.Expiry = now.Add(-90*time.Second).Unix(), now.Add(-30*time.Second).Unix()
		}))}},
		{"issued in the future past the leeway", []string{Sign(t, priv, kid, with(func(c *Claims) {
			c.IssuedAt, c.Expiry = now.Add(10*time.Second).Unix(), now.Add(40*time.Second).Unix()
		}))}},
		{"valid for more than a minute", []string{Sign(t, priv, kid, with(func(c *Claims) {
			c.Expiry = now.Add(time.Hour).Unix()
		}))}},
		{"no exp", []string{Sign(t, priv, kid, with(func(c *Claims) { c.Expiry = 0 }))}},
		{"another audience", []string{Sign(t, priv, kid, with(func(c *Claims) { c.Audience = []string{"billing"} }))}},
		{"another issuer", []string{Sign(t, priv, kid, with(func(c *Claims) { c.Issuer = "someone" }))}},
		{"no organisation", []string{Sign(t, priv, kid, with(func(c *Claims) { c.OrgID = "" }))}},
		{"a role that is not one", []string{Sign(t, priv, kid, with(func(c *Claims) { c.Role = "Owner" }))}},
		{"alg none", []string{handMade(map[string]any{"alg": "none", "kid": kid}, Good(now, id),
			func(string) []byte { return nil })}},
		{"HS256 keyed with the public key", []string{handMade(map[string]any{"alg": "HS256", "typ": "JWT", "kid": kid}, Good(now, id),
			func(in string) []byte {
				m := hmac.New(sha256.New, pub)
				m.Write([]byte(in))
				return m.Sum(nil)
			})}},
		{"typ other than JWT", []string{SignHeader(priv, map[string]any{"alg": "EdDSA", "typ": "at+jwt", "kid": kid}, Good(now, id))}},
		{"no typ", []string{SignHeader(priv, map[string]any{"alg": "EdDSA", "kid": kid}, Good(now, id))}},
		{"a critical extension", []string{SignHeader(priv, map[string]any{"alg": "EdDSA", "typ": "JWT", "kid": kid, "crit": []string{"b64"}, "b64": false}, Good(now, id))}},
		{"alg Ed25519 rather than EdDSA", []string{SignHeader(priv, map[string]any{"alg": "Ed25519", "typ": "JWT", "kid": kid}, Good(now, id))}},
		{"a JWE of five parts", []string{good + ".AAAA.AAAA"}},
	}
}
