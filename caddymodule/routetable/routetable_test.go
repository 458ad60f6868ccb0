package routetable

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
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

// TestARuleNamingGETMatchesHEAD: a service answers a HEAD with its GET handler, so a
// rule naming GET weighs and scopes HEAD alike; a rule naming HEAD alone does not
// match GET.
func TestARuleNamingGETMatchesHEAD(t *testing.T) {
	table := New([]Rule{
		{Methods: []string{"GET"}, Path: "/v1/reports/*", Scope: "reports:read", Cost: 20},
		{Methods: []string{"HEAD"}, Path: "/v1/heads", Cost: 3},
	})
	for _, tc := range []struct {
		method, path string
		cost         int
		matched      bool
	}{
		{"GET", "/v1/reports/q1", 20, true},
		{"HEAD", "/v1/reports/q1", 20, true},
		{"POST", "/v1/reports/q1", 1, false},
		{"HEAD", "/v1/heads", 3, true},
		{"GET", "/v1/heads", 1, false},
	} {
		rt := table.Match(httptest.NewRequest(tc.method, tc.path, nil))
		if rt.Cost() != tc.cost || (rt != nil) != tc.matched {
			t.Errorf("%s %s: cost %d, matched %v; want %d, %v", tc.method, tc.path, rt.Cost(), rt != nil, tc.cost, tc.matched)
		}
	}
	if ok, missing := table.Match(httptest.NewRequest("HEAD", "/v1/reports/q1", nil)).Allows([]string{"monitors:read"}); ok || missing != "reports:read" {
		t.Errorf("HEAD of a GET rule with scope reports:read, for a key without it: %v %q", ok, missing)
	}
}

// TestACostIsFromOneToAMillion: Check refuses a cost below 1 or above MaxCost, in the
// JSON config too, where a cost given as 0 is refused and a cost left out is 1.
func TestACostIsFromOneToAMillion(t *testing.T) {
	for _, tc := range []struct {
		json string
		want string // the error's end; "" none
		cost int
	}{
		{`{"path":"/v1/r"}`, "", 0},
		{`{"path":"/v1/r","cost":1}`, "", 1},
		{`{"path":"/v1/r","cost":1000000}`, "", MaxCost},
		{`{"path":"/v1/r","cost":1000001}`, "cost 1000001 must be from 1 to 1000000", 0},
		{`{"path":"/v1/r","cost":100000000000000000}`, "cost 100000000000000000 must be from 1 to 1000000", 0},
		{`{"path":"/v1/r","cost":0}`, "cost 0 must be from 1 to 1000000", 0},
		{`{"path":"/v1/r","cost":-5}`, "cost -5 must be from 1 to 1000000", 0},
		{`{"methods":["GET"],"path":"/v1/r","scope":"reports:read"}`, "", 0},
	} {
		var r Rule
		err := json.Unmarshal([]byte(tc.json), &r)
		if err == nil {
			err = Check(r)
		}
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v, want it accepted", tc.json, err)
		case tc.want != "" && (err == nil || !strings.HasSuffix(err.Error(), tc.want)):
			t.Errorf("%s: %v, want …%s", tc.json, err, tc.want)
		case tc.want == "" && r.Cost != tc.cost:
			t.Errorf("%s: cost %d, want %d", tc.json, r.Cost, tc.cost)
		}
	}
	if r := (Rule{Methods: []string{"GET"}, Path: "/v1/r", Scope: "reports:read"}); func() error {
		var back Rule
		b, _ := json.Marshal(r)
		return json.Unmarshal(b, &back)
	}() != nil {
		t.Error("a rule without a cost does not survive its own JSON")
	}
}

// TestCheckTarget: every path whose segments a service could read otherwise than the
// table matched it is refused, however it is spelled; any other path passes, with
// its case, encoded letters, a trailing slash and its query.
func TestCheckTarget(t *testing.T) {
	for target, want := range map[string]string{
		"/v1/monitors":                     "",
		"/v1/monitors/":                    "",
		"/v1/Monitors/M1":                  "",
		"/v1/%6donitors":                   "",
		"/v1/monitors/a%20b":               "",
		"/v1/monitors?x=..%2F..&y=//":      "",
		"/v1/me.json":                      "",
		"/v1/monitors/..x":                 "",
		"/v1/monitors/...":                 "",
		"/v1/reports/q1%2F..%2F..%2Fme":    PathEncoded,
		"/v1/reports/q1%2f":                PathEncoded,
		"/v1/monitors/..%2Fme":             PathEncoded,
		"/v1/reports%5Cx":                  PathBackslash,
		"/v1/reports%5cx":                  PathBackslash,
		"/v1/monitors/%2E%2E/me":           PathEncoded,
		"/v1/monitors/%2e":                 PathEncoded,
		"/v1/monitors/a%2Ejson":            PathEncoded,
		"/v1/monitors/../me":               PathDotSegment,
		"/v1/monitors/..":                  PathDotSegment,
		"/v1/./me":                         PathDotSegment,
		"/v1/monitors/.":                   PathDotSegment,
		"/admin/../v1/me":                  PathDotSegment,
		"/v1//me":                          PathEmptySegment,
		"//v1/me":                          PathEmptySegment,
		"/v1/monitors//":                   PathEmptySegment,
		"/v1/monitors/a\\b":                PathBackslash,
		"http://gw/v1/monitors/%2e%2e/me":  PathEncoded,
		"http://gw/v1/monitors/x/../../me": PathDotSegment,
		"/v1/reports/%252F":                "",
		"/v1/reports/%25":                  "",
		"/v1/reports/%":                    "",
	} {
		u, err := url.ParseRequestURI(target)
		if err != nil {
			if want != "" && strings.HasSuffix(target, "%") {
				continue
			}
			u = &url.URL{Path: target}
		}
		if got := CheckTarget(u); got != want {
			t.Errorf("%s: %q, want %q", target, got, want)
		}
	}
}
