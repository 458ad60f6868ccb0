// Package schema holds the versioned SQL migrations of keygate's PostgreSQL database,
// and applies them with tern. Every binary that needs them embeds them.
//
// Migrate is idempotent, and safe to run from several processes at once. tern records
// the applied version in the table schema_version. It holds a PostgreSQL advisory lock
// while it migrates.
package schema

import (
	"context"
	"embed"
	"fmt"
	"io/fs"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/tern/v2/migrate"
)

//go:embed migrations/*.sql
var migrations embed.FS

// versionTable is where tern records the applied version.
const versionTable = "schema_version"

// Migrate applies every migration not yet applied to the database at databaseURL.
func Migrate(ctx context.Context, databaseURL string) error {
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		return fmt.Errorf("connecting to postgres: %w", err)
	}
	defer conn.Close(ctx)
	m, err := migrate.NewMigrator(ctx, conn, versionTable)
	if err != nil {
		return fmt.Errorf("preparing migrations: %w", err)
	}
	sub, err := fs.Sub(migrations, "migrations")
	if err != nil {
		return err
	}
	if err := m.LoadMigrations(sub); err != nil {
		return fmt.Errorf("loading migrations: %w", err)
	}
	if err := m.Migrate(ctx); err != nil {
		return fmt.Errorf("applying migrations: %w", err)
	}
	return nil
}
