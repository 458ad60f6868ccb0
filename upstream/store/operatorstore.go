package upstream

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The operator's writes behind the commands of commands.go (CONTRACT §7). Each changes
// the database in one statement or transaction and returns what it wrote, which the
// command prints as JSON. Their input has been checked by the command; a missing
// referent is ENOTFOUND, a duplicate ECONFLICT.

// planRecord is a plan as `plan put` writes and prints it.
type planRecord struct {
	Name               string   `json:"name"`
	APIRateLimit       int      `json:"api_rate_limit"`
	MaxMonitors        int      `json:"max_monitors"`
	MinIntervalSeconds int      `json:"min_interval_seconds"`
	Locations          []string `json:"locations"`
	CheckTypes         []string `json:"check_types"`
}

// orgRecord is an organisation as `org create` and `org set-plan` print it.
type orgRecord struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	Plan string `json:"plan"`
}

// userRecord is a user as `user create` prints it.
type userRecord struct {
	ID    string `json:"id"`
	Email string `json:"email"`
}

// memberRecord is a membership as `member add` prints it.
type memberRecord struct {
	OrgID  string `json:"org_id"`
	UserID string `json:"user_id"`
	Email  string `json:"email"`
	Role   string `json:"role"`
}

// putPlan creates the plan p.Name or replaces its limits; p has passed checkPlan.
func putPlan(ctx context.Context, pool *pgxpool.Pool, p planRecord) (planRecord, error) {
	_, err := pool.Exec(ctx, `INSERT INTO plans (name, api_rate_limit, max_monitors, min_interval_seconds, locations, check_types)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (name) DO UPDATE SET
	api_rate_limit = EXCLUDED.api_rate_limit,
	max_monitors = EXCLUDED.max_monitors,
	min_interval_seconds = EXCLUDED.min_interval_seconds,
	locations = EXCLUDED.locations,
	check_types = EXCLUDED.check_types,
	updated_at = now()`,
		p.Name, p.APIRateLimit, p.MaxMonitors, p.MinIntervalSeconds, p.Locations, p.CheckTypes)
	if err != nil {
		return planRecord{}, fmt.Errorf("writing plan: %w", err)
	}
	return p, nil
}

// createOrg creates an organisation on an existing plan; name has passed checkOrgName.
func createOrg(ctx context.Context, pool *pgxpool.Pool, name, planName string) (orgRecord, error) {
	o := orgRecord{Name: name, Plan: planName}
	err := pool.QueryRow(ctx, `INSERT INTO orgs (name, plan) SELECT $1, name FROM plans WHERE name = $2 RETURNING id::text`,
		name, planName).Scan(&o.ID)
	if errors.Is(err, pgx.ErrNoRows) {
		return orgRecord{}, Errorf(ENOTFOUND, "unknown plan %q", planName)
	}
	if err != nil {
		return orgRecord{}, fmt.Errorf("creating org: %w", err)
	}
	return o, nil
}

// setOrgPlan moves the organisation orgID, a UUID, to another existing plan.
func setOrgPlan(ctx context.Context, pool *pgxpool.Pool, orgID, planName string) (orgRecord, error) {
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM plans WHERE name = $1)`, planName).Scan(&exists); err != nil {
		return orgRecord{}, fmt.Errorf("looking up plan: %w", err)
	}
	if !exists {
		return orgRecord{}, Errorf(ENOTFOUND, "unknown plan %q", planName)
	}
	o := orgRecord{Plan: planName}
	err := pool.QueryRow(ctx, `UPDATE orgs SET plan = $2 WHERE id = $1 RETURNING id::text, name`, orgID, planName).
		Scan(&o.ID, &o.Name)
	if errors.Is(err, pgx.ErrNoRows) {
		return orgRecord{}, Errorf(ENOTFOUND, "unknown org %s", orgID)
	}
	if err != nil {
		return orgRecord{}, fmt.Errorf("setting plan: %w", err)
	}
	return o, nil
}

// createUser creates a user with an argon2id hash of password; email has passed
// checkEmail and password checkNewPassword. Emails are unique whatever their case.
func createUser(ctx context.Context, pool *pgxpool.Pool, hasher *passwordHasher, email, password string) (userRecord, error) {
	encoded, err := hasher.hash(ctx, password)
	if err != nil {
		return userRecord{}, fmt.Errorf("hashing password: %w", err)
	}
	u := userRecord{Email: email}
	err = pool.QueryRow(ctx, `INSERT INTO users (email, password_hash) VALUES ($1, $2) RETURNING id::text`,
		email, encoded).Scan(&u.ID)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		return userRecord{}, Errorf(ECONFLICT, "a user with email %s already exists", email)
	}
	if err != nil {
		return userRecord{}, fmt.Errorf("creating user: %w", err)
	}
	return u, nil
}

// addMember makes the user with email a member of orgID with role, which have passed
// checkMember; a user who is already a member gets the new role.
func addMember(ctx context.Context, pool *pgxpool.Pool, orgID, email, role string) (memberRecord, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return memberRecord{}, fmt.Errorf("beginning transaction: %w", err)
	}
	defer tx.Rollback(ctx)
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM orgs WHERE id = $1)`, orgID).Scan(&exists); err != nil {
		return memberRecord{}, fmt.Errorf("looking up org: %w", err)
	}
	if !exists {
		return memberRecord{}, Errorf(ENOTFOUND, "unknown org %s", orgID)
	}
	m := memberRecord{OrgID: orgID, Role: role}
	err = tx.QueryRow(ctx, `SELECT id::text, email FROM users WHERE lower(email) = lower($1)`, email).Scan(&m.UserID, &m.Email)
	if errors.Is(err, pgx.ErrNoRows) {
		return memberRecord{}, Errorf(ENOTFOUND, "no user with email %s", email)
	}
	if err != nil {
		return memberRecord{}, fmt.Errorf("looking up user: %w", err)
	}
	err = tx.QueryRow(ctx, `INSERT INTO memberships (org_id, user_id, role) VALUES ($1, $2, $3)
ON CONFLICT (org_id, user_id) DO UPDATE SET role = EXCLUDED.role
RETURNING org_id::text`, orgID, m.UserID, role).Scan(&m.OrgID)
	if err != nil {
		return memberRecord{}, fmt.Errorf("adding member: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return memberRecord{}, fmt.Errorf("adding member: %w", err)
	}
	return m, nil
}
