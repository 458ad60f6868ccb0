package caddymodule

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/keygate/keygate/gatewayauth"
	"github.com/keygate/keygate/gatewayauth/gatewayauthtest"
	"github.com/keygate/keygate/keystore"
)

func TestAProxiedRequestCarriesASignedIdentityAndNeverTheClients(t *testing.T) {
	d := newDB(t)
	org := d.org("pro")
	key, keyID := d.key(org, keystore.RoleViewer)
	priv, keyFile := gatewayauthtest.NewKey(t)
	up := newUpstream(t)
	opts := gatewayOptions(d.url, map[string]any{"identity_key": keyFile, "identity_audience": "billing"})
	delete(opts, "gateway_secret") // signed identity alone
	gw := startGateway(t, gatewayConfig{handler: opts, upstream: up.addr()})

	res, body := gw.do(t, "GET", "/v1/echo", "Bearer "+key, http.Header{
		"X-Gateway-Identity": {"forged.by.client"},
	}, "")
	if res.StatusCode != http.StatusOK {
		t.Fatalf("status %d %s", res.StatusCode, body)
	}
	var seen seenRequest
	if err := json.Unmarshal(body, &seen); err != nil {
		t.Fatal(err)
	}
	got := seen.Header.Values("X-Gateway-Identity")
	if len(got) != 1 || got[0] == "forged.by.client" {
		t.Fatalf("X-Gateway-Identity at the upstream %q, want the gateway's one assertion", got)
	}
	if s := seen.Header.Get("X-Gateway-Secret"); s != "" {
		t.Errorf("X-Gateway-Secret %q sent without a gateway_secret", s)
	}

	// The header: EdDSA, kid the key's thumbprint.
	parts := strings.Split(got[0], ".")
	hb, _ := base64.RawURLEncoding.DecodeString(parts[0])
	var header map[string]any
	json.Unmarshal(hb, &header)
	if header["alg"] != "EdDSA" || header["kid"] != gatewayauthtest.KeyID(priv) {
		t.Errorf("assertion header %v", header)
	}
	// The claims, as a service verifies them.
	v, err := gatewayauth.New(gatewayauth.Config{KeyFile: keyFile, Audience: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	id, err := v.Verify(t.Context(), got[0])
	if err != nil {
		t.Fatalf("the assertion does not verify: %v", err)
	}
	if id != (gatewayauth.Identity{KeyID: keyID, OrgID: org, Role: "Viewer"}) {
		t.Errorf("identity %+v, want key %s of %s, Viewer", id, keyID, org)
	}
	cb, _ := base64.RawURLEncoding.DecodeString(parts[1])
	var claims map[string]any
	json.Unmarshal(cb, &claims)
	if claims["iss"] != "keygate" || claims["sub"] != keyID || claims["org_id"] != org || claims["role"] != "Viewer" ||
		claims["exp"].(float64)-claims["iat"].(float64) != 60 {
		t.Errorf("claims %v", claims)
	}
	// Another audience's verifier refuses it.
	other, _ := gatewayauth.New(gatewayauth.Config{KeyFile: keyFile})
	if _, err := other.Verify(t.Context(), got[0]); err == nil {
		t.Error("an assertion for billing verified for keygate-upstream")
	}
}

func TestAClientsConnectionHeaderCannotRemoveTheGatewaysFields(t *testing.T) {
	// The reverse proxy deletes the fields a request's Connection header names, after
	// the module has set its own. So the client's names of them are dropped first. Its
	// other names still work as hop-by-hop names do.
	d := newDB(t)
	org := d.org("pro")
	key, keyID := d.key(org, keystore.RoleEditor)
	_, keyFile := gatewayauthtest.NewKey(t)
	gw := startGateway(t, gatewayConfig{
		handler:  gatewayOptions(d.url, map[string]any{"identity_key": keyFile}),
		upstream: newUpstream(t).addr(),
	})
	for _, connection := range [][]string{
		{"X-Gateway-Identity, x-gateway-org-id,X-GATEWAY-KEY-ID , X-Gateway-Key-Role, X-Gateway-Secret, Accept-Encoding, X-Hop"},
		{"X-Gateway-Identity", "keep-alive", "X-Hop", "accept-encoding", "X-Gateway-Secret,X-Gateway-Org-Id,X-Gateway-Key-Id,X-Gateway-Key-Role"},
	} {
		res, body := gw.do(t, "GET", "/v1/echo", "Bearer "+key, http.Header{
			"Connection":      connection,
			"X-Hop":           {"hop-by-hop"},
			"Accept-Encoding": {"gzip"},
		}, "")
		if res.StatusCode != http.StatusOK {
			t.Fatalf("status %d %s", res.StatusCode, body)
		}
		var seen seenRequest
		if err := json.Unmarshal(body, &seen); err != nil {
			t.Fatal(err)
		}
		for name, want := range map[string]string{
			"X-Gateway-Org-Id":   org,
			"X-Gateway-Key-Id":   keyID,
			"X-Gateway-Key-Role": "Editor",
			"X-Gateway-Secret":   testSecret,
			"Accept-Encoding":    "identity",
			"X-Hop":              "",
		} {
			if got := seen.Header.Get(name); got != want {
				t.Errorf("Connection %q: the upstream got %s %q, want %q", connection, name, got, want)
			}
		}
		if len(seen.Header.Values("X-Gateway-Identity")) != 1 {
			t.Errorf("Connection %q: the upstream got no X-Gateway-Identity", connection)
		}
	}
}

func TestAnUpstreamRefusingTheIdentityIsLoggedAtMostOnceAMinute(t *testing.T) {
	// The gateway signs for identity_audience billing. The service behind it verifies
	// with gatewayauth for the default audience, and answers every request 401. The
	// client sees only "api key unauthenticated". The gateway's log says why, once.
	d := newDB(t)
	key, _ := d.key(d.org("pro"), keystore.RoleEditor)
	priv, keyFile := gatewayauthtest.NewKey(t)
	v, err := gatewayauth.New(gatewayauth.Config{KeyFile: keyFile})
	if err != nil {
		t.Fatal(err)
	}
	up := httptest.NewServer(v.Middleware(http.NotFoundHandler()))
	t.Cleanup(up.Close)
	opts := gatewayOptions(d.url, map[string]any{"identity_key": keyFile, "identity_audience": "billing"})
	delete(opts, "gateway_secret")
	gw := startGateway(t, gatewayConfig{handler: opts, upstream: strings.TrimPrefix(up.URL, "http://")})

	for range 3 {
		res, body := gw.get(t, "/v1/monitors?api_key="+key, key)
		wantJSONError(t, res, body, http.StatusUnauthorized, `{"error":"api key unauthenticated"}`)
	}
	var lines []map[string]any
	for _, line := range strings.Split(gw.logText(t), "\n") {
		if strings.Contains(line, "the upstream refused the credentials") {
			var entry map[string]any
			json.Unmarshal([]byte(line), &entry)
			lines = append(lines, entry)
		}
	}
	if len(lines) != 1 {
		t.Fatalf("%d log lines of the upstream's refusal for 3 requests, want 1:\n%s", len(lines), gw.logText(t))
	}
	if e := lines[0]; e["identity_audience"] != "billing" || e["identity_kid"] != gatewayauthtest.KeyID(priv) ||
		e["path"] != "/v1/monitors" || e["level"] != "error" {
		t.Errorf("the log line %v, want the audience, kid and path at level error", e)
	}
	if strings.Contains(gw.logText(t), key[strings.IndexByte(key, '.'):]) {
		t.Error("the log holds the key's secret")
	}
}
