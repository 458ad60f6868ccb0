package caddymodule

// The hot path of ServeHTTP, request by request, as Caddy calls it: a replacer and
// the extra log fields in the context. It runs on a Verifier double, limiter.NewLocal,
// the usage record in memory and a next handler writing a small JSON body.
// BenchmarkServeHTTP reports allocations and the process's CPU per request
// (go test -bench ServeHTTP -benchmem ./caddymodule), and TestServeHTTPAllocs holds
// the allocations. PostgreSQL and Redis costs are make bench's
// (scripts/bench.sh).

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/keygate/keygate/caddymodule/routetable"
	"github.com/keygate/keygate/internal/testkit/benchcpu"
	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/limiter"
)

// hotKeys are the keys of the hot path: one whose limit is never reached, one of a
// plan with an organisation ceiling and a monthly quota never reached, one with a
// second's and a day's limits beside its minute, never reached, and one already over
// its limit.
var hotKeys = map[string]keystore.Key{
	"HotAdminHotAdminHotAd1": {ID: "HotAdminHotAdminHotAd1", OrgID: "11111111-1111-4111-8111-111111111111", Role: keystore.RoleAdmin, RateLimit: 1 << 30},
	"HotOrgsHotOrgsHotOrgs1": {ID: "HotOrgsHotOrgsHotOrgs1", OrgID: "22222222-2222-4222-8222-222222222222", Role: keystore.RoleAdmin, RateLimit: 1 << 30,
		OrgRateLimit: 1 << 30, MonthlyQuota: 1 << 50},
	"HotWindowsHotWindowsH1": {ID: "HotWindowsHotWindowsH1", OrgID: "11111111-1111-4111-8111-111111111111", Role: keystore.RoleAdmin, RateLimit: 1 << 30,
		Windows: [keystore.NumWindows]int{keystore.PerSecond: 1 << 30, keystore.PerHour: -1, keystore.PerDay: 1 << 30}},
	"HotOverHotOverHotOver1": {ID: "HotOverHotOverHotOver1", OrgID: "11111111-1111-4111-8111-111111111111", Role: keystore.RoleAdmin, RateLimit: 1},
	"HotScopedHotScopedHot1": {ID: "HotScopedHotScopedHot1", OrgID: "11111111-1111-4111-8111-111111111111", Role: keystore.RoleAdmin, RateLimit: 1 << 30,
		Scopes: []string{"monitors:read", "monitors:write"}},
}

// twentyRules is a route table of 20 rules whose last matches the hot path's GET of a
// monitor, with a cost above 1 somewhere, so that every request is matched.
var twentyRules = func() []Route {
	var rs []Route
	for i := range 19 {
		rs = append(rs, Route{Methods: []string{"GET", "POST"}, Path: fmt.Sprintf("/v1/service%d/*", i), Scope: "s:read", Cost: 1 + i%3})
	}
	return append(rs, Route{Methods: []string{"GET", "HEAD"}, Path: "/v1/monitors/*", Scope: "monitors:read"})
}()

// hotVerifier is fakeVerifier without the call counter, so that it can serve in
// parallel.
type hotVerifier struct{}

func (hotVerifier) VerifyParsed(_ context.Context, keyID, secret string, _ netip.Addr) (keystore.Key, bool, error) {
	k, ok := hotKeys[keyID]
	if !ok || secret != testSecretPart {
		return keystore.Key{}, false, nil
	}
	return k, true, nil
}

const hotBody = `{"id":"00000000-0000-4000-8000-000000000001","name":"bench","type":"http","config":{"a":1},"org_id":"o","paused":false}`

// hotNext stands in for the reverse proxy: a small JSON body, as the upstream's GET
// /v1/monitors/{id}.
var hotNext = caddyhttp.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) error {
	hdr := w.Header()
	hdr["Content-Type"] = []string{"application/json"}
	hdr["Content-Length"] = []string{"120"}
	_, err := io.WriteString(w, hotBody)
	return err
})

// discardWriter is a ResponseWriter that keeps its header map from one request to
// the next, as a server's connection does not. It counts what it is given.
type discardWriter struct {
	hdr    http.Header
	status int
	n      int
}

func (w *discardWriter) Header() http.Header         { return w.hdr }
func (w *discardWriter) WriteHeader(status int)      { w.status = status }
func (w *discardWriter) Write(p []byte) (int, error) { w.n += len(p); return len(p), nil }

// hotRequest is one request through ServeHTTP. It reuses its parts between runs, as
// a test can. So what the handler allocates is what is left.
type hotRequest struct {
	h      *Handler
	r      *http.Request
	w      *discardWriter
	auth   []string
	tracer trace.Tracer // nil: untraced
}

// traceAll makes every request of hr traced at full sampling, as under Caddy's
// tracing directive: a server span around each, its spans exported in batches to an
// exporter that drops them.
func (hr *hotRequest) traceAll(tb testing.TB) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()),
		sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	tb.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	hr.tracer = tp.Tracer("caddy")
}

func newHotRequest(tb testing.TB, method, path, auth string, routes []Route) *hotRequest {
	tb.Helper()
	h := newTestHandler(tb, hotVerifier{}, "")
	if routes != nil {
		h.routes = routetable.New(routes)
	}
	h.counts = localCounts(limiter.NewLocal(), h.metrics)
	h.usage = keystore.NewUsage(nil, keystore.UsageOptions{}) // counted as by default; never flushed here
	r := httptest.NewRequest(method, "http://gw"+path, nil)
	repl := caddy.NewReplacer()
	ctx := context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl)
	ctx = context.WithValue(ctx, caddyhttp.ExtraLogFieldsCtxKey, new(caddyhttp.ExtraLogFields))
	r = r.WithContext(ctx)
	r.Header["User-Agent"] = []string{"wrk"}
	r.Header["Accept"] = []string{"*/*"}
	return &hotRequest{h: h, r: r, w: &discardWriter{hdr: http.Header{}}, auth: []string{auth}}
}

// serve runs the request once and returns its status.
func (hr *hotRequest) serve(tb testing.TB) int {
	clear(hr.w.hdr)
	hr.w.status = 0
	hr.r.Header["Authorization"] = hr.auth
	r := hr.r
	if hr.tracer != nil {
		ctx, span := hr.tracer.Start(r.Context(), "keygate", trace.WithSpanKind(trace.SpanKindServer))
		defer span.End()
		r = r.WithContext(ctx)
	}
	if err := hr.h.ServeHTTP(hr.w, r, hotNext); err != nil {
		tb.Fatal(err)
	}
	return hr.w.status
}

// The hot paths, with the status each must answer.
var hotPaths = []struct {
	name         string
	method, path string
	auth         string
	routes       []Route // nil: the built-in table
	status       int
	traced       bool // under a recording span (hotRequest.traceAll)
}{
	{"proxied", http.MethodGet, "/v1/monitors/00000000-0000-4000-8000-000000000001", bearer("HotAdminHotAdminHotAd1"), nil, http.StatusOK, false},
	{"proxied_budgets", http.MethodGet, "/v1/monitors/00000000-0000-4000-8000-000000000001", bearer("HotOrgsHotOrgsHotOrgs1"), nil, http.StatusOK, false},
	{"proxied_windows", http.MethodGet, "/v1/monitors/00000000-0000-4000-8000-000000000001", bearer("HotWindowsHotWindowsH1"), nil, http.StatusOK, false},
	{"proxied_scoped", http.MethodGet, "/v1/monitors/00000000-0000-4000-8000-000000000001", bearer("HotScopedHotScopedHot1"), nil, http.StatusOK, false},
	{"proxied_20_rules", http.MethodGet, "/v1/monitors/00000000-0000-4000-8000-000000000001", bearer("HotAdminHotAdminHotAd1"), twentyRules, http.StatusOK, false},
	{"me", http.MethodGet, "/v1/me", bearer("HotAdminHotAdminHotAd1"), nil, http.StatusOK, false},
	{"unknown_key", http.MethodGet, "/v1/monitors", bearer("UnknownUnknownUnknown1"), nil, http.StatusUnauthorized, false},
	{"malformed_key", http.MethodGet, "/v1/monitors", "Bearer mon_live_nope", nil, http.StatusUnauthorized, false},
	{"over_limit", http.MethodGet, "/v1/monitors", bearer("HotOverHotOverHotOver1"), nil, http.StatusTooManyRequests, false},
	// proxied under tracing: the request's span, which Caddy would start, and what the
	// module adds to it (package spans).
	{name: "proxied_traced", method: http.MethodGet, path: "/v1/monitors/00000000-0000-4000-8000-000000000001",
		auth: bearer("HotAdminHotAdminHotAd1"), status: http.StatusOK, traced: true},
}

func BenchmarkServeHTTP(b *testing.B) {
	for _, p := range hotPaths {
		b.Run(p.name, func(b *testing.B) {
			hr := newHotRequest(b, p.method, p.path, p.auth, p.routes)
			if p.traced {
				hr.traceAll(b)
			}
			hr.serve(b) // the over-limit key's first request is allowed
			if got := hr.serve(b); got != p.status {
				b.Fatalf("status %d, want %d", got, p.status)
			}
			b.ReportAllocs()
			benchcpu.Loop(b, func() { hr.serve(b) }, benchcpu.Self())
		})
	}
}

// maxHotAllocs is the allocations per request each hot path may make, as measured by
// BenchmarkServeHTTP -benchmem. Lower them when the code gets better. Never raise
// them to let a regression through. The ExtraLogFields of the test outlive a
// request, so its growth is not counted.
var maxHotAllocs = map[string]float64{
	"proxied":          12,
	"proxied_budgets":  12,
	"proxied_windows":  12,
	"proxied_scoped":   13, // X-Gateway-Key-Scopes: two scopes, joined
	"proxied_20_rules": 12,
	"me":               10, // its body, with limits, is over 99 bytes: Content-Length is no small string of strconv's
	"unknown_key":      2,
	"malformed_key":    2,
	"over_limit":       10,
	"proxied_traced":   30, // proxied's, the request's span and its context, and the module's attributes and two child spans
}

func TestServeHTTPAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are the race detector's under -race; make test runs this without it")
	}
	for _, p := range hotPaths {
		t.Run(p.name, func(t *testing.T) {
			hr := newHotRequest(t, p.method, p.path, p.auth, p.routes)
			if p.traced {
				hr.traceAll(t)
			}
			hr.serve(t)
			if got := hr.serve(t); got != p.status {
				t.Fatalf("status %d, want %d", got, p.status)
			}
			got := testing.AllocsPerRun(200, func() {
				if st := hr.serve(t); st != p.status {
					t.Fatalf("status %d, want %d", st, p.status)
				}
			})
			if want := maxHotAllocs[p.name]; got > want {
				t.Errorf("%v allocations per request, want at most %v", got, want)
			}
		})
	}
}
