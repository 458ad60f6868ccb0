package caddymodule

import (
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/schema/schematest"
)

const (
	wantUnauthenticated = `{"error":"api key unauthenticated"}`
	wantFeatureGated    = `{"error":"feature_gated","feature":"api","upgrade":true}`
	wantForbidden       = `{"error":"forbidden"}`
	wantUnavailable     = `{"error":"service_unavailable"}`
)

// fixture is a database with an org on each plan the tests need, a gateway in front
// of a test upstream, and the Redis limiter.
type fixture struct {
	db       *db
	up       *testUpstream
	gw       *gateway
	pro      string // org ids
	free     string
	unlim    string
	tiny     string // plan "tiny": 3 requests a minute
	redisURL string
}

func newFixture(t *testing.T, extra map[string]any) *fixture {
	t.Helper()
	f := &fixture{db: newDB(t), up: newUpstream(t), redisURL: redisURL(t)}
	f.db.plan("tiny", 3)
	f.pro, f.free, f.unlim, f.tiny = f.db.org("pro"), f.db.org("free"), f.db.org("enterprise"), f.db.org("tiny")
	opts := gatewayOptions(f.db.url, map[string]any{"redis_url": f.redisURL})
	for k, v := range extra {
		opts[k] = v
	}
	f.gw = startGateway(t, gatewayConfig{handler: opts, upstream: f.up.addr()})
	return f
}

func TestEveryCredentialFailureGetsTheSameResponse(t *testing.T) {
	f := newFixture(t, nil)
	valid, validID := f.db.key(f.pro, keystore.RoleAdmin)
	revoked, revokedID := f.db.key(f.pro, keystore.RoleAdmin)
	if found, err := f.db.store.Revoke(t.Context(), f.pro, revokedID); err != nil || !found {
		t.Fatalf("Revoke: %v, %v", found, err)
	}
	expired, expiredID := f.db.key(f.pro, keystore.RoleAdmin)
	f.db.exec(`UPDATE api_keys SET expires_at = now() - interval '1 second' WHERE key_id = $1`, expiredID)
	// The right key id with another (well-formed) secret.
	wrongSecret := "mon_live_" + validID + ".AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
	unknown := "mon_live_ZZZZZZZZZZZZZZZZZZZZZZ.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"

	type attempt struct {
		name, path, auth string
		hdr              http.Header
	}
	attempts := []attempt{
		{name: "no credentials", path: "/v1/me"},
		{name: "unknown key", path: "/v1/me", auth: "Bearer " + unknown},
		{name: "revoked key", path: "/v1/me", auth: "Bearer " + revoked},
		{name: "expired key", path: "/v1/me", auth: "Bearer " + expired},
		{name: "wrong secret", path: "/v1/me", auth: "Bearer " + wrongSecret},
		{name: "key in api_key query parameter", path: "/v1/me?api_key=" + url.QueryEscape(valid)},
		{name: "key in access_token query parameter", path: "/v1/me?access_token=" + url.QueryEscape(valid)},
		{name: "key in a cookie", path: "/v1/me", hdr: http.Header{"Cookie": {"session=" + valid + "; api_key=" + valid}}},
		{name: "key as basic auth user", path: "/v1/me", auth: "Basic " + base64.StdEncoding.EncodeToString([]byte(valid+":"))},
		{name: "key as basic auth password", path: "/v1/me", auth: "Basic " + base64.StdEncoding.EncodeToString([]byte("x:"+valid))},
		{name: "two Authorization headers", path: "/v1/me", hdr: http.Header{"Authorization": {"Bearer " + valid, "Bearer " + valid}}},
		{name: "key with a trailing character", path: "/v1/me", auth: "Bearer " + valid + "x"},
		{name: "key without its last character", path: "/v1/me", auth: "Bearer " + valid[:len(valid)-1]},
		{name: "key in another case", path: "/v1/me", auth: "Bearer " + strings.ToUpper(valid[:10]) + valid[10:]},
		{name: "key of another prefix", path: "/v1/me", auth: "Bearer sk" + valid[3:]},
		{name: "a proxied path", path: "/v1/monitors", auth: "Bearer " + unknown},
		{name: "a POST", path: "/v1/monitors", auth: "Bearer " + revoked},
	}
	for _, tc := range malformedAuthorizations {
		attempts = append(attempts, attempt{name: "malformed: " + tc.name, path: "/v1/me", auth: strings.ReplaceAll(tc.value, testKey, valid)})
	}

	var first string
	for _, a := range attempts {
		method := http.MethodGet
		if a.name == "a POST" {
			method = http.MethodPost
		}
		res, body := f.gw.do(t, method, a.path, a.auth, a.hdr, "")
		if res.StatusCode != http.StatusUnauthorized || string(body) != wantUnauthenticated ||
			res.Header.Get("Www-Authenticate") != "Bearer" || res.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s: %d %q %s", a.name, res.StatusCode, res.Header, body)
		}
		dump := headerDump(res, body)
		if first == "" {
			first = dump
		} else if dump != first {
			t.Errorf("%s: the response differs from the first 401:\n%s\nvs\n%s", a.name, dump, first)
		}
	}
	if n := f.up.requests(); n != 0 {
		t.Errorf("the upstream saw %d requests; want none", n)
	}
	// The valid key works, so the failures above were the credentials'.
	if res, body := f.gw.get(t, "/v1/me", valid); res.StatusCode != http.StatusOK {
		t.Errorf("valid key: %d %s", res.StatusCode, body)
	}
}

func TestMeIsAnsweredByTheGateway(t *testing.T) {
	f := newFixture(t, nil)
	for _, role := range []keystore.Role{keystore.RoleAdmin, keystore.RoleEditor, keystore.RoleViewer} {
		key, _ := f.db.key(f.pro, role)
		res, body := f.gw.get(t, "/v1/me", key)
		want := `{"org_id":"` + f.pro + `","role":"` + string(role) + `"}`
		if res.StatusCode != http.StatusOK || string(body) != want {
			t.Errorf("%s: GET /v1/me = %d %s, want 200 %s", role, res.StatusCode, body, want)
		}
		if ct := res.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s: Content-Type %q", role, ct)
		}
		if res.Header.Get("Ratelimit-Policy") != `"default";q=600;w=60` {
			t.Errorf("%s: RateLimit-Policy %q", role, res.Header.Get("Ratelimit-Policy"))
		}
		res, body = f.gw.do(t, http.MethodHead, "/v1/me", "Bearer "+key, nil, "")
		if res.StatusCode != http.StatusOK || len(body) != 0 || res.Header.Get("Content-Length") != strconv.Itoa(len(want)) {
			t.Errorf("%s: HEAD /v1/me = %d %q %s", role, res.StatusCode, res.Header, body)
		}
	}
	if n := f.up.requests(); n != 0 {
		t.Errorf("the upstream saw %d requests for /v1/me; want none", n)
	}

	// Other methods on /v1/me, and other paths, are the upstream's.
	admin, _ := f.db.key(f.pro, keystore.RoleAdmin)
	res, body := f.gw.do(t, http.MethodPost, "/v1/me", "Bearer "+admin, nil, "{}")
	if res.StatusCode != http.StatusOK || string(body) != `{"upstream":"me","method":"POST"}` {
		t.Errorf("POST /v1/me = %d %s; want the upstream's answer", res.StatusCode, body)
	}
	for _, path := range []string{"/v1/me/", "/v1//me", "/v1/mE"} {
		res, _ := f.gw.get(t, path, admin)
		if res.StatusCode == http.StatusOK && res.Header.Get("Cache-Control") == "no-store" {
			t.Errorf("GET %s was answered as /v1/me", path)
		}
	}
}

func TestDecisionOrder(t *testing.T) {
	f := newFixture(t, nil)
	awayFromWindowEdge(t, 10*time.Second)
	freeViewer, _ := f.db.key(f.free, keystore.RoleViewer)
	tinyViewer, _ := f.db.key(f.tiny, keystore.RoleViewer)
	for range 3 {
		f.gw.get(t, "/v1/me", tinyViewer) // use up the budget
	}
	proViewer, _ := f.db.key(f.pro, keystore.RoleViewer)
	unlimViewer, _ := f.db.key(f.unlim, keystore.RoleViewer)

	for _, tc := range []struct {
		name, method, path, auth string
		status                   int
		body                     string
	}{
		{"malformed key before anything", "POST", "/v1/monitors", "Bearer nope", 401, wantUnauthenticated},
		{"no API access before the rate limit and the role", "POST", "/v1/monitors", "Bearer " + freeViewer, 403, wantFeatureGated},
		{"no API access on /v1/me too", "GET", "/v1/me", "Bearer " + freeViewer, 403, wantFeatureGated},
		{"rate limit before the role", "POST", "/v1/monitors", "Bearer " + tinyViewer, 429, ""},
		{"rate limit before /v1/me", "GET", "/v1/me", "Bearer " + tinyViewer, 429, ""},
		{"role before the proxy", "POST", "/v1/monitors", "Bearer " + proViewer, 403, wantForbidden},
		{"role with no limit", "DELETE", "/v1/monitors/m1", "Bearer " + unlimViewer, 403, wantForbidden},
		{"a Viewer reads /v1/me", "GET", "/v1/me", "Bearer " + proViewer, 200, ""},
		{"a Viewer reads through the proxy", "GET", "/v1/monitors", "Bearer " + proViewer, 200, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, body := f.gw.do(t, tc.method, tc.path, tc.auth, nil, "")
			if res.StatusCode != tc.status || (tc.body != "" && string(body) != tc.body) {
				t.Errorf("%s %s = %d %s; want %d %s", tc.method, tc.path, res.StatusCode, body, tc.status, tc.body)
			}
		})
	}
}

func TestRevokedKeyIsRefusedOnTheNextRequest(t *testing.T) {
	f := newFixture(t, nil)
	key, id := f.db.key(f.pro, keystore.RoleEditor)
	if res, body := f.gw.get(t, "/v1/monitors", key); res.StatusCode != http.StatusOK {
		t.Fatalf("before revocation: %d %s", res.StatusCode, body)
	}
	if _, err := f.db.store.Revoke(t.Context(), f.pro, id); err != nil {
		t.Fatal(err)
	}
	res, body := f.gw.get(t, "/v1/monitors", key)
	wantJSONError(t, res, body, http.StatusUnauthorized, wantUnauthenticated)
}

func TestExpiredKeyIsRefusedOnTheNextRequest(t *testing.T) {
	f := newFixture(t, nil)
	future := time.Now().Add(time.Hour)
	_, key, err := f.db.store.Create(t.Context(), keystore.NewKey{OrgID: f.pro, Name: "exp", Role: keystore.RoleAdmin, ExpiresAt: &future})
	if err != nil {
		t.Fatal(err)
	}
	if res, body := f.gw.get(t, "/v1/me", key); res.StatusCode != http.StatusOK {
		t.Fatalf("before expiry: %d %s", res.StatusCode, body)
	}
	id, _, _ := mustFormat(t, "mon").Parse(key)
	f.db.exec(`UPDATE api_keys SET expires_at = now() WHERE key_id = $1`, id)
	res, body := f.gw.get(t, "/v1/me", key)
	wantJSONError(t, res, body, http.StatusUnauthorized, wantUnauthenticated)
}

func TestPlanWithoutAPIAccessIsFeatureGated(t *testing.T) {
	f := newFixture(t, nil)
	key, _ := f.db.key(f.free, keystore.RoleAdmin)
	for _, path := range []string{"/v1/me", "/v1/monitors"} {
		res, body := f.gw.get(t, path, key)
		wantJSONError(t, res, body, http.StatusForbidden, wantFeatureGated)
		if res.Header.Get("Ratelimit") != "" || res.Header.Get("Ratelimit-Policy") != "" {
			t.Errorf("%s: RateLimit headers on a key without API access: %q", path, res.Header)
		}
	}
	if n := f.up.requests(); n != 0 {
		t.Errorf("the upstream saw %d requests", n)
	}
	// A plan change applies on the next request: nothing is cached.
	f.db.exec(`UPDATE orgs SET plan = 'pro' WHERE id = $1`, f.free)
	if res, body := f.gw.get(t, "/v1/me", key); res.StatusCode != http.StatusOK {
		t.Errorf("after the upgrade: %d %s", res.StatusCode, body)
	}
}

func TestRateLimit(t *testing.T) {
	for _, tc := range []struct {
		name  string
		extra map[string]any
	}{
		{"redis", nil},
		{"in-process", map[string]any{"redis_url": nil}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.extra)
			awayFromWindowEdge(t, 10*time.Second)
			key, _ := f.db.key(f.tiny, keystore.RoleViewer)
			other, _ := f.db.key(f.tiny, keystore.RoleEditor)

			// 1: /v1/me, 2: a proxied read, 3: a refused write: all count.
			for i, req := range []struct{ method, path string }{
				{"GET", "/v1/me"}, {"GET", "/v1/monitors"}, {"POST", "/v1/monitors"},
			} {
				res, body := f.gw.do(t, req.method, req.path, "Bearer "+key, nil, "{}")
				if res.StatusCode == http.StatusTooManyRequests {
					t.Fatalf("request %d refused: %s", i+1, body)
				}
				checkRateLimitHeaders(t, res, 3, 2-i)
			}
			res, body := f.gw.get(t, "/v1/me", key)
			if res.StatusCode != http.StatusTooManyRequests {
				t.Fatalf("4th request: %d %s", res.StatusCode, body)
			}
			s := checkRateLimitHeaders(t, res, 3, 0)
			if got := res.Header.Get("Retry-After"); got != strconv.Itoa(s) {
				t.Errorf("Retry-After %q, want %d (the t of RateLimit)", got, s)
			}
			wantJSONError(t, res, body, http.StatusTooManyRequests, `{"error":"rate_limited","retryAfter":`+strconv.Itoa(s)+`}`)
			// Refused requests count too: still refused, still r=0.
			res, _ = f.gw.get(t, "/v1/monitors", key)
			if res.StatusCode != http.StatusTooManyRequests {
				t.Errorf("5th request: %d", res.StatusCode)
			}
			// Another key of the same org has its own budget.
			res, _ = f.gw.get(t, "/v1/me", other)
			if res.StatusCode != http.StatusOK {
				t.Errorf("other key: %d", res.StatusCode)
			}
			checkRateLimitHeaders(t, res, 3, 2)
			if n := f.up.requests(); n != 1 {
				t.Errorf("the upstream saw %d requests, want 1 (the allowed read)", n)
			}
		})
	}
}

// checkRateLimitHeaders checks the RateLimit header fields of CONTRACT §5 and returns
// their t.
func checkRateLimitHeaders(t *testing.T, res *http.Response, limit, remaining int) int {
	t.Helper()
	if got, want := res.Header.Values("Ratelimit-Policy"), `"default";q=`+strconv.Itoa(limit)+`;w=60`; len(got) != 1 || got[0] != want {
		t.Errorf("RateLimit-Policy %q, want %q", got, want)
	}
	got := res.Header.Values("Ratelimit")
	prefix := `"default";r=` + strconv.Itoa(remaining) + ";t="
	if len(got) != 1 || !strings.HasPrefix(got[0], prefix) {
		t.Fatalf("RateLimit %q, want %q…", got, prefix)
	}
	s, err := strconv.Atoi(strings.TrimPrefix(got[0], prefix))
	if err != nil || s < 1 || s > 60 {
		t.Errorf("RateLimit t=%q: want 1..60", strings.TrimPrefix(got[0], prefix))
	}
	return s
}

func TestUnlimitedKeyHasNoRateLimitHeaders(t *testing.T) {
	f := newFixture(t, nil)
	key, _ := f.db.key(f.unlim, keystore.RoleAdmin)
	for _, path := range []string{"/v1/me", "/v1/monitors", "/v1/text-error", "/v1/ratelimit-spoof"} {
		res, _ := f.gw.get(t, path, key)
		if res.Header.Get("Ratelimit") != "" || res.Header.Get("Ratelimit-Policy") != "" {
			t.Errorf("%s: %d with RateLimit headers %q", path, res.StatusCode, res.Header)
		}
	}
}

func TestViewerCannotWrite(t *testing.T) {
	f := newFixture(t, nil)
	viewer, _ := f.db.key(f.pro, keystore.RoleViewer)
	for _, method := range []string{"POST", "PUT", "PATCH", "DELETE", "PROPFIND"} {
		res, body := f.gw.do(t, method, "/v1/monitors", "Bearer "+viewer, nil, `{"name":"x"}`)
		wantJSONError(t, res, body, http.StatusForbidden, wantForbidden)
		if res.Header.Get("Ratelimit") == "" {
			t.Errorf("%s: a forbidden request of a limited key carries no RateLimit header", method)
		}
	}
	if n := f.up.requests(); n != 0 {
		t.Errorf("the upstream saw %d writes of a Viewer", n)
	}
	for _, method := range []string{"GET", "HEAD", "OPTIONS"} {
		res, body := f.gw.do(t, method, "/v1/echo", "Bearer "+viewer, nil, "")
		if res.StatusCode != http.StatusOK {
			t.Errorf("Viewer %s: %d %s", method, res.StatusCode, body)
		}
	}
	for _, role := range []keystore.Role{keystore.RoleAdmin, keystore.RoleEditor} {
		key, _ := f.db.key(f.pro, role)
		res, body := f.gw.do(t, "POST", "/v1/monitors", "Bearer "+key, nil, `{"name":"x","config":{}}`)
		if res.StatusCode != http.StatusCreated || string(body) != monitorFiltered {
			t.Errorf("%s POST: %d %s", role, res.StatusCode, body)
		}
	}
}

func TestProxyRemovesClientCredentialsAndAssertsTheKeysIdentity(t *testing.T) {
	f := newFixture(t, nil)
	key, id := f.db.key(f.pro, keystore.RoleEditor)
	hdr := http.Header{
		"Cookie":             {"session=abc"},
		"X-Gateway-Org-Id":   {"00000000-0000-0000-0000-000000000000"},
		"X-Gateway-Key-Role": {"Admin"},
		"X-Gateway-Secret":   {"forged"},
		"X-Gateway-Anything": {"x"},
		"x-gateway-key-id":   {"lowercase"}, // sent as is by Go's client
		"Accept-Encoding":    {"gzip, br"},
		"Range":              {"bytes=0-10"},
		"X-Custom":           {"kept"},
	}
	res, body := f.gw.do(t, http.MethodGet, "/v1/echo", "Bearer "+key, hdr, "")
	if res.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", res.StatusCode, body)
	}
	var seen seenRequest
	if err := json.Unmarshal(body, &seen); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	h := seen.Header
	for name, want := range map[string]string{
		"X-Gateway-Org-Id":   f.pro,
		"X-Gateway-Key-Id":   id,
		"X-Gateway-Key-Role": "Editor",
		"X-Gateway-Secret":   testSecret,
		"Accept-Encoding":    "identity",
		"X-Custom":           "kept",
	} {
		if got := h.Values(name); len(got) != 1 || got[0] != want {
			t.Errorf("upstream got %s %q, want %q", name, got, want)
		}
	}
	for _, name := range []string{"Authorization", "Cookie", "Range", "X-Gateway-Anything"} {
		if got := h.Values(name); len(got) != 0 {
			t.Errorf("upstream got %s %q", name, got)
		}
	}
	for name := range h {
		if strings.HasPrefix(strings.ToLower(name), "x-gateway-") &&
			!map[string]bool{"X-Gateway-Org-Id": true, "X-Gateway-Key-Id": true, "X-Gateway-Key-Role": true, "X-Gateway-Secret": true}[name] {
			t.Errorf("upstream got a client's %s", name)
		}
	}
	if strings.Contains(string(body), key) || strings.Contains(string(body), "session=abc") {
		t.Error("the key or the cookie reached the upstream")
	}
}

// timed runs fn and returns how long it took.
func timed(fn func()) time.Duration {
	start := time.Now()
	fn()
	return time.Since(start)
}

func TestPostgresUnreachableAnswers503(t *testing.T) {
	up := newUpstream(t)
	dead := withHost(t, schematest.URL(t), freeAddr(t))
	gw := startGateway(t, gatewayConfig{
		handler:  gatewayOptions(dead, map[string]any{"database_timeout": "500ms"}),
		upstream: up.addr(),
	})
	var res *http.Response
	var body []byte
	d := timed(func() { res, body = gw.get(t, "/v1/me", testKey) })
	wantJSONError(t, res, body, http.StatusServiceUnavailable, wantUnavailable)
	if d > 1500*time.Millisecond {
		t.Errorf("answered after %v; database_timeout is 500ms", d)
	}
	// A malformed key needs no database: still the 401.
	res, body = gw.get(t, "/v1/me", "nope")
	wantJSONError(t, res, body, http.StatusUnauthorized, wantUnauthenticated)
	if n := up.requests(); n != 0 {
		t.Errorf("the upstream saw %d requests", n)
	}
}

func TestSlowPostgresAnswers503WithinTheTimeout(t *testing.T) {
	d := newDB(t)
	org := d.org("pro")
	key, _ := d.key(org, keystore.RoleEditor)
	proxy := newFaultProxy(t, hostOf(t, d.url))
	proxy.set("blackhole") // accepts, never answers
	up := newUpstream(t)
	gw := startGateway(t, gatewayConfig{
		handler:  gatewayOptions(withHost(t, d.url, proxy.addr()), map[string]any{"database_timeout": "300ms"}),
		upstream: up.addr(),
	})

	// More concurrent requests than the pool has connections: each is bounded alone.
	type answer struct {
		status int
		body   string
		took   time.Duration
	}
	answers := make(chan answer, 10)
	for range cap(answers) {
		go func() {
			var a answer
			// Deferred, so that a request failing in gw.get (which ends this
			// goroutine) still answers, as status 0, instead of leaving the loop
			// below waiting.
			defer func() { answers <- a }()
			a.took = timed(func() {
				res, body := gw.get(t, "/v1/monitors", key)
				a.status, a.body = res.StatusCode, string(body)
			})
		}()
	}
	for range cap(answers) {
		a := <-answers
		if a.status != http.StatusServiceUnavailable || a.body != wantUnavailable {
			t.Errorf("%d %s; want 503", a.status, a.body)
		}
		if a.took < 250*time.Millisecond || a.took > 2*time.Second {
			t.Errorf("answered after %v; database_timeout is 300ms", a.took)
		}
	}
}

func TestPostgresOutageAndRecovery(t *testing.T) {
	d := newDB(t)
	org := d.org("pro")
	key, _ := d.key(org, keystore.RoleEditor)
	proxy := newFaultProxy(t, hostOf(t, d.url))
	up := newUpstream(t)
	gw := startGateway(t, gatewayConfig{
		handler:  gatewayOptions(withHost(t, d.url, proxy.addr()), map[string]any{"database_timeout": "500ms"}),
		upstream: up.addr(),
	})
	if res, body := gw.get(t, "/v1/me", key); res.StatusCode != http.StatusOK {
		t.Fatalf("before the outage: %d %s", res.StatusCode, body)
	}
	for _, mode := range []string{"refuse", "blackhole"} {
		proxy.set(mode)
		for range 3 {
			res, body := gw.get(t, "/v1/me", key)
			wantJSONError(t, res, body, http.StatusServiceUnavailable, wantUnavailable)
		}
		proxy.set("forward")
		eventually(t, 3*time.Second, func() bool {
			res, _ := gw.get(t, "/v1/me", key)
			if res.StatusCode != http.StatusOK && res.StatusCode != http.StatusServiceUnavailable {
				t.Fatalf("during recovery: %d", res.StatusCode)
			}
			return res.StatusCode == http.StatusOK
		})
	}
	if log := gw.logText(t); !strings.Contains(log, "key lookup failed") {
		t.Errorf("the outage was not logged:\n%s", log)
	}
}

// eventually retries cond until it holds or the time is up.
func eventually(t *testing.T, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v", within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestRedisFailure(t *testing.T) {
	d := newDB(t)
	org := d.org("pro")
	key, _ := d.key(org, keystore.RoleEditor)
	up := newUpstream(t)
	blackhole := newFaultProxy(t, hostOf(t, redisURL(t)))
	blackhole.set("blackhole")

	for _, tc := range []struct {
		name, redis, policy string
		status              int
	}{
		{"unreachable, open", withHost(t, redisURL(t), freeAddr(t)), "open", http.StatusOK},
		{"unreachable, closed", withHost(t, redisURL(t), freeAddr(t)), "closed", http.StatusServiceUnavailable},
		{"not answering, open", withHost(t, redisURL(t), blackhole.addr()), "open", http.StatusOK},
		{"not answering, closed", withHost(t, redisURL(t), blackhole.addr()), "closed", http.StatusServiceUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gw := startGateway(t, gatewayConfig{
				handler: gatewayOptions(d.url, map[string]any{
					"redis_url": tc.redis, "limiter_failure": tc.policy, "redis_timeout": "100ms",
				}),
				upstream: up.addr(),
			})
			for range 3 {
				var res *http.Response
				var body []byte
				took := timed(func() { res, body = gw.get(t, "/v1/me", key) })
				if res.StatusCode != tc.status {
					t.Errorf("%d %s; want %d", res.StatusCode, body, tc.status)
				}
				if tc.status == http.StatusServiceUnavailable {
					wantJSONError(t, res, body, tc.status, wantUnavailable)
				}
				if res.Header.Get("Ratelimit") != "" || res.Header.Get("Ratelimit-Policy") != "" {
					t.Errorf("RateLimit headers without a count: %q", res.Header)
				}
				if took > time.Second {
					t.Errorf("answered after %v; redis_timeout is 100ms", took)
				}
			}
		})
	}
}

func TestRedisOutageAndRecovery(t *testing.T) {
	d := newDB(t)
	org := d.org("pro")
	key, _ := d.key(org, keystore.RoleEditor)
	up := newUpstream(t)
	proxy := newFaultProxy(t, hostOf(t, redisURL(t)))
	gw := startGateway(t, gatewayConfig{
		handler:  gatewayOptions(d.url, map[string]any{"redis_url": withHost(t, redisURL(t), proxy.addr()), "redis_timeout": "100ms"}),
		upstream: up.addr(),
	})
	awayFromWindowEdge(t, 10*time.Second)
	res, _ := gw.get(t, "/v1/monitors", key)
	checkRateLimitHeaders(t, res, 600, 599)

	proxy.set("refuse")
	for range 3 {
		res, body := gw.get(t, "/v1/monitors", key)
		if res.StatusCode != http.StatusOK || res.Header.Get("Ratelimit") != "" {
			t.Errorf("during the outage (open): %d %q %s", res.StatusCode, res.Header, body)
		}
	}
	proxy.set("forward")
	eventually(t, 5*time.Second, func() bool {
		res, _ := gw.get(t, "/v1/monitors", key)
		return res.Header.Get("Ratelimit") != ""
	})
	if log := gw.logText(t); !strings.Contains(log, "rate limiter failed") {
		t.Errorf("the outage was not logged:\n%s", log)
	}
}

func TestLogsNeverShowKeys(t *testing.T) {
	d := newDB(t)
	org := d.org("pro")
	key, id := d.key(org, keystore.RoleEditor)
	_, secret, _ := strings.Cut(key, ".")
	unknown := "mon_live_ZZZZZZZZZZZZZZZZZZZZZZ.BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB"
	up := newUpstream(t)
	gw := startGateway(t, gatewayConfig{
		handler:      gatewayOptions(d.url, nil),
		upstream:     up.addr(),
		accessLog:    true,
		filterSecret: true,
	})
	cookie := http.Header{"Cookie": {"api_key=" + key}}
	gw.do(t, "GET", "/v1/me", "Bearer "+key, cookie, "")
	gw.do(t, "GET", "/v1/monitors", "Bearer "+key, cookie, "")
	gw.do(t, "GET", "/v1/me", "Bearer "+unknown, nil, "")
	gw.do(t, "GET", "/v1/me", "Bearer "+key+"x", nil, "") // malformed
	// An aborted response makes the reverse proxy log the headers it sent upstream.
	if res, err := gw.client.Do(mustRequest(t, gw.base+"/v1/invalid-json", key)); err == nil {
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
	}
	time.Sleep(100 * time.Millisecond) // the access log is written after the response

	log := gw.logText(t)
	if !strings.Contains(log, `"user_id":"`+id+`"`) {
		t.Errorf("the access log does not name the key id as user_id:\n%s", log)
	}
	if !strings.Contains(log, "REDACTED") || !strings.Contains(log, "aborting with incomplete response") {
		t.Fatalf("the log lacks the entries this test is about:\n%s", log)
	}
	for what, s := range map[string]string{"the key": key, "its secret": secret, "an unknown key's secret": "BBBBBBBBBBBBBBBBBBBB", "the gateway secret": testSecret} {
		if strings.Contains(log, s) {
			t.Errorf("the log shows %s:\n%s", what, log)
		}
	}
}

func TestLogCredentialsWouldShowTheKey(t *testing.T) {
	// Why the operator must not turn log_credentials on under /v1, and the proof
	// that the test above would catch a key in the log.
	d := newDB(t)
	org := d.org("pro")
	key, _ := d.key(org, keystore.RoleEditor)
	gw := startGateway(t, gatewayConfig{handler: gatewayOptions(d.url, nil), upstream: newUpstream(t).addr(), accessLog: true, logCreds: true})
	gw.get(t, "/v1/me", key)
	time.Sleep(100 * time.Millisecond)
	if !strings.Contains(gw.logText(t), key) {
		t.Error("with log_credentials the access log shows the Authorization header; this test expected it to")
	}
}

func mustRequest(t testing.TB, url, key string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	return req
}

func TestReverseProxyLogsTheGatewaySecretWithoutTheFilter(t *testing.T) {
	// Why Caddyfile.example filters X-Gateway-Secret out of the logs: the reverse
	// proxy logs the headers it sent upstream when it aborts a response (and at debug
	// level), and Caddy redacts only Authorization, Cookie and the like.
	d := newDB(t)
	key, _ := d.key(d.org("pro"), keystore.RoleEditor)
	gw := startGateway(t, gatewayConfig{handler: gatewayOptions(d.url, nil), upstream: newUpstream(t).addr()})
	if res, err := gw.client.Do(mustRequest(t, gw.base+"/v1/invalid-json", key)); err == nil {
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
	}
	time.Sleep(100 * time.Millisecond)
	if !strings.Contains(gw.logText(t), testSecret) {
		t.Error("the unfiltered log does not show the gateway secret; the log filter of Caddyfile.example may no longer be needed")
	}
}
