// Package tracing is the upstream's OpenTelemetry tracing, set up from the standard
// OTEL_* environment variables: a server span for each HTTP request, continuing the
// trace of its traceparent and named by its route (otelhttp), the PostgreSQL queries
// as its children (otelpgx), and a span for each webhook delivery. Where the
// environment configures no exporter, there is no tracing at all: nothing is
// exported, no goroutine starts, and every function here does nothing on a nil
// *Traces. docs/operations.md (Tracing) shows the spans and the variables.
package tracing

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5/multitracer"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/contrib/propagators/autoprop"
	"go.opentelemetry.io/otel/attribute"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/keygate/keygate/keystore"
)

// ServiceName is the service.name of the upstream's spans, unless OTEL_SERVICE_NAME
// or OTEL_RESOURCE_ATTRIBUTES names another.
const ServiceName = "keygate-upstream"

// Traces is the upstream's tracing: the tracer provider and the propagation of the
// trace context. A nil *Traces is no tracing.
type Traces struct {
	provider   *sdktrace.TracerProvider
	propagator propagation.TextMapPropagator
}

// Configured reports whether the environment, read by getenv, asks for traces:
// OTEL_TRACES_EXPORTER names an exporter other than none, or, without it,
// OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT names a
// collector. OTEL_SDK_DISABLED=true turns them off whatever the rest says.
func Configured(getenv func(string) string) bool {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return false
	}
	if e := strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")); e != "" {
		return e != "none"
	}
	return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// FromEnv returns the tracing the environment configures (Configured), or nil
// without error where it configures none. The exporter and its protocol, OTLP over
// HTTP (the default) or gRPC, follow the OTEL_* variables as the OpenTelemetry SDK
// reads them from the process's environment (package autoexport), and so do the
// sampler (OTEL_TRACES_SAMPLER), the batching (OTEL_BSP_*), the propagators
// (OTEL_PROPAGATORS) and the resource (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES).
// version is the service.version. Shutdown sends what is left.
func FromEnv(ctx context.Context, getenv func(string) string, version string) (*Traces, error) {
	if !Configured(getenv) {
		return nil, nil
	}
	exp, err := autoexport.NewSpanExporter(ctx)
	if err != nil {
		return nil, fmt.Errorf("configuring the trace exporter: %w", err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName(ServiceName), semconv.ServiceVersion(version)),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv(), // last: the environment's names win
	)
	if err != nil {
		_ = exp.Shutdown(ctx)
		return nil, fmt.Errorf("describing the service for its traces: %w", err)
	}
	return &Traces{
		provider:   sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res)),
		propagator: autoprop.NewTextMapPropagator(),
	}, nil
}

// Shutdown exports the spans not sent yet, within ctx, and stops the exporter.
func (t *Traces) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	return t.provider.Shutdown(ctx)
}

// Tracer returns the tracer of the spans of the package named name: a tracer that
// records nothing on a nil *Traces.
func (t *Traces) Tracer(name string) trace.Tracer {
	if t == nil {
		return tracenoop.NewTracerProvider().Tracer(name)
	}
	return t.provider.Tracer(name)
}

// Handler returns h with a server span around each request, a child of the
// request's traceparent where it carries one. NameRequest names it by its route.
// A nil *Traces returns h itself.
func (t *Traces) Handler(h http.Handler) http.Handler {
	if t == nil {
		return h
	}
	return otelhttp.NewHandler(h, "HTTP",
		otelhttp.WithTracerProvider(t.provider),
		otelhttp.WithPropagators(t.propagator),
		otelhttp.WithMeterProvider(metricnoop.NewMeterProvider()), // the metrics are Prometheus's
	)
}

// Pool makes the queries of a pool configured by cfg, and its waits for a
// connection, child spans of the request or job that made them. Their attributes
// hold the SQL text, never its arguments. It keeps the tracer cfg has, which runs
// first.
func (t *Traces) Pool(cfg *pgxpool.Config) {
	if t == nil {
		return
	}
	tracer := otelpgx.NewTracer(otelpgx.WithTracerProvider(t.provider),
		otelpgx.WithMeterProvider(metricnoop.NewMeterProvider()))
	if cfg.ConnConfig.Tracer == nil {
		cfg.ConnConfig.Tracer = tracer
		return
	}
	cfg.ConnConfig.Tracer = multitracer.New(cfg.ConnConfig.Tracer, tracer)
}

// NameRequest names the server span of r by route: the mux pattern that took it,
// such as "GET /v1/monitors/{id}", as the request metrics name it. A key in r's path
// loses its secret in the span's url.path, as in the request log. It does nothing
// where r's span does not record.
func NameRequest(r *http.Request, route string) {
	span := trace.SpanFromContext(r.Context())
	if !span.IsRecording() {
		return
	}
	span.SetName(route)
	if _, path, ok := strings.Cut(route, " "); ok {
		span.SetAttributes(semconv.HTTPRoute(path))
	}
	if p := keystore.Redact(r.URL.Path); p != r.URL.Path {
		span.SetAttributes(attribute.String(string(semconv.URLPathKey), p))
	}
}
