package httpapi_test

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/keygate/keygate/openapi"
	"github.com/keygate/keygate/schema/schematest"
	"github.com/keygate/keygate/upstream/internal/upstreamtest"
	"github.com/keygate/keygate/upstream/store"
)

func TestUnknownRoutesAndWrongMethodsAnswerJSON(t *testing.T) {
	e := upstreamtest.NewEnv(t)
	org := e.Org("pro")
	gw := e.Gateway(org, store.RoleAdmin)
	// want checks the answer's status, body and Allow header, and that it redirects
	// nowhere.
	want := func(t *testing.T, r upstreamtest.Response, status int, body, allow string) {
		t.Helper()
		upstreamtest.Want(t, r, status, body)
		if got := r.Header.Get("Allow"); got != allow {
			t.Errorf("Allow = %q, want %q", got, allow)
		}
		if loc := r.Header.Get("Location"); loc != "" {
			t.Errorf("Location = %q, want none", loc)
		}
	}
	// A GET of an unknown path is 404, without Allow.
	for _, tc := range []struct {
		name string
		c    *upstreamtest.Client
		path string
	}{
		{"root", e.Anon(), "/"},
		{"unknown path", e.Anon(), "/nope"},
		{"unknown org subpath", e.Anon(), "/orgs/" + org + "/billing"},
		{"trailing slash", e.Anon(), "/orgs/" + org + "/monitors/"},
		{"unknown /v1 path", gw, "/v1/keys"},
		// Paths with empty or dot segments are unknown. They are never redirected to
		// their clean form, as http.ServeMux would with a 301 or 307 and HTML.
		{"double slash", e.Anon(), "//"},
		{"dot segment", e.Anon(), "/./"},
		{"dot-dot segment", e.Anon(), "/orgs/../auth/login"},
		{"empty segment in a dashboard path", e.Anon(), "/orgs/" + org + "//monitors"},
		{"dot segment in a dashboard path", e.Anon(), "/orgs/" + org + "/./monitors"},
		{"escaped dot segment", e.Anon(), "/orgs/" + org + "/%2e/monitors"},
		{"empty segment under /v1", gw, "/v1//monitors"},
		{"dot segment under /v1", gw, "/v1/./monitors"},
		{"dot-dot at the end under /v1", gw, "/v1/monitors/x/.."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want(t, tc.c.Do("GET", tc.path, ""), 404, bodyNotFound, "")
		})
	}
	// A method a known path does not take is 405, with the methods it takes in Allow.
	for _, tc := range []struct {
		name                string
		c                   *upstreamtest.Client
		method, path, allow string
	}{
		{"GET login", e.Anon(), "GET", "/auth/login", "POST"},
		{"PUT login", e.Anon(), "PUT", "/auth/login", "POST"},
		{"PUT monitors", e.Anon(), "PUT", "/orgs/" + org + "/monitors", "GET, HEAD, POST"},
		{"POST a monitor id", e.Anon(), "POST", "/orgs/" + org + "/monitors/x", "DELETE, GET, HEAD, PATCH"},
		{"GET a key id", e.Anon(), "GET", "/orgs/" + org + "/api-keys/x", "DELETE, PATCH"},
		{"PUT /v1 monitor", gw, "PUT", "/v1/monitors/x", "DELETE, GET, HEAD, PATCH"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want(t, tc.c.Do(tc.method, tc.path, ""), 405, `{"error":"method not allowed"}`, tc.allow)
		})
	}
}

func TestPanicIsRecoveredIntoAnInternalErrorWithoutDetails(t *testing.T) {
	e := upstreamtest.NewEnv(t)
	h := e.Server.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Half-Done", "yes")
		panic("boom: password=hunter2")
	}))
	ts := httptest.NewServer(h)
	defer ts.Close()
	res, err := http.Get(ts.URL + "/anything")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var body bytes.Buffer
	_, _ = body.ReadFrom(res.Body)
	upstreamtest.Want(t, upstreamtest.Response{Status: res.StatusCode, Header: res.Header, Body: body.String()}, 500, `{"error":"internal"}`)
	if res.Header.Get("X-Half-Done") != "" {
		t.Error("headers set before the panic were sent")
	}
	logged := e.Logs.FilterMessage("handler panicked").All()
	if len(logged) != 1 || !strings.Contains(logged[0].ContextMap()["panic"].(string), "boom") {
		t.Errorf("panic log = %+v", logged)
	}
	if reqs := e.Logs.FilterMessage("request").FilterField(zap.Int("status", 500)).Len(); reqs != 1 {
		t.Errorf("request log lines with status 500 = %d, want 1", reqs)
	}
}

func TestDatabaseFailuresAnswerWithoutDetails(t *testing.T) {
	for _, tc := range []struct {
		name string
		// fail breaks the server's database.
		fail   func(t *testing.T, e *upstreamtest.Env)
		status int
		body   string
		// logged is the message logged once a request.
		logged string
	}{
		{"a broken database is an internal error", func(t *testing.T, e *upstreamtest.Env) { e.Pool.Close() },
			500, `{"error":"internal"}`, "internal error"},
		// The same server, its pool now pointing where no PostgreSQL listens.
		{"an unreachable database is 503", func(t *testing.T, e *upstreamtest.Env) { e.Server.SetPool(schematest.UnreachablePool(t)) },
			503, `{"error":"service_unavailable"}`, "database unavailable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, org, owner := upstreamtest.NewOrgEnv(t, "pro", store.RoleOwner)
			gw := e.Gateway(org, store.RoleAdmin)
			tc.fail(t, e)
			requests := []upstreamtest.Response{
				owner.Do("GET", "/orgs/"+org+"/monitors", ""),
				gw.Do("GET", "/v1/monitors", ""),
				gw.Do("POST", "/v1/monitors", `{"name":"n","type":"http","target":"https://example.com"}`),
				e.Anon().Do("POST", "/auth/login", `{"email":"a@example.com","password":"p"}`),
			}
			for _, r := range requests {
				upstreamtest.Want(t, r, tc.status, tc.body)
			}
			if n := e.Logs.FilterMessage(tc.logged).Len(); n != len(requests) {
				t.Errorf("%s log lines = %d, want %d", tc.logged, n, len(requests))
			}
		})
	}
}

func TestTheOpenAPIDocumentsAreServedByteForByteWithoutAuthentication(t *testing.T) {
	e := upstreamtest.NewEnv(t)
	for _, name := range openapi.Names {
		want, err := openapi.Files.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		r := e.Anon().Do("GET", "/openapi/"+name, "")
		if r.Status != http.StatusOK || r.Body != string(want) {
			t.Errorf("GET /openapi/%s: %d, %d bytes; want 200 and the %d bytes of the file", name, r.Status, len(r.Body), len(want))
		}
		if ct := r.Header.Get("Content-Type"); ct != "application/yaml" {
			t.Errorf("GET /openapi/%s: Content-Type %q, want application/yaml", name, ct)
		}
	}
	upstreamtest.Want(t, e.Anon().Do("GET", "/openapi/other.yaml", ""), 404, bodyNotFound)
}
