package webhook_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/keygate/keygate/upstream/webhook"
)

// TestEachDeliveryAttemptIsASpanOfItsOwn: a failed attempt and its retry are two
// root spans, each naming the endpoint, the event, the attempt and what came of it.
func TestEachDeliveryAttemptIsASpanOfItsOwn(t *testing.T) {
	e := newEnv(t)
	rc := newReceiver(t, func(n int) int {
		if n == 0 {
			return 500
		}
		return 204
	})
	ep := e.addEndpoint(t, rc.URL)
	id := e.sendTest(t, ep)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	d := e.dispatcher(open)
	d.Tracer = tp.Tracer(webhook.TracerName)
	drain(t, d)
	e.clock.Advance(webhook.Schedule[0])
	drain(t, d)

	spans := rec.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want one per attempt, 2", len(spans))
	}
	for i, want := range []struct {
		attempt, status, result string
		code                    codes.Code
	}{
		{"1", "500", webhook.ResultRetrying, codes.Error},
		{"2", "204", webhook.ResultDelivered, codes.Unset},
	} {
		s := spans[i]
		got := map[attribute.Key]string{}
		for _, kv := range s.Attributes() {
			got[kv.Key] = kv.Value.Emit()
		}
		if s.Name() != "webhook delivery" || s.Parent().IsValid() || got["keygate.webhook.id"] != ep.ID ||
			got["keygate.webhook.event_id"] != id || got["keygate.org_id"] != e.org || got["keygate.webhook.attempt"] != want.attempt ||
			got["http.response.status_code"] != want.status || got["keygate.webhook.result"] != want.result || s.Status().Code != want.code {
			t.Errorf("attempt %d: span %q (parent %v) %v status %v, want attempt %s answered %s, %s, %v",
				i+1, s.Name(), s.Parent().IsValid(), got, s.Status(), want.attempt, want.status, want.result, want.code)
		}
	}
	if spans[0].SpanContext().TraceID() == spans[1].SpanContext().TraceID() {
		t.Errorf("the two attempts share a trace")
	}
}
