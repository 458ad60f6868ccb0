package keystore

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// A key's scopes narrow what its role allows: a key with scopes may do only what both
// its role and one of its scopes allow, and a key without scopes (nil) whatever its
// role allows. A scope never widens a role (docs/security.md, Scopes). Which scopes
// exist is the operator's data, the vocabulary of the scopes table (`upstream scope
// put`): a key's scopes are checked against it when the key is created or changed.

// FieldScopes is the name of a key's scopes, as the API and the audit trail spell it.
const FieldScopes = "scopes"

// The scopes of the gateway's built-in route table, in the vocabulary from the start.
const (
	ScopeMonitorsRead   = "monitors:read"
	ScopeMonitorsWrite  = "monitors:write"
	ScopeMonitorsDelete = "monitors:delete"
)

// MaxScopeLen is the longest a scope's name may be.
const MaxScopeLen = 64

// scopeRE is what a scope's name looks like.
var scopeRE = regexp.MustCompile(`^[a-z][a-z0-9_.:-]*$`)

// ScopeNamePattern is scopeRE as messages and documents write it.
const ScopeNamePattern = "[a-z][a-z0-9_.:-]*"

// ValidScopeName reports whether s may name a scope: ScopeNamePattern, at most
// MaxScopeLen characters. The gateway's route table and the vocabulary both hold to it.
func ValidScopeName(s string) bool {
	return len(s) <= MaxScopeLen && scopeRE.MatchString(s)
}

// Scope is one scope of the vocabulary: its name and what it is for, in words.
type Scope struct {
	Name        string `json:"name"`
	Description string `json:"description"`
}

// Scopes returns the vocabulary, in its order.
func (s *Store) Scopes(ctx context.Context) ([]Scope, error) {
	rows, err := s.pool.Query(ctx, `SELECT name, description FROM scopes ORDER BY position`)
	if err != nil {
		return nil, fmt.Errorf("listing scopes: %w", err)
	}
	list, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Scope])
	if err != nil {
		return nil, fmt.Errorf("listing scopes: %w", err)
	}
	return list, nil
}

// ParseScopes checks a key's scopes as a person gave them: a non-empty list of
// distinct names of scopes. A nil list is unscoped and stays nil; an empty one is
// refused, since a key that may do nothing is a mistake rather than a choice. Whether
// each is in the vocabulary is checked when the key is written (Create, Update), which
// also puts them in the vocabulary's order, so that two lists of the same scopes are
// equal.
func ParseScopes(list []string) ([]string, error) {
	if list == nil {
		return nil, nil
	}
	if len(list) == 0 {
		return nil, invalidSetting(FieldScopes, "must list at least one scope, or be null for everything the role allows")
	}
	for i, s := range list {
		if !ValidScopeName(s) {
			return nil, invalidSetting(FieldScopes, "%q is not a scope: a scope matches %s", s, ScopeNamePattern)
		}
		if slices.Contains(list[:i], s) {
			return nil, invalidSetting(FieldScopes, "lists %s more than once", s)
		}
	}
	return slices.Clone(list), nil
}

// resolveScopes returns list, which ParseScopes has passed, in the vocabulary's
// order, within tx. Each scope's row is share-locked until tx ends, so that a scope
// cannot be deleted between this check and the key's write. A scope not in the
// vocabulary is a *SettingError naming it and the vocabulary.
func resolveScopes(ctx context.Context, tx pgx.Tx, list []string) ([]string, error) {
	if list == nil {
		return nil, nil
	}
	rows, err := tx.Query(ctx, `SELECT name FROM scopes WHERE name = ANY($1) ORDER BY position FOR SHARE`, list)
	if err != nil {
		return nil, fmt.Errorf("reading scopes: %w", err)
	}
	known, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("reading scopes: %w", err)
	}
	if len(known) == len(list) {
		return known, nil
	}
	var unknown string
	for _, s := range list {
		if !slices.Contains(known, s) {
			unknown = s
			break
		}
	}
	var names []string
	rows, err = tx.Query(ctx, `SELECT name FROM scopes ORDER BY position`)
	if err == nil {
		names, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil {
		return nil, fmt.Errorf("reading scopes: %w", err)
	}
	return nil, invalidSetting(FieldScopes, "%q is not a scope: use %s", unknown, orWords(names))
}

// orWords lists words as a message does: "a, b or c".
func orWords(words []string) string {
	switch len(words) {
	case 0:
		return "none: the operator has defined no scope"
	case 1:
		return words[0]
	}
	return strings.Join(words[:len(words)-1], ", ") + " or " + words[len(words)-1]
}
