package keystore_test

import (
	"strings"
	"testing"

	"github.com/keygate/keygate/keystore"
)

func TestRedactRemovesEverySecretAndKeepsTheRest(t *testing.T) {
	const (
		id     = "AbCdEfGhIjKlMnOpQrStUv"
		secret = "dGhpcyBpcyBhIDMyIGJ5dGUgc2VjcmV0IGZvciB0ZXN0"
		key    = "mon_live_" + id + "." + secret
		gone   = "mon_live_" + id + ".REDACTED"
	)
	for _, tc := range []struct{ in, want string }{
		{"/v1/monitors/" + key, "/v1/monitors/" + gone},
		{"/orgs/" + key + "/api-keys", "/orgs/" + gone + "/api-keys"},
		{"/dashboard/" + key + "?x=1", "/dashboard/" + gone + "?x=1"},
		{"a " + key + " and acme_live_" + id + "." + secret, "a " + gone + " and acme_live_" + id + ".REDACTED"},
		{strings.NewReplacer("_", "%5F", ".", "%2E").Replace(key), gone},
		{strings.NewReplacer("_", "%255F", ".", "%252E").Replace(key), gone}, // encoded twice
		// A key sent as a header name is logged canonicalized, mostly lower case.
		{"Mon_live_" + strings.ToLower(id) + "." + strings.ToLower(secret), "Mon_live_" + strings.ToLower(id) + ".REDACTED"},
		{strings.ToUpper(key), "MON_LIVE_" + strings.ToUpper(id) + ".REDACTED"},
		{"/v1/monitors/" + id, "/v1/monitors/" + id}, // a key id alone is no secret
		{"no key here, 100%", "no key here, 100%"},
	} {
		if got := keystore.Redact(tc.in); got != tc.want {
			t.Errorf("Redact(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if strings.Contains(strings.ToLower(keystore.Redact(tc.in)), strings.ToLower(secret[:12])) {
			t.Errorf("Redact(%q) still shows the secret", tc.in)
		}
	}
}

func TestPercentDecodeLeavesWhatIsNoEscape(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"plain", "plain"},
		{"p%40ss%2Fw%3Ard", "p@ss/w:rd"},
		{"%41%62", "Ab"},
		{"100%", "100%"},
		{"%4", "%4"},
		{"%zz%41", "%zzA"},
		{"%2541", "%41"}, // once: a second decoding is the caller's
	} {
		if got := keystore.PercentDecode(tc.in); got != tc.want {
			t.Errorf("PercentDecode(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
