package integration

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/keygate/keygate/gatewayauth"
	"github.com/keygate/keygate/gatewayauth/gatewayauthtest"
)

func TestTheUpstreamServesV1OnSignedIdentityAloneWithNoSharedSecret(t *testing.T) {
	// The gateways sign who is calling with identity_key and send no shared secret;
	// the upstream has no GATEWAY_SECRET and verifies the assertions through
	// gatewayauth against the JWKS gateway 0 publishes (v1_gateway_jwks), fetched
	// over HTTP after the upstream started.
	priv, keyFile := gatewayauthtest.NewKey(t)
	s := newStackWith(t, stackOptions{identityKey: keyFile})
	o, owner := s.newOwner("pro")
	other := s.newOrg("pro")
	_, key := owner.createKey(o.ID, "ci", "Editor", nil)

	r := s.api(key, 0).do("POST", "/v1/monitors", map[string]any{"name": "home", "type": "http", "target": "https://example.com"})
	if r.Status != http.StatusCreated {
		t.Fatalf("POST /v1/monitors through gateway 0: %d %s", r.Status, r.Body)
	}
	id, _ := r.JSON(t)["id"].(string)
	// Through the other gateway, which signs with the same key.
	if r := s.api(key, 1).do("GET", "/v1/monitors/"+id, nil); r.Status != http.StatusOK {
		t.Errorf("GET /v1/monitors/{id} through gateway 1: %d %s", r.Status, r.Body)
	}

	// A client's own assertion never passes: one naming another org, validly signed
	// with the gateway's own key (as if it had leaked from a log), is replaced by
	// the gateway's, so the request still acts for the key's org.
	forged := gatewayauthtest.Sign(t, priv, gatewayauthtest.KeyID(priv),
		gatewayauthtest.Good(time.Now(), gatewayauth.Identity{KeyID: "AAAAAAAAAAAAAAAAAAAAAA", OrgID: other.ID, Role: "Admin"}))
	r = s.raw("GET", s.URL(0)+"/v1/monitors/"+id, nil, http.Header{"Authorization": {"Bearer " + key}, gatewayauth.Header: {forged}})
	if r.Status != http.StatusOK {
		t.Errorf("with a client-sent X-Gateway-Identity of another org: %d %s, want the key's own monitor", r.Status, r.Body)
	}

	// Straight to the upstream: the gateway's X-Gateway-* headers without a valid
	// assertion get nowhere, and every forgery is refused.
	upstream := "http://" + s.upAddr + "/v1/monitors"
	plain := http.Header{"X-Gateway-Org-Id": {o.ID}, "X-Gateway-Key-Id": {"AAAAAAAAAAAAAAAAAAAAAA"}, "X-Gateway-Key-Role": {"Admin"}}
	victim := gatewayauth.Identity{KeyID: "AAAAAAAAAAAAAAAAAAAAAA", OrgID: o.ID, Role: "Admin"}
	for _, f := range gatewayauthtest.Forgeries(t, priv, victim) {
		t.Run(f.Name, func(t *testing.T) {
			h := plain.Clone()
			if f.Header != nil {
				h[gatewayauth.Header] = f.Header
			}
			wantError(t, s.raw("GET", upstream, nil, h), http.StatusUnauthorized, `{"error":"api key unauthenticated"}`)
		})
	}
	// And the same request with an assertion the gateway's key signed is served: the
	// upstream verifies against the published key, not anything the client says.
	h := plain.Clone()
	h.Set(gatewayauth.Header, gatewayauthtest.Sign(t, priv, gatewayauthtest.KeyID(priv), gatewayauthtest.Good(time.Now(), victim)))
	if r := s.raw("GET", upstream, nil, h); r.Status != http.StatusOK {
		t.Errorf("a valid assertion sent straight to the upstream: %d %s", r.Status, r.Body)
	}
}

func TestAWrongIdentityAudienceIsLoggedByTheGatewayAndTheUpstream(t *testing.T) {
	// A gateway signing for another identity_audience than the upstream's
	// --gateway-audience: clients see only 401s, and both logs say why, once.
	_, keyFile := gatewayauthtest.NewKey(t)
	s := newStackWith(t, stackOptions{identityKey: keyFile})
	o, owner := s.newOwner("pro")
	_, key := owner.createKey(o.ID, "ci", "Editor", nil)
	i := s.withGateway("identity_audience billing")
	for range 3 {
		wantError(t, s.api(key, i).do("GET", "/v1/monitors", nil), http.StatusUnauthorized, `{"error":"api key unauthenticated"}`)
	}
	lines := func(log, msg string) []string {
		var found []string
		for _, line := range strings.Split(log, "\n") {
			if strings.Contains(line, msg) {
				found = append(found, line)
			}
		}
		return found
	}
	gw := lines(s.gateways[i].proc.logs(), "the upstream refused the credentials of a request the gateway authenticated")
	if len(gw) != 1 || !strings.Contains(gw[0], `"identity_audience":"billing"`) {
		t.Errorf("the gateway logged %q, want one line naming identity_audience billing", gw)
	}
	up := lines(s.upstream.logs(), "refusing the gateway's credentials")
	if len(up) != 1 || !strings.Contains(up[0], `billing`) || !strings.Contains(up[0], `keygate-upstream`) {
		t.Errorf("the upstream logged %q, want one line naming both audiences", up)
	}
}
