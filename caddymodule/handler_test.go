package caddymodule

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keygate/keygate/internal/testkit/testenv"
	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/keystore/keystoretest"
	"github.com/keygate/keygate/schema/schematest"
)

const (
	wantUnauthenticated = `{"error":"api key unauthenticated"}`
	wantFeatureGated    = `{"error":"feature_gated","feature":"api","upgrade":true}`
	wantForbidden       = `{"error":"forbidden","reason":"role","required_role":"Editor"}`
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
			if _, inProcess := tc.extra["redis_url"]; inProcess {
				pinClock(t, time.Now()) // the in-process limiter's window is the module's
			} else {
				awayFromWindowEdge(t, 10*time.Second) // Redis's windows follow Redis's clock
			}
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
			wantJSONError(t, res, body, http.StatusTooManyRequests, `{"error":"rate_limited","retryAfter":`+strconv.Itoa(s)+`,"budget":"key","window":"minute"}`)
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

// checkRateLimitHeaders checks the RateLimit header fields of a counted request
// (README.md, the decision order's step 4). It returns their t.
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

// timed runs fn and returns how long it took.
func timed(fn func()) time.Duration {
	start := time.Now()
	fn()
	return time.Since(start)
}

func TestSlowPostgresAnswers503WithinTheTimeout(t *testing.T) {
	d := newDB(t)
	org := d.org("pro")
	key, _ := d.key(org, keystore.RoleEditor)
	proxy := newLatencyProxy(t, hostOf(t, d.url))
	proxy.Hang() // accepts, never answers
	up := newUpstream(t)
	gw := startGateway(t, gatewayConfig{
		handler:  gatewayOptions(withHost(t, d.url, proxy.Addr()), map[string]any{"database_timeout": "300ms"}),
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
			// Deferred, so that a request failing in gw.get still answers, as status 0. The
			// failure ends this goroutine, and would leave the loop below waiting.
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
	// The access log is written after the response: wait for the last request's line.
	var log string
	testenv.Eventually(t, 5*time.Second, "the aborted response's log lines", func() bool {
		log = gw.logText(t)
		return strings.Contains(log, "aborting with incomplete response") && strings.Contains(log, `"uri":"/v1/invalid-json"`)
	})
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
	// Why the operator must not turn log_credentials on under /v1. And the proof that
	// the test above would catch a key in the log.
	d := newDB(t)
	org := d.org("pro")
	key, _ := d.key(org, keystore.RoleEditor)
	gw := startGateway(t, gatewayConfig{handler: gatewayOptions(d.url, nil), upstream: newUpstream(t).addr(), accessLog: true, logCreds: true})
	gw.get(t, "/v1/me", key)
	testenv.Eventually(t, 5*time.Second, "with log_credentials, the key in the access log (the Authorization header)", func() bool {
		return strings.Contains(gw.logText(t), key)
	})
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
	// Why Caddyfile.example filters X-Gateway-Secret out of the logs. The reverse proxy
	// logs the headers it sent upstream when it aborts a response, and at debug level.
	// Caddy redacts only Authorization, Cookie and the like.
	d, key, _ := newDBWithKey(t)
	gw := startGateway(t, gatewayConfig{handler: gatewayOptions(d.url, nil), upstream: newUpstream(t).addr()})
	if res, err := gw.client.Do(mustRequest(t, gw.base+"/v1/invalid-json", key)); err == nil {
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
	}
	testenv.Eventually(t, 5*time.Second, "the gateway secret in the unfiltered log (without it, the log filter of Caddyfile.example may no longer be needed)", func() bool {
		return strings.Contains(gw.logText(t), testSecret)
	})
}

// BenchmarkTellingAWrongSecretFromAnUnknownKey times pairs of requests through
// ServeHTTP, over the real PostgreSQL and a Batcher. It runs each pair in turn in
// either order. It is what an attacker would do to learn whether a key id is live. A
// pair is a live key's id with a wrong secret, and an unknown id. Both have a valid
// checksum, so both are looked up. The attacker guesses that the slower of a pair is
// the live id. %told-apart is the share of pairs where that is right (50 is chance).
// µs-apart is the difference of their medians. "revoked" pairs a revoked key's id
// with an unknown id the same way. A wrong secret should cost what a revoked key does
// (docs/security.md). Run with -benchtime 3000x or more. A pair is two round trips to
// PostgreSQL, and the machine's noise is in the share.
func BenchmarkTellingAWrongSecretFromAnUnknownKey(b *testing.B) {
	pool, _ := schematest.NewPool(b)
	store := keystore.New(pool, keystoretest.Format(b, "mon"))
	ctx := context.Background()
	var org string
	if err := pool.QueryRow(ctx, `INSERT INTO orgs (name, plan) VALUES ('acme', 'pro') RETURNING id::text`).Scan(&org); err != nil {
		b.Fatal(err)
	}
	var ids []string
	for range 2 {
		rec, _, err := store.Create(ctx, keystore.NewKey{OrgID: org, Name: "k", Role: keystore.RoleEditor})
		if err != nil {
			b.Fatal(err)
		}
		ids = append(ids, rec.ID)
	}
	if _, err := store.Revoke(ctx, org, ids[1], "bench"); err != nil {
		b.Fatal(err)
	}
	// Every key here has a wrong secret, with a valid checksum.
	withChecksum := func(keyID string) string {
		body := "mon_live_" + keyID + "." + strings.Repeat("A", 43)
		return body + keystore.Checksum(body)
	}
	unknown := withChecksum("Z" + ids[0][1:])
	h := newTestHandler(b, keystore.NewBatcher(store, keystore.BatcherOptions{Timeout: 2 * time.Second}), "")
	timed := func(key string) time.Duration {
		r := httptest.NewRequest(http.MethodGet, "http://gw/v1/me", nil)
		r.Header.Set("Authorization", "Bearer "+key)
		w := httptest.NewRecorder()
		start := time.Now()
		if err := h.ServeHTTP(w, r, nil); err != nil || w.Code != http.StatusUnauthorized {
			b.Fatalf("%d, %v; want the 401", w.Code, err)
		}
		return time.Since(start)
	}
	for _, tc := range []struct{ name, key string }{
		{"wrong-secret", withChecksum(ids[0])},
		{"revoked", withChecksum(ids[1])},
	} {
		b.Run(tc.name, func(b *testing.B) {
			for range 100 { // connections and prepared statements warm
				timed(tc.key)
				timed(unknown)
			}
			told, i := 0, 0
			var keyTook, unknownTook []time.Duration
			for b.Loop() {
				var k, u time.Duration
				if i++; i%2 == 0 {
					k, u = timed(tc.key), timed(unknown)
				} else {
					u, k = timed(unknown), timed(tc.key)
				}
				keyTook, unknownTook = append(keyTook, k), append(unknownTook, u)
				if k > u {
					told++
				}
			}
			b.ReportMetric(100*float64(told)/float64(i), "%told-apart")
			b.ReportMetric(float64(median(keyTook)-median(unknownTook))/1e3, "µs-apart")
		})
	}
}

// median returns the median of ds, which it sorts.
func median(ds []time.Duration) time.Duration {
	slices.Sort(ds)
	return ds[len(ds)/2]
}
