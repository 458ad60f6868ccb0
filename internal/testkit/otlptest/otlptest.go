// Package otlptest is a test helper: an OpenTelemetry collector's trace receiver
// that keeps every span it is sent, over OTLP/gRPC and over OTLP/HTTP (protobuf, POST
// /v1/traces). The tests of the upstream's tracing and the integration suite export
// to it; cmd/otlpsink, which only counts them, is make bench's collector. Nothing
// shipped imports it.
package otlptest

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// Receiver takes spans over both protocols and keeps them, or only counts them.
type Receiver struct {
	// GRPCAddr and HTTPAddr are the loopback host:port of each protocol.
	GRPCAddr, HTTPAddr string
	// Discard makes the Receiver count the spans it is sent and keep nothing, for a
	// benchmark's collector (cmd/otlpsink). Set it before Serve.
	Discard bool

	mu       sync.Mutex
	count    int      // spans received
	requests [][]byte // every request received, as protobuf
	spans    []Span
}

// Span is a span as received, with its ids in hex.
type Span struct {
	Service         string // the resource's service.name
	TraceID, SpanID string
	ParentID        string // "" for a root
	Name            string
	Kind            tracepb.Span_SpanKind
	Attrs           map[string]string // each value as text
	Events          []string
	StatusError     bool
	StatusMessage   string
}

// Start starts a Receiver on two loopback ports. It stops when tb ends.
func Start(tb testing.TB) *Receiver {
	tb.Helper()
	var lns [2]net.Listener
	for i := range lns {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		lns[i] = ln
	}
	r := &Receiver{}
	tb.Cleanup(r.Serve(lns[0], lns[1]))
	return r
}

// Serve serves OTLP/gRPC on grpcLn and OTLP/HTTP on httpLn, either of which may be
// nil, until stop is called.
func (r *Receiver) Serve(grpcLn, httpLn net.Listener) (stop func()) {
	gs := grpc.NewServer()
	if grpcLn != nil {
		r.GRPCAddr = grpcLn.Addr().String()
		coltracepb.RegisterTraceServiceServer(gs, traceService{r: r})
		go func() { _ = gs.Serve(grpcLn) }()
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", r.serveHTTP)
	hs := &http.Server{Handler: mux}
	if httpLn != nil {
		r.HTTPAddr = httpLn.Addr().String()
		go func() { _ = hs.Serve(httpLn) }()
	}
	return func() {
		gs.Stop()
		_ = hs.Close()
	}
}

// Count returns how many spans r has received.
func (r *Receiver) Count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.count
}

// Env returns the OTEL_* environment that points an OpenTelemetry SDK at r over
// protocol, "grpc" or "http/protobuf", with spans sent a tenth of a second after
// they end.
func (r *Receiver) Env(protocol string) []string {
	addr := r.HTTPAddr
	if protocol == "grpc" {
		addr = r.GRPCAddr
	}
	return []string{
		"OTEL_EXPORTER_OTLP_ENDPOINT=http://" + addr,
		"OTEL_EXPORTER_OTLP_PROTOCOL=" + protocol,
		"OTEL_BSP_SCHEDULE_DELAY=100",
	}
}

type traceService struct {
	coltracepb.UnimplementedTraceServiceServer
	r *Receiver
}

func (s traceService) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	b, err := proto.Marshal(req)
	if err != nil {
		return nil, err
	}
	s.r.keep(b, req)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// serveHTTP is OTLP/HTTP's POST /v1/traces, in protobuf.
func (r *Receiver) serveHTTP(w http.ResponseWriter, req *http.Request) {
	var body io.Reader = req.Body
	if req.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	if ct := req.Header.Get("Content-Type"); ct != "application/x-protobuf" {
		http.Error(w, "Content-Type "+ct+": only application/x-protobuf is taken", http.StatusUnsupportedMediaType)
		return
	}
	b, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var msg coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(b, &msg); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.keep(b, &msg)
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// keep counts the spans of a request and, unless r discards them, stores it: raw,
// and its spans.
func (r *Receiver) keep(raw []byte, req *coltracepb.ExportTraceServiceRequest) {
	if r.Discard {
		n := 0
		for _, rs := range req.GetResourceSpans() {
			for _, ss := range rs.GetScopeSpans() {
				n += len(ss.GetSpans())
			}
		}
		r.mu.Lock()
		r.count += n
		r.mu.Unlock()
		return
	}
	var spans []Span
	for _, rs := range req.GetResourceSpans() {
		service := attrs(rs.GetResource().GetAttributes())["service.name"]
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				sp := Span{
					Service: service, TraceID: hex.EncodeToString(s.GetTraceId()), SpanID: hex.EncodeToString(s.GetSpanId()),
					ParentID: hex.EncodeToString(s.GetParentSpanId()), Name: s.GetName(), Kind: s.GetKind(),
					Attrs:       attrs(s.GetAttributes()),
					StatusError: s.GetStatus().GetCode() == tracepb.Status_STATUS_CODE_ERROR, StatusMessage: s.GetStatus().GetMessage(),
				}
				for _, e := range s.GetEvents() {
					sp.Events = append(sp.Events, e.GetName())
				}
				spans = append(spans, sp)
			}
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.count += len(spans)
	r.requests = append(r.requests, raw)
	r.spans = append(r.spans, spans...)
}

// attrs returns attributes as text, by key.
func attrs(kvs []*commonpb.KeyValue) map[string]string {
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		m[kv.GetKey()] = text(kv.GetValue())
	}
	return m
}

func text(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return fmt.Sprint(x.IntValue)
	case *commonpb.AnyValue_BoolValue:
		return fmt.Sprint(x.BoolValue)
	case *commonpb.AnyValue_DoubleValue:
		return fmt.Sprint(x.DoubleValue)
	case *commonpb.AnyValue_ArrayValue:
		var parts []string
		for _, e := range x.ArrayValue.GetValues() {
			parts = append(parts, text(e))
		}
		return "[" + strings.Join(parts, ",") + "]"
	}
	return v.String()
}

// Spans returns every span received so far.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// Trace returns the spans received so far of the trace traceID (hex).
func (r *Receiver) Trace(traceID string) []Span {
	var out []Span
	for _, s := range r.Spans() {
		if s.TraceID == traceID {
			out = append(out, s)
		}
	}
	return out
}

// Holds reports whether any request received holds s anywhere: in a span's name,
// attributes, events, links or status, or in a resource. Protobuf carries strings
// as they are, so a search of the bytes finds them all.
func (r *Receiver) Holds(s string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, b := range r.requests {
		if bytes.Contains(b, []byte(s)) {
			return true
		}
	}
	return false
}

// Describe lists spans, one a line, for a failure message: service, name, ids and
// attributes.
func Describe(spans []Span) string {
	var b strings.Builder
	for _, s := range spans {
		keys := make([]string, 0, len(s.Attrs))
		for k := range s.Attrs {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		fmt.Fprintf(&b, "\n  %s %q span %s parent %s error=%v", s.Service, s.Name, s.SpanID, s.ParentID, s.StatusError)
		for _, k := range keys {
			fmt.Fprintf(&b, " %s=%s", k, s.Attrs[k])
		}
	}
	return b.String()
}
