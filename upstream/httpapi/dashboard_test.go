package httpapi

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
)

// form returns c sending form bodies.
func (c *client) form() *client {
	return c.with("Content-Type", "application/x-www-form-urlencoded")
}

// fullKeyPattern finds a full key of the test servers' prefix in a page.
var fullKeyPattern = regexp.MustCompile(`mon_live_[A-Za-z0-9]+\.[A-Za-z0-9_-]{20,}`)

// dashboardKey creates a key through the JSON API and returns its id and full key.
func dashboardKey(t *testing.T, owner *client, org, name string) (id, full string) {
	t.Helper()
	r := owner.do("POST", "/orgs/"+org+"/api-keys", jsonBody(map[string]string{"name": name, "role": "Admin"}))
	if r.status != http.StatusCreated {
		t.Fatalf("creating key: %d %s", r.status, r.body)
	}
	var k createdKeyJSON
	r.decode(t, &k)
	return k.ID, k.Key
}

// liveKey reports whether full still verifies.
func (e *testEnv) liveKey(full string) bool {
	e.t.Helper()
	_, ok, err := e.srv.keys.Verify(context.Background(), full)
	if err != nil {
		e.t.Fatal(err)
	}
	return ok
}

// keyCount returns the number of keys of org.
func (e *testEnv) keyCount(org string) int {
	e.t.Helper()
	recs, err := e.srv.keys.List(context.Background(), org)
	if err != nil {
		e.t.Fatal(err)
	}
	return len(recs)
}

func TestDashboardRefusesCrossSiteFormsAndChangesNothing(t *testing.T) {
	e := newTestEnv(t)
	org := e.org("pro")
	email, password := e.user()
	e.member(org, email, roleOwner)
	owner := e.login(email, password)
	id, full := dashboardKey(t, owner, org, "kept")
	login := url.Values{"email": {email}, "password": {password}}.Encode()
	create := url.Values{"name": {"new"}, "role": {"Admin"}}.Encode()
	for _, origin := range [][]string{
		{"Sec-Fetch-Site", "cross-site"},
		{"Sec-Fetch-Site", "same-site"},
		{"Origin", "https://evil.example"},
	} {
		for _, tc := range []struct {
			name, path, body string
			c                *client
		}{
			{"login", "/dashboard/login", login, e.anon()},
			{"logout", "/dashboard/logout", "", owner},
			{"create", "/dashboard/orgs/" + org + "/keys", create, owner},
			{"revoke", "/dashboard/orgs/" + org + "/keys/" + id + "/revoke", "", owner},
			{"roll", "/dashboard/orgs/" + org + "/keys/" + id + "/roll", "grace_seconds=0", owner},
		} {
			t.Run(tc.name+" "+origin[0]+" "+origin[1], func(t *testing.T) {
				r := tc.c.form().with(origin...).do("POST", tc.path, tc.body)
				if r.status != http.StatusForbidden {
					t.Fatalf("status %d, want 403: %s", r.status, r.body)
				}
				if len(r.cookies()) != 0 {
					t.Errorf("a refused form set cookies: %v", r.cookies())
				}
			})
		}
	}
	if n := e.keyCount(org); n != 1 {
		t.Errorf("org has %d keys after the refused forms, want 1", n)
	}
	if !e.liveKey(full) {
		t.Error("the key was revoked or rolled by a refused form")
	}
	if r := owner.do("GET", "/orgs/"+org+"/api-keys", ""); r.status != http.StatusOK {
		t.Errorf("the session no longer works after a refused logout: %d", r.status)
	}
	// The same form from the dashboard's own origin passes.
	r := owner.form().with("Sec-Fetch-Site", "same-origin").do("POST", "/dashboard/orgs/"+org+"/keys/"+id+"/revoke", "")
	if r.status != http.StatusSeeOther || e.liveKey(full) {
		t.Errorf("same-origin revoke: %d, key live %v", r.status, e.liveKey(full))
	}
}

func TestDashboardPagesCarryTheSecurityHeaders(t *testing.T) {
	e := newTestEnv(t)
	org := e.org("pro")
	owner := e.person(roleOwner, org)
	for _, tc := range []struct {
		name, path string
		c          *client
		status     int
		ctype      string
	}{
		{"login page", "/dashboard", e.anon(), 200, "text/html; charset=utf-8"},
		{"keys page", "/dashboard/orgs/" + org, owner, 200, "text/html; charset=utf-8"},
		{"audit page", "/dashboard/orgs/" + org + "/audit", owner, 200, "text/html; charset=utf-8"},
		{"not a member", "/dashboard/orgs/00000000-0000-0000-0000-000000000000", owner, 404, "text/html; charset=utf-8"},
		{"stylesheet", "/dashboard/static/dashboard.css", e.anon(), 200, "text/css; charset=utf-8"},
		{"script", "/dashboard/static/dashboard.js", e.anon(), 200, "text/javascript; charset=utf-8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.c.do("GET", tc.path, "")
			if r.status != tc.status {
				t.Fatalf("status %d, want %d: %s", r.status, tc.status, r.body)
			}
			for name, want := range map[string]string{
				"Content-Security-Policy": dashboardCSP,
				"X-Frame-Options":         "DENY",
				"X-Content-Type-Options":  "nosniff",
				"Referrer-Policy":         "no-referrer",
				"Content-Type":            tc.ctype,
			} {
				if got := r.header.Get(name); got != want {
					t.Errorf("%s: %q, want %q", name, got, want)
				}
			}
		})
	}
	for _, bad := range []string{"unsafe-inline", "unsafe-eval", "http:", "https:", "*"} {
		if strings.Contains(dashboardCSP, bad) {
			t.Errorf("the CSP allows %s", bad)
		}
	}
	if !strings.Contains(dashboardCSP, "frame-ancestors 'none'") || !strings.Contains(dashboardCSP, "default-src 'none'") {
		t.Errorf("CSP %q lacks frame-ancestors 'none' or default-src 'none'", dashboardCSP)
	}
}

func TestDashboardShowsANewKeyOnceAndMaskedAfter(t *testing.T) {
	e := newTestEnv(t)
	org := e.org("pro")
	owner := e.person(roleOwner, org)
	r := owner.form().do("POST", "/dashboard/orgs/"+org+"/keys", url.Values{"name": {"ci"}, "role": {"Editor"}}.Encode())
	if r.status != http.StatusCreated {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	full := fullKeyPattern.FindString(r.body)
	if full == "" || !strings.Contains(r.body, `data-testid="new-key">`+full+`</code>`) {
		t.Fatalf("no new-key in the create answer: %s", r.body)
	}
	if !e.liveKey(full) {
		t.Fatal("the key shown does not verify")
	}
	page := owner.do("GET", "/dashboard/orgs/"+org, "")
	secret := full[strings.IndexByte(full, '.')+1:]
	if strings.Contains(page.body, secret) || strings.Contains(page.body, "new-key") {
		t.Errorf("the keys page shows the secret again: %s", page.body)
	}
	if !strings.Contains(page.body, `data-testid="key-row"`) || !strings.Contains(page.body, ".********") {
		t.Errorf("the keys page lacks the masked row: %s", page.body)
	}
}

func TestDashboardErrorsAreWords(t *testing.T) {
	e := newTestEnv(t)
	org, free := e.org("pro"), e.org("free")
	email, password := e.user()
	e.member(org, email, roleOwner)
	e.member(free, email, roleOwner)
	owner := e.login(email, password)
	for _, tc := range []struct {
		name, path, body string
		status           int
		words            string
	}{
		{"wrong password", "/dashboard/login", url.Values{"email": {email}, "password": {"not the password"}}.Encode(), 401, "Wrong email or password."},
		{"no api access", "/dashboard/orgs/" + free + "/keys", url.Values{"name": {"k"}, "role": {"Admin"}}.Encode(), 403, "has no API access"},
		{"name too long", "/dashboard/orgs/" + org + "/keys", url.Values{"name": {strings.Repeat("n", 101)}, "role": {"Admin"}}.Encode(), 400, "name: must be 1 to 100 characters long"},
		{"expiry in the past", "/dashboard/orgs/" + org + "/keys", url.Values{"name": {"k"}, "role": {"Admin"}, "expires_at": {"2001-01-01T00:00"}}.Encode(), 400, "expires_at: must be in the future"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := owner.form().do("POST", tc.path, tc.body)
			if r.status != tc.status || !strings.Contains(r.body, tc.words) {
				t.Errorf("status %d, want %d with %q: %s", r.status, tc.status, tc.words, r.body)
			}
			if ct := r.header.Get("Content-Type"); ct != "text/html; charset=utf-8" {
				t.Errorf("Content-Type %q", ct)
			}
		})
	}
}

func TestDashboardMembersWhoMayNotManageKeysSeeNoControls(t *testing.T) {
	e := newTestEnv(t)
	org := e.org("pro")
	owner := e.person(roleOwner, org)
	id, full := dashboardKey(t, owner, org, "shared")
	for _, role := range []string{roleEditor, roleViewer} {
		t.Run(role, func(t *testing.T) {
			m := e.person(role, org)
			page := m.do("GET", "/dashboard/orgs/"+org, "")
			if page.status != http.StatusOK || !strings.Contains(page.body, `data-key-id="`+id+`"`) {
				t.Fatalf("list: %d %s", page.status, page.body)
			}
			for _, control := range []string{`data-testid="revoke"`, `data-testid="roll"`, `data-testid="create-key-submit"`} {
				if strings.Contains(page.body, control) {
					t.Errorf("%s sees %s", role, control)
				}
			}
			r := m.form().do("POST", "/dashboard/orgs/"+org+"/keys/"+id+"/revoke", "")
			if r.status != http.StatusForbidden || !e.liveKey(full) {
				t.Errorf("%s revoke: %d, key live %v", role, r.status, e.liveKey(full))
			}
		})
	}
}

func TestDashboardThrottledLoginIsSaidInWords(t *testing.T) {
	e := newTestEnv(t, func(c *Config) { c.LoginThrottle = LoginThrottle{PerEmail: 1} })
	email, password := e.user()
	wrong := url.Values{"email": {email}, "password": {"not the password"}}.Encode()
	if r := e.anon().form().do("POST", "/dashboard/login", wrong); r.status != http.StatusUnauthorized {
		t.Fatalf("first failure: %d", r.status)
	}
	right := url.Values{"email": {email}, "password": {password}}.Encode()
	r := e.anon().form().do("POST", "/dashboard/login", right)
	if r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") == "" ||
		!strings.Contains(r.body, "Too many failed logins. Try again in ") {
		t.Fatalf("throttled: %d, Retry-After %q: %s", r.status, r.header.Get("Retry-After"), r.body)
	}
	if len(r.cookies()) != 0 {
		t.Error("a throttled login set a cookie")
	}
}
