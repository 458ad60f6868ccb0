package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/keygate/keygate/internal/pgfailover"
	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/upstream/apperr"
)

// The vocabulary of scopes: the operator's writes behind `upstream scope put` and
// `scope delete`, each audited in the operators' audit. Keys read it through
// package keystore, which checks a key's scopes against it.

// PutScope adds sc to the vocabulary, after the others, or replaces the description
// of the scope of that name. It reports whether it created it.
func (s *Store) PutScope(ctx context.Context, sc keystore.Scope) (created bool, err error) {
	tx, err := pgfailover.Begin(ctx, s.pool, pgfailover.Local)
	if err != nil {
		return false, fmt.Errorf("beginning transaction: %w", err)
	}
	defer tx.Rollback(ctx)
	var old keystore.Scope
	err = tx.QueryRow(ctx, `SELECT name, description FROM scopes WHERE name = $1 FOR UPDATE`, sc.Name).Scan(&old.Name, &old.Description)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		created = true
		_, err = tx.Exec(ctx, `INSERT INTO scopes (name, description) VALUES ($1, $2)`, sc.Name, sc.Description)
		if err == nil {
			err = auditOperator(ctx, tx, ActionScopeCreated, sc.Name, nil, sc)
		}
	case err != nil:
	case old == sc:
		return false, nil
	default:
		_, err = tx.Exec(ctx, `UPDATE scopes SET description = $2 WHERE name = $1`, sc.Name, sc.Description)
		if err == nil {
			err = auditOperator(ctx, tx, ActionScopeUpdated, sc.Name, old, sc)
		}
	}
	if err != nil {
		return false, fmt.Errorf("writing scope: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("writing scope: %w", err)
	}
	return created, nil
}

// DeleteScope removes the scope name from the vocabulary. It refuses, with
// apperr.ECONFLICT, while a live key holds it: a scope a key holds means what the
// routes that need it say. An unknown scope is apperr.ENOTFOUND.
//
// The scope's row is locked first, which waits for the keys being written with it
// (keystore share-locks the scopes of a key it writes), and keeps new ones from being
// written until this ends. The keys are read after the lock, by a statement of their
// own, so they include those just written.
func (s *Store) DeleteScope(ctx context.Context, name string) (keystore.Scope, error) {
	tx, err := pgfailover.Begin(ctx, s.pool, pgfailover.Local)
	if err != nil {
		return keystore.Scope{}, fmt.Errorf("beginning transaction: %w", err)
	}
	defer tx.Rollback(ctx)
	var old keystore.Scope
	err = tx.QueryRow(ctx, `SELECT name, description FROM scopes WHERE name = $1 FOR UPDATE`, name).Scan(&old.Name, &old.Description)
	if errors.Is(err, pgx.ErrNoRows) {
		return keystore.Scope{}, apperr.Errorf(apperr.ENOTFOUND, "unknown scope %q", name)
	}
	if err != nil {
		return keystore.Scope{}, fmt.Errorf("locking scope: %w", err)
	}
	var holders int
	err = tx.QueryRow(ctx, `SELECT count(*) FROM api_keys
WHERE $1 = ANY (scopes) AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())`, name).Scan(&holders)
	if err != nil {
		return keystore.Scope{}, fmt.Errorf("reading the keys of scope: %w", err)
	}
	if holders > 0 {
		what := fmt.Sprintf("%d live keys hold", holders)
		if holders == 1 {
			what = "a live key holds"
		}
		return keystore.Scope{}, apperr.Errorf(apperr.ECONFLICT, "%s scope %s: revoke them, or take the scope from them (the key PATCH), first", what, name)
	}
	if _, err := tx.Exec(ctx, `DELETE FROM scopes WHERE name = $1`, name); err != nil {
		return keystore.Scope{}, fmt.Errorf("deleting scope: %w", err)
	}
	if err := auditOperator(ctx, tx, ActionScopeDeleted, name, old, nil); err != nil {
		return keystore.Scope{}, err
	}
	if err := tx.Commit(ctx); err != nil {
		return keystore.Scope{}, fmt.Errorf("deleting scope: %w", err)
	}
	return old, nil
}
