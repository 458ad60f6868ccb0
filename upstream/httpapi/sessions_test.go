package httpapi_test

import (
	"context"
	"crypto/sha256"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/keygate/keygate/upstream/httpapi"
	"github.com/keygate/keygate/upstream/internal/upstreamtest"
	"github.com/keygate/keygate/upstream/password"
	"github.com/keygate/keygate/upstream/store"
)

func TestLoginSetsAnHttpOnlyLaxSessionCookieAndStoresOnlyItsHash(t *testing.T) {
	e := upstreamtest.NewEnv(t, func(c *httpapi.Config) { c.SessionTTL = time.Hour })
	email, password := e.User()
	r := e.Anon().Do("POST", "/auth/login", upstreamtest.JSONBody(map[string]string{"email": email, "password": password}))
	upstreamtest.Want(t, r, http.StatusNoContent, "")

	cookies := r.Cookies()
	if len(cookies) != 1 {
		t.Fatalf("cookies = %v, want one", cookies)
	}
	c := cookies[0]
	if c.Name != "session" || !c.HttpOnly || c.SameSite != http.SameSiteLaxMode || c.Path != "/" || c.Secure || c.MaxAge != 3600 {
		t.Errorf("cookie = %+v, want session, HttpOnly, SameSite=Lax, Path=/, not Secure over http, Max-Age=3600", c)
	}
	if !regexp.MustCompile(`^[A-Za-z0-9_-]{43}$`).MatchString(c.Value) {
		t.Errorf("cookie value %q is not 32 bytes of base64url", c.Value)
	}

	sum := sha256.Sum256([]byte(c.Value))
	if n := upstreamtest.Scalar[int](e, `SELECT count(*) FROM sessions WHERE token_hash = $1`, sum[:]); n != 1 {
		t.Errorf("sessions with the token's hash = %d, want 1", n)
	}
	if n := upstreamtest.Scalar[int](e, `SELECT count(*) FROM sessions WHERE position($1::bytea in token_hash) > 0`, []byte(c.Value)); n != 0 {
		t.Errorf("the token itself is stored")
	}
	ttl := upstreamtest.Scalar[float64](e, `SELECT extract(epoch FROM expires_at - created_at)::float8 FROM sessions`)
	if ttl != 3600 {
		t.Errorf("session lifetime = %vs, want 3600", ttl)
	}
}

func TestSessionCookieIsSecureOverTLS(t *testing.T) {
	e := upstreamtest.NewEnv(t)
	email, password := e.User()
	ts := httptest.NewTLSServer(e.Server)
	defer ts.Close()
	res, err := ts.Client().Post(ts.URL+"/auth/login", "application/json",
		strings.NewReader(upstreamtest.JSONBody(map[string]string{"email": email, "password": password})))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusNoContent || len(res.Cookies()) != 1 || !res.Cookies()[0].Secure {
		t.Errorf("got %d with cookies %v, want 204 and a Secure cookie", res.StatusCode, res.Cookies())
	}
}

func TestSessionCookieIsSecureBehindATLSProxyWhenConfigured(t *testing.T) {
	e := upstreamtest.NewEnv(t, func(c *httpapi.Config) { c.SecureCookies = true })
	email, password := e.User()
	r := e.Anon().Do("POST", "/auth/login", upstreamtest.JSONBody(map[string]string{"email": email, "password": password}))
	if cs := r.Cookies(); r.Status != 204 || len(cs) != 1 || !cs[0].Secure {
		t.Errorf("got %d with cookies %v, want 204 and a Secure cookie", r.Status, cs)
	}
	r = e.Anon().Do("POST", "/auth/logout", "")
	if cs := r.Cookies(); len(cs) != 1 || !cs[0].Secure {
		t.Errorf("logout cookies %v, want a Secure cookie", cs)
	}
}

func TestLoginRefusesWrongCredentialsAlike(t *testing.T) {
	e := upstreamtest.NewEnv(t)
	email, password := e.User()
	for _, tc := range []struct {
		name            string
		email, password string
		status          int
		body            string
	}{
		{"right", email, password, 204, ""},
		{"email in another case", strings.ToUpper(email), password, 204, ""},
		{"wrong password", email, password + "x", 401, `{"error":"invalid credentials"}`},
		{"password in another case", email, strings.ToUpper(password), 401, `{"error":"invalid credentials"}`},
		{"unknown email", "nobody@example.com", password, 401, `{"error":"invalid credentials"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := e.Server.Passwords().Derivations()
			r := e.Anon().Do("POST", "/auth/login", upstreamtest.JSONBody(map[string]string{"email": tc.email, "password": tc.password}))
			upstreamtest.Want(t, r, tc.status, tc.body)
			if tc.status != 204 && len(r.Cookies()) != 0 {
				t.Errorf("a refused login set cookies %v", r.Cookies())
			}
			// Known or not, the email costs exactly one argon2id derivation.
			if n := e.Server.Passwords().Derivations() - before; n != 1 {
				t.Errorf("argon2id derivations = %d, want 1", n)
			}
		})
	}
}

func TestLoginValidatesItsBody(t *testing.T) {
	e := upstreamtest.NewEnv(t)
	for _, tc := range []struct {
		name, body, want string
	}{
		{"not JSON", `email=a`, `{"error":"invalid_request","message":"body: must be a JSON object"}`},
		{"array", `[]`, `{"error":"invalid_request","message":"body: must be a JSON object"}`},
		{"no email", `{"password":"x"}`, `{"error":"invalid_request","message":"email: required"}`},
		{"no password", `{"email":"a@b.c"}`, `{"error":"invalid_request","message":"password: required"}`},
		{"email not a string", `{"email":1,"password":"x"}`, `{"error":"invalid_request","message":"email: must be a string, not a number"}`},
		{"unknown field", `{"email":"a@b.c","password":"x","remember":true}`, `{"error":"invalid_request","message":"remember: unknown field"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			upstreamtest.Want(t, e.Anon().Do("POST", "/auth/login", tc.body), 400, tc.want)
		})
	}
}

func TestLogoutEndsTheSession(t *testing.T) {
	e, org, c := upstreamtest.NewOrgEnv(t, "pro", store.RoleOwner)
	upstreamtest.WantStatus(t, c.Do("GET", "/orgs/"+org+"/api-keys", ""), 200)

	r := c.Do("POST", "/auth/logout", "")
	upstreamtest.Want(t, r, http.StatusNoContent, "")
	if cs := r.Cookies(); len(cs) != 1 || cs[0].Name != "session" || cs[0].MaxAge != -1 || cs[0].Value != "" {
		t.Errorf("logout cookies = %v, want the session cookie cleared", cs)
	}
	if n := upstreamtest.Scalar[int](e, `SELECT count(*) FROM sessions`); n != 0 {
		t.Errorf("sessions after logout = %d, want 0", n)
	}
	upstreamtest.Want(t, c.Do("GET", "/orgs/"+org+"/api-keys", ""), 401, `{"error":"unauthenticated"}`)

	// Logging out without a (valid) session still answers 204.
	upstreamtest.Want(t, c.Do("POST", "/auth/logout", ""), http.StatusNoContent, "")
	upstreamtest.Want(t, e.Anon().Do("POST", "/auth/logout", ""), http.StatusNoContent, "")
	upstreamtest.Want(t, e.Anon().With("Cookie", "session=garbage").Do("POST", "/auth/logout", ""), http.StatusNoContent, "")
}

func TestExpiredSessionIsRefusedAndDeletedAtTheNextLogin(t *testing.T) {
	e := upstreamtest.NewEnv(t)
	org := e.Org("pro")
	email, password, c := e.Account(store.RoleOwner, org)
	e.Exec(`UPDATE sessions SET expires_at = now() - interval '1 second'`)
	upstreamtest.Want(t, c.Do("GET", "/orgs/"+org+"/api-keys", ""), 401, `{"error":"unauthenticated"}`)

	fresh := e.Login(email, password)
	upstreamtest.WantStatus(t, fresh.Do("GET", "/orgs/"+org+"/api-keys", ""), 200)
	if n := upstreamtest.Scalar[int](e, `SELECT count(*) FROM sessions`); n != 1 {
		t.Errorf("sessions = %d, want only the live one", n)
	}
}

func TestCrossOriginStateChangesAreRefused(t *testing.T) {
	e, org, owner := upstreamtest.NewOrgEnv(t, "pro", store.RoleOwner)
	email, password := e.User()
	monitor := `{"name":"m","type":"http","target":"https://example.com"}`
	forbidden := `{"error":"forbidden"}`
	host := strings.TrimPrefix(e.TS.URL, "http://")

	for _, tc := range []struct {
		name    string
		c       *upstreamtest.Client
		method  string
		path    string
		body    string
		headers []string
		status  int
	}{
		{"cross-site create", owner, "POST", "/orgs/" + org + "/monitors", monitor, []string{"Sec-Fetch-Site", "cross-site"}, 403},
		{"same-site create", owner, "POST", "/orgs/" + org + "/monitors", monitor, []string{"Sec-Fetch-Site", "same-site"}, 403},
		{"foreign Origin create", owner, "POST", "/orgs/" + org + "/monitors", monitor, []string{"Origin", "https://evil.example"}, 403},
		{"cross-site key creation", owner, "POST", "/orgs/" + org + "/api-keys", `{"name":"k","role":"Admin"}`, []string{"Sec-Fetch-Site", "cross-site"}, 403},
		{"cross-site key revocation", owner, "DELETE", "/orgs/" + org + "/api-keys/AAAAAAAAAAAAAAAAAAAAAA", "", []string{"Sec-Fetch-Site", "cross-site"}, 403},
		{"cross-site logout", owner, "POST", "/auth/logout", "", []string{"Sec-Fetch-Site", "cross-site"}, 403},
		{"cross-site login", e.Anon(), "POST", "/auth/login", upstreamtest.JSONBody(map[string]string{"email": email, "password": password}), []string{"Sec-Fetch-Site", "cross-site"}, 403},
		{"same-origin create", owner, "POST", "/orgs/" + org + "/monitors", monitor, []string{"Sec-Fetch-Site", "same-origin"}, 201},
		{"matching Origin create", owner, "POST", "/orgs/" + org + "/monitors", monitor, []string{"Origin", "http://" + host}, 201},
		{"non-browser create", owner, "POST", "/orgs/" + org + "/monitors", monitor, nil, 201},
		{"cross-site read", owner, "GET", "/orgs/" + org + "/monitors", "", []string{"Sec-Fetch-Site", "cross-site"}, 200},
		{"cross-site /v1 write is the gateway's business", e.Gateway(org, store.RoleEditor), "POST", "/v1/monitors", monitor, []string{"Sec-Fetch-Site", "cross-site"}, 201},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.c.With(tc.headers...).Do(tc.method, tc.path, tc.body)
			if tc.status == 403 {
				upstreamtest.Want(t, r, 403, forbidden)
			} else {
				upstreamtest.WantStatus(t, r, tc.status)
			}
		})
	}
	if n := upstreamtest.Scalar[int](e, `SELECT count(*) FROM monitors`); n != 4 {
		t.Errorf("monitors = %d, want the 4 allowed creates only", n)
	}
	if n := upstreamtest.Scalar[int](e, `SELECT count(*) FROM api_keys`); n != 0 {
		t.Errorf("api keys = %d, want 0", n)
	}
}

func TestFullHashingQueueAnswers503AtOnceAndCountsNoFailure(t *testing.T) {
	e := upstreamtest.NewEnv(t)
	email, password := e.User()
	// Every running and waiting place of the queue is taken.
	release := e.Server.Passwords().Saturate()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "POST", e.TS.URL+"/auth/login",
		strings.NewReader(upstreamtest.JSONBody(map[string]string{"email": email, "password": password})))
	if err != nil {
		t.Fatal(err)
	}
	res, err := e.TS.Client().Do(req)
	if err != nil {
		t.Fatalf("login with a full queue did not answer: %v", err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	upstreamtest.Want(t, upstreamtest.Response{Status: res.StatusCode, Header: res.Header, Body: string(body)}, 503, `{"error":"service_unavailable"}`)
	if n := upstreamtest.Scalar[int](e, `SELECT count(*) FROM login_attempts`); n != 0 {
		t.Errorf("%d login attempts kept after a 503, want 0", n)
	}

	release()
	e.Login(email, password)
}

func TestATooShortPasswordIsA400NamingTheField(t *testing.T) {
	e := upstreamtest.NewEnv(t)
	for _, pw := range []string{"123456789", "日本語日本語日本語"} {
		rec := httptest.NewRecorder()
		e.Server.WriteError(rec, httptest.NewRequest("POST", "/", nil), password.CheckNew(pw))
		upstreamtest.Want(t, upstreamtest.Response{Status: rec.Code, Header: rec.Header(), Body: rec.Body.String()}, 400,
			`{"error":"invalid_request","message":"password: must be at least 10 characters"}`)
	}
}
