package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/upstream/apperr"
)

// The routes' queries of organisations, their plans and their memberships. The
// operator's writes to the same tables are in operatorstore.go.

// Member roles. Owner exists only for people. Keys are Admin, Editor or Viewer.
const (
	RoleOwner  = "Owner"
	RoleAdmin  = "Admin"
	RoleEditor = "Editor"
	RoleViewer = "Viewer"
)

// ValidMemberRole reports whether role is a membership role.
func ValidMemberRole(role string) bool {
	return role == RoleOwner || role == RoleAdmin || role == RoleEditor || role == RoleViewer
}

// MemberRole returns the role of userID in orgID. It returns apperr.ErrNotFound when
// userID is not a member, or orgID does not exist.
func (s *Store) MemberRole(ctx context.Context, orgID, userID string) (string, error) {
	var role string
	err := s.pool.QueryRow(ctx, `SELECT role FROM memberships WHERE org_id = $1 AND user_id = $2`,
		orgID, userID).Scan(&role)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", apperr.ErrNotFound
	}
	if err != nil {
		return "", fmt.Errorf("looking up membership: %w", err)
	}
	return role, nil
}

// APIRateLimit returns the api_rate_limit of orgID's plan. 0 means no API access. It
// returns apperr.ErrNotFound when the org no longer exists.
func (s *Store) APIRateLimit(ctx context.Context, orgID string) (int, error) {
	var rateLimit int
	err := s.pool.QueryRow(ctx, `SELECT p.api_rate_limit FROM orgs o JOIN plans p ON p.name = o.plan WHERE o.id = $1`,
		orgID).Scan(&rateLimit)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, apperr.ErrNotFound
	}
	if err != nil {
		return 0, fmt.Errorf("looking up plan: %w", err)
	}
	return rateLimit, nil
}

// Budgets are the API budgets of an organisation's plan: each key's requests a minute
// (0 no API access, -1 unlimited) and in its windows beside the minute, by
// keystore.Window (-1 none), all its keys' requests a minute and a UTC month together
// (-1 none).
type Budgets struct {
	APIRateLimit        int
	Windows             [keystore.NumWindows]int
	OrgRateLimit        int
	APIRequestsPerMonth int64
}

// PlanBudgets returns the budgets of orgID's plan. It returns apperr.ErrNotFound when
// the org no longer exists.
func (s *Store) PlanBudgets(ctx context.Context, orgID string) (Budgets, error) {
	var b Budgets
	err := s.pool.QueryRow(ctx, `SELECT p.api_rate_limit, p.org_rate_limit, p.api_requests_per_month,
	p.api_rate_limit_per_second, p.api_rate_limit_per_hour, p.api_rate_limit_per_day
FROM orgs o JOIN plans p ON p.name = o.plan WHERE o.id = $1`, orgID).Scan(&b.APIRateLimit, &b.OrgRateLimit, &b.APIRequestsPerMonth,
		&b.Windows[keystore.PerSecond], &b.Windows[keystore.PerHour], &b.Windows[keystore.PerDay])
	if errors.Is(err, pgx.ErrNoRows) {
		return Budgets{}, apperr.ErrNotFound
	}
	if err != nil {
		return Budgets{}, fmt.Errorf("looking up plan: %w", err)
	}
	return b, nil
}
