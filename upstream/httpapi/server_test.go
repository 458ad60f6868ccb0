package httpapi

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/keygate/keygate/openapi"
	"github.com/keygate/keygate/schema/schematest"
)

func TestUnknownRoutesAndWrongMethodsAnswerJSON(t *testing.T) {
	e := newTestEnv(t)
	org := e.org("pro")
	gw := e.gateway(org, roleAdmin)
	methodNotAllowed := `{"error":"method not allowed"}`
	for _, tc := range []struct {
		name         string
		c            *client
		method, path string
		status       int
		body, allow  string
	}{
		{"root", e.anon(), "GET", "/", 404, bodyNotFound, ""},
		{"unknown path", e.anon(), "GET", "/nope", 404, bodyNotFound, ""},
		{"unknown org subpath", e.anon(), "GET", "/orgs/" + org + "/billing", 404, bodyNotFound, ""},
		{"trailing slash", e.anon(), "GET", "/orgs/" + org + "/monitors/", 404, bodyNotFound, ""},
		{"unknown /v1 path", gw, "GET", "/v1/keys", 404, bodyNotFound, ""},
		{"GET login", e.anon(), "GET", "/auth/login", 405, methodNotAllowed, "POST"},
		{"PUT login", e.anon(), "PUT", "/auth/login", 405, methodNotAllowed, "POST"},
		{"PUT monitors", e.anon(), "PUT", "/orgs/" + org + "/monitors", 405, methodNotAllowed, "GET, HEAD, POST"},
		{"POST a monitor id", e.anon(), "POST", "/orgs/" + org + "/monitors/x", 405, methodNotAllowed, "DELETE, GET, HEAD, PATCH"},
		{"GET a key id", e.anon(), "GET", "/orgs/" + org + "/api-keys/x", 405, methodNotAllowed, "DELETE"},
		{"PUT /v1 monitor", gw, "PUT", "/v1/monitors/x", 405, methodNotAllowed, "DELETE, GET, HEAD, PATCH"},
		// Paths with empty or dot segments are unknown, never redirected to their
		// clean form (http.ServeMux would answer 301 or 307 with HTML).
		{"double slash", e.anon(), "GET", "//", 404, bodyNotFound, ""},
		{"dot segment", e.anon(), "GET", "/./", 404, bodyNotFound, ""},
		{"dot-dot segment", e.anon(), "GET", "/orgs/../auth/login", 404, bodyNotFound, ""},
		{"empty segment in a dashboard path", e.anon(), "GET", "/orgs/" + org + "//monitors", 404, bodyNotFound, ""},
		{"dot segment in a dashboard path", e.anon(), "GET", "/orgs/" + org + "/./monitors", 404, bodyNotFound, ""},
		{"escaped dot segment", e.anon(), "GET", "/orgs/" + org + "/%2e/monitors", 404, bodyNotFound, ""},
		{"empty segment under /v1", gw, "GET", "/v1//monitors", 404, bodyNotFound, ""},
		{"dot segment under /v1", gw, "GET", "/v1/./monitors", 404, bodyNotFound, ""},
		{"dot-dot at the end under /v1", gw, "GET", "/v1/monitors/x/..", 404, bodyNotFound, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.c.do(tc.method, tc.path, "")
			want(t, r, tc.status, tc.body)
			if got := r.header.Get("Allow"); got != tc.allow {
				t.Errorf("Allow = %q, want %q", got, tc.allow)
			}
			if loc := r.header.Get("Location"); loc != "" {
				t.Errorf("Location = %q, want none", loc)
			}
		})
	}
}

func TestPanicIsRecoveredIntoAnInternalErrorWithoutDetails(t *testing.T) {
	e := newTestEnv(t)
	h := e.srv.logRequests(e.srv.recoverPanics(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Half-Done", "yes")
		panic("boom: password=hunter2")
	})))
	ts := httptest.NewServer(h)
	defer ts.Close()
	res, err := http.Get(ts.URL + "/anything")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var body bytes.Buffer
	_, _ = body.ReadFrom(res.Body)
	want(t, response{status: res.StatusCode, header: res.Header, body: body.String()}, 500, `{"error":"internal"}`)
	if res.Header.Get("X-Half-Done") != "" {
		t.Error("headers set before the panic were sent")
	}
	logged := e.logs.FilterMessage("handler panicked").All()
	if len(logged) != 1 || !strings.Contains(logged[0].ContextMap()["panic"].(string), "boom") {
		t.Errorf("panic log = %+v", logged)
	}
	if reqs := e.logs.FilterMessage("request").FilterField(fieldInt("status", 500)).Len(); reqs != 1 {
		t.Errorf("request log lines with status 500 = %d, want 1", reqs)
	}
}

func TestBrokenDatabaseIsAnInternalErrorWithoutDetails(t *testing.T) {
	e := newTestEnv(t)
	org := e.org("pro")
	owner := e.person(roleOwner, org)
	gw := e.gateway(org, roleAdmin)
	e.pool.Close()
	for _, r := range []response{
		owner.do("GET", "/orgs/"+org+"/monitors", ""),
		gw.do("GET", "/v1/monitors", ""),
		gw.do("POST", "/v1/monitors", `{"name":"n","type":"http","target":"https://example.com"}`),
		e.anon().do("POST", "/auth/login", `{"email":"a@example.com","password":"p"}`),
	} {
		want(t, r, 500, `{"error":"internal"}`)
	}
	if n := e.logs.FilterMessage("internal error").Len(); n != 4 {
		t.Errorf("internal error log lines = %d, want 4", n)
	}
}

func TestUnreachableDatabaseIs503(t *testing.T) {
	e := newTestEnv(t)
	org := e.org("pro")
	owner := e.person(roleOwner, org)
	gw := e.gateway(org, roleAdmin)
	// The same server, its pool now pointing where no PostgreSQL listens.
	e.srv.pool = schematest.UnreachablePool(t)
	for _, r := range []response{
		owner.do("GET", "/orgs/"+org+"/monitors", ""),
		gw.do("POST", "/v1/monitors", `{"name":"n","type":"http","target":"https://example.com"}`),
		e.anon().do("POST", "/auth/login", `{"email":"a@example.com","password":"p"}`),
	} {
		want(t, r, 503, `{"error":"service_unavailable"}`)
	}
	if n := e.logs.FilterMessage("database unavailable").Len(); n != 3 {
		t.Errorf("database unavailable log lines = %d, want 3", n)
	}
}

// lockedBuffer is a bytes.Buffer safe for the logger's and the test's goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func TestLogsCarryNoSecrets(t *testing.T) {
	var logs lockedBuffer
	e := newTestEnv(t, func(c *Config) { c.Logger = newLogger(&logs) })
	org := e.org("pro")
	email, password := e.user()
	e.member(org, email, roleOwner)
	owner := e.login(email, password)
	token := strings.TrimPrefix(owner.header.Get("Cookie"), "session=")

	var key struct{ ID, Key string }
	owner.do("POST", "/orgs/"+org+"/api-keys", `{"name":"ci","role":"Admin"}`).decode(t, &key)
	gw := e.gateway(org, roleAdmin)
	wantStatus(t, gw.do("POST", "/v1/monitors", `{"name":"n","type":"http","target":"https://example.com","config":{"token":"CONFIG-SECRET"}}`), 201)
	wantStatus(t, e.anon().with(headerSecret, "WRONG-SECRET").do("GET", "/v1/monitors", ""), 401)
	wantStatus(t, e.anon().do("POST", "/auth/login", `{"email":"`+email+`","password":"WRONG-PASSWORD"}`), 401)
	wantStatus(t, owner.do("POST", "/auth/logout", ""), 204)

	out := logs.String()
	if !strings.Contains(out, `"msg":"request"`) || !strings.Contains(out, `"path":"/auth/login"`) {
		t.Fatalf("no request log:\n%s", out)
	}
	for _, secret := range []string{password, "WRONG-PASSWORD", token, testSecret, "WRONG-SECRET", key.Key,
		key.Key[strings.IndexByte(key.Key, '.')+1:], "CONFIG-SECRET", "session="} {
		if strings.Contains(out, secret) {
			t.Errorf("logs contain %q:\n%s", secret, out)
		}
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var entry map[string]any
		if err := json.Unmarshal([]byte(line), &entry); err != nil {
			t.Errorf("log line %q is not JSON", line)
		}
	}
}

func TestTheOpenAPIDocumentsAreServedByteForByteWithoutAuthentication(t *testing.T) {
	e := newTestEnv(t)
	for _, name := range openapi.Names {
		want, err := openapi.Files.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		r := e.anon().do("GET", "/openapi/"+name, "")
		if r.status != http.StatusOK || r.body != string(want) {
			t.Errorf("GET /openapi/%s: %d, %d bytes; want 200 and the %d bytes of the file", name, r.status, len(r.body), len(want))
		}
		if ct := r.header.Get("Content-Type"); ct != "application/yaml" {
			t.Errorf("GET /openapi/%s: Content-Type %q, want application/yaml", name, ct)
		}
	}
	want(t, e.anon().do("GET", "/openapi/other.yaml", ""), 404, bodyNotFound)
}
