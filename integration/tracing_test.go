package integration

import (
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"strings"
	"testing"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/keygate/keygate/internal/testkit/otlptest"
	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/upstream/tracing"
)

// gatewayService is the service.name the traced gateways run with, as
// docs/operations.md (Tracing) sets it.
const gatewayService = "keygate-gateway"

// traced are the options of a stack whose gateways run Caddy's tracing directive and
// whose upstream exports its spans, both to rcv over protocol.
func traced(rcv *otlptest.Receiver, protocol string) stackOptions {
	env := rcv.Env(protocol)
	return stackOptions{
		siteOptions: "tracing {\n\t\tspan keygate\n\t}",
		gatewayEnv:  append(env, "OTEL_SERVICE_NAME="+gatewayService),
		upstreamEnv: env,
	}
}

// traceparent returns a W3C traceparent of a new sampled trace: the header, the trace
// id and the caller's span id.
func traceparent(t *testing.T) (header, traceID, parent string) {
	t.Helper()
	var b [24]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	traceID, parent = hex.EncodeToString(b[:16]), hex.EncodeToString(b[16:])
	return "00-" + traceID + "-" + parent + "-01", traceID, parent
}

// tracedCall sends a /v1 request to gateway 0 with key and a new traceparent, and
// returns its response and trace id.
func tracedCall(t *testing.T, s *Stack, key, method, path string) (Resp, string, string) {
	t.Helper()
	tp, traceID, parent := traceparent(t)
	h := http.Header{"Traceparent": {tp}}
	if key != "" {
		h.Set("Authorization", "Bearer "+key)
	}
	return s.raw(method, s.URL(0)+path, nil, h), traceID, parent
}

// spanOf returns the span of spans that match says is the one, or nil.
func spanOf(spans []otlptest.Span, match func(otlptest.Span) bool) *otlptest.Span {
	for i := range spans {
		if match(spans[i]) {
			return &spans[i]
		}
	}
	return nil
}

// awaitTrace waits until the spans received of traceID hold everything complete
// looks for, and returns them. Its failure shows every span received of the trace.
func awaitTrace(t *testing.T, rcv *otlptest.Receiver, traceID, what string, complete func([]otlptest.Span) bool) []otlptest.Span {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		spans := rcv.Trace(traceID)
		if complete(spans) {
			return spans
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not received within 30s; the trace's spans:%s", what, otlptest.Describe(spans))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// descends reports whether s descends from the span ancestor in spans.
func descends(spans []otlptest.Span, s otlptest.Span, ancestor string) bool {
	for s.ParentID != "" {
		if s.ParentID == ancestor {
			return true
		}
		p := spanOf(spans, func(x otlptest.Span) bool { return x.SpanID == s.ParentID })
		if p == nil {
			return false
		}
		s = *p
	}
	return false
}

func isGateway(s otlptest.Span) bool {
	return s.Service == gatewayService && s.Kind == tracepb.Span_SPAN_KIND_SERVER
}

func isUpstream(s otlptest.Span) bool {
	return s.Service == tracing.ServiceName && s.Kind == tracepb.Span_SPAN_KIND_SERVER
}

func isQuery(s otlptest.Span) bool {
	return s.Service == tracing.ServiceName && s.Attrs["db.system.name"] == "postgresql" && s.Attrs["db.query.text"] != ""
}

// TestOneRequestIsOneTraceFromTheClientToTheDatabase sends requests with their own
// traceparent through bin/caddy, under the tracing directive, and bin/upstream, both
// exporting to a real OTLP receiver, over gRPC and over HTTP. A proxied request is one
// trace: the gateway's span, a child of the caller's, with what the gateway decided and
// its waits; the upstream's span below it, named by its route; the queries below that.
// An unknown key's span has its outcome and no key, and nothing of it reaches the
// upstream. No span holds a key's secret, even a key sent in the path.
func TestOneRequestIsOneTraceFromTheClientToTheDatabase(t *testing.T) {
	for _, protocol := range []string{"grpc", "http/protobuf"} {
		t.Run(protocol, func(t *testing.T) {
			rcv := otlptest.Start(t)
			s := newStackWith(t, traced(rcv, protocol))
			org, key := s.newKey("pro", "Admin")
			keyID := strings.TrimPrefix(strings.Split(key, ".")[0], "mon_live_")
			_, keySecret, _ := strings.Cut(key, ".")

			// A proxied request.
			r, traceID, parent := tracedCall(t, s, key, "GET", "/v1/monitors")
			if r.Status != 200 {
				t.Fatalf("GET /v1/monitors: %d %s", r.Status, r.Body)
			}
			spans := awaitTrace(t, rcv, traceID, "the gateway's, its waits, the upstream's and a query span", func(spans []otlptest.Span) bool {
				gw := spanOf(spans, isGateway)
				up := spanOf(spans, isUpstream)
				return gw != nil && up != nil && spanOf(spans, isQuery) != nil &&
					spanOf(spans, func(s otlptest.Span) bool { return s.Name == "keygate.lookup" }) != nil &&
					spanOf(spans, func(s otlptest.Span) bool { return s.Name == "keygate.count" }) != nil
			})
			gw, up := *spanOf(spans, isGateway), *spanOf(spans, isUpstream)
			if gw.ParentID != parent {
				t.Errorf("the gateway's span has parent %s, want the caller's %s", gw.ParentID, parent)
			}
			for k, want := range map[string]string{
				"keygate.outcome": "proxied", "keygate.org_id": org.ID, "keygate.key_id": keyID,
				"keygate.role": "Admin", "keygate.cost": "1", "keygate.lookup.server": "primary",
			} {
				if got := gw.Attrs[k]; got != want {
					t.Errorf("the gateway's span has %s=%q, want %q:%s", k, got, want, otlptest.Describe([]otlptest.Span{gw}))
				}
			}
			for _, name := range []string{"keygate.lookup", "keygate.count"} {
				w := spanOf(spans, func(s otlptest.Span) bool { return s.Name == name })
				if w.ParentID != gw.SpanID || w.Service != gatewayService {
					t.Errorf("%s is not a child of the gateway's span:%s", name, otlptest.Describe(spans))
				}
			}
			if !descends(spans, up, gw.SpanID) || up.Name != "GET /v1/monitors" || up.Attrs["http.route"] != "/v1/monitors" {
				t.Errorf("the upstream's span is not GET /v1/monitors below the gateway's:%s", otlptest.Describe(spans))
			}
			for _, q := range spans {
				if q.Service == tracing.ServiceName && q.SpanID != up.SpanID && !descends(spans, q, up.SpanID) {
					t.Errorf("an upstream span %q is not below the upstream's request span:%s", q.Name, otlptest.Describe(spans))
				}
			}

			// An unknown key, well formed and with a valid checksum: looked up, refused.
			format, _ := keystore.NewFormat("mon")
			unknown, _, unknownSecret, err := format.Generate()
			if err != nil {
				t.Fatal(err)
			}
			r, unknownTrace, _ := tracedCall(t, s, unknown, "GET", "/v1/monitors")
			wantError(t, r, 401, unauthenticated)
			// A key sent in the path as well as in the header: proxied, and the
			// upstream answers 404.
			r, pathTrace, _ := tracedCall(t, s, key, "GET", "/v1/monitors/"+key)
			if r.Status != 404 {
				t.Errorf("GET /v1/monitors/<key>: %d %s, want 404", r.Status, r.Body)
			}
			// The upstream exports in order: once the last request's span is in, the
			// unknown key's would be too.
			awaitTrace(t, rcv, pathTrace, "the upstream's span of the key in the path", func(spans []otlptest.Span) bool {
				return spanOf(spans, isUpstream) != nil && spanOf(spans, isGateway) != nil
			})
			spans = awaitTrace(t, rcv, unknownTrace, "the unknown key's span", func(spans []otlptest.Span) bool {
				return spanOf(spans, isGateway) != nil
			})
			gw = *spanOf(spans, isGateway)
			if gw.Attrs["keygate.outcome"] != "unauthenticated" || gw.Attrs["http.response.status_code"] != "401" {
				t.Errorf("the unknown key's span:%s", otlptest.Describe(spans))
			}
			for _, k := range []string{"keygate.key_id", "keygate.org_id", "keygate.role"} {
				if v, ok := gw.Attrs[k]; ok {
					t.Errorf("the unknown key's span has %s=%q", k, v)
				}
			}
			for _, sp := range spans {
				if sp.Service != gatewayService {
					t.Errorf("the unknown key's request reached the upstream:%s", otlptest.Describe(spans))
				}
			}

			for what, secret := range map[string]string{
				"a key": key, "a key's secret": keySecret, "an unknown key's secret": unknownSecret, "the gateway secret": gatewaySecret,
			} {
				if rcv.Holds(secret) {
					t.Errorf("a span received holds %s", what)
				}
			}
		})
	}
}

// TestAnAnswerOfPostgresDownIsAnErrorSpan stops PostgreSQL: the gateway's 503 is an
// error span, with its outcome.
func TestAnAnswerOfPostgresDownIsAnErrorSpan(t *testing.T) {
	rcv := otlptest.Start(t)
	s := newStackWith(t, traced(rcv, "http/protobuf"))
	_, key := s.newKey("pro", "Admin")

	s.stackCmd("stop-pg")
	restarted := false
	defer func() {
		if !restarted {
			s.stackCmd("start-pg")
		}
	}()
	r, traceID, _ := tracedCall(t, s, key, "GET", "/v1/me")
	wantError(t, r, 503, serviceUnavailable)
	s.stackCmd("start-pg")
	restarted = true

	spans := awaitTrace(t, rcv, traceID, "the 503's span", func(spans []otlptest.Span) bool {
		return spanOf(spans, isGateway) != nil
	})
	gw := *spanOf(spans, isGateway)
	if !gw.StatusError || gw.Attrs["keygate.outcome"] != "lookup_unavailable" {
		t.Errorf("the 503's span is not an error of outcome lookup_unavailable:%s", otlptest.Describe(spans))
	}
	lookup := spanOf(spans, func(s otlptest.Span) bool { return s.Name == "keygate.lookup" })
	if lookup == nil || !lookup.StatusError {
		t.Errorf("the failed lookup's span is not an error:%s", otlptest.Describe(spans))
	}
}

// TestATraceNamesTheServerThatAnsweredTheLookup runs the gateways on the stack's
// standbys (database_read_urls): once a standby answers the lookups, the gateway's span
// says so; every traced request names a server.
func TestATraceNamesTheServerThatAnsweredTheLookup(t *testing.T) {
	rcv := otlptest.Start(t)
	s := newStandbyStackWith(t, traced(rcv, "http/protobuf"))
	_, key := s.newKey("pro", "Admin")
	s.waitForStandbys(key)
	var seen []string
	deadline := time.Now().Add(30 * time.Second)
	for {
		r, traceID, _ := tracedCall(t, s, key, "GET", "/v1/me")
		if r.Status != 200 {
			t.Fatalf("GET /v1/me: %d %s", r.Status, r.Body)
		}
		spans := awaitTrace(t, rcv, traceID, "the gateway's span", func(spans []otlptest.Span) bool {
			return spanOf(spans, isGateway) != nil
		})
		server := spanOf(spans, isGateway).Attrs["keygate.lookup.server"]
		seen = append(seen, server)
		if server != "primary" && server != "standby" {
			t.Fatalf("keygate.lookup.server %q, want primary or standby:%s", server, otlptest.Describe(spans))
		}
		if server == "standby" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no span named a standby within 30s; servers seen %q", seen)
		}
	}
}
