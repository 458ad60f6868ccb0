package routetable

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// TestRouteMatchingIsCaddys: the table's own matcher agrees with Caddy's path matcher
// on every pattern it handles, and hands the rest to Caddy's.
func TestRouteMatchingIsCaddys(t *testing.T) {
	patterns := []string{"/v1/monitors", "/v1/monitors/*", "/v1/monitors*", "*/m1", "*monitors*", "/v1/*/m1",
		"/v1/monitors/m?", "/V1/Monitors", "*", "/v1/%6donitors", "/v1//monitors"}
	paths := []string{"/v1/monitors", "/v1/monitors/", "/v1/monitors/m1", "/V1/MONITORS/M1", "/v1//monitors",
		"/v1/./monitors/m1", "/v1/monitors/../me", "/v1/monitorsx", "/v1/reports/m1", "/v1/%6donitors"}
	for _, p := range patterns {
		table := New([]Rule{{Path: p}})
		for _, path := range paths {
			r := httptest.NewRequest("GET", "http://gw"+path, nil)
			r = withReplacer(r)
			want := caddyhttp.MatchPath{strings.ToLower(p)}.Match(r)
			if got := table.Match(r) != nil; got != want {
				t.Errorf("pattern %q, path %q: matched %v, Caddy's matcher %v", p, path, got, want)
			}
		}
	}
}

// TestCostAndScopesOfARoute: a request no rule matched costs 1 and is refused to a
// scoped key; a rule's scope is needed by a scoped key only.
func TestCostAndScopesOfARoute(t *testing.T) {
	table := New([]Rule{{Methods: []string{"POST"}, Path: "/v1/reports", Scope: "reports:write", Cost: 20}, {Path: "/v1/open"}})
	post := table.Match(httptest.NewRequest("POST", "/v1/reports", nil))
	open := table.Match(httptest.NewRequest("GET", "/v1/open", nil))
	none := table.Match(httptest.NewRequest("GET", "/v1/reports", nil))
	if !table.Weighed || post.Cost() != 20 || open.Cost() != 1 || none != nil || none.Cost() != 1 {
		t.Fatalf("weighed %v, costs %d %d %d (nil %v)", table.Weighed, post.Cost(), open.Cost(), none.Cost(), none == nil)
	}
	for _, tc := range []struct {
		rt      *Route
		scopes  []string
		ok      bool
		missing string
	}{
		{post, nil, true, ""},
		{post, []string{"reports:write"}, true, ""},
		{post, []string{"reports:read"}, false, "reports:write"},
		{open, []string{"reports:read"}, true, ""},
		{none, nil, true, ""},
		{none, []string{"reports:read"}, false, ""},
	} {
		if ok, missing := tc.rt.Allows(tc.scopes); ok != tc.ok || missing != tc.missing {
			t.Errorf("route %+v, scopes %v: %v %q, want %v %q", tc.rt, tc.scopes, ok, missing, tc.ok, tc.missing)
		}
	}
}

// withReplacer gives r the replacer Caddy's server gives every request.
func withReplacer(r *http.Request) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, caddy.NewReplacer()))
}
