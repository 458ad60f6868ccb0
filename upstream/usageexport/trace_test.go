package usageexport_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/upstream/usageexport"
)

// TestEachExportAttemptIsASpanOfItsOwn: a refused batch and its retry are two root
// spans, each naming its events, the attempt and what came of it, never the URL.
func TestEachExportAttemptIsASpanOfItsOwn(t *testing.T) {
	e := newEnv(t)
	rc := newReceiver(t, func(n int) int { return []int{503, 204}[min(n, 1)] })
	cfg := config(rc)
	cfg.URL += "/ingest?token=SECRET-IN-URL"
	x := e.exporter(cfg, nil)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	x.Tracer = tp.Tracer(usageexport.TracerName)
	m0 := e.clock.Now().Truncate(time.Minute)
	e.record(keyA, m0, keystore.OutcomeProxied, 200, 1, 1)
	e.record(keyB, m0, keystore.OutcomeProxied, 200, 1, 1)
	e.at(m0.Add(3 * time.Minute))
	drain(t, x)
	e.clock.Advance(cfg.Backoff)
	drain(t, x)

	spans := rec.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want one per attempt, 2", len(spans))
	}
	for i, want := range []struct {
		attempt, status, result string
		code                    codes.Code
	}{
		{"1", "503", usageexport.ResultRetrying, codes.Error},
		{"2", "204", usageexport.ResultDelivered, codes.Unset},
	} {
		s := spans[i]
		got := map[attribute.Key]string{}
		for _, kv := range s.Attributes() {
			got[kv.Key] = kv.Value.Emit()
			if strings.Contains(kv.Value.Emit(), "SECRET-IN-URL") {
				t.Errorf("attempt %d: %s holds the URL's token", i+1, kv.Key)
			}
		}
		if s.Name() != "usage export" || s.Parent().IsValid() || got["keygate.usage_export.events"] != "2" ||
			got["keygate.usage_export.attempt"] != want.attempt || got["http.response.status_code"] != want.status ||
			got["keygate.usage_export.result"] != want.result || s.Status().Code != want.code {
			t.Errorf("attempt %d: span %q (parent %v) %v status %v, want attempt %s answered %s, %s, %v",
				i+1, s.Name(), s.Parent().IsValid(), got, s.Status(), want.attempt, want.status, want.result, want.code)
		}
	}
	if spans[0].SpanContext().TraceID() == spans[1].SpanContext().TraceID() {
		t.Errorf("the two attempts share a trace")
	}
	if p := rc.got()[0]; p.Header.Get("traceparent") != "" {
		t.Errorf("the receiver got a traceparent %q", p.Header.Get("traceparent"))
	}
}
