package store

import (
	"context"
	"fmt"
)

// OrgMembership is one organisation a user belongs to, as the dashboard shows it.
type OrgMembership struct {
	ID   string
	Name string
	Role string
}

// UserOrgs returns the organisations userID is a member of, by name.
func (s *Store) UserOrgs(ctx context.Context, userID string) ([]OrgMembership, error) {
	rows, err := s.pool.Query(ctx, `
		SELECT o.id::text, o.name, m.role
		FROM memberships m JOIN orgs o ON o.id = m.org_id
		WHERE m.user_id = $1
		ORDER BY o.name, o.id`, userID)
	if err != nil {
		return nil, fmt.Errorf("listing memberships: %w", err)
	}
	defer rows.Close()
	var orgs []OrgMembership
	for rows.Next() {
		var o OrgMembership
		if err := rows.Scan(&o.ID, &o.Name, &o.Role); err != nil {
			return nil, fmt.Errorf("listing memberships: %w", err)
		}
		orgs = append(orgs, o)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing memberships: %w", err)
	}
	return orgs, nil
}
