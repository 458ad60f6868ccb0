package jwks

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/keygate/keygate/gatewayauth/gatewayauthtest"
)

func TestTheJWKSHandlerPublishesThePublicHalvesOnly(t *testing.T) {
	newKey, newFile := gatewayauthtest.NewKey(t)
	oldKey, oldFile := gatewayauthtest.NewKey(t)
	j := &JWKS{Files: []string{newFile, oldFile}}
	if err := j.Provision(caddy.Context{}); err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	if err := j.ServeHTTP(rec, httptest.NewRequest("GET", "/.well-known/jwks.json", nil), nil); err != nil {
		t.Fatal(err)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/jwk-set+json" {
		t.Errorf("Content-Type %q", ct)
	}
	var set struct {
		Keys []map[string]any `json:"keys"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &set); err != nil {
		t.Fatal(err)
	}
	if len(set.Keys) != 2 || set.Keys[0]["kid"] != gatewayauthtest.KeyID(newKey) ||
		set.Keys[1]["kid"] != gatewayauthtest.KeyID(oldKey) {
		t.Errorf("keys %v, want the new and the old key", set.Keys)
	}
	for _, k := range set.Keys {
		if _, ok := k["d"]; ok {
			t.Errorf("a private part in the JWKS: %v", k)
		}
	}
}

func TestUnmarshalJWKSCaddyfile(t *testing.T) {
	for _, tc := range []struct {
		input   string
		want    []string
		wantErr bool
	}{
		{"v1_gateway_jwks /a.pem /b.pem", []string{"/a.pem", "/b.pem"}, false},
		{"v1_gateway_jwks", nil, true},
		{"v1_gateway_jwks /a.pem {\n\tfiles /b.pem\n}", nil, true},
	} {
		var j JWKS
		err := j.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.input))
		if (err != nil) != tc.wantErr || (!tc.wantErr && strings.Join(j.Files, " ") != strings.Join(tc.want, " ")) {
			t.Errorf("%q: files %v, error %v", tc.input, j.Files, err)
		}
	}
}
