package caddymodule

import (
	"encoding/base64"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/keygate/keygate/keystore/keystoretest"
)

// testKey is a well-formed key of prefix mon: 22-character key id, 43-character secret.
const testKey = "mon_live_AbCdEfGhIjKlMnOpQrStUv.0123456789abcdefghijklmnopqrstuvwxyzABCDEFE"

// malformedAuthorizations are credential shapes that must not authenticate
// (README.md, the decision order's step 1). Each holds a key that would be
// well-formed on its own.
var malformedAuthorizations = []struct{ name, value string }{
	{"empty", ""},
	{"scheme only", "Bearer"},
	{"scheme and space only", "Bearer "},
	{"no space", "Bearer" + testKey},
	{"tab", "Bearer\t" + testKey},
	{"key alone", testKey},
	{"basic", "Basic " + base64.StdEncoding.EncodeToString([]byte("user:"+testKey))},
	{"basic with the key as user", "Basic " + base64.StdEncoding.EncodeToString([]byte(testKey+":"))},
	{"other scheme", "Token " + testKey},
	{"bearer prefix of another word", "Bearers " + testKey},
	{"wrong key prefix", "Bearer sk_live_AbCdEfGhIjKlMnOpQrStUv.0123456789abcdefghijklmnopqrstuvwxyzABCDEFE"},
	{"test instead of live", "Bearer mon_test_AbCdEfGhIjKlMnOpQrStUv.0123456789abcdefghijklmnopqrstuvwxyzABCDEFE"},
	{"uppercase key prefix", "Bearer MON_live_AbCdEfGhIjKlMnOpQrStUv.0123456789abcdefghijklmnopqrstuvwxyzABCDEFE"},
	{"key id too short", "Bearer mon_live_AbCdEfGhIjKlMnO.0123456789abcdefghijklmnopqrstuvwxyzABCDEFE"},
	{"key id with a symbol", "Bearer mon_live_AbCdEfGhIjKlMnOpQrStU-.0123456789abcdefghijklmnopqrstuvwxyzABCDEFE"},
	{"no dot", "Bearer mon_live_AbCdEfGhIjKlMnOpQrStUv0123456789abcdefghijklmnopqrstuvwxyzABCDEFE"},
	{"two dots", "Bearer mon_live_AbCdEfGhIjKlMnOpQrStUv.0123456789abcdefghijklmnopqrstuvwxyzABCDEFE.x"},
	{"secret too short", "Bearer mon_live_AbCdEfGhIjKlMnOpQrStUv.0123456789abcdefghijklmnopqrstuvwxyzABCDE"},
	{"secret with padding", "Bearer mon_live_AbCdEfGhIjKlMnOpQrStUv.0123456789abcdefghijklmnopqrstuvwxyzABCDEFE="},
	{"secret in standard base64", "Bearer mon_live_AbCdEfGhIjKlMnOpQrStUv.0123456789abcdefghijklmnopqrstuvwxyzABCD+/E"},
	{"secret not canonical", "Bearer mon_live_AbCdEfGhIjKlMnOpQrStUv.0123456789abcdefghijklmnopqrstuvwxyzABCDEFF"},
	{"trailing garbage", "Bearer " + testKey + " x"},
	{"two keys", "Bearer " + testKey + ", Bearer " + testKey},
	{"quoted key", `Bearer "` + testKey + `"`},
	{"leading garbage", "xBearer " + testKey},
	{"non-ASCII scheme", "Beårer " + testKey},
}

func TestParseAuthorizationAcceptsOnlyTheBearerShape(t *testing.T) {
	f := keystoretest.Format(t, "mon")
	for _, tc := range []struct{ name, value string }{
		{"canonical", "Bearer " + testKey},
		{"lowercase scheme", "bearer " + testKey},
		{"uppercase scheme", "BEARER " + testKey},
		{"mixed case scheme", "bEaReR " + testKey},
		{"several spaces", "Bearer     " + testKey},
	} {
		key, _, _, ok := parseAuthorization(tc.value, f)
		if !ok || key != testKey {
			t.Errorf("%s: parseAuthorization(%q) = %q, %v; want the key", tc.name, tc.value, key, ok)
		}
	}
	for _, tc := range malformedAuthorizations {
		if key, _, _, ok := parseAuthorization(tc.value, f); ok {
			t.Errorf("%s: parseAuthorization(%q) = %q, true; want refused", tc.name, tc.value, key)
		}
	}
}

func TestBearerKeyWantsExactlyOneAuthorizationHeader(t *testing.T) {
	f := keystoretest.Format(t, "mon")
	for _, tc := range []struct {
		name string
		hdr  http.Header
		ok   bool
	}{
		{"one", http.Header{"Authorization": {"Bearer " + testKey}}, true},
		{"none", http.Header{}, false},
		{"two identical", http.Header{"Authorization": {"Bearer " + testKey, "Bearer " + testKey}}, false},
		{"a good one and a bad one", http.Header{"Authorization": {"Bearer " + testKey, "Basic eDp5"}}, false},
		{"cookie only", http.Header{"Cookie": {"session=" + testKey + "; api_key=" + testKey}}, false},
		{"other header", http.Header{"X-Api-Key": {testKey}, "Api-Key": {testKey}}, false},
	} {
		if _, _, ok := bearerKey(tc.hdr, f); ok != tc.ok {
			t.Errorf("%s: bearerKey = %v, want %v", tc.name, ok, tc.ok)
		}
	}
}

func TestParseAuthorizationDoesNotAllocate(t *testing.T) {
	f := keystoretest.Format(t, "mon")
	v := "Bearer " + testKey
	if n := testing.AllocsPerRun(100, func() { parseAuthorization(v, f) }); n != 0 {
		t.Errorf("parseAuthorization allocates %v times", n)
	}
}

// referenceAuthorization is the rule of README.md's step 1, written the slow and
// obvious way.
var referenceAuthorization = regexp.MustCompile(`^(?i:bearer) +(mon_live_[A-Za-z0-9]{16,64}\.([A-Za-z0-9_-]{43,128}))$`)

func referenceParse(v string) (string, bool) {
	m := referenceAuthorization.FindStringSubmatch(v)
	if m == nil {
		return "", false
	}
	// The secret must be canonical unpadded base64url: it decodes, strictly, and
	// encodes back to itself.
	raw, err := base64.RawURLEncoding.Strict().DecodeString(m[2])
	if err != nil || base64.RawURLEncoding.EncodeToString(raw) != m[2] {
		return "", false
	}
	return m[1], true
}

// FuzzAuthorization checks parseAuthorization against referenceAuthorization, the
// rule as a regular expression. Both give the same verdict and the same key, for any
// header value.
func FuzzAuthorization(f *testing.F) {
	f.Add("Bearer " + testKey)
	f.Add("bearer   " + testKey)
	for _, tc := range malformedAuthorizations {
		f.Add(tc.value)
	}
	f.Add("Bearer mon_live_" + strings.Repeat("a", 64) + "." + strings.Repeat("A", 128))
	f.Add("Bearer mon_live_" + strings.Repeat("a", 65) + "." + strings.Repeat("A", 43))
	format := keystoretest.Format(f, "mon")
	f.Fuzz(func(t *testing.T, v string) {
		key, keyID, secret, ok := parseAuthorization(v, format)
		wantKey, wantOK := referenceParse(v)
		if ok != wantOK || key != wantKey {
			t.Fatalf("parseAuthorization(%q) = %q, %v; the reference says %q, %v", v, key, ok, wantKey, wantOK)
		}
		if ok && "mon_live_"+keyID+"."+secret != key {
			t.Fatalf("parseAuthorization(%q) parts %q, %q do not make the key %q", v, keyID, secret, key)
		}
	})
}
