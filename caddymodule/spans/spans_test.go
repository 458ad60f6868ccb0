package spans_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/keygate/keygate/caddymodule/conns"
	"github.com/keygate/keygate/caddymodule/spans"
	"github.com/keygate/keygate/keystore"
)

const secret = "c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2U"

var key = keystore.Key{ID: "AbcdefghIjklmnop1", OrgID: "11111111-1111-4111-8111-111111111111", Role: keystore.RoleEditor}

// traced returns a request to path whose context holds a recording server span, as
// Caddy's tracing directive gives the handlers, and the recorder of its spans.
func traced(t *testing.T, path string) (*http.Request, trace.Span, *tracetest.SpanRecorder) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	r := httptest.NewRequest(http.MethodGet, "http://gw"+path, nil)
	ctx, span := tp.Tracer("test").Start(r.Context(), "handler", trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("url.path", r.URL.Path)))
	return r.WithContext(ctx), span, rec
}

// attrs returns a span's attributes, the last value of each key.
func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]string {
	m := map[attribute.Key]string{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value.Emit()
	}
	return m
}

// ended returns the one ended span named name.
func ended(t *testing.T, rec *tracetest.SpanRecorder, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	var found []sdktrace.ReadOnlySpan
	var names []string
	for _, s := range rec.Ended() {
		names = append(names, s.Name())
		if s.Name() == name {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d ended spans named %s among %q, want 1", len(found), name, names)
	}
	return found[0]
}

func TestDecidedPutsTheOutcomeAndTheKeyOnTheRequestSpan(t *testing.T) {
	for _, tc := range []struct {
		name    string
		outcome keystore.Outcome
		key     *keystore.Key
		cost    int
		want    map[attribute.Key]string // keygate.* attributes, exactly
		status  codes.Code
	}{
		{"an unknown key: its outcome, no key", keystore.OutcomeUnauthenticated, nil, 1,
			map[attribute.Key]string{spans.AttrOutcome: "unauthenticated"}, codes.Unset},
		{"proxied: the key, its org, role and the route's cost", keystore.OutcomeProxied, &key, 3,
			map[attribute.Key]string{spans.AttrOutcome: "proxied", spans.AttrKeyID: key.ID, spans.AttrOrgID: key.OrgID,
				spans.AttrRole: "Editor", spans.AttrCost: "3"}, codes.Unset},
		{"a refusal of a known key", keystore.OutcomeRateLimited, &key, 1,
			map[attribute.Key]string{spans.AttrOutcome: "rate_limited", spans.AttrKeyID: key.ID, spans.AttrOrgID: key.OrgID,
				spans.AttrRole: "Editor", spans.AttrCost: "1"}, codes.Unset},
		{"PostgreSQL down: a 503 is an error", keystore.OutcomeLookupUnavailable, nil, 1,
			map[attribute.Key]string{spans.AttrOutcome: "lookup_unavailable"}, codes.Error},
		{"Redis down under limiter_failure closed", keystore.OutcomeLimiterUnavailable, &key, 2,
			map[attribute.Key]string{spans.AttrOutcome: "limiter_unavailable", spans.AttrKeyID: key.ID, spans.AttrOrgID: key.OrgID,
				spans.AttrRole: "Editor", spans.AttrCost: "2"}, codes.Error},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, span, rec := traced(t, "/v1/monitors")
			spans.Decided(r, tc.outcome, tc.key, tc.cost)
			span.End()
			s := ended(t, rec, "handler")
			got := map[attribute.Key]string{}
			for k, v := range attrs(s) {
				if strings.HasPrefix(string(k), "keygate.") {
					got[k] = v
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("attributes %v, want %v", got, tc.want)
			}
			if s.Status().Code != tc.status {
				t.Errorf("status %v %q, want %v", s.Status().Code, s.Status().Description, tc.status)
			}
		})
	}
}

func TestDecidedRedactsAKeyInThePath(t *testing.T) {
	r, span, rec := traced(t, "/v1/monitors/mon_live_"+key.ID+"."+secret)
	spans.Decided(r, keystore.OutcomeProxied, &key, 1)
	span.End()
	if got, want := attrs(ended(t, rec, "handler"))["url.path"], "/v1/monitors/mon_live_"+key.ID+".REDACTED"; got != want {
		t.Errorf("url.path %q, want %q", got, want)
	}
}

func TestWaitsAreChildSpansOfTheRequest(t *testing.T) {
	r, span, rec := traced(t, "/v1/me")
	lookup := spans.Start(r.Context(), spans.Lookup)
	lookup.Served(false)
	lookup.End(nil)
	count := spans.Start(r.Context(), spans.Count)
	count.End(fmt.Errorf("counting %s: %w", secret, context.DeadlineExceeded))
	span.End()

	parent := ended(t, rec, "handler")
	if got := attrs(parent)[spans.AttrLookupServer]; got != "primary" {
		t.Errorf("keygate.lookup.server %q, want primary", got)
	}
	for _, tc := range []struct {
		name   string
		status codes.Code
		desc   string
	}{
		{spans.Lookup, codes.Unset, ""},
		{spans.Count, codes.Error, "timed out"},
	} {
		s := ended(t, rec, tc.name)
		if s.Parent().SpanID() != parent.SpanContext().SpanID() || s.SpanContext().TraceID() != parent.SpanContext().TraceID() {
			t.Errorf("%s is not a child of the request's span", tc.name)
		}
		if s.Status().Code != tc.status || s.Status().Description != tc.desc {
			t.Errorf("%s: status %v %q, want %v %q", tc.name, s.Status().Code, s.Status().Description, tc.status, tc.desc)
		}
		if s.StartTime().Before(parent.StartTime()) || s.EndTime().After(parent.EndTime()) {
			t.Errorf("%s lies outside its request", tc.name)
		}
	}
}

func TestAFailedWaitTellsItsKindNeverItsText(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("looking up %s: %w", secret, conns.ErrBreakerOpen), "circuit breaker open"},
		{fmt.Errorf("looking up %s: %w", secret, context.DeadlineExceeded), "timed out"},
		{fmt.Errorf("looking up %s: %w", secret, context.Canceled), "canceled"},
		{errors.New("ERROR: invalid input " + secret), "failed"},
	} {
		r, span, rec := traced(t, "/v1/me")
		spans.Start(r.Context(), spans.Lookup).End(tc.err)
		span.End()
		if got := ended(t, rec, spans.Lookup).Status().Description; got != tc.want {
			t.Errorf("%v: description %q, want %q", tc.err, got, tc.want)
		}
	}
}

func TestLookupServerNamesTheStandby(t *testing.T) {
	r, span, rec := traced(t, "/v1/me")
	spans.LookupServer(r.Context(), true)
	span.End()
	if got := attrs(ended(t, rec, "handler"))[spans.AttrLookupServer]; got != "standby" {
		t.Errorf("keygate.lookup.server %q, want standby", got)
	}
}

// TestNoSpanWorkWithoutARecordingSpan holds the promise of an untraced request: no
// tracing (no span in the context) or a request not sampled costs one check and no
// allocation.
func TestNoSpanWorkWithoutARecordingSpan(t *testing.T) {
	unsampled := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))
	ctx, notSampled := unsampled.Tracer("test").Start(context.Background(), "handler")
	defer notSampled.End()
	for name, ctx := range map[string]context.Context{"no span": context.Background(), "not sampled": ctx} {
		r := httptest.NewRequest(http.MethodGet, "http://gw/v1/monitors/mon_live_"+key.ID+"."+secret, nil).WithContext(ctx)
		allocs := testing.AllocsPerRun(100, func() {
			w := spans.Start(r.Context(), spans.Lookup)
			w.Served(false)
			w.End(conns.ErrBreakerOpen)
			spans.LookupServer(r.Context(), true)
			spans.Decided(r, keystore.OutcomeLookupUnavailable, &key, 1)
		})
		if allocs != 0 {
			t.Errorf("%s: %v allocations, want 0", name, allocs)
		}
	}
}
