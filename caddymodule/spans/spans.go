// Package spans adds what the gateway decided of a request to the span a tracer
// started for it: Caddy's tracing directive starts one per request, and v1_gateway
// adds the outcome, the key's identity and cost, which server answered the key
// lookup, and the waits on PostgreSQL and Redis as child spans. It knows nothing of
// Caddy. docs/operations.md (Tracing) shows the spans.
//
// Where the request's span does not record (no tracing directive, or a request not
// sampled), every function returns after one check and allocates nothing. No
// attribute ever holds a key's secret.
package spans

import (
	"context"
	"errors"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/keygate/keygate/caddymodule/conns"
	"github.com/keygate/keygate/keystore"
)

// The names of the child spans: a request's wait for its key lookup, and for its
// count. A lookup or a count batched with others' is one round trip, which each
// request that waited on it shows as its own child span.
const (
	Lookup = "keygate.lookup"
	Count  = "keygate.count"
)

// The attributes of a request's span.
const (
	AttrOutcome      = attribute.Key("keygate.outcome")
	AttrOrgID        = attribute.Key("keygate.org_id")
	AttrKeyID        = attribute.Key("keygate.key_id")
	AttrRole         = attribute.Key("keygate.role")
	AttrCost         = attribute.Key("keygate.cost")
	AttrLookupServer = attribute.Key("keygate.lookup.server") // primary or standby
)

// urlPath is the request span's url.path, as otelhttp sets it.
const urlPath = attribute.Key("url.path")

// scope is the instrumentation scope of the child spans.
const scope = "github.com/keygate/keygate/caddymodule"

// Wait is a request's wait on a dependency, a child span of the request's span. The
// zero Wait, where the request's span does not record, does nothing.
type Wait struct {
	parent, span trace.Span
}

// Start begins the wait named name (Lookup or Count) of the request of ctx.
func Start(ctx context.Context, name string) Wait {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return Wait{}
	}
	_, span := parent.TracerProvider().Tracer(scope).Start(ctx, name)
	return Wait{parent: parent, span: span}
}

// End ends the wait, which came to err. A failed wait has the error status, with a
// description of the failure that holds nothing of the request.
func (w Wait) End(err error) {
	if w.span == nil {
		return
	}
	if err != nil {
		w.span.SetStatus(codes.Error, failure(err))
	}
	w.span.End()
}

// Served sets the server that answered a lookup on the request's span, for a
// lookup that only the primary answers. LookupServer is the same for a lookup that
// standbys may answer.
func (w Wait) Served(standby bool) {
	if w.parent != nil {
		w.parent.SetAttributes(server(standby))
	}
}

// LookupServer sets the server that answered the lookup of the request of ctx on
// its span: a standby, or the primary. It is a keystore.Reader's OnLookup.
func LookupServer(ctx context.Context, standby bool) {
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.SetAttributes(server(standby))
	}
}

func server(standby bool) attribute.KeyValue {
	if standby {
		return AttrLookupServer.String("standby")
	}
	return AttrLookupServer.String("primary")
}

// Decided sets the outcome o of r on its span. A request whose key is known (key
// not nil) also gets the key's id, organisation and role, and its cost in units
// of every budget. An outcome answering 5xx sets the span's error status. A key in
// r's path loses its secret in the span's url.path, as in the access log.
func Decided(r *http.Request, o keystore.Outcome, key *keystore.Key, cost int) {
	span := trace.SpanFromContext(r.Context())
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(AttrOutcome.String(o.String()))
	if key != nil {
		span.SetAttributes(AttrKeyID.String(key.ID), AttrOrgID.String(key.OrgID),
			AttrRole.String(string(key.Role)), AttrCost.Int(cost))
	}
	if o.Status() >= http.StatusInternalServerError {
		span.SetStatus(codes.Error, o.String())
	}
	if p := keystore.Redact(r.URL.Path); p != r.URL.Path {
		span.SetAttributes(urlPath.String(p))
	}
}

// failure describes err for a span's status: what kind of failure, never its text,
// which could quote a request's input.
func failure(err error) string {
	switch {
	case errors.Is(err, conns.ErrBreakerOpen):
		return "circuit breaker open"
	case errors.Is(err, context.DeadlineExceeded):
		return "timed out"
	case errors.Is(err, context.Canceled):
		return "canceled"
	}
	return "failed"
}
