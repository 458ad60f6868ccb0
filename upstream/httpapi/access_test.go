package httpapi

import (
	"net/http"
	"testing"
	"time"

	"github.com/keygate/keygate/gatewayauth"
	"github.com/keygate/keygate/gatewayauth/gatewayauthtest"
)

const bodyKeyUnauth = `{"error":"api key unauthenticated"}`

func TestV1RequiresTheGatewaySecret(t *testing.T) {
	e := newTestEnv(t)
	org := e.org("pro")
	owner := e.person(roleOwner, org)
	identity := []string{headerOrgID, org, headerKeyID, "AAAAAAAAAAAAAAAAAAAAAA", headerKeyRole, roleAdmin}
	anon := e.anon().with(identity...)
	for _, tc := range []struct {
		name string
		c    *client
	}{
		{"no secret", anon},
		{"empty secret", anon.with(headerSecret, "")},
		{"wrong secret", anon.with(headerSecret, "wrong")},
		{"secret with a suffix", anon.with(headerSecret, testSecret+"x")},
		{"secret's prefix", anon.with(headerSecret, testSecret[:len(testSecret)-1])},
		{"secret in another case", anon.with(headerSecret, "TEST-GATEWAY-SECRET-0123456789")},
		{"secret twice", anon.with(headerSecret, testSecret, headerSecret, testSecret)},
		{"a wrong and a right secret", anon.with(headerSecret, "wrong", headerSecret, testSecret)},
		{"a session cookie instead", owner.with(identity...)},
		{"an API key instead", anon.with("Authorization", "Bearer mon_live_AAAAAAAAAAAAAAAAAAAAAA.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")},
		{"no headers at all", e.anon()},
	} {
		for _, rt := range []struct{ method, path string }{
			{"GET", "/v1/monitors"},
			{"POST", "/v1/monitors"},
			{"GET", "/v1/monitors/00000000-0000-0000-0000-000000000000"},
			{"DELETE", "/v1/monitors/00000000-0000-0000-0000-000000000000"},
			{"GET", "/v1/me"},
			{"GET", "/v1/no-such-route"},
			{"GET", "/v1"},
		} {
			t.Run(tc.name+" "+rt.method+" "+rt.path, func(t *testing.T) {
				r := tc.c.do(rt.method, rt.path, `{"name":"n","type":"http","target":"https://example.com"}`)
				want(t, r, 401, bodyKeyUnauth)
				if got := r.header.Get("WWW-Authenticate"); got != "Bearer" {
					t.Errorf("WWW-Authenticate = %q, want Bearer", got)
				}
			})
		}
	}
	if n := scalar[int](e, `SELECT count(*) FROM monitors`); n != 0 {
		t.Errorf("monitors = %d, want none created", n)
	}
}

func TestV1RefusesMalformedIdentityHeaders(t *testing.T) {
	e := newTestEnv(t)
	org := e.org("pro")
	good := e.gateway(org, roleAdmin)
	without := func(name string) *client {
		c := good.with()
		c.header.Del(name)
		return c
	}
	replaced := func(name, value string) *client {
		c := good.with()
		c.header.Set(name, value)
		return c
	}
	for _, tc := range []struct {
		name string
		c    *client
	}{
		{"no org", without(headerOrgID)},
		{"org not a UUID", replaced(headerOrgID, "acme")},
		{"org a UUID without hyphens", replaced(headerOrgID, "00000000000000000000000000000000")},
		{"two orgs", good.with(headerOrgID, "00000000-0000-0000-0000-000000000000")},
		{"no key id", without(headerKeyID)},
		{"empty key id", replaced(headerKeyID, "")},
		{"key id with a dot", replaced(headerKeyID, "AAAAAAAAAAAAAAAA.AAAAAA")},
		{"no role", without(headerKeyRole)},
		{"role Owner", replaced(headerKeyRole, "Owner")},
		{"role in lower case", replaced(headerKeyRole, "admin")},
		{"two roles", good.with(headerKeyRole, roleViewer)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want(t, tc.c.do("GET", "/v1/monitors", ""), 401, bodyKeyUnauth)
		})
	}
	want(t, good.do("GET", "/v1/monitors", ""), 200, `{"data":[],"next_cursor":null}`)
	want(t, good.do("GET", "/v1/no-such-route", ""), 404, bodyNotFound)
}

func TestV1ActsForTheOrgAndRoleOfTheHeaders(t *testing.T) {
	e := newTestEnv(t)
	org, other := e.org("pro"), e.org("pro")
	body := `{"name":"n","type":"http","target":"https://example.com"}`
	viewer := e.gateway(org, roleViewer)
	want(t, viewer.do("POST", "/v1/monitors", body), 403, bodyForbidden)
	m := door{"v1", e.gateway(org, roleEditor), "/v1/monitors"}.create(t, body)
	want(t, viewer.do("PATCH", "/v1/monitors/"+m.ID, `{"name":"x"}`), 403, bodyForbidden)
	want(t, viewer.do("DELETE", "/v1/monitors/"+m.ID, ""), 403, bodyForbidden)
	wantStatus(t, viewer.do("GET", "/v1/monitors/"+m.ID, ""), 200)

	if got := scalar[string](e, `SELECT org_id::text FROM monitors WHERE id = $1`, m.ID); got != org {
		t.Errorf("monitor created in org %s, want %s", got, org)
	}
	// The same monitor through another org's identity does not exist.
	want(t, e.gateway(other, roleAdmin).do("GET", "/v1/monitors/"+m.ID, ""), 404, `{"error":"monitor not found"}`)
	// Headers naming a UUID that is no org find nothing and create nothing.
	ghost := e.gateway("00000000-0000-0000-0000-000000000000", roleAdmin)
	want(t, ghost.do("GET", "/v1/monitors", ""), 200, `{"data":[],"next_cursor":null}`)
	want(t, ghost.do("POST", "/v1/monitors", body), http.StatusNotFound, bodyNotFound)
}

func TestV1WithSignedIdentityAcceptsOnlyTheGatewaysAssertion(t *testing.T) {
	// An upstream verifying the gateway's signed identity, with no shared secret: a
	// request sent straight to it gets nowhere without a valid assertion, whatever
	// X-Gateway-* headers it carries, and a valid one names the caller.
	priv, keyFile := gatewayauthtest.NewKey(t)
	verifier, err := gatewayauth.New(gatewayauth.Config{KeyFile: keyFile})
	if err != nil {
		t.Fatal(err)
	}
	e := newTestEnv(t, func(c *Config) { c.GatewaySecret, c.Identity = "", verifier })
	org := e.org("pro")
	id := gatewayauth.Identity{KeyID: "AAAAAAAAAAAAAAAAAAAAAA", OrgID: org, Role: "Viewer"}
	good := gatewayauthtest.Sign(t, priv, gatewayauthtest.KeyID(priv), gatewayauthtest.Good(time.Now(), id))
	want(t, e.anon().with(gatewayauth.Header, good).do("GET", "/v1/monitors", ""), 200, `{"data":[],"next_cursor":null}`)
	// The assertion's role, not a header's: a Viewer cannot write.
	r := e.anon().with(gatewayauth.Header, good, headerKeyRole, "Admin").do("POST", "/v1/monitors", `{"name":"a","type":"http","target":"https://example.com"}`)
	want(t, r, 403, `{"error":"forbidden"}`)
	for _, f := range append(gatewayauthtest.Forgeries(t, priv, id),
		gatewayauthtest.Forgery{Name: "headers alone", Header: nil}) {
		t.Run(f.Name, func(t *testing.T) {
			c := e.gateway(org, "Admin") // the plain headers, and a secret the server has none of
			for _, v := range f.Header {
				c = c.with(gatewayauth.Header, v)
			}
			r := c.do("GET", "/v1/monitors", "")
			want(t, r, 401, bodyKeyUnauth)
		})
	}
}

func TestV1WithSecretAndSignedIdentityNeedsBoth(t *testing.T) {
	priv, keyFile := gatewayauthtest.NewKey(t)
	verifier, err := gatewayauth.New(gatewayauth.Config{KeyFile: keyFile})
	if err != nil {
		t.Fatal(err)
	}
	e := newTestEnv(t, func(c *Config) { c.Identity = verifier })
	org := e.org("pro")
	id := gatewayauth.Identity{KeyID: "AAAAAAAAAAAAAAAAAAAAAA", OrgID: org, Role: "Admin"}
	good := gatewayauthtest.Sign(t, priv, gatewayauthtest.KeyID(priv), gatewayauthtest.Good(time.Now(), id))
	want(t, e.gateway(org, "Admin").with(gatewayauth.Header, good).do("GET", "/v1/monitors", ""), 200, `{"data":[],"next_cursor":null}`)
	want(t, e.anon().with(gatewayauth.Header, good).do("GET", "/v1/monitors", ""), 401, bodyKeyUnauth)
	want(t, e.gateway(org, "Admin").do("GET", "/v1/monitors", ""), 401, bodyKeyUnauth)
}
