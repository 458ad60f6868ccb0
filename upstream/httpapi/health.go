package upstream

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
)

// readyTimeout bounds the database check of /readyz, so that a probe never hangs on a
// database that does not answer.
const readyTimeout = 2 * time.Second

// AdminHandler serves what operators and orchestrators ask of the upstream, on an
// address of its own (`serve --admin-addr`), never on the public one:
//
//   - GET /metrics: m in Prometheus's format;
//   - GET /healthz: 200 {"status":"ok"} while the process serves (liveness);
//   - GET /readyz: 200 {"status":"ready"} when the database answers and has the schema
//     this code needs, else 503 {"error":"not_ready","reason":"…"} (readiness: take
//     the instance out of the load balancer, do not restart it).
func AdminHandler(pool *pgxpool.Pool, m *Metrics) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", m.Handler())
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if reason := notReady(r.Context(), pool); reason != "" {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "not_ready", "reason": reason})
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	})
	return mux
}

// notReady returns why the upstream cannot serve requests, or "" when it can.
func notReady(ctx context.Context, pool *pgxpool.Pool) string {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	v, err := schemaVersion(ctx, pool)
	if err != nil {
		return "database unreachable"
	}
	if v < requiredSchemaVersion {
		return fmt.Sprintf("database schema at version %d, needs %d", v, requiredSchemaVersion)
	}
	return ""
}

// serveAdmin serves AdminHandler on addr until the returned stop is called, which
// waits up to shutdownTimeout for the requests in flight.
func serveAdmin(addr string, pool *pgxpool.Pool, m *Metrics, logger *zap.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening on --admin-addr: %w", err)
	}
	hs := &http.Server{
		Handler:           AdminHandler(pool, m),
		ReadHeaderTimeout: 10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       120 * time.Second,
		ErrorLog:          zap.NewStdLog(logger.Named("admin")),
	}
	logger.Info("serving admin endpoints", zap.String("admin_addr", ln.Addr().String()))
	go func() {
		if err := hs.Serve(ln); err != nil && err != http.ErrServerClosed {
			logger.Error("admin endpoints stopped", zap.Error(err))
		}
	}()
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		_ = hs.Shutdown(ctx)
	}, nil
}
