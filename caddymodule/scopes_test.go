package caddymodule

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/limiter"
)

// oneKey is a Verifier double that knows one key, whatever the key id.
type oneKey struct{ key keystore.Key }

func (v oneKey) VerifyParsed(context.Context, string, string, netip.Addr) (keystore.Key, bool, error) {
	return v.key, true, nil
}

// scopedHandler is newTestHandler with key as the one key, and routes as the route
// table (nil: the built-in one).
func scopedHandler(t testing.TB, key keystore.Key, routes []Route) *Handler {
	t.Helper()
	h := &Handler{DatabaseURL: "postgres://unused", GatewaySecret: testSecret, Routes: routes}
	if err := h.configure(zap.NewNop()); err != nil {
		t.Fatal(err)
	}
	h.metrics = newMetrics()
	withDoubles(h, oneKey{key}, limiter.NewLocal(limiter.WithClock(func() time.Time { return testNow })))
	return h
}

// serveOnce sends one request of the handler's key and returns the answer and the
// request the upstream saw (nil: none).
func serveOnce(t *testing.T, h *Handler, method, path string) (*httptest.ResponseRecorder, *http.Request) {
	t.Helper()
	r := httptest.NewRequest(method, "http://gw"+path, nil)
	r.Header.Set("Authorization", bearer(admin))
	r.Header.Set("X-Gateway-Key-Scopes", "monitors:delete") // a client's own never passes
	var seen *http.Request
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		seen = r
		return jsonUpstream(w, r)
	})
	w := httptest.NewRecorder()
	if err := h.ServeHTTP(w, r, next); err != nil {
		t.Fatalf("ServeHTTP: %v", err)
	}
	return w, seen
}

// TestScopeDecisions decides every combination of role, scopes and built-in rule
// against a table written out by hand: the role first, then a scoped key's scopes,
// deny by default, GET /v1/me free of both.
func TestScopeDecisions(t *testing.T) {
	const read, write, del = "monitors:read", "monitors:write", "monitors:delete"
	// What each request needs under the built-in table; absent: no rule matches.
	needs := map[string]string{
		"GET /v1/monitors": read, "HEAD /v1/monitors": read, "GET /v1/monitors/m1": read,
		"HEAD /v1/MONITORS/m1": read, "GET /v1//monitors/./m1": read,
		"POST /v1/monitors": write, "PATCH /v1/monitors/m1": write, "DELETE /v1/monitors/m1": del,
	}
	requests := []string{
		"GET /v1/monitors", "HEAD /v1/monitors", "GET /v1/monitors/m1", "HEAD /v1/MONITORS/m1",
		"GET /v1//monitors/./m1", "POST /v1/monitors", "PATCH /v1/monitors/m1", "DELETE /v1/monitors/m1",
		"PUT /v1/monitors/m1", "POST /v1/monitors/m1", "OPTIONS /v1/monitors", "GET /v1/reports",
		"GET /v1/me", "HEAD /v1/me",
	}
	scopeSets := [][]string{nil, {read}, {write}, {del}, {read, write}, {read, write, del}}
	for _, role := range []keystore.Role{keystore.RoleAdmin, keystore.RoleEditor, keystore.RoleViewer} {
		for _, scopes := range scopeSets {
			for _, req := range requests {
				method, path, _ := strings.Cut(req, " ")
				name := fmt.Sprintf("%s %v %s", role, scopes, req)
				t.Run(name, func(t *testing.T) {
					key := keystore.Key{ID: "k", OrgID: "org-1", Role: role, RateLimit: 600, Scopes: scopes}
					w, seen := serveOnce(t, scopedHandler(t, key, nil), method, path)
					me := path == "/v1/me"
					status, body := http.StatusOK, ""
					need, ruled := needs[req]
					switch {
					case role == keystore.RoleViewer && !readOnlyMethod(method):
						status, body = 403, `{"error":"forbidden","reason":"role","required_role":"Editor"}`
					case scopes != nil && !me && !ruled:
						status, body = 403, `{"error":"forbidden","reason":"scope"}`
					case scopes != nil && !me && !slices.Contains(scopes, need):
						status, body = 403, `{"error":"forbidden","reason":"scope","required_scope":"`+need+`"}`
					}
					if w.Code != status {
						t.Fatalf("status %d %s, want %d %s", w.Code, w.Body, status, body)
					}
					if body != "" && w.Body.String() != body {
						t.Errorf("body %s, want %s", w.Body, body)
					}
					if proxied := status == 200 && !me; (seen != nil) != proxied {
						t.Errorf("proxied %v, want %v", seen != nil, proxied)
					}
					if w.Header().Get("Ratelimit") != `"default";r=599;t=45` {
						t.Errorf("RateLimit %q: every decision after the budgets counts", w.Header().Get("Ratelimit"))
					}
					if seen == nil {
						return
					}
					got, want := seen.Header.Values("X-Gateway-Key-Scopes"), []string(nil)
					if scopes != nil {
						want = []string{strings.Join(scopes, " ")}
					}
					if !slices.Equal(got, want) {
						t.Errorf("X-Gateway-Key-Scopes %q, want %q", got, want)
					}
				})
			}
		}
	}
}

// TestMeShowsTheScopes: GET /v1/me gives a scoped key its scopes, and null to an
// unscoped one.
func TestMeShowsTheScopes(t *testing.T) {
	for _, tc := range []struct {
		scopes []string
		want   string
	}{
		{nil, `"scopes":null`},
		{[]string{"monitors:read", "monitors:write"}, `"scopes":["monitors:read","monitors:write"]`},
	} {
		key := keystore.Key{ID: "k", OrgID: "org-1", Role: keystore.RoleEditor, RateLimit: 600, Scopes: tc.scopes}
		w, _ := serveOnce(t, scopedHandler(t, key, nil), "GET", "/v1/me")
		if want := `{"org_id":"org-1","role":"Editor",` + tc.want + `,` + noLimits("600")[len(`"scopes":null,`):] + `}`; w.Code != 200 || w.Body.String() != want {
			t.Errorf("GET /v1/me of %v: %d %s, want %s", tc.scopes, w.Code, w.Body, want)
		}
	}
}

// TestACustomTableWeighsEachRoute: a table of the operator's replaces the built-in one;
// each rule's cost counts at every budget, RateLimit shows units, and a cost that does
// not fit in what is left is refused whole and counts nothing.
func TestACustomTableWeighsEachRoute(t *testing.T) {
	routes := []Route{
		{Methods: []string{"GET", "HEAD"}, Path: "/v1/monitors*", Scope: "monitors:read"},
		{Methods: []string{"POST"}, Path: "/v1/monitors", Scope: "monitors:write", Cost: 5},
		{Path: "/v1/reports/*", Scope: "reports:read", Cost: 20},
	}
	for _, scopes := range [][]string{nil, {"monitors:read", "monitors:write"}} {
		key := keystore.Key{ID: "k", OrgID: "org-1", Role: keystore.RoleEditor, RateLimit: 8, Scopes: scopes}
		h := scopedHandler(t, key, routes)
		for i, step := range []struct {
			method, path string
			status       int
			ratelimit    string
		}{
			{"POST", "/v1/monitors", 200, `"default";r=3;t=45`},
			{"POST", "/v1/monitors", 429, `"default";r=3;t=45`}, // 5 with 3 left: nothing counted
			{"GET", "/v1/monitors/m1", 200, `"default";r=2;t=45`},
			{"GET", "/v1/me", 200, `"default";r=1;t=45`}, // no rule of this table: 1
			{"GET", "/v1/monitors", 200, `"default";r=0;t=45`},
			{"GET", "/v1/monitors", 429, `"default";r=0;t=45`},
		} {
			w, _ := serveOnce(t, h, step.method, step.path)
			if w.Code != step.status || w.Header().Get("Ratelimit") != step.ratelimit {
				t.Errorf("scopes %v, step %d %s %s: %d %s RateLimit %q; want %d %q",
					scopes, i, step.method, step.path, w.Code, w.Body, w.Header().Get("Ratelimit"), step.status, step.ratelimit)
			}
			// A request of cost above 1 says its cost.
			cost := map[string]string{"POST": `,"cost":5`}[step.method]
			if step.status == 429 && w.Body.String() != `{"error":"rate_limited","retryAfter":45,"budget":"key","window":"minute"`+cost+`}` {
				t.Errorf("step %d: 429 body %s", i, w.Body)
			}
		}
		// The table replaced the built-in one: DELETE has no rule, so a scoped key is
		// refused it whatever its scopes; an unscoped key's role decides.
		key.RateLimit = 600
		h = scopedHandler(t, key, routes)
		w, _ := serveOnce(t, h, "DELETE", "/v1/monitors/m1")
		if scopes != nil && (w.Code != 403 || w.Body.String() != `{"error":"forbidden","reason":"scope"}`) ||
			scopes == nil && w.Code != 200 {
			t.Errorf("scopes %v, DELETE without a rule: %d %s", scopes, w.Code, w.Body)
		}
		w, _ = serveOnce(t, h, "GET", "/v1/reports/r1")
		if scopes != nil && w.Body.String() != `{"error":"forbidden","reason":"scope","required_scope":"reports:read"}` ||
			scopes == nil && (w.Code != 200 || w.Header().Get("Ratelimit") != `"default";r=579;t=45`) {
			t.Errorf("scopes %v, GET of a report: %d %s", scopes, w.Code, w.Body)
		}
	}
}

// TestBadRoutesAreRefused: what caddy validate refuses.
func TestBadRoutesAreRefused(t *testing.T) {
	for _, r := range []Route{
		{Path: ""}, {Path: "  "}, {Methods: []string{"FETCH"}, Path: "/v1/x"}, {Methods: []string{"get"}, Path: "/v1/x"},
		{Path: "/v1/x", Scope: "Monitors:Read"}, {Path: "/v1/x", Scope: "1monitors"}, {Path: "/v1/x", Scope: "monitors read"},
		{Path: "/v1/x", Cost: -1},
	} {
		h := &Handler{DatabaseURL: "postgres://unused", GatewaySecret: testSecret, Routes: []Route{r}}
		if err := h.configure(zap.NewNop()); err == nil {
			t.Errorf("route %+v was accepted", r)
		}
	}
}
