package gatewayauth

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
)

// maxTokenSize bounds an assertion: the gateway's are about 400 bytes. A longer one
// is refused before anything is decoded.
const maxTokenSize = 4096

// header is the JOSE header of an assertion (RFC 7515 §4).
type header struct {
	Alg  string          `json:"alg"`
	Typ  string          `json:"typ"`
	Kid  string          `json:"kid"`
	Crit json.RawMessage `json:"crit"`
}

// claims are an assertion's claims (RFC 7519 §4).
type claims struct {
	Issuer    string   `json:"iss"`
	Audience  audience `json:"aud"`
	Subject   string   `json:"sub"`
	IssuedAt  *number  `json:"iat"`
	Expiry    *number  `json:"exp"`
	NotBefore *number  `json:"nbf,omitempty"`
	OrgID     string   `json:"org_id"`
	Role      string   `json:"role"`
	Scope     string   `json:"scope,omitempty"`
}

// audience is aud: one string, or an array of them (RFC 7519 §4.1.3).
type audience []string

func (a *audience) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*a = audience{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return errors.New("aud is neither a string nor an array of strings")
	}
	*a = many
	return nil
}

func (a audience) has(aud string) bool {
	for _, v := range a {
		if v == aud {
			return true
		}
	}
	return false
}

// number is a NumericDate: seconds since the epoch, possibly fractional.
type number float64

func (n number) time() time.Time {
	if math.Abs(float64(n)) > 1e11 { // past the year 5000: out of any window
		return time.Unix(int64(math.Copysign(1e11, float64(n))), 0)
	}
	sec, frac := math.Modf(float64(n))
	return time.Unix(int64(sec), int64(frac*1e9))
}

// signed is an assertion whose form and algorithm are right, with its signature not
// yet checked.
type signed struct {
	header  header
	input   string // the signing input: base64url(header) "." base64url(payload)
	payload []byte
	sig     []byte
}

var strictB64 = base64.RawURLEncoding.Strict()

// parse splits a compact JWS (RFC 7515 §7.1) and decodes its header, refusing every
// algorithm but EdDSA, every typ but JWT and any critical extension before the
// signature is looked at. Only base64url characters and two dots are allowed: the
// decoder would otherwise skip line breaks.
func parse(token string) (signed, error) {
	if len(token) > maxTokenSize {
		return signed{}, fmt.Errorf("longer than %d bytes", maxTokenSize)
	}
	for i := 0; i < len(token); i++ {
		c := token[i]
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return signed{}, errors.New("not a compact JWS")
		}
	}
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return signed{}, fmt.Errorf("%d parts, not the 3 of a compact JWS", len(parts))
	}
	var s signed
	hb, err := strictB64.DecodeString(parts[0])
	if err != nil {
		return signed{}, fmt.Errorf("header: %v", err)
	}
	if err := strictJSON(hb, &s.header); err != nil {
		return signed{}, fmt.Errorf("header: %v", err)
	}
	switch {
	case s.header.Alg != "EdDSA":
		return signed{}, fmt.Errorf("alg %q, not EdDSA", s.header.Alg)
	case !strings.EqualFold(s.header.Typ, "JWT"):
		return signed{}, fmt.Errorf("typ %q, not JWT", s.header.Typ)
	case s.header.Crit != nil:
		return signed{}, errors.New("a critical header extension") // RFC 7515 §4.1.11: none is understood
	}
	if s.payload, err = strictB64.DecodeString(parts[1]); err != nil {
		return signed{}, fmt.Errorf("payload: %v", err)
	}
	if s.sig, err = strictB64.DecodeString(parts[2]); err != nil {
		return signed{}, fmt.Errorf("signature: %v", err)
	}
	s.input = token[:len(parts[0])+1+len(parts[1])]
	return s, nil
}

// strictJSON decodes one JSON object into v, refusing trailing data.
func strictJSON(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	if err := d.Decode(v); err != nil {
		return err
	}
	if d.More() {
		return errors.New("trailing data after the JSON object")
	}
	return nil
}

// verify checks the signature of s with pub (RFC 8037 §3.1) and returns its claims.
func (s signed) verify(pub ed25519.PublicKey) (claims, error) {
	if !ed25519.Verify(pub, []byte(s.input), s.sig) {
		return claims{}, errors.New("bad signature")
	}
	var c claims
	if err := strictJSON(s.payload, &c); err != nil {
		return claims{}, fmt.Errorf("claims: %v", err)
	}
	return c, nil
}

// check validates the claims at now: iss, aud, iat and exp (and nbf, if present) with
// leeway, a lifetime of at most Lifetime, a key, an organisation and a role.
func (c claims) check(now time.Time, aud string, leeway time.Duration) error {
	switch {
	case c.Issuer != Issuer:
		return fmt.Errorf("iss %q, not %q", c.Issuer, Issuer)
	case !c.Audience.has(aud):
		return fmt.Errorf("aud %q, not %q", []string(c.Audience), aud)
	case c.Expiry == nil || c.IssuedAt == nil:
		return errors.New("no exp or iat")
	}
	exp, iat := c.Expiry.time(), c.IssuedAt.time()
	switch {
	case !now.Before(exp.Add(leeway)):
		return fmt.Errorf("expired at %s", exp.UTC().Format(time.RFC3339))
	case now.Add(leeway).Before(iat):
		return fmt.Errorf("issued in the future, at %s", iat.UTC().Format(time.RFC3339))
	case c.NotBefore != nil && now.Add(leeway).Before(c.NotBefore.time()):
		return errors.New("not valid yet (nbf)")
	case exp.Sub(iat) > Lifetime:
		return fmt.Errorf("valid for more than %s", Lifetime)
	case c.Subject == "" || c.OrgID == "" || !validRole(c.Role):
		return errors.New("no key, organisation or role")
	}
	return nil
}

func validRole(r string) bool { return r == "Admin" || r == "Editor" || r == "Viewer" }
