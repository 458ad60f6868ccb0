package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/keygate/keygate/upstream/apperr"
	"github.com/keygate/keygate/upstream/password"
)

// The operator's writes behind the commands of package cli (docs/configuration.md).
// Each changes the database in one statement or transaction. Each returns what it
// wrote, and the command prints that as JSON. The command has checked their input. A
// missing referent is apperr.ENOTFOUND, a duplicate apperr.ECONFLICT.

// Plan is a plan as the plan commands print it, and as `plan put` writes it.
type Plan struct {
	Name               string   `json:"name"`
	APIRateLimit       int      `json:"api_rate_limit"`
	MaxMonitors        int      `json:"max_monitors"`
	MinIntervalSeconds int      `json:"min_interval_seconds"`
	Locations          []string `json:"locations"`
	CheckTypes         []string `json:"check_types"`
	// OrgRateLimit is the requests a minute of all an organisation's keys together,
	// and APIRequestsPerMonth those of a UTC calendar month. -1 is none; 0 is not a
	// value either takes.
	OrgRateLimit        int   `json:"org_rate_limit"`
	APIRequestsPerMonth int64 `json:"api_requests_per_month"`
	// APIRateLimitPerSecond, APIRateLimitPerHour and APIRateLimitPerDay are each
	// key's requests in a second, an hour and a UTC day, beside its minute. -1 is
	// none; 0 is not a value any takes (no API access is APIRateLimit 0).
	APIRateLimitPerSecond int `json:"api_rate_limit_per_second"`
	APIRateLimitPerHour   int `json:"api_rate_limit_per_hour"`
	APIRateLimitPerDay    int `json:"api_rate_limit_per_day"`
}

// Org is an organisation as `org create` and `org set-plan` print it.
type Org struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	Plan string `json:"plan"`
}

// User is a user as `user create` prints it.
type User struct {
	ID    string `json:"id"`
	Email string `json:"email"`
}

// Member is a membership as `member add` prints it.
type Member struct {
	OrgID  string `json:"org_id"`
	UserID string `json:"user_id"`
	Email  string `json:"email"`
	Role   string `json:"role"`
}

// PutPlan creates the plan p.Name or replaces its limits.
func (s *Store) PutPlan(ctx context.Context, p Plan) (Plan, error) {
	_, err := s.pool.Exec(ctx, `INSERT INTO plans (name, api_rate_limit, max_monitors, min_interval_seconds, locations, check_types,
	org_rate_limit, api_requests_per_month, api_rate_limit_per_second, api_rate_limit_per_hour, api_rate_limit_per_day)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
ON CONFLICT (name) DO UPDATE SET
	api_rate_limit = EXCLUDED.api_rate_limit,
	max_monitors = EXCLUDED.max_monitors,
	min_interval_seconds = EXCLUDED.min_interval_seconds,
	locations = EXCLUDED.locations,
	check_types = EXCLUDED.check_types,
	org_rate_limit = EXCLUDED.org_rate_limit,
	api_requests_per_month = EXCLUDED.api_requests_per_month,
	api_rate_limit_per_second = EXCLUDED.api_rate_limit_per_second,
	api_rate_limit_per_hour = EXCLUDED.api_rate_limit_per_hour,
	api_rate_limit_per_day = EXCLUDED.api_rate_limit_per_day,
	updated_at = now()`,
		p.Name, p.APIRateLimit, p.MaxMonitors, p.MinIntervalSeconds, p.Locations, p.CheckTypes,
		p.OrgRateLimit, p.APIRequestsPerMonth, p.APIRateLimitPerSecond, p.APIRateLimitPerHour, p.APIRateLimitPerDay)
	if err != nil {
		return Plan{}, fmt.Errorf("writing plan: %w", err)
	}
	return p, nil
}

// planColumns are the columns of a Plan in the order scanPlan reads them.
const planColumns = `name, api_rate_limit, max_monitors, min_interval_seconds, locations, check_types,
	org_rate_limit, api_requests_per_month, api_rate_limit_per_second, api_rate_limit_per_hour, api_rate_limit_per_day`

// scanPlan reads one row of planColumns.
func scanPlan(row pgx.Row) (Plan, error) {
	var p Plan
	err := row.Scan(&p.Name, &p.APIRateLimit, &p.MaxMonitors, &p.MinIntervalSeconds, &p.Locations, &p.CheckTypes,
		&p.OrgRateLimit, &p.APIRequestsPerMonth, &p.APIRateLimitPerSecond, &p.APIRateLimitPerHour, &p.APIRateLimitPerDay)
	return p, err
}

// Plans returns every plan, ordered by name.
func (s *Store) Plans(ctx context.Context) ([]Plan, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+planColumns+` FROM plans ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("listing plans: %w", err)
	}
	plans, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Plan, error) { return scanPlan(row) })
	if err != nil {
		return nil, fmt.Errorf("listing plans: %w", err)
	}
	return plans, nil
}

// Plan returns the plan name. An unknown plan is apperr.ENOTFOUND.
func (s *Store) Plan(ctx context.Context, name string) (Plan, error) {
	p, err := scanPlan(s.pool.QueryRow(ctx, `SELECT `+planColumns+` FROM plans WHERE name = $1`, name))
	if errors.Is(err, pgx.ErrNoRows) {
		return Plan{}, apperr.Errorf(apperr.ENOTFOUND, "unknown plan %q", name)
	}
	if err != nil {
		return Plan{}, fmt.Errorf("reading plan: %w", err)
	}
	return p, nil
}

// UpdatePlan changes the existing plan name: change gets its stored limits and
// alters those it is given, and may refuse the result with an error. The read and the
// write are one transaction with the row locked, so two updates of different limits
// both hold. An unknown plan is apperr.ENOTFOUND.
func (s *Store) UpdatePlan(ctx context.Context, name string, change func(*Plan) error) (Plan, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return Plan{}, fmt.Errorf("beginning transaction: %w", err)
	}
	defer tx.Rollback(ctx)
	p, err := scanPlan(tx.QueryRow(ctx, `SELECT `+planColumns+` FROM plans WHERE name = $1 FOR UPDATE`, name))
	if errors.Is(err, pgx.ErrNoRows) {
		return Plan{}, apperr.Errorf(apperr.ENOTFOUND, "unknown plan %q", name)
	}
	if err != nil {
		return Plan{}, fmt.Errorf("reading plan: %w", err)
	}
	if err := change(&p); err != nil {
		return Plan{}, err
	}
	_, err = tx.Exec(ctx, `UPDATE plans SET api_rate_limit = $2, max_monitors = $3, min_interval_seconds = $4,
	locations = $5, check_types = $6, org_rate_limit = $7, api_requests_per_month = $8,
	api_rate_limit_per_second = $9, api_rate_limit_per_hour = $10, api_rate_limit_per_day = $11, updated_at = now()
WHERE name = $1`,
		name, p.APIRateLimit, p.MaxMonitors, p.MinIntervalSeconds, p.Locations, p.CheckTypes,
		p.OrgRateLimit, p.APIRequestsPerMonth, p.APIRateLimitPerSecond, p.APIRateLimitPerHour, p.APIRateLimitPerDay)
	if err != nil {
		return Plan{}, fmt.Errorf("writing plan: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return Plan{}, fmt.Errorf("writing plan: %w", err)
	}
	return p, nil
}

// CreateOrg creates an organisation on an existing plan.
func (s *Store) CreateOrg(ctx context.Context, name, planName string) (Org, error) {
	o := Org{Name: name, Plan: planName}
	err := s.pool.QueryRow(ctx, `INSERT INTO orgs (name, plan) SELECT $1, name FROM plans WHERE name = $2 RETURNING id::text`,
		name, planName).Scan(&o.ID)
	if errors.Is(err, pgx.ErrNoRows) {
		return Org{}, apperr.Errorf(apperr.ENOTFOUND, "unknown plan %q", planName)
	}
	if err != nil {
		return Org{}, fmt.Errorf("creating org: %w", err)
	}
	return o, nil
}

// SetOrgPlan moves the organisation orgID, a UUID, to another existing plan.
func (s *Store) SetOrgPlan(ctx context.Context, orgID, planName string) (Org, error) {
	var exists bool
	if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM plans WHERE name = $1)`, planName).Scan(&exists); err != nil {
		return Org{}, fmt.Errorf("looking up plan: %w", err)
	}
	if !exists {
		return Org{}, apperr.Errorf(apperr.ENOTFOUND, "unknown plan %q", planName)
	}
	o := Org{Plan: planName}
	err := s.pool.QueryRow(ctx, `UPDATE orgs SET plan = $2 WHERE id = $1 RETURNING id::text, name`, orgID, planName).
		Scan(&o.ID, &o.Name)
	if errors.Is(err, pgx.ErrNoRows) {
		return Org{}, apperr.Errorf(apperr.ENOTFOUND, "unknown org %s", orgID)
	}
	if err != nil {
		return Org{}, fmt.Errorf("setting plan: %w", err)
	}
	return o, nil
}

// CreateUser creates a user with hasher's hash of pw. Emails are unique, whatever their
// case.
func (s *Store) CreateUser(ctx context.Context, hasher *password.Hasher, email, pw string) (User, error) {
	encoded, err := hasher.Hash(ctx, pw)
	if err != nil {
		return User{}, fmt.Errorf("hashing password: %w", err)
	}
	u := User{Email: email}
	err = s.pool.QueryRow(ctx, `INSERT INTO users (email, password_hash) VALUES ($1, $2) RETURNING id::text`,
		email, encoded).Scan(&u.ID)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		return User{}, apperr.Errorf(apperr.ECONFLICT, "a user with email %s already exists", email)
	}
	if err != nil {
		return User{}, fmt.Errorf("creating user: %w", err)
	}
	return u, nil
}

// AddMember makes the user with email a member of orgID with role. A user who is
// already a member gets the new role.
func (s *Store) AddMember(ctx context.Context, orgID, email, role string) (Member, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return Member{}, fmt.Errorf("beginning transaction: %w", err)
	}
	defer tx.Rollback(ctx)
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM orgs WHERE id = $1)`, orgID).Scan(&exists); err != nil {
		return Member{}, fmt.Errorf("looking up org: %w", err)
	}
	if !exists {
		return Member{}, apperr.Errorf(apperr.ENOTFOUND, "unknown org %s", orgID)
	}
	m := Member{OrgID: orgID, Role: role}
	err = tx.QueryRow(ctx, `SELECT id::text, email FROM users WHERE lower(email) = lower($1)`, email).Scan(&m.UserID, &m.Email)
	if errors.Is(err, pgx.ErrNoRows) {
		return Member{}, apperr.Errorf(apperr.ENOTFOUND, "no user with email %s", email)
	}
	if err != nil {
		return Member{}, fmt.Errorf("looking up user: %w", err)
	}
	err = tx.QueryRow(ctx, `INSERT INTO memberships (org_id, user_id, role) VALUES ($1, $2, $3)
ON CONFLICT (org_id, user_id) DO UPDATE SET role = EXCLUDED.role
RETURNING org_id::text`, orgID, m.UserID, role).Scan(&m.OrgID)
	if err != nil {
		return Member{}, fmt.Errorf("adding member: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return Member{}, fmt.Errorf("adding member: %w", err)
	}
	return m, nil
}
