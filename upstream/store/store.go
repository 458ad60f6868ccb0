// Package store is the upstream's data in PostgreSQL. It holds organisations and their
// plans, users, sessions, the login throttle, monitors, the usage record's roll-up and
// reads, and the operator's writes.
// Every SQL statement of the upstream is in this package's *store.go files. Every
// pgx.ErrNoRows is mapped here to the apperr error the caller answers with.
//
// The package knows nothing of HTTP. The same Store serves the HTTP API (package
// httpapi) and the command line (package cli).
package store

import "github.com/jackc/pgx/v5/pgxpool"

// Store runs the upstream's queries on a pool. Build it with New. It is safe for
// concurrent use.
type Store struct {
	pool *pgxpool.Pool
}

// New returns a Store on pool, which must hold the schema of package schema.
func New(pool *pgxpool.Pool) *Store {
	return &Store{pool: pool}
}
