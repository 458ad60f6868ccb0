package upstream

import (
	"context"
	"fmt"
)

// orgMembership is one organisation a user belongs to, as the dashboard's chooser
// shows it.
type orgMembership struct {
	ID   string
	Name string
	Role string
}

// userOrgs returns the organisations userID is a member of, by name.
func (s *Server) userOrgs(ctx context.Context, userID string) ([]orgMembership, error) {
	rows, err := s.pool.Query(ctx, `
		SELECT o.id::text, o.name, m.role
		FROM memberships m JOIN orgs o ON o.id = m.org_id
		WHERE m.user_id = $1
		ORDER BY o.name, o.id`, userID)
	if err != nil {
		return nil, fmt.Errorf("listing memberships: %w", err)
	}
	defer rows.Close()
	var orgs []orgMembership
	for rows.Next() {
		var o orgMembership
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
