package caddymodule

import (
	"net/http"
	"testing"

	"github.com/keygate/keygate/keystore"
)

// windowRoutes weigh a read 1, a create 3 and a report 9.
var windowRoutes = []Route{
	{Methods: []string{"GET", "HEAD"}, Path: "/v1/monitors*", Scope: "monitors:read"},
	{Methods: []string{"POST"}, Path: "/v1/monitors", Scope: "monitors:write", Cost: 3},
	{Path: "/v1/reports/*", Scope: "reports:read", Cost: 9},
}

// TestAKeysWindowsAnswerEachRefusal: a key's windows beside its minute show in
// RateLimit-Policy and RateLimit in their order, and each refusal names its budget
// and window, with Retry-After to that window's end (testNow is 03:04:15 UTC), the
// cost of a request above 1, and no Retry-After for a cost above the window's whole
// limit.
func TestAKeysWindowsAnswerEachRefusal(t *testing.T) {
	const policy = `"default";q=1000;w=60, "second";q=4;w=1, "day";q=6;w=86400`
	type step struct {
		method, path string
		status       int
		body         string // "" for the upstream's
		retryAfter   string // "" for none
		policy       string
		ratelimit    string
	}
	for _, tc := range []struct {
		name  string
		key   keystore.Key
		steps []step
	}{
		{"a second and a day", keystore.Key{RateLimit: 1000, Windows: [3]int{4, -1, 6}}, []step{
			{"GET", "/v1/monitors", 200, "", "", policy, `"default";r=999;t=45, "second";r=3;t=1, "day";r=5;t=75345`},
			{"GET", "/v1/monitors", 200, "", "", policy, `"default";r=998;t=45, "second";r=2;t=1, "day";r=4;t=75345`},
			// 3 units with 2 left in the second: refused whole, nothing spent.
			{"POST", "/v1/monitors", 429, `{"error":"rate_limited","retryAfter":1,"budget":"key","window":"second","cost":3}`, "1",
				policy, `"default";r=998;t=45, "second";r=2;t=1, "day";r=4;t=75345`},
			// 9 units fit neither the second's 4 nor the day's 6: the day, no wait helps.
			{"GET", "/v1/reports/r1", 429, `{"error":"rate_limited","budget":"key","window":"day","cost":9,"limit":6,"fits":false}`, "",
				policy, `"default";r=998;t=45, "second";r=2;t=1, "day";r=4;t=75345`},
			{"GET", "/v1/monitors", 200, "", "", policy, `"default";r=997;t=45, "second";r=1;t=1, "day";r=3;t=75345`},
			{"GET", "/v1/monitors", 200, "", "", policy, `"default";r=996;t=45, "second";r=0;t=1, "day";r=2;t=75345`},
			{"GET", "/v1/monitors", 429, `{"error":"rate_limited","retryAfter":1,"budget":"key","window":"second"}`, "1",
				policy, `"default";r=996;t=45, "second";r=0;t=1, "day";r=2;t=75345`},
			{"GET", "/v1/me", 429, `{"error":"rate_limited","retryAfter":1,"budget":"key","window":"second"}`, "1", "", ""},
		}},
		{"a day alone, without a minute", keystore.Key{RateLimit: -1, Windows: [3]int{-1, -1, 2}}, []step{
			{"GET", "/v1/monitors", 200, "", "", `"day";q=2;w=86400`, `"day";r=1;t=75345`},
			{"GET", "/v1/me", 200, `{"org_id":"org-1","role":"Editor","scopes":null,"limits":{"per_minute":null,"per_second":null,"per_hour":null,"per_day":2,` +
				`"org_per_minute":null,"per_month":null,"used_this_month":null}}`, "", `"day";q=2;w=86400`, `"day";r=0;t=75345`},
			// Retry-After: to midnight UTC.
			{"GET", "/v1/monitors", 429, `{"error":"rate_limited","retryAfter":75345,"budget":"key","window":"day"}`, "75345",
				`"day";q=2;w=86400`, `"day";r=0;t=75345`},
		}},
		{"an hour", keystore.Key{RateLimit: 1000, Windows: [3]int{-1, 4, -1}}, []step{
			{"GET", "/v1/monitors", 200, "", "", `"default";q=1000;w=60, "hour";q=4;w=3600`, `"default";r=999;t=45, "hour";r=3;t=3345`},
			{"GET", "/v1/monitors", 200, "", "", `"default";q=1000;w=60, "hour";q=4;w=3600`, `"default";r=998;t=45, "hour";r=2;t=3345`},
			{"POST", "/v1/monitors", 429, `{"error":"rate_limited","retryAfter":3345,"budget":"key","window":"hour","cost":3}`, "3345",
				`"default";q=1000;w=60, "hour";q=4;w=3600`, `"default";r=998;t=45, "hour";r=2;t=3345`},
		}},
		{"an org's minute after the key's windows", keystore.Key{RateLimit: 1000, Windows: [3]int{20, -1, -1}, OrgRateLimit: 4}, []step{
			{"POST", "/v1/monitors", 200, "", "", `"default";q=1000;w=60, "second";q=20;w=1, "org";q=4;w=60`,
				`"default";r=997;t=45, "second";r=17;t=1, "org";r=1;t=45`},
			{"POST", "/v1/monitors", 429, `{"error":"rate_limited","retryAfter":45,"budget":"org","window":"minute","cost":3}`, "45",
				`"default";q=1000;w=60, "second";q=20;w=1, "org";q=4;w=60`, `"default";r=994;t=45, "second";r=14;t=1, "org";r=1;t=45`},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := tc.key
			key.ID, key.OrgID, key.Role = "k", "org-1", keystore.RoleEditor
			h := scopedHandler(t, key, windowRoutes)
			for i, st := range tc.steps {
				w, seen := serveOnce(t, h, st.method, st.path)
				body := st.body
				if body == "" {
					body = `{"id":"m1"}`
				}
				if w.Code != st.status || w.Body.String() != body || (seen != nil) != (st.status == 200 && st.path != "/v1/me") {
					t.Errorf("step %d %s %s: %d %s; want %d %s", i, st.method, st.path, w.Code, w.Body, st.status, body)
				}
				if got := w.Header().Get("Retry-After"); got != st.retryAfter {
					t.Errorf("step %d: Retry-After %q, want %q", i, got, st.retryAfter)
				}
				if st.policy == "" {
					continue
				}
				if got := w.Header().Get("RateLimit-Policy"); got != st.policy {
					t.Errorf("step %d: RateLimit-Policy %q, want %q", i, got, st.policy)
				}
				if got := w.Header().Get("RateLimit"); got != st.ratelimit {
					t.Errorf("step %d: RateLimit %q, want %q", i, got, st.ratelimit)
				}
			}
		})
	}
}

// TestRefusalsThatExplain: a 402 names the month's limit and what it has used, a
// role's 403 the least role that may.
func TestRefusalsThatExplain(t *testing.T) {
	key := keystore.Key{ID: "k", OrgID: "org-1", Role: keystore.RoleEditor, RateLimit: 1000, MonthlyQuota: 5}
	h := scopedHandler(t, key, windowRoutes)
	for i, st := range []struct {
		status int
		body   string
	}{
		{200, `{"id":"m1"}`},
		// 3 more with 2 left in the month: refused, with the month's use.
		{402, `{"error":"quota_exceeded","metric":"api_requests","upgrade":true,"limit":5,"used":3}`},
	} {
		if w, _ := serveOnce(t, h, "POST", "/v1/monitors"); w.Code != st.status || w.Body.String() != st.body ||
			w.Header().Get("Retry-After") != "" {
			t.Errorf("step %d: %d %s Retry-After %q; want %d %s and none", i, w.Code, w.Body, w.Header().Get("Retry-After"), st.status, st.body)
		}
	}
	key.Role = keystore.RoleViewer
	w, _ := serveOnce(t, scopedHandler(t, key, nil), "DELETE", "/v1/monitors/m1")
	if w.Code != http.StatusForbidden || w.Body.String() != `{"error":"forbidden","reason":"role","required_role":"Editor"}` {
		t.Errorf("a Viewer deleting: %d %s", w.Code, w.Body)
	}
}
