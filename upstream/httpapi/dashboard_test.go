package httpapi_test

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keygate/keygate/upstream/httpapi"
	"github.com/keygate/keygate/upstream/internal/upstreamtest"
	"github.com/keygate/keygate/upstream/store"
)

// form returns c sending form bodies.
func form(c *upstreamtest.Client) *upstreamtest.Client {
	return c.With("Content-Type", "application/x-www-form-urlencoded")
}

// fullKeyPattern finds a full key of the test servers' prefix in a page.
var fullKeyPattern = regexp.MustCompile(`mon_live_[A-Za-z0-9]+\.[A-Za-z0-9_-]{20,}`)

// dashboardKey creates a key through the JSON API and returns its id and full key.
func dashboardKey(t *testing.T, owner *upstreamtest.Client, org, name string) (id, full string) {
	t.Helper()
	r := owner.Do("POST", "/orgs/"+org+"/api-keys", upstreamtest.JSONBody(map[string]string{"name": name, "role": "Admin"}))
	if r.Status != http.StatusCreated {
		t.Fatalf("creating key: %d %s", r.Status, r.Body)
	}
	var k struct{ ID, Key string }
	r.Decode(t, &k)
	return k.ID, k.Key
}

// liveKey reports whether full still verifies.
func liveKey(e *upstreamtest.Env, full string) bool {
	e.T.Helper()
	_, ok, err := e.Keys.Verify(context.Background(), full)
	if err != nil {
		e.T.Fatal(err)
	}
	return ok
}

// keyCount returns the number of keys of org.
func keyCount(e *upstreamtest.Env, org string) int {
	e.T.Helper()
	recs, err := e.Keys.List(context.Background(), org)
	if err != nil {
		e.T.Fatal(err)
	}
	return len(recs)
}

func TestDashboardRefusesCrossSiteFormsAndChangesNothing(t *testing.T) {
	e := upstreamtest.NewEnv(t)
	org := e.Org("pro")
	email, password, owner := e.Account(store.RoleOwner, org)
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
			c                *upstreamtest.Client
		}{
			{"login", "/dashboard/login", login, e.Anon()},
			{"logout", "/dashboard/logout", "", owner},
			{"create", "/dashboard/orgs/" + org + "/keys", create, owner},
			{"revoke", "/dashboard/orgs/" + org + "/keys/" + id + "/revoke", "", owner},
			{"roll", "/dashboard/orgs/" + org + "/keys/" + id + "/roll", "grace_seconds=0", owner},
		} {
			t.Run(tc.name+" "+origin[0]+" "+origin[1], func(t *testing.T) {
				r := form(tc.c).With(origin...).Do("POST", tc.path, tc.body)
				if r.Status != http.StatusForbidden {
					t.Fatalf("status %d, want 403: %s", r.Status, r.Body)
				}
				if len(r.Cookies()) != 0 {
					t.Errorf("a refused form set cookies: %v", r.Cookies())
				}
			})
		}
	}
	if n := keyCount(e, org); n != 1 {
		t.Errorf("org has %d keys after the refused forms, want 1", n)
	}
	if !liveKey(e, full) {
		t.Error("the key was revoked or rolled by a refused form")
	}
	if r := owner.Do("GET", "/orgs/"+org+"/api-keys", ""); r.Status != http.StatusOK {
		t.Errorf("the session no longer works after a refused logout: %d", r.Status)
	}
	// The same form from the dashboard's own origin passes.
	r := form(owner).With("Sec-Fetch-Site", "same-origin").Do("POST", "/dashboard/orgs/"+org+"/keys/"+id+"/revoke", "")
	if r.Status != http.StatusSeeOther || liveKey(e, full) {
		t.Errorf("same-origin revoke: %d, key live %v", r.Status, liveKey(e, full))
	}
}

func TestDashboardPagesCarryTheSecurityHeaders(t *testing.T) {
	e, org, owner := upstreamtest.NewOrgEnv(t, "pro", store.RoleOwner)
	for _, tc := range []struct {
		name, path string
		c          *upstreamtest.Client
		status     int
		ctype      string
	}{
		{"login page", "/dashboard", e.Anon(), 200, "text/html; charset=utf-8"},
		{"keys page", "/dashboard/orgs/" + org, owner, 200, "text/html; charset=utf-8"},
		{"audit page", "/dashboard/orgs/" + org + "/audit", owner, 200, "text/html; charset=utf-8"},
		{"usage page", "/dashboard/orgs/" + org + "/usage", owner, 200, "text/html; charset=utf-8"},
		{"not a member", "/dashboard/orgs/00000000-0000-0000-0000-000000000000", owner, 404, "text/html; charset=utf-8"},
		{"stylesheet", "/dashboard/static/dashboard.css", e.Anon(), 200, "text/css; charset=utf-8"},
		{"script", "/dashboard/static/dashboard.js", e.Anon(), 200, "text/javascript; charset=utf-8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.c.Do("GET", tc.path, "")
			if r.Status != tc.status {
				t.Fatalf("status %d, want %d: %s", r.Status, tc.status, r.Body)
			}
			for name, want := range map[string]string{
				"Content-Security-Policy": httpapi.DashboardCSP,
				"X-Frame-Options":         "DENY",
				"X-Content-Type-Options":  "nosniff",
				"Referrer-Policy":         "no-referrer",
				"Content-Type":            tc.ctype,
			} {
				if got := r.Header.Get(name); got != want {
					t.Errorf("%s: %q, want %q", name, got, want)
				}
			}
		})
	}
	for _, bad := range []string{"unsafe-inline", "unsafe-eval", "http:", "https:", "*"} {
		if strings.Contains(httpapi.DashboardCSP, bad) {
			t.Errorf("the CSP allows %s", bad)
		}
	}
	if !strings.Contains(httpapi.DashboardCSP, "frame-ancestors 'none'") || !strings.Contains(httpapi.DashboardCSP, "default-src 'none'") {
		t.Errorf("CSP %q lacks frame-ancestors 'none' or default-src 'none'", httpapi.DashboardCSP)
	}
}

func TestDashboardShowsANewKeyOnceAndMaskedAfter(t *testing.T) {
	e, org, owner := upstreamtest.NewOrgEnv(t, "pro", store.RoleOwner)
	r := form(owner).Do("POST", "/dashboard/orgs/"+org+"/keys", url.Values{"name": {"ci"}, "role": {"Editor"}}.Encode())
	if r.Status != http.StatusCreated {
		t.Fatalf("create: %d %s", r.Status, r.Body)
	}
	full := fullKeyPattern.FindString(r.Body)
	if full == "" || !strings.Contains(r.Body, `data-testid="new-key">`+full+`</code>`) {
		t.Fatalf("no new-key in the create answer: %s", r.Body)
	}
	if !liveKey(e, full) {
		t.Fatal("the key shown does not verify")
	}
	page := owner.Do("GET", "/dashboard/orgs/"+org, "")
	secret := full[strings.IndexByte(full, '.')+1:]
	if strings.Contains(page.Body, secret) || strings.Contains(page.Body, "new-key") {
		t.Errorf("the keys page shows the secret again: %s", page.Body)
	}
	if !strings.Contains(page.Body, `data-testid="key-row"`) || !strings.Contains(page.Body, ".********") {
		t.Errorf("the keys page lacks the masked row: %s", page.Body)
	}
}

func TestDashboardErrorsAreWords(t *testing.T) {
	e := upstreamtest.NewEnv(t)
	org, free := e.Org("pro"), e.Org("free")
	email, _, owner := e.Account(store.RoleOwner, org, free)
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
			r := form(owner).Do("POST", tc.path, tc.body)
			if r.Status != tc.status || !strings.Contains(r.Body, tc.words) {
				t.Errorf("status %d, want %d with %q: %s", r.Status, tc.status, tc.words, r.Body)
			}
			if ct := r.Header.Get("Content-Type"); ct != "text/html; charset=utf-8" {
				t.Errorf("Content-Type %q", ct)
			}
		})
	}
}

func TestDashboardMembersWhoMayNotManageKeysSeeNoControls(t *testing.T) {
	e, org, owner := upstreamtest.NewOrgEnv(t, "pro", store.RoleOwner)
	id, full := dashboardKey(t, owner, org, "shared")
	for _, role := range []string{store.RoleEditor, store.RoleViewer} {
		t.Run(role, func(t *testing.T) {
			m := e.Person(role, org)
			page := m.Do("GET", "/dashboard/orgs/"+org, "")
			if page.Status != http.StatusOK || !strings.Contains(page.Body, `data-key-id="`+id+`"`) {
				t.Fatalf("list: %d %s", page.Status, page.Body)
			}
			for _, control := range []string{`data-testid="revoke"`, `data-testid="roll"`, `data-testid="create-key-submit"`} {
				if strings.Contains(page.Body, control) {
					t.Errorf("%s sees %s", role, control)
				}
			}
			r := form(m).Do("POST", "/dashboard/orgs/"+org+"/keys/"+id+"/revoke", "")
			if r.Status != http.StatusForbidden || !liveKey(e, full) {
				t.Errorf("%s revoke: %d, key live %v", role, r.Status, liveKey(e, full))
			}
		})
	}
}

func TestDashboardThrottledLoginIsSaidInWords(t *testing.T) {
	e := upstreamtest.NewEnv(t, func(c *httpapi.Config) { c.LoginThrottle = store.LoginThrottle{PerEmail: 1} })
	email, password := e.User()
	wrong := url.Values{"email": {email}, "password": {"not the password"}}.Encode()
	if r := form(e.Anon()).Do("POST", "/dashboard/login", wrong); r.Status != http.StatusUnauthorized {
		t.Fatalf("first failure: %d", r.Status)
	}
	right := url.Values{"email": {email}, "password": {password}}.Encode()
	r := form(e.Anon()).Do("POST", "/dashboard/login", right)
	if r.Status != http.StatusTooManyRequests || r.Header.Get("Retry-After") == "" ||
		!strings.Contains(r.Body, "Too many failed logins. Try again in ") {
		t.Fatalf("throttled: %d, Retry-After %q: %s", r.Status, r.Header.Get("Retry-After"), r.Body)
	}
	if len(r.Cookies()) != 0 {
		t.Error("a throttled login set a cookie")
	}
}

// TestDashboardFormsAreCheckedAsTheJSONBodies sends the create and roll forms with bad
// values. Each is refused with the message the JSON API gives the same value, shown on
// the keys page, and nothing changes.
func TestDashboardFormsAreCheckedAsTheJSONBodies(t *testing.T) {
	e, org, owner := upstreamtest.NewOrgEnv(t, "pro", store.RoleOwner)
	id, full := dashboardKey(t, owner, org, "kept")
	past := time.Now().Add(-time.Hour).UTC()
	for _, tc := range []struct {
		name    string
		path    string     // the JSON route after /orgs/{org}/; the form's is alike
		form    url.Values // the dashboard's form
		json    string     // the JSON body of the same values; "" when JSON cannot say them
		message string
	}{
		{"empty name", "api-keys", url.Values{"name": {""}, "role": {"Admin"}},
			`{"name":"","role":"Admin"}`, "name: must be 1 to 100 characters long"},
		{"name of 101 characters", "api-keys", url.Values{"name": {strings.Repeat("é", 101)}, "role": {"Admin"}},
			`{"name":"` + strings.Repeat("é", 101) + `","role":"Admin"}`, "name: must be 1 to 100 characters long"},
		{"name with a control character", "api-keys", url.Values{"name": {"a\x01b"}, "role": {"Admin"}},
			`{"name":"a\u0001b","role":"Admin"}`, "name: must not contain control characters"},
		{"no name field", "api-keys", url.Values{"role": {"Admin"}},
			"", "name: must be 1 to 100 characters long"},
		{"role Owner", "api-keys", url.Values{"name": {"ci"}, "role": {"Owner"}},
			`{"name":"ci","role":"Owner"}`, "role: must be one of Admin, Editor, Viewer"},
		{"empty role", "api-keys", url.Values{"name": {"ci"}, "role": {""}},
			`{"name":"ci","role":""}`, "role: must be one of Admin, Editor, Viewer"},
		{"expiry in the past", "api-keys", url.Values{"name": {"ci"}, "role": {"Admin"}, "expires_at": {past.Format("2006-01-02T15:04")}},
			`{"name":"ci","role":"Admin","expires_at":"` + past.Format(time.RFC3339) + `"}`, "expires_at: must be in the future"},
		{"expiry not a date", "api-keys", url.Values{"name": {"ci"}, "role": {"Admin"}, "expires_at": {"tomorrow"}},
			"", "expires_at: must be a date and time"},
		{"expiry checked before name and role", "api-keys", url.Values{"name": {""}, "role": {""}, "expires_at": {"tomorrow"}},
			"", "expires_at: must be a date and time"},
		{"name checked before role", "api-keys", url.Values{"name": {""}, "role": {""}},
			`{"name":"","role":""}`, "name: must be 1 to 100 characters long"},
		{"negative grace", "api-keys/" + id + "/roll", url.Values{"grace_seconds": {"-1"}},
			`{"grace_seconds":-1}`, "grace_seconds: must be an integer from 0 to 86400"},
		{"grace over a day", "api-keys/" + id + "/roll", url.Values{"grace_seconds": {"86401"}},
			`{"grace_seconds":86401}`, "grace_seconds: must be an integer from 0 to 86400"},
		{"grace beyond 32 bits", "api-keys/" + id + "/roll", url.Values{"grace_seconds": {"99999999999"}},
			`{"grace_seconds":99999999999}`, "grace_seconds: must be an integer"},
		{"grace not a number", "api-keys/" + id + "/roll", url.Values{"grace_seconds": {"1.5"}},
			"", "grace_seconds: must be a whole number of seconds"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			page := "/dashboard/orgs/" + org + "/" + strings.Replace(tc.path, "api-keys", "keys", 1)
			r := form(owner).Do("POST", page, tc.form.Encode())
			words := "Please check the form: " + tc.message + "."
			if r.Status != http.StatusBadRequest || !strings.Contains(r.Body, words) ||
				!strings.Contains(r.Body, `data-testid="key-row"`) {
				t.Errorf("dashboard: %d, want 400 with %q on the keys page: %s", r.Status, words, r.Body)
			}
			if tc.json != "" {
				upstreamtest.Want(t, owner.Do("POST", "/orgs/"+org+"/"+tc.path, tc.json), 400,
					`{"error":"invalid_request","message":`+upstreamtest.JSONBody(tc.message)+`}`)
			}
		})
	}
	if n := keyCount(e, org); n != 1 || !liveKey(e, full) {
		t.Errorf("the refused forms changed the keys: %d keys, the first live %v", n, liveKey(e, full))
	}
}

// TestDashboardStoresANameThatIsNotUTF8AsJSONDoes checks that a byte of a key's name
// that is not UTF-8 becomes U+FFFD on both doors, as encoding/json decodes it.
func TestDashboardStoresANameThatIsNotUTF8AsJSONDoes(t *testing.T) {
	e, org, owner := upstreamtest.NewOrgEnv(t, "pro", store.RoleOwner)
	r := form(owner).Do("POST", "/dashboard/orgs/"+org+"/keys", "name=a%FF%FEb&role=Admin")
	upstreamtest.WantStatus(t, r, http.StatusCreated)
	upstreamtest.WantStatus(t, owner.Do("POST", "/orgs/"+org+"/api-keys", "{\"name\":\"c\xff\xfed\",\"role\":\"Admin\"}"), http.StatusCreated)
	recs, err := e.Keys.List(context.Background(), org)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, rec := range recs {
		names = append(names, rec.Name)
	}
	if want := []string{"a\uFFFD\uFFFDb", "c\uFFFD\uFFFDd"}; !slices.Equal(names, want) {
		t.Errorf("names %q, want %q", names, want)
	}
}

// TestDashboardSendsThoseWithoutASessionToTheLoginForm checks every page that needs a
// session: without one it answers 303 to /dashboard, which shows the login form.
func TestDashboardSendsThoseWithoutASessionToTheLoginForm(t *testing.T) {
	e, org, owner := upstreamtest.NewOrgEnv(t, "pro", store.RoleOwner)
	id, full := dashboardKey(t, owner, org, "kept")
	anon := form(e.Anon())
	for _, tc := range []struct{ method, path, body string }{
		{"GET", "/dashboard/orgs/" + org, ""},
		{"GET", "/dashboard/orgs/" + org + "/audit", ""},
		{"GET", "/dashboard/orgs/" + org + "/keys/" + id + "/revoke", ""},
		{"POST", "/dashboard/orgs/" + org + "/keys", "name=ci&role=Admin"},
		{"POST", "/dashboard/orgs/" + org + "/keys/" + id + "/revoke", ""},
		{"POST", "/dashboard/orgs/" + org + "/keys/" + id + "/roll", "grace_seconds=0"},
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			r := anon.Do(tc.method, tc.path, tc.body)
			if r.Status != http.StatusSeeOther || r.Header.Get("Location") != "/dashboard" {
				t.Errorf("%d to %q, want 303 to /dashboard: %s", r.Status, r.Header.Get("Location"), r.Body)
			}
		})
	}
	r := e.Anon().Do("GET", "/dashboard", "")
	if r.Status != http.StatusOK || !strings.Contains(r.Body, `type="password"`) {
		t.Errorf("/dashboard without a session: %d %s", r.Status, r.Body)
	}
	if n := keyCount(e, org); n != 1 || !liveKey(e, full) {
		t.Errorf("the forms without a session changed the keys: %d keys, the first live %v", n, liveKey(e, full))
	}
}

// TestDashboardShowsAServerFailureOnTheErrorPageAndLogsItOnce breaks the keystore's
// database under the create form. The answer is the error page, not the keys page,
// and the cause is logged once.
func TestDashboardShowsAServerFailureOnTheErrorPageAndLogsItOnce(t *testing.T) {
	direct := upstreamtest.NewEnv(t)
	keysPool := upstreamtest.NewPool(t, direct.DBURL, store.DefaultDatabaseTimeout)
	e := upstreamtest.NewEnvWith(t, direct.Pool, keysPool, direct.DBURL)
	e.Server.SetPool(direct.Pool) // the sessions and plans stay on a working pool
	org := e.Org("pro")
	owner := e.Person(store.RoleOwner, org)
	keysPool.Close()

	r := form(owner).Do("POST", "/dashboard/orgs/"+org+"/keys", "name=ci&role=Admin")
	if r.Status != http.StatusInternalServerError || !strings.Contains(r.Body, "Something went wrong on our side.") ||
		strings.Contains(r.Body, `data-testid="create-key-submit"`) {
		t.Errorf("%d, want 500 on the error page: %s", r.Status, r.Body)
	}
	if n := e.Logs.FilterMessage("internal error").Len(); n != 1 {
		t.Errorf("the failure was logged %d times, want once", n)
	}
}
