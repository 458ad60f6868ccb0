package upstream

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// schemaVersion returns the version tern recorded, 0 for a database never migrated.
func schemaVersion(ctx context.Context, pool *pgxpool.Pool) (int, error) {
	var present bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('schema_version') IS NOT NULL`).Scan(&present); err != nil {
		return 0, fmt.Errorf("reading schema version: %w", err)
	}
	if !present {
		return 0, nil
	}
	var v int
	err := pool.QueryRow(ctx, `SELECT version FROM schema_version`).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("reading schema version: %w", err)
	}
	return v, nil
}
