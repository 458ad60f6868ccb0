package caddymodule

// The handler's decisions as tables over ServeHTTP, without servers. They run on a
// Verifier double, limiter.NewLocal on a fixed clock, and a next handler standing in
// for the reverse proxy. PostgreSQL and Redis behaviour is the keystore, limiter and
// integration suites'.

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"

	"github.com/keygate/keygate/caddymodule/conns"
	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/limiter"
)

// The keys the Verifier double knows: id → key. Every key's secret is testSecretPart.
const testSecretPart = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFE"

var testKeys = map[string]keystore.Key{
	"AdminAdminAdminAdmin01": {ID: "AdminAdminAdminAdmin01", OrgID: "org-1", Role: keystore.RoleAdmin, RateLimit: 600},
	"EditorEditorEditor0001": {ID: "EditorEditorEditor0001", OrgID: "org-1", Role: keystore.RoleEditor, RateLimit: 600},
	"ViewerViewerViewer0001": {ID: "ViewerViewerViewer0001", OrgID: "org-1", Role: keystore.RoleViewer, RateLimit: 600},
	"TinyViewerTinyViewer01": {ID: "TinyViewerTinyViewer01", OrgID: "org-2", Role: keystore.RoleViewer, RateLimit: 3},
	"FreeAdminFreeAdmin0001": {ID: "FreeAdminFreeAdmin0001", OrgID: "org-3", Role: keystore.RoleAdmin, RateLimit: 0},
	"UnlimitedViewer0000001": {ID: "UnlimitedViewer0000001", OrgID: "org-4", Role: keystore.RoleViewer, RateLimit: -1},
	"UnlimitedAdmin00000001": {ID: "UnlimitedAdmin00000001", OrgID: "org-4", Role: keystore.RoleAdmin, RateLimit: -1},
	"OddRoleOddRoleOddRole1": {ID: "OddRoleOddRoleOddRole1", OrgID: "org-1", Role: "Owner", RateLimit: 600},
	"OrgCeilingViewer000001": {ID: "OrgCeilingViewer000001", OrgID: "org-5", Role: keystore.RoleViewer, RateLimit: 600, OrgRateLimit: 3, MonthlyQuota: -1},
	"QuotaViewerQuotaView01": {ID: "QuotaViewerQuotaView01", OrgID: "org-6", Role: keystore.RoleViewer, RateLimit: 5, OrgRateLimit: -1, MonthlyQuota: 2},
	"OrgCeilingUnlimited001": {ID: "OrgCeilingUnlimited001", OrgID: "org-7", Role: keystore.RoleViewer, RateLimit: -1, OrgRateLimit: 4, MonthlyQuota: -1},
	"RestrictedAdminRestr01": {ID: "RestrictedAdminRestr01", OrgID: "org-1", Role: keystore.RoleAdmin, RateLimit: 600,
		AllowedCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}},
	"NearbyAdminNearbyAdm01": {ID: "NearbyAdminNearbyAdm01", OrgID: "org-1", Role: keystore.RoleAdmin, RateLimit: 600,
		AllowedCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.0.2.0/24")}},
}

// bearer returns the Authorization value of a test key id.
func bearer(id string) string { return "Bearer mon_live_" + id + "." + testSecretPart }

// fakeVerifier is the Verifier double: testKeys with testSecretPart, or err for every
// lookup. As the store does, it refuses a key asked from outside its networks, and
// tells such a key apart afterwards as its Denier. It counts its lookups.
type fakeVerifier struct {
	err   error
	calls int
}

func (v *fakeVerifier) VerifyParsed(_ context.Context, keyID, secret string, from netip.Addr) (keystore.Key, bool, error) {
	v.calls++
	if v.err != nil {
		return keystore.Key{}, false, v.err
	}
	k, ok := testKeys[keyID]
	if !ok || secret != testSecretPart || from.IsValid() && !k.AllowsAddr(from) {
		return keystore.Key{}, false, nil
	}
	return k, true, nil
}

func (v *fakeVerifier) Denied(ctx context.Context, keyID, secret string) (keystore.Key, bool, error) {
	if err := ctx.Err(); err != nil {
		return keystore.Key{}, false, err
	}
	k, ok := testKeys[keyID]
	if !ok || secret != testSecretPart || len(k.AllowedCIDRs) == 0 {
		return keystore.Key{}, false, nil
	}
	return keystore.Key{ID: k.ID, OrgID: k.OrgID}, true, nil
}

// failingLimiter is a Redis that cannot count.
type failingLimiter struct{}

func (failingLimiter) Allow(context.Context, limiter.Budgets) (limiter.Result, error) {
	return limiter.Result{}, errors.New("redis: connection refused")
}

// testNow is the limiter's clock: 15 seconds into a minute, so every window has 45s left.
var testNow = time.Date(2030, 1, 2, 3, 4, 15, 0, time.UTC)

// newTestHandler is a configured Handler without pools. It has the Verifier double,
// the in-process limiter on testNow, and metrics not registered anywhere.
// limiterFailure, when set, puts a Redis that cannot count in front, with that
// policy.
func newTestHandler(t testing.TB, v Verifier, limiterFailure string) *Handler {
	t.Helper()
	h := &Handler{DatabaseURL: "postgres://unused", GatewaySecret: testSecret, LimiterFailure: limiterFailure}
	if err := h.configure(zap.NewNop()); err != nil {
		t.Fatal(err)
	}
	h.metrics = newMetrics()
	withDoubles(h, v, limiter.NewLocal(limiter.WithClock(func() time.Time { return testNow })))
	if limiterFailure != "" {
		h.counts = redisCounts(failingLimiter{}, conns.NewBreaker(nil, nil), nil, h.metrics)
		if h.failMode == failLocal {
			h.fallback = limiter.NewLocal(limiter.WithClock(func() time.Time { return testNow }))
		}
	}
	return h
}

// withDoubles gives h the request path Provision builds, on v and lim. The lookups
// go behind a PostgreSQL breaker, with v as their Denier if it is one, and the
// counts are in process.
func withDoubles(h *Handler, v Verifier, lim limiter.Limiter) {
	h.lookups = newLookups(v, conns.NewBreaker(nil, h.breakerChanged("postgres")), h.metrics)
	h.lookups.denials, _ = v.(Denier)
	h.counts = localCounts(lim, h.metrics)
}

// spend counts n requests of the test key keyID, as step 4 would: against its
// organisation's budgets when its plan has any, its minute alone otherwise.
func spend(t *testing.T, h *Handler, keyID string, n int) {
	t.Helper()
	key := testKeys[keyID]
	for range n {
		if _, err := h.counts.lim.Allow(context.Background(), budgetsOf(&key, 1)); err != nil {
			t.Fatal(err)
		}
	}
}

// upstream is what the next handler, the reverse proxy's stand-in, does. The default
// answers JSON with a field strip_fields removes.
type upstream func(w http.ResponseWriter, r *http.Request) error

const upstreamJSON = `{"id":"m1","config":{"a":1},"org_id":"o"}`

func jsonUpstream(w http.ResponseWriter, _ *http.Request) error {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(upstreamJSON)))
	_, err := io.WriteString(w, upstreamJSON)
	return err
}

// decision is one row of the decision table.
type decision struct {
	name           string
	method, path   string
	auth           []string // Authorization values; none: no header
	header         http.Header
	used           int    // requests of auth's key already counted in this window
	verifierErr    error  // the lookup fails
	limiterFailure string // a Redis that cannot count, with this policy
	upstream       upstream

	status  int
	body    string      // exact; "" with bodyAny
	bodyAny bool        // the body is not checked (a proxied body checked elsewhere)
	headers http.Header // exact values; an empty slice: absent
	proxied bool        // the next handler was called
	outcome keystore.Outcome
}

func (d decision) run(t *testing.T) {
	t.Helper()
	v := &fakeVerifier{err: d.verifierErr}
	h := newTestHandler(t, v, d.limiterFailure)
	method := d.method
	if method == "" {
		method = http.MethodGet
	}
	r := httptest.NewRequest(method, "http://gw"+d.path, nil)
	for k, vv := range d.header {
		r.Header[k] = vv
	}
	if len(d.auth) > 0 {
		r.Header["Authorization"] = d.auth
		if keyID, _, ok := bearerKey(r.Header, h.format); ok {
			spend(t, h, keyID, d.used)
		}
	}
	var seen *http.Request
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		seen = r
		if d.upstream != nil {
			return d.upstream(w, r)
		}
		return jsonUpstream(w, r)
	})
	w := httptest.NewRecorder()
	if err := h.ServeHTTP(w, r, next); err != nil {
		t.Fatalf("ServeHTTP: %v", err)
	}
	if w.Code != d.status {
		t.Errorf("status %d, want %d (body %s)", w.Code, d.status, w.Body)
	}
	if !d.bodyAny && w.Body.String() != d.body {
		t.Errorf("body %s, want %s", w.Body, d.body)
	}
	for k, want := range d.headers {
		if got := w.Header().Values(k); strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("%s %q, want %q", k, got, want)
		}
	}
	if (seen != nil) != d.proxied {
		t.Errorf("proxied %v, want %v", seen != nil, d.proxied)
	}
	if got := counterValue(t, h.metrics.byOutcome[d.outcome]); got != 1 {
		t.Errorf("keygate_requests_total{outcome=%q} = %v, want 1", d.outcome, got)
	}
}

// The headers every answer of the module's own carries.
func ownJSON(extra http.Header) http.Header {
	h := http.Header{"Content-Type": {"application/json"}, "Cache-Control": {"no-store"}, "X-Content-Type-Options": {"nosniff"}}
	for k, v := range extra {
		h[k] = v
	}
	return h
}

var (
	noRateLimit   = http.Header{"Ratelimit": {}, "Ratelimit-Policy": {}, "Retry-After": {}}
	unauthHeaders = ownJSON(http.Header{"Www-Authenticate": {"Bearer"}, "Content-Length": {"35"}, "Ratelimit": {}, "Ratelimit-Policy": {}})
)

func rateLimitHeader(limit, remaining int) http.Header {
	return http.Header{
		"Ratelimit-Policy": {`"default";q=` + strconv.Itoa(limit) + `;w=60`},
		"Ratelimit":        {`"default";r=` + strconv.Itoa(remaining) + `;t=45`},
	}
}

func merge(hs ...http.Header) http.Header {
	out := http.Header{}
	for _, h := range hs {
		for k, v := range h {
			out[k] = v
		}
	}
	return out
}

const (
	admin, editor, viewer = "AdminAdminAdminAdmin01", "EditorEditorEditor0001", "ViewerViewerViewer0001"
	tinyViewer, freeAdmin = "TinyViewerTinyViewer01", "FreeAdminFreeAdmin0001"
	unlimViewer           = "UnlimitedViewer0000001"
	unlimAdmin            = "UnlimitedAdmin00000001"
	oddRole               = "OddRoleOddRoleOddRole1"
	orgCeiling, quotaKey  = "OrgCeilingViewer000001", "QuotaViewerQuotaView01"
	orgUnlimited          = "OrgCeilingUnlimited001"
	restricted, nearby    = "RestrictedAdminRestr01", "NearbyAdminNearbyAdm01" // httptest's client is 192.0.2.1
)

// noLimits is the limits member of /v1/me for a key of rate limit perMinute on a plan
// without organisation budgets.
func noLimits(perMinute string) string {
	return `"scopes":null,"limits":{"per_minute":` + perMinute + `,"per_second":null,"per_hour":null,"per_day":null,"org_per_minute":null,"per_month":null,"used_this_month":null}`
}

// orgHeaders are the RateLimit fields of a key of 600 a minute under an org ceiling.
func orgHeaders(keyLeft, orgLimit, orgLeft int) http.Header {
	return http.Header{
		"Ratelimit-Policy": {`"default";q=600;w=60, "org";q=` + strconv.Itoa(orgLimit) + `;w=60`},
		"Ratelimit":        {`"default";r=` + strconv.Itoa(keyLeft) + `;t=45, "org";r=` + strconv.Itoa(orgLeft) + `;t=45`},
	}
}

func TestDecisions(t *testing.T) {
	rl600 := rateLimitHeader(600, 599)
	for _, d := range []decision{
		// 1–2. Credentials and the key.
		{name: "no credentials", path: "/v1/me", status: 401, body: wantUnauthenticated, headers: unauthHeaders, outcome: keystore.OutcomeUnauthenticated},
		{name: "malformed before anything", method: "POST", path: "/v1/monitors", auth: []string{"Bearer nope"}, status: 401, body: wantUnauthenticated, headers: unauthHeaders, outcome: keystore.OutcomeUnauthenticated},
		{name: "two Authorization headers", path: "/v1/me", auth: []string{bearer(admin), bearer(admin)}, status: 401, body: wantUnauthenticated, headers: unauthHeaders, outcome: keystore.OutcomeUnauthenticated},
		{name: "unknown key", path: "/v1/monitors", auth: []string{bearer("ZZZZZZZZZZZZZZZZZZZZZZ")}, status: 401, body: wantUnauthenticated, headers: unauthHeaders, outcome: keystore.OutcomeUnauthenticated},
		{name: "wrong secret", path: "/v1/me", auth: []string{"Bearer mon_live_" + admin + ".AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}, status: 401, body: wantUnauthenticated, headers: unauthHeaders, outcome: keystore.OutcomeUnauthenticated},
		{name: "key in a cookie", path: "/v1/me", header: http.Header{"Cookie": {"api_key=mon_live_" + admin + "." + testSecretPart}}, status: 401, body: wantUnauthenticated, headers: unauthHeaders, outcome: keystore.OutcomeUnauthenticated},
		{name: "lookup fails: 503, never 401", path: "/v1/me", auth: []string{bearer(admin)}, verifierErr: errors.New("dial tcp: refused"), status: 503, body: wantUnavailable, headers: merge(ownJSON(nil), noRateLimit), outcome: keystore.OutcomeLookupUnavailable},
		// 3. API access, before the rate limit and the role.
		{name: "no API access", path: "/v1/monitors", auth: []string{bearer(freeAdmin)}, status: 403, body: wantFeatureGated, headers: merge(ownJSON(nil), noRateLimit), outcome: keystore.OutcomeFeatureGated},
		{name: "no API access on /v1/me too", path: "/v1/me", auth: []string{bearer(freeAdmin)}, status: 403, body: wantFeatureGated, headers: merge(ownJSON(nil), noRateLimit), outcome: keystore.OutcomeFeatureGated},
		// 4. The rate limit, before the role and /v1/me.
		{name: "last request of the budget", path: "/v1/me", auth: []string{bearer(tinyViewer)}, used: 2, status: 200, body: `{"org_id":"org-2","role":"Viewer",` + noLimits("3") + `}`, headers: rateLimitHeader(3, 0), outcome: keystore.OutcomeMe},
		{name: "over budget", path: "/v1/me", auth: []string{bearer(tinyViewer)}, used: 3, status: 429, body: `{"error":"rate_limited","retryAfter":45,"budget":"key","window":"minute"}`,
			headers: merge(ownJSON(rateLimitHeader(3, 0)), http.Header{"Retry-After": {"45"}}), outcome: keystore.OutcomeRateLimited},
		{name: "rate limit before the role", method: "POST", path: "/v1/monitors", auth: []string{bearer(tinyViewer)}, used: 5, status: 429, body: `{"error":"rate_limited","retryAfter":45,"budget":"key","window":"minute"}`,
			headers: rateLimitHeader(3, 0), outcome: keystore.OutcomeRateLimited},
		// 5. The role.
		{name: "a Viewer writing", method: "POST", path: "/v1/monitors", auth: []string{bearer(viewer)}, status: 403, body: wantForbidden, headers: ownJSON(rl600), outcome: keystore.OutcomeForbidden},
		{name: "a Viewer with no limit deleting", method: "DELETE", path: "/v1/monitors/m1", auth: []string{bearer(unlimViewer)}, status: 403, body: wantForbidden, headers: merge(ownJSON(nil), noRateLimit), outcome: keystore.OutcomeForbidden},
		{name: "a Viewer PROPFIND", method: "PROPFIND", path: "/v1/monitors", auth: []string{bearer(viewer)}, status: 403, body: wantForbidden, outcome: keystore.OutcomeForbidden},
		{name: "a role the gateway does not know reads only", method: "PATCH", path: "/v1/monitors/m1", auth: []string{bearer(oddRole)}, status: 403, body: wantForbidden, outcome: keystore.OutcomeForbidden},
		{name: "a Viewer OPTIONS", method: "OPTIONS", path: "/v1/monitors", auth: []string{bearer(viewer)}, status: 200, body: `{"id":"m1"}`, proxied: true, outcome: keystore.OutcomeProxied},
		{name: "an Editor writes", method: "POST", path: "/v1/monitors", auth: []string{bearer(editor)}, status: 200, body: `{"id":"m1"}`, headers: rl600, proxied: true, outcome: keystore.OutcomeProxied},
		// 6. /v1/me.
		{name: "GET /v1/me", path: "/v1/me", auth: []string{bearer(editor)}, status: 200, body: `{"org_id":"org-1","role":"Editor",` + noLimits("600") + `}`,
			headers: ownJSON(merge(rl600, http.Header{"Content-Length": {"187"}})), outcome: keystore.OutcomeMe},
		{name: "GET /v1/me of a Viewer", path: "/v1/me", auth: []string{bearer(viewer)}, status: 200, body: `{"org_id":"org-1","role":"Viewer",` + noLimits("600") + `}`, outcome: keystore.OutcomeMe},
		{name: "HEAD /v1/me", method: "HEAD", path: "/v1/me", auth: []string{bearer(admin)}, status: 200, bodyAny: true,
			headers: ownJSON(http.Header{"Content-Length": {"186"}}), outcome: keystore.OutcomeMe},
		{name: "POST /v1/me is the upstream's", method: "POST", path: "/v1/me", auth: []string{bearer(admin)}, status: 200, body: `{"id":"m1"}`, proxied: true, outcome: keystore.OutcomeProxied},
		{name: "an upstream that writes nothing: 200 with the RateLimit fields", path: "/v1/monitors", auth: []string{bearer(admin)},
			upstream: func(http.ResponseWriter, *http.Request) error { return nil }, status: 200, body: "", headers: rl600, proxied: true, outcome: keystore.OutcomeProxied},
		{name: "/v1/me/ is the upstream's", path: "/v1/me/", auth: []string{bearer(admin)}, status: 200, body: `{"id":"m1"}`, proxied: true, outcome: keystore.OutcomeProxied},
		{name: "/v1//me is the upstream's", path: "/v1//me", auth: []string{bearer(admin)}, status: 200, body: `{"id":"m1"}`, proxied: true, outcome: keystore.OutcomeProxied},
		{name: "/v1/mE is the upstream's", path: "/v1/mE", auth: []string{bearer(admin)}, status: 200, body: `{"id":"m1"}`, proxied: true, outcome: keystore.OutcomeProxied},
		// 7. The proxy and its response.
		{name: "unlimited: no RateLimit fields, whatever the upstream sends", path: "/v1/monitors", auth: []string{bearer(unlimAdmin)},
			upstream: spoofRateLimit, status: 200, body: `{}`, headers: noRateLimit, proxied: true, outcome: keystore.OutcomeProxied},
		{name: "counted: the gateway's RateLimit fields, not the upstream's", path: "/v1/monitors", auth: []string{bearer(admin)},
			upstream: spoofRateLimit, status: 200, body: `{}`, headers: rl600, proxied: true, outcome: keystore.OutcomeProxied},
		{name: "an upstream error that is not JSON becomes JSON", path: "/v1/x", auth: []string{bearer(admin)}, upstream: htmlError,
			status: 500, body: `{"error":"internal_server_error"}`,
			headers: merge(ownJSON(rl600), http.Header{"Content-Length": {"33"}, "Etag": {}, "Last-Modified": {}, "Content-Disposition": {}}), proxied: true, outcome: keystore.OutcomeProxied},
		{name: "an upstream in an unknown encoding answers 502", path: "/v1/x", auth: []string{bearer(admin)}, upstream: brotliJSON,
			status: 502, body: `{"error":"bad_gateway"}`, headers: merge(ownJSON(rl600), http.Header{"Content-Encoding": {}}), proxied: true, outcome: keystore.OutcomeProxied},
		{name: "an unreachable upstream answers 502 JSON", path: "/v1/x", auth: []string{bearer(admin)}, upstream: failWith(http.StatusBadGateway),
			status: 502, body: `{"error":"bad_gateway"}`, headers: ownJSON(rl600), proxied: true, outcome: keystore.OutcomeProxied},
		{name: "a slow upstream answers 504 JSON", path: "/v1/x", auth: []string{bearer(unlimAdmin)}, upstream: failWith(http.StatusGatewayTimeout),
			status: 504, body: `{"error":"gateway_timeout"}`, headers: merge(ownJSON(nil), noRateLimit), proxied: true, outcome: keystore.OutcomeProxied},
		{name: "an upstream JSON error is the upstream's, filtered", path: "/v1/x", auth: []string{bearer(admin)}, upstream: jsonConflict,
			status: 409, body: `{"error":"conflict"}`, headers: rl600, proxied: true, outcome: keystore.OutcomeProxied},
		// 4. An organisation's budgets, after the key's own.
		{name: "an org ceiling: both minute budgets in the fields", path: "/v1/monitors", auth: []string{bearer(orgCeiling)},
			status: 200, body: `{"id":"m1"}`, headers: orgHeaders(599, 3, 2), proxied: true, outcome: keystore.OutcomeProxied},
		{name: "an org ceiling spent: 429 until the org's window ends", path: "/v1/monitors", auth: []string{bearer(orgCeiling)}, used: 3,
			status: 429, body: `{"error":"rate_limited","retryAfter":45,"budget":"org","window":"minute"}`,
			headers: ownJSON(merge(orgHeaders(596, 3, 0), http.Header{"Retry-After": {"45"}})), outcome: keystore.OutcomeRateLimited},
		{name: "an unlimited key under an org ceiling: the org's fields alone", path: "/v1/monitors", auth: []string{bearer(orgUnlimited)},
			status: 200, body: `{"id":"m1"}`, proxied: true, outcome: keystore.OutcomeProxied,
			headers: http.Header{"Ratelimit-Policy": {`"org";q=4;w=60`}, "Ratelimit": {`"org";r=3;t=45`}}},
		{name: "a month spent: 402 quota_exceeded, no Retry-After", path: "/v1/monitors", auth: []string{bearer(quotaKey)}, used: 2,
			status: 402, body: `{"error":"quota_exceeded","metric":"api_requests","upgrade":true,"limit":2,"used":2}`,
			headers: ownJSON(merge(rateLimitHeader(5, 2), http.Header{"Retry-After": {}})), outcome: keystore.OutcomeQuotaExceeded},
		{name: "GET /v1/me shows the budgets and the month's use", path: "/v1/me", auth: []string{bearer(quotaKey)}, used: 1, status: 200,
			body:    `{"org_id":"org-6","role":"Viewer","scopes":null,"limits":{"per_minute":5,"per_second":null,"per_hour":null,"per_day":null,"org_per_minute":null,"per_month":2,"used_this_month":2}}`,
			headers: rateLimitHeader(5, 3), outcome: keystore.OutcomeMe},
		{name: "GET /v1/me under an org ceiling", path: "/v1/me", auth: []string{bearer(orgCeiling)}, status: 200,
			body:    `{"org_id":"org-5","role":"Viewer","scopes":null,"limits":{"per_minute":600,"per_second":null,"per_hour":null,"per_day":null,"org_per_minute":3,"per_month":null,"used_this_month":null}}`,
			headers: orgHeaders(599, 3, 2), outcome: keystore.OutcomeMe},
		// 2. A key's allowed networks.
		{name: "outside its networks: the unknown key's 401", path: "/v1/monitors", auth: []string{bearer(restricted)},
			status: 401, body: wantUnauthenticated, headers: unauthHeaders, outcome: keystore.OutcomeIPDenied},
		{name: "inside its networks: through", path: "/v1/monitors", auth: []string{bearer(nearby)},
			status: 200, body: `{"id":"m1"}`, headers: rl600, proxied: true, outcome: keystore.OutcomeProxied},
		// Limiter failure modes.
		{name: "Redis down, open: through without RateLimit fields", path: "/v1/monitors", auth: []string{bearer(admin)}, limiterFailure: "open",
			status: 200, body: `{"id":"m1"}`, headers: noRateLimit, proxied: true, outcome: keystore.OutcomeProxied},
		{name: "Redis down, closed: 503", path: "/v1/monitors", auth: []string{bearer(admin)}, limiterFailure: "closed",
			status: 503, body: wantUnavailable, headers: merge(ownJSON(nil), noRateLimit), outcome: keystore.OutcomeLimiterUnavailable},
		{name: "Redis down, closed: /v1/me too", path: "/v1/me", auth: []string{bearer(admin)}, limiterFailure: "closed",
			status: 503, body: wantUnavailable, outcome: keystore.OutcomeLimiterUnavailable},
		{name: "Redis down, local: counted here", path: "/v1/monitors", auth: []string{bearer(admin)}, limiterFailure: "local",
			status: 200, body: `{"id":"m1"}`, headers: rl600, proxied: true, outcome: keystore.OutcomeProxied},
		{name: "Redis down, closed: an org's budgets too", path: "/v1/monitors", auth: []string{bearer(orgCeiling)}, limiterFailure: "closed",
			status: 503, body: wantUnavailable, headers: merge(ownJSON(nil), noRateLimit), outcome: keystore.OutcomeLimiterUnavailable},
		{name: "Redis down, local: an org's budgets counted here", path: "/v1/monitors", auth: []string{bearer(orgCeiling)}, limiterFailure: "local",
			status: 200, body: `{"id":"m1"}`, headers: orgHeaders(599, 3, 2), proxied: true, outcome: keystore.OutcomeProxied},
		{name: "Redis down, unlimited key: never asked", path: "/v1/monitors", auth: []string{bearer(unlimAdmin)}, limiterFailure: "closed",
			status: 200, body: `{"id":"m1"}`, headers: noRateLimit, proxied: true, outcome: keystore.OutcomeProxied},
	} {
		t.Run(d.name, d.run)
	}
}

func spoofRateLimit(w http.ResponseWriter, _ *http.Request) error {
	w.Header().Set("Ratelimit", `"default";r=999;t=1`)
	w.Header().Set("Ratelimit-Policy", `"default";q=999;w=60`)
	w.Header().Set("Content-Type", "application/json")
	_, err := io.WriteString(w, `{}`)
	return err
}

func htmlError(w http.ResponseWriter, _ *http.Request) error {
	w.Header().Set("Content-Type", "text/html")
	w.Header().Set("Etag", `"e1"`)
	w.Header().Set("Last-Modified", "Mon, 01 Jan 2024 00:00:00 GMT")
	w.Header().Set("Content-Disposition", "attachment")
	w.WriteHeader(http.StatusInternalServerError)
	_, err := io.WriteString(w, "<h1>stack trace with config secrets</h1>")
	return err
}

func brotliJSON(w http.ResponseWriter, _ *http.Request) error {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Encoding", "br")
	_, err := io.WriteString(w, "\x1b\x2f\x00not really brotli")
	return err
}

func jsonConflict(w http.ResponseWriter, _ *http.Request) error {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusConflict)
	_, err := io.WriteString(w, `{"error":"conflict","org_id":"o1"}`)
	return err
}

// failWith is a reverse proxy that could not get an answer. It returns the error
// Caddy's reverse proxy does, having written nothing.
func failWith(status int) upstream {
	return func(http.ResponseWriter, *http.Request) error {
		return caddyhttp.Error(status, errors.New("upstream: dial tcp: connection refused"))
	}
}

func TestEveryCredentialFailureIsTheSame401(t *testing.T) {
	valid := "mon_live_" + admin + "." + testSecretPart
	var first string
	for _, auth := range append([]string{
		"", bearer("ZZZZZZZZZZZZZZZZZZZZZZ"), "Bearer mon_live_" + admin + ".AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
		"Bearer " + valid + "x", "Bearer " + valid[:len(valid)-1], "Bearer sk" + valid[3:],
	}, malformedValues(valid)...) {
		h := newTestHandler(t, &fakeVerifier{}, "")
		r := httptest.NewRequest(http.MethodGet, "http://gw/v1/me", nil)
		if auth != "" {
			r.Header.Set("Authorization", auth)
		}
		w := httptest.NewRecorder()
		if err := h.ServeHTTP(w, r, nil); err != nil {
			t.Fatal(err)
		}
		dump := headerDump(w.Result(), w.Body.Bytes())
		if first == "" {
			first = dump
			if w.Code != 401 || w.Body.String() != wantUnauthenticated {
				t.Fatalf("%q: %s", auth, dump)
			}
		} else if dump != first {
			t.Errorf("%q: the response differs from the first 401:\n%s\nvs\n%s", auth, dump, first)
		}
	}
}

// malformedValues are malformedAuthorizations with testKey replaced by key.
func malformedValues(key string) []string {
	var out []string
	for _, tc := range malformedAuthorizations {
		out = append(out, strings.ReplaceAll(tc.value, testKey, key))
	}
	return out
}

func TestProxyStripsClientCredentialsAndAssertsTheKeysIdentity(t *testing.T) {
	h := newTestHandler(t, &fakeVerifier{}, "")
	r := httptest.NewRequest(http.MethodGet, "http://gw/v1/echo", nil)
	for k, v := range map[string]string{
		"Authorization":      bearer(editor),
		"Cookie":             "session=abc",
		"X-Gateway-Org-Id":   "00000000-0000-0000-0000-000000000000",
		"X-Gateway-Key-Role": "Admin",
		"X-Gateway-Secret":   "forged",
		"X-Gateway-Anything": "x",
		"Accept-Encoding":    "gzip, br",
		"Range":              "bytes=0-10",
		"If-Range":           `"e1"`,
		"X-Custom":           "kept",
	} {
		r.Header.Set(k, v)
	}
	r.Header["x-gateway-key-id"] = []string{"lowercase"} // not canonical, as a raw client may send it
	var seen http.Header
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		seen = r.Header.Clone()
		return jsonUpstream(w, r)
	})
	if err := h.ServeHTTP(httptest.NewRecorder(), r, next); err != nil {
		t.Fatal(err)
	}
	want := http.Header{
		"X-Gateway-Org-Id":   {"org-1"},
		"X-Gateway-Key-Id":   {editor},
		"X-Gateway-Key-Role": {"Editor"},
		"X-Gateway-Secret":   {testSecret},
		"Accept-Encoding":    {"identity"},
		"X-Custom":           {"kept"},
	}
	if len(seen) != len(want) {
		t.Errorf("the upstream got %q; want exactly %q", seen, want)
	}
	for k, v := range want {
		if got := seen[k]; len(got) != 1 || got[0] != v[0] {
			t.Errorf("the upstream got %s %q, want %q", k, got, v)
		}
	}
}

// counterValue reads a counter.
func counterValue(t testing.TB, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// TestARequestFromOutsideItsNetworksSpendsNoBudget: a key used from outside its allowed
// networks is refused before step 4, so its minute is not counted.
func TestARequestFromOutsideItsNetworksSpendsNoBudget(t *testing.T) {
	h := newTestHandler(t, &fakeVerifier{}, "")
	for range 3 {
		r := httptest.NewRequest(http.MethodGet, "http://gw/v1/monitors", nil)
		r.Header.Set("Authorization", bearer(restricted))
		w := httptest.NewRecorder()
		if err := h.ServeHTTP(w, r, caddyhttp.HandlerFunc(jsonUpstream)); err != nil || w.Code != http.StatusUnauthorized {
			t.Fatalf("ServeHTTP = %d, %v; want 401", w.Code, err)
		}
	}
	rl, err := h.counts.lim.Allow(context.Background(), limiter.Budgets{Key: restricted, KeyLimit: 600})
	if err != nil || rl.Key.Remaining != 599 {
		t.Errorf("the key's minute after 3 denied requests: %+v, %v; want 599 left", rl, err)
	}
	if got := counterValue(t, h.metrics.byOutcome[keystore.OutcomeIPDenied]); got != 3 {
		t.Errorf("keygate_requests_total{outcome=\"ip_denied\"} = %v, want 3", got)
	}
}
