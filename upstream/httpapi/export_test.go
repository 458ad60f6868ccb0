package httpapi

import (
	"net/http"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keygate/keygate/upstream/password"
	"github.com/keygate/keygate/upstream/store"
)

// The hooks below reach into a Server for the black-box tests of package
// httpapi_test. Those see nothing else unexported.

// Passwords returns the hasher s checks logins with.
func (s *Server) Passwords() *password.Hasher { return s.passwords }

// WriteError answers r with err as every route does.
func (s *Server) WriteError(w http.ResponseWriter, r *http.Request, err error) {
	s.writeError(w, r, err)
}

// Middleware wraps h in the request log and the panic recovery every route passes.
func (s *Server) Middleware(h http.Handler) http.Handler { return s.logRequests(s.recoverPanics(h)) }

// EncodeEventCursor is the cursor of the audit page after the event id.
var EncodeEventCursor = encodeEventCursor

// DashboardCSP is the Content-Security-Policy of every dashboard answer.
const DashboardCSP = dashboardCSP

// SetPool points the queries of s at pool.
func (s *Server) SetPool(pool *pgxpool.Pool) { s.store = store.New(pool) }
