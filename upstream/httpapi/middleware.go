package httpapi

import (
	"cmp"
	"context"
	"net/http"
	"runtime/debug"
	"time"

	"go.uber.org/zap"

	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/upstream/tracing"
)

// requestInfo tells the request log who made a request. The authentication steps fill
// it in. It travels in the request's context.
type requestInfo struct {
	userID string
	orgID  string
	keyID  string
	route  string // the mux pattern that took the request, for Metrics
}

type requestInfoKey struct{}

// infoOf returns the requestInfo of ctx, or a throwaway one outside logRequests.
func infoOf(ctx context.Context) *requestInfo {
	if info, ok := ctx.Value(requestInfoKey{}).(*requestInfo); ok {
		return info
	}
	return &requestInfo{}
}

// statusWriter remembers the status and size of a response. The request log reports
// them. recoverPanics may answer only while nothing has been written.
type statusWriter struct {
	http.ResponseWriter
	status int
	bytes  int
}

func (w *statusWriter) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(b)
	w.bytes += n
	return n, err
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// logRequests writes one log line per request: method, path, status, size, duration,
// and the ids of whoever made it. It names the request's span by its route. It never logs headers, bodies or query strings. So
// cookies, secrets, passwords and keys stay out of the logs. A key in the path, or
// sent as the method, is redacted (keystore.Redact).
func (s *Server) logRequests(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		info := &requestInfo{}
		sw := &statusWriter{ResponseWriter: w}
		next.ServeHTTP(sw, r.WithContext(context.WithValue(r.Context(), requestInfoKey{}, info)))
		s.metrics.observe(info.route, sw.status, time.Since(start))
		tracing.NameRequest(r, cmp.Or(info.route, routeNone))
		ce := s.logger.Check(zap.InfoLevel, "request")
		if ce == nil {
			return
		}
		status := sw.status
		if status == 0 {
			status = http.StatusOK
		}
		fields := []zap.Field{
			zap.String("method", keystore.Redact(r.Method)),
			zap.String("path", keystore.Redact(r.URL.Path)),
			zap.Int("status", status),
			zap.Int("bytes", sw.bytes),
			zap.Duration("duration", time.Since(start)),
		}
		if info.userID != "" {
			fields = append(fields, zap.String("user_id", info.userID))
		}
		if info.orgID != "" {
			fields = append(fields, zap.String("org_id", info.orgID))
		}
		if info.keyID != "" {
			fields = append(fields, zap.String("key_id", info.keyID))
		}
		ce.Write(fields...)
	})
}

// recoverPanics logs a handler's panic. If nothing has been written yet, it answers 500
// {"error":"internal"}. The client never sees the panic's value or stack.
// http.ErrAbortHandler is passed on, as net/http expects.
func (s *Server) recoverPanics(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw, ok := w.(*statusWriter)
		if !ok {
			sw = &statusWriter{ResponseWriter: w}
		}
		defer func() {
			v := recover()
			if v == nil {
				return
			}
			if v == http.ErrAbortHandler {
				panic(v)
			}
			s.logger.Error("handler panicked",
				zap.String("method", keystore.Redact(r.Method)),
				zap.String("path", keystore.Redact(r.URL.Path)),
				zap.Any("panic", v),
				zap.ByteString("stack", debug.Stack()))
			if sw.status == 0 {
				// Headers the handler set before panicking belong to an answer not given.
				clear(sw.Header())
				writeJSON(sw, http.StatusInternalServerError, errorBody{Error: "internal"})
			}
		}()
		next.ServeHTTP(sw, r)
	})
}
