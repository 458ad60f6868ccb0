package tracing_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keygate/keygate/internal/testkit/otlptest"
	"github.com/keygate/keygate/upstream/tracing"
)

func TestConfiguredOnlyByAnExporterOrACollector(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want bool
	}{
		{map[string]string{}, false},
		{map[string]string{"OTEL_SERVICE_NAME": "x", "OTEL_TRACES_SAMPLER": "always_on"}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, true},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, true},
		{map[string]string{"OTEL_TRACES_EXPORTER": "console"}, true},
		{map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, false},
		{map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, false},
	} {
		if got := tracing.Configured(func(k string) string { return tc.env[k] }); got != tc.want {
			t.Errorf("Configured(%v) = %v, want %v", tc.env, got, tc.want)
		}
	}
}

func TestWithoutAnExporterThereIsNoTracing(t *testing.T) {
	traces, err := tracing.FromEnv(context.Background(), func(string) string { return "" }, "v0")
	if err != nil || traces != nil {
		t.Fatalf("FromEnv with no OTEL_* = %v, %v; want nil, nil", traces, err)
	}
	h := http.NewServeMux()
	if got, ok := traces.Handler(h).(*http.ServeMux); !ok || got != h {
		t.Errorf("a nil *Traces wraps the handler")
	}
	cfg, err := pgxpool.ParseConfig("postgres://localhost/x")
	if err != nil {
		t.Fatal(err)
	}
	traces.Pool(cfg)
	if cfg.ConnConfig.Tracer != nil {
		t.Errorf("a nil *Traces set the pool's tracer %T", cfg.ConnConfig.Tracer)
	}
	if _, span := traces.Tracer("x").Start(context.Background(), "s"); span.IsRecording() {
		t.Errorf("a nil *Traces records spans")
	}
	if err := traces.Shutdown(context.Background()); err != nil {
		t.Error(err)
	}
}

// TestTheServerSpanContinuesTheCallersTrace exports over each protocol to a real
// receiver: the request's span is the child of its traceparent, named by its route,
// an error where it answers 5xx, and without the secret of a key in its path.
func TestTheServerSpanContinuesTheCallersTrace(t *testing.T) {
	const (
		traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
		parent  = "00f067aa0ba902b7"
		secret  = "c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2U"
	)
	for _, protocol := range []string{"grpc", "http/protobuf"} {
		t.Run(protocol, func(t *testing.T) {
			rcv := otlptest.Start(t)
			for _, kv := range rcv.Env(protocol) {
				k, v, _ := strings.Cut(kv, "=")
				t.Setenv(k, v)
			}
			t.Setenv("OTEL_SERVICE_NAME", "")
			traces, err := tracing.FromEnv(context.Background(), os.Getenv, "v1.2.3")
			if err != nil || traces == nil {
				t.Fatalf("FromEnv = %v, %v", traces, err)
			}
			h := traces.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				tracing.NameRequest(r, "GET /v1/monitors/{id}")
				w.WriteHeader(http.StatusServiceUnavailable)
			}))
			r := httptest.NewRequest(http.MethodGet, "/v1/monitors/mon_live_AbcdefghIjklmnop1."+secret, nil)
			r.Header.Set("Traceparent", "00-"+traceID+"-"+parent+"-01")
			h.ServeHTTP(httptest.NewRecorder(), r)
			if err := traces.Shutdown(context.Background()); err != nil {
				t.Fatalf("Shutdown: %v", err)
			}

			spans := rcv.Trace(traceID)
			if len(spans) != 1 {
				t.Fatalf("%d spans of the trace received, want 1:%s", len(spans), otlptest.Describe(rcv.Spans()))
			}
			s := spans[0]
			for _, c := range []struct{ what, got, want string }{
				{"service", s.Service, tracing.ServiceName},
				{"name", s.Name, "GET /v1/monitors/{id}"},
				{"parent", s.ParentID, parent},
				{"http.route", s.Attrs["http.route"], "/v1/monitors/{id}"},
				{"url.path", s.Attrs["url.path"], "/v1/monitors/mon_live_AbcdefghIjklmnop1.REDACTED"},
				{"http.response.status_code", s.Attrs["http.response.status_code"], "503"},
			} {
				if c.got != c.want {
					t.Errorf("%s %q, want %q:%s", c.what, c.got, c.want, otlptest.Describe(spans))
				}
			}
			if !s.StatusError {
				t.Errorf("a 503 is not an error span")
			}
			if rcv.Holds(secret) {
				t.Errorf("a span holds the key's secret")
			}
		})
	}
}
