package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// RequiredSchemaVersion is the newest migration of schema/ this code relies on. serve
// refuses an older database, rather than fail on its first request.
const RequiredSchemaVersion = 11

// SchemaVersion returns the version tern recorded, or 0 for a database never migrated.
func (s *Store) SchemaVersion(ctx context.Context) (int, error) {
	var present bool
	if err := s.pool.QueryRow(ctx, `SELECT to_regclass('schema_version') IS NOT NULL`).Scan(&present); err != nil {
		return 0, fmt.Errorf("reading schema version: %w", err)
	}
	if !present {
		return 0, nil
	}
	var v int
	err := s.pool.QueryRow(ctx, `SELECT version FROM schema_version`).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("reading schema version: %w", err)
	}
	return v, nil
}
