package httpapi_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/keygate/keygate/gatewayauth"
	"github.com/keygate/keygate/gatewayauth/gatewayauthtest"
	"github.com/keygate/keygate/upstream/httpapi"
	"github.com/keygate/keygate/upstream/internal/upstreamtest"
	"github.com/keygate/keygate/upstream/store"
)

const bodyKeyUnauth = `{"error":"api key unauthenticated"}`

func TestV1RequiresTheGatewaySecret(t *testing.T) {
	e, org, owner := upstreamtest.NewOrgEnv(t, "pro", store.RoleOwner)
	identity := []string{httpapi.HeaderOrgID, org, httpapi.HeaderKeyID, "AAAAAAAAAAAAAAAAAAAAAA", httpapi.HeaderKeyRole, store.RoleAdmin}
	anon := e.Anon().With(identity...)
	for _, tc := range []struct {
		name string
		c    *upstreamtest.Client
	}{
		{"no secret", anon},
		{"empty secret", anon.With(httpapi.HeaderSecret, "")},
		{"wrong secret", anon.With(httpapi.HeaderSecret, "wrong")},
		{"secret with a suffix", anon.With(httpapi.HeaderSecret, upstreamtest.GatewaySecret+"x")},
		{"secret's prefix", anon.With(httpapi.HeaderSecret, upstreamtest.GatewaySecret[:len(upstreamtest.GatewaySecret)-1])},
		{"secret in another case", anon.With(httpapi.HeaderSecret, "TEST-GATEWAY-SECRET-0123456789")},
		{"secret twice", anon.With(httpapi.HeaderSecret, upstreamtest.GatewaySecret, httpapi.HeaderSecret, upstreamtest.GatewaySecret)},
		{"a wrong and a right secret", anon.With(httpapi.HeaderSecret, "wrong", httpapi.HeaderSecret, upstreamtest.GatewaySecret)},
		{"a session cookie instead", owner.With(identity...)},
		{"an API key instead", anon.With("Authorization", "Bearer mon_live_AAAAAAAAAAAAAAAAAAAAAA.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")},
		{"no headers at all", e.Anon()},
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
				r := tc.c.Do(rt.method, rt.path, `{"name":"n","type":"http","target":"https://example.com"}`)
				upstreamtest.Want(t, r, 401, bodyKeyUnauth)
				if got := r.Header.Get("WWW-Authenticate"); got != "Bearer" {
					t.Errorf("WWW-Authenticate = %q, want Bearer", got)
				}
			})
		}
	}
	if n := upstreamtest.Scalar[int](e, `SELECT count(*) FROM monitors`); n != 0 {
		t.Errorf("monitors = %d, want none created", n)
	}
}

func TestV1RefusesMalformedIdentityHeaders(t *testing.T) {
	e := upstreamtest.NewEnv(t)
	org := e.Org("pro")
	good := e.Gateway(org, store.RoleAdmin)
	without := func(name string) *upstreamtest.Client {
		c := good.With()
		c.Header.Del(name)
		return c
	}
	replaced := func(name, value string) *upstreamtest.Client {
		c := good.With()
		c.Header.Set(name, value)
		return c
	}
	for _, tc := range []struct {
		name string
		c    *upstreamtest.Client
	}{
		{"no org", without(httpapi.HeaderOrgID)},
		{"org not a UUID", replaced(httpapi.HeaderOrgID, "acme")},
		{"org a UUID without hyphens", replaced(httpapi.HeaderOrgID, "00000000000000000000000000000000")},
		{"two orgs", good.With(httpapi.HeaderOrgID, "00000000-0000-0000-0000-000000000000")},
		{"no key id", without(httpapi.HeaderKeyID)},
		{"empty key id", replaced(httpapi.HeaderKeyID, "")},
		{"key id with a dot", replaced(httpapi.HeaderKeyID, "AAAAAAAAAAAAAAAA.AAAAAA")},
		{"no role", without(httpapi.HeaderKeyRole)},
		{"role Owner", replaced(httpapi.HeaderKeyRole, "Owner")},
		{"role in lower case", replaced(httpapi.HeaderKeyRole, "admin")},
		{"two roles", good.With(httpapi.HeaderKeyRole, store.RoleViewer)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			upstreamtest.Want(t, tc.c.Do("GET", "/v1/monitors", ""), 401, bodyKeyUnauth)
		})
	}
	upstreamtest.Want(t, good.Do("GET", "/v1/monitors", ""), 200, `{"data":[],"next_cursor":null}`)
	upstreamtest.Want(t, good.Do("GET", "/v1/no-such-route", ""), 404, bodyNotFound)
}

func TestV1ActsForTheOrgAndRoleOfTheHeaders(t *testing.T) {
	e := upstreamtest.NewEnv(t)
	org, other := e.Org("pro"), e.Org("pro")
	body := `{"name":"n","type":"http","target":"https://example.com"}`
	viewer := e.Gateway(org, store.RoleViewer)
	upstreamtest.Want(t, viewer.Do("POST", "/v1/monitors", body), 403, bodyForbidden)
	m := door{"v1", e.Gateway(org, store.RoleEditor), "/v1/monitors"}.create(t, body)
	upstreamtest.Want(t, viewer.Do("PATCH", "/v1/monitors/"+m.ID, `{"name":"x"}`), 403, bodyForbidden)
	upstreamtest.Want(t, viewer.Do("DELETE", "/v1/monitors/"+m.ID, ""), 403, bodyForbidden)
	upstreamtest.WantStatus(t, viewer.Do("GET", "/v1/monitors/"+m.ID, ""), 200)

	if got := upstreamtest.Scalar[string](e, `SELECT org_id::text FROM monitors WHERE id = $1`, m.ID); got != org {
		t.Errorf("monitor created in org %s, want %s", got, org)
	}
	// The same monitor through another org's identity does not exist.
	upstreamtest.Want(t, e.Gateway(other, store.RoleAdmin).Do("GET", "/v1/monitors/"+m.ID, ""), 404, `{"error":"monitor not found"}`)
	// Headers naming a UUID that is no org find nothing and create nothing.
	ghost := e.Gateway("00000000-0000-0000-0000-000000000000", store.RoleAdmin)
	upstreamtest.Want(t, ghost.Do("GET", "/v1/monitors", ""), 200, `{"data":[],"next_cursor":null}`)
	upstreamtest.Want(t, ghost.Do("POST", "/v1/monitors", body), http.StatusNotFound, bodyNotFound)
}

func TestV1WithSignedIdentityAcceptsOnlyTheGatewaysAssertion(t *testing.T) {
	// An upstream verifies the gateway's signed identity, with no shared secret. A
	// request sent straight to it gets nowhere without a valid assertion, whatever
	// X-Gateway-* headers it carries. A valid assertion names the caller.
	priv, keyFile := gatewayauthtest.NewKey(t)
	verifier, err := gatewayauth.New(gatewayauth.Config{KeyFile: keyFile})
	if err != nil {
		t.Fatal(err)
	}
	e := upstreamtest.NewEnv(t, func(c *httpapi.Config) { c.GatewaySecret, c.Identity = "", verifier })
	org := e.Org("pro")
	id := gatewayauth.Identity{KeyID: "AAAAAAAAAAAAAAAAAAAAAA", OrgID: org, Role: "Viewer"}
	good := gatewayauthtest.Sign(t, priv, gatewayauthtest.KeyID(priv), gatewayauthtest.Good(time.Now(), id))
	upstreamtest.Want(t, e.Anon().With(gatewayauth.Header, good).Do("GET", "/v1/monitors", ""), 200, `{"data":[],"next_cursor":null}`)
	// The assertion's role, not a header's: a Viewer cannot write.
	r := e.Anon().With(gatewayauth.Header, good, httpapi.HeaderKeyRole, "Admin").Do("POST", "/v1/monitors", `{"name":"a","type":"http","target":"https://example.com"}`)
	upstreamtest.Want(t, r, 403, `{"error":"forbidden"}`)
	for _, f := range append(gatewayauthtest.Forgeries(t, priv, id),
		gatewayauthtest.Forgery{Name: "headers alone", Header: nil}) {
		t.Run(f.Name, func(t *testing.T) {
			c := e.Gateway(org, "Admin") // the plain headers, and a secret the server has none of
			for _, v := range f.Header {
				c = c.With(gatewayauth.Header, v)
			}
			r := c.Do("GET", "/v1/monitors", "")
			upstreamtest.Want(t, r, 401, bodyKeyUnauth)
		})
	}
}

func TestV1WithSecretAndSignedIdentityNeedsBoth(t *testing.T) {
	priv, keyFile := gatewayauthtest.NewKey(t)
	verifier, err := gatewayauth.New(gatewayauth.Config{KeyFile: keyFile})
	if err != nil {
		t.Fatal(err)
	}
	e := upstreamtest.NewEnv(t, func(c *httpapi.Config) { c.Identity = verifier })
	org := e.Org("pro")
	id := gatewayauth.Identity{KeyID: "AAAAAAAAAAAAAAAAAAAAAA", OrgID: org, Role: "Admin"}
	good := gatewayauthtest.Sign(t, priv, gatewayauthtest.KeyID(priv), gatewayauthtest.Good(time.Now(), id))
	upstreamtest.Want(t, e.Gateway(org, "Admin").With(gatewayauth.Header, good).Do("GET", "/v1/monitors", ""), 200, `{"data":[],"next_cursor":null}`)
	upstreamtest.Want(t, e.Anon().With(gatewayauth.Header, good).Do("GET", "/v1/monitors", ""), 401, bodyKeyUnauth)
	upstreamtest.Want(t, e.Gateway(org, "Admin").Do("GET", "/v1/monitors", ""), 401, bodyKeyUnauth)
}

func TestV1WhileTheGatewaysKeysCannotBeFetchedIs503NotA401(t *testing.T) {
	// The upstream cannot reach the gateway's JWKS: the caller's key is not at fault,
	// so the answer is the 503 of a dependency down, and the log says which.
	priv, _ := gatewayauthtest.NewKey(t)
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	verifier, err := gatewayauth.New(gatewayauth.Config{JWKSURL: gone.URL + "/.well-known/jwks.json"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(verifier.Close)
	e := upstreamtest.NewEnv(t, func(c *httpapi.Config) { c.GatewaySecret, c.Identity = "", verifier })
	org := e.Org("pro")
	id := gatewayauth.Identity{KeyID: "AAAAAAAAAAAAAAAAAAAAAA", OrgID: org, Role: "Viewer"}
	good := gatewayauthtest.Sign(t, priv, gatewayauthtest.KeyID(priv), gatewayauthtest.Good(time.Now(), id))
	upstreamtest.Want(t, e.Anon().With(gatewayauth.Header, good).Do("GET", "/v1/monitors", ""), 503, `{"error":"service_unavailable"}`)
	logged := e.Logs.FilterMessage("the gateway's keys cannot be fetched; answering /v1 with 503").All()
	if len(logged) != 1 || !strings.Contains(logged[0].ContextMap()["error"].(string), "connection refused") {
		t.Errorf("logged %v, want the fetch's cause once", logged)
	}
}

func TestARefusedIdentityIsLoggedWithItsReasonAtMostOnceAMinute(t *testing.T) {
	// The gateway signs for its identity_audience, which is not the upstream's
	// --gateway-audience: every /v1 request is refused, and the log says why, once.
	priv, keyFile := gatewayauthtest.NewKey(t)
	verifier, err := gatewayauth.New(gatewayauth.Config{KeyFile: keyFile, Audience: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	e := upstreamtest.NewEnv(t, func(c *httpapi.Config) { c.GatewaySecret, c.Identity = "", verifier })
	org := e.Org("pro")
	id := gatewayauth.Identity{KeyID: "AAAAAAAAAAAAAAAAAAAAAA", OrgID: org, Role: "Viewer"}
	good := gatewayauthtest.Sign(t, priv, gatewayauthtest.KeyID(priv), gatewayauthtest.Good(time.Now(), id))
	for range 3 {
		upstreamtest.Want(t, e.Anon().With(gatewayauth.Header, good).Do("GET", "/v1/monitors", ""), 401, bodyKeyUnauth)
	}
	logged := e.Logs.FilterMessage("refusing the gateway's credentials; answering /v1 with 401").All()
	if len(logged) != 1 || !strings.Contains(logged[0].ContextMap()["error"].(string), `aud ["keygate-upstream"], not "billing"`) {
		t.Errorf("logged %v, want the wrong audience once", logged)
	}
}
