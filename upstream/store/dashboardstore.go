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

// UserEmails returns the email of each user of ids that exists, by id, so that the
// dashboard names people rather than ids. Ids that are not UUIDs are left out.
func (s *Store) UserEmails(ctx context.Context, ids []string) (map[string]string, error) {
	var uuids []string
	for _, id := range ids {
		if ValidUUID(id) {
			uuids = append(uuids, id)
		}
	}
	emails := map[string]string{}
	if len(uuids) == 0 {
		return emails, nil
	}
	rows, err := s.pool.Query(ctx, `SELECT id::text, email FROM users WHERE id = ANY($1::uuid[])`, uuids)
	if err != nil {
		return nil, fmt.Errorf("reading emails: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id, email string
		if err := rows.Scan(&id, &email); err != nil {
			return nil, fmt.Errorf("reading emails: %w", err)
		}
		emails[id] = email
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading emails: %w", err)
	}
	return emails, nil
}
