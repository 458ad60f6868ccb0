package pgfailover_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keygate/keygate/internal/pgfailover"
	"github.com/keygate/keygate/internal/testkit/pgpair"
)

// TestOnlySyncedWritesWaitForTheSynchronousStandby: a primary whose synchronous
// standby is stopped, so that no commit that waits for it returns. Every form of a
// Local write commits at once; every form of a Synced one, and a Local transaction
// raised by Sync, is still waiting when its context ends. Through each of pgx's
// query modes, PgBouncer's among them.
func TestOnlySyncedWritesWaitForTheSynchronousStandby(t *testing.T) {
	pair := pgpair.Start(t)
	for _, mode := range []string{"", "&default_query_exec_mode=exec", "&default_query_exec_mode=simple_protocol"} {
		pool, err := pgxpool.New(context.Background(), pair.PrimaryURL+mode)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		if _, err := pool.Exec(context.Background(), `CREATE TABLE IF NOT EXISTS w (x int)`); err != nil {
			t.Fatal(err)
		}
	}
	pair.StopStandby()

	writes := []struct {
		name  string
		write func(ctx context.Context, pool *pgxpool.Pool, c pgfailover.Commit) error
	}{
		{"Exec", func(ctx context.Context, pool *pgxpool.Pool, c pgfailover.Commit) error {
			tag, err := pgfailover.Exec(ctx, pool, c, `INSERT INTO w VALUES ($1), ($1)`, 1)
			if err == nil && tag.RowsAffected() != 2 {
				return errors.New("the command tag is not the statement's: " + tag.String())
			}
			return err
		}},
		{"QueryRow", func(ctx context.Context, pool *pgxpool.Pool, c pgfailover.Commit) error {
			var x int
			err := pgfailover.QueryRow(ctx, pool, c, `INSERT INTO w VALUES ($1) RETURNING x`, 2).Scan(&x)
			if err == nil && x != 2 {
				return errors.New("the row is not the statement's")
			}
			return err
		}},
		{"Query", func(ctx context.Context, pool *pgxpool.Pool, c pgfailover.Commit) error {
			rows, err := pgfailover.Query(ctx, pool, c, `INSERT INTO w VALUES ($1), ($1) RETURNING x`, 3)
			if err != nil {
				return err
			}
			xs, err := pgx.CollectRows(rows, pgx.RowTo[int])
			if err == nil && len(xs) != 2 {
				return errors.New("the rows are not the statement's")
			}
			return err
		}},
		{"NewBatch", func(ctx context.Context, pool *pgxpool.Pool, c pgfailover.Commit) error {
			b := pgfailover.NewBatch(c)
			b.Queue(`INSERT INTO w VALUES ($1)`, 4)
			b.Queue(`INSERT INTO w VALUES ($1)`, 5)
			return pool.SendBatch(ctx, b).Close()
		}},
		{"Begin", func(ctx context.Context, pool *pgxpool.Pool, c pgfailover.Commit) error {
			tx, err := pgfailover.Begin(ctx, pool, c)
			if err != nil {
				return err
			}
			defer tx.Rollback(ctx)
			if _, err := tx.Exec(ctx, `INSERT INTO w VALUES ($1)`, 6); err != nil {
				return err
			}
			return tx.Commit(ctx)
		}},
	}
	for _, mode := range []string{"", "&default_query_exec_mode=exec", "&default_query_exec_mode=simple_protocol"} {
		pool, err := pgxpool.New(context.Background(), pair.PrimaryURL+mode)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		for _, w := range writes {
			t.Run(w.name+mode, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				start := time.Now()
				if err := w.write(ctx, pool, pgfailover.Local); err != nil {
					t.Errorf("Local: %v after %v", err, time.Since(start))
				}
				wantWaiting(t, "Synced", func(ctx context.Context) error { return w.write(ctx, pool, pgfailover.Synced) })
			})
		}
		t.Run("Sync"+mode, func(t *testing.T) {
			wantWaiting(t, "Local raised by Sync", func(ctx context.Context) error {
				tx, err := pgfailover.Begin(ctx, pool, pgfailover.Local)
				if err != nil {
					return err
				}
				defer tx.Rollback(ctx)
				if _, err := tx.Exec(ctx, `INSERT INTO w VALUES ($1)`, 7); err != nil {
					return err
				}
				if err := pgfailover.Sync(ctx, tx); err != nil {
					return err
				}
				return tx.Commit(ctx)
			})
		})
	}
}

// wantWaiting runs a write that must wait for the standby, and fails the test unless
// it is still waiting when its context ends, a second on.
func wantWaiting(t *testing.T, name string, write func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	err := write(ctx)
	if err == nil || ctx.Err() == nil {
		t.Errorf("%s: %v after %v; want it waiting for the standby until its context ends", name, err, time.Since(start))
	}
}
