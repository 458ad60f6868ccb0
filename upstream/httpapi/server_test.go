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
	methodNotAllowed := `{"error":"method not allowed"}`
	for _, tc := range []struct {
		name         string
		c            *upstreamtest.Client
		method, path string
		status       int
		body, allow  string
	}{
		{"root", e.Anon(), "GET", "/", 404, bodyNotFound, ""},
		{"unknown path", e.Anon(), "GET", "/nope", 404, bodyNotFound, ""},
		{"unknown org subpath", e.Anon(), "GET", "/orgs/" + org + "/billing", 404, bodyNotFound, ""},
		{"trailing slash", e.Anon(), "GET", "/orgs/" + org + "/monitors/", 404, bodyNotFound, ""},
		{"unknown /v1 path", gw, "GET", "/v1/keys", 404, bodyNotFound, ""},
		{"GET login", e.Anon(), "GET", "/auth/login", 405, methodNotAllowed, "POST"},
		{"PUT login", e.Anon(), "PUT", "/auth/login", 405, methodNotAllowed, "POST"},
		{"PUT monitors", e.Anon(), "PUT", "/orgs/" + org + "/monitors", 405, methodNotAllowed, "GET, HEAD, POST"},
		{"POST a monitor id", e.Anon(), "POST", "/orgs/" + org + "/monitors/x", 405, methodNotAllowed, "DELETE, GET, HEAD, PATCH"},
		{"GET a key id", e.Anon(), "GET", "/orgs/" + org + "/api-keys/x", 405, methodNotAllowed, "DELETE"},
		{"PUT /v1 monitor", gw, "PUT", "/v1/monitors/x", 405, methodNotAllowed, "DELETE, GET, HEAD, PATCH"},
		// Paths with empty or dot segments are unknown, never redirected to their
		// clean form (http.ServeMux would answer 301 or 307 with HTML).
		{"double slash", e.Anon(), "GET", "//", 404, bodyNotFound, ""},
		{"dot segment", e.Anon(), "GET", "/./", 404, bodyNotFound, ""},
		{"dot-dot segment", e.Anon(), "GET", "/orgs/../auth/login", 404, bodyNotFound, ""},
		{"empty segment in a dashboard path", e.Anon(), "GET", "/orgs/" + org + "//monitors", 404, bodyNotFound, ""},
		{"dot segment in a dashboard path", e.Anon(), "GET", "/orgs/" + org + "/./monitors", 404, bodyNotFound, ""},
		{"escaped dot segment", e.Anon(), "GET", "/orgs/" + org + "/%2e/monitors", 404, bodyNotFound, ""},
		{"empty segment under /v1", gw, "GET", "/v1//monitors", 404, bodyNotFound, ""},
		{"dot segment under /v1", gw, "GET", "/v1/./monitors", 404, bodyNotFound, ""},
		{"dot-dot at the end under /v1", gw, "GET", "/v1/monitors/x/..", 404, bodyNotFound, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.c.Do(tc.method, tc.path, "")
			upstreamtest.Want(t, r, tc.status, tc.body)
			if got := r.Header.Get("Allow"); got != tc.allow {
				t.Errorf("Allow = %q, want %q", got, tc.allow)
			}
			if loc := r.Header.Get("Location"); loc != "" {
				t.Errorf("Location = %q, want none", loc)
			}
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

func TestBrokenDatabaseIsAnInternalErrorWithoutDetails(t *testing.T) {
	e := upstreamtest.NewEnv(t)
	org := e.Org("pro")
	owner := e.Person(store.RoleOwner, org)
	gw := e.Gateway(org, store.RoleAdmin)
	e.Pool.Close()
	for _, r := range []upstreamtest.Response{
		owner.Do("GET", "/orgs/"+org+"/monitors", ""),
		gw.Do("GET", "/v1/monitors", ""),
		gw.Do("POST", "/v1/monitors", `{"name":"n","type":"http","target":"https://example.com"}`),
		e.Anon().Do("POST", "/auth/login", `{"email":"a@example.com","password":"p"}`),
	} {
		upstreamtest.Want(t, r, 500, `{"error":"internal"}`)
	}
	if n := e.Logs.FilterMessage("internal error").Len(); n != 4 {
		t.Errorf("internal error log lines = %d, want 4", n)
	}
}

func TestUnreachableDatabaseIs503(t *testing.T) {
	e := upstreamtest.NewEnv(t)
	org := e.Org("pro")
	owner := e.Person(store.RoleOwner, org)
	gw := e.Gateway(org, store.RoleAdmin)
	// The same server, its pool now pointing where no PostgreSQL listens.
	e.Server.SetPool(schematest.UnreachablePool(t))
	for _, r := range []upstreamtest.Response{
		owner.Do("GET", "/orgs/"+org+"/monitors", ""),
		gw.Do("POST", "/v1/monitors", `{"name":"n","type":"http","target":"https://example.com"}`),
		e.Anon().Do("POST", "/auth/login", `{"email":"a@example.com","password":"p"}`),
	} {
		upstreamtest.Want(t, r, 503, `{"error":"service_unavailable"}`)
	}
	if n := e.Logs.FilterMessage("database unavailable").Len(); n != 3 {
		t.Errorf("database unavailable log lines = %d, want 3", n)
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
