package httpapi

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keygate/keygate/internal/version"
	"github.com/keygate/keygate/upstream/store"
)

// readyTimeout bounds the database check of /readyz. A probe never hangs on a database
// that does not answer.
const readyTimeout = 2 * time.Second

// AdminHandler serves what operators and orchestrators ask of the upstream. It has an
// address of its own (`serve --admin-addr`), never the public one:
//
//   - GET /metrics: m in Prometheus's format.
//   - GET /healthz: 200 {"status":"ok","version":"…"} while the process serves
//     (liveness); version is version.String().
//   - GET /readyz: 200 {"status":"ready"} when the database answers with the schema
//     this code needs. Otherwise 503 {"error":"not_ready","reason":"…"}: take the
//     instance out of the load balancer, but do not restart it (readiness).
func AdminHandler(pool *pgxpool.Pool, m *Metrics) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", m.Handler())
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok", "version": version.String()})
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
	v, err := store.New(pool).SchemaVersion(ctx)
	if err != nil {
		return "database unreachable"
	}
	if v < store.RequiredSchemaVersion {
		return fmt.Sprintf("database schema at version %d, needs %d", v, store.RequiredSchemaVersion)
	}
	return ""
}
