package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/keygate/keygate/internal/pgfailover"
	"github.com/keygate/keygate/upstream/apperr"
	"github.com/keygate/keygate/upstream/password"
)

// The operator's writes behind the commands of package cli (docs/configuration.md).
// Each changes the database in one statement or transaction, with its audit
// (operatoraudit.go). Each returns what it wrote, and the command prints that as JSON. The command has checked their input. A
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

// PutPlan creates the plan p.Name or replaces its limits, audited in the operators'
// audit as plan.created or plan.updated with the plan before and after. A plan left
// without API access commits Synced (planCommit).
func (s *Store) PutPlan(ctx context.Context, p Plan) (Plan, error) {
	tx, err := pgfailover.Begin(ctx, s.pool, planCommit(p.APIRateLimit))
	if err != nil {
		return Plan{}, fmt.Errorf("beginning transaction: %w", err)
	}
	defer tx.Rollback(ctx)
	old, err := scanPlan(tx.QueryRow(ctx, `SELECT `+planColumns+` FROM plans WHERE name = $1 FOR UPDATE`, p.Name))
	var before any = old
	action := ActionPlanUpdated
	if errors.Is(err, pgx.ErrNoRows) {
		before, action, err = nil, ActionPlanCreated, nil
	}
	if err != nil {
		return Plan{}, fmt.Errorf("reading plan: %w", err)
	}
	_, err = tx.Exec(ctx, `INSERT INTO plans (name, api_rate_limit, max_monitors, min_interval_seconds, locations, check_types,
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
	if err := auditOperator(ctx, tx, action, p.Name, before, p); err != nil {
		return Plan{}, err
	}
	if err := tx.Commit(ctx); err != nil {
		return Plan{}, fmt.Errorf("writing plan: %w", err)
	}
	return p, nil
}

// planCommit is how a write that leaves a plan, or an organisation's plan, with
// apiRateLimit commits: Synced without API access, which takes every key of the
// plan's organisations off the API, and Local otherwise.
func planCommit(apiRateLimit int) pgfailover.Commit {
	if apiRateLimit == 0 {
		return pgfailover.Synced
	}
	return pgfailover.Local
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
// both hold. It is audited in the operators' audit as plan.updated, with the plan
// before and after. An unknown plan is apperr.ENOTFOUND. It commits as PutPlan does.
func (s *Store) UpdatePlan(ctx context.Context, name string, change func(*Plan) error) (Plan, error) {
	tx, err := pgfailover.Begin(ctx, s.pool, pgfailover.Local)
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
	before := p
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
	if err := auditOperator(ctx, tx, ActionPlanUpdated, name, before, p); err != nil {
		return Plan{}, err
	}
	if planCommit(p.APIRateLimit) == pgfailover.Synced {
		if err := pgfailover.Sync(ctx, tx); err != nil {
			return Plan{}, fmt.Errorf("writing plan: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return Plan{}, fmt.Errorf("writing plan: %w", err)
	}
	return p, nil
}

// CreateOrg creates an organisation on an existing plan.
func (s *Store) CreateOrg(ctx context.Context, name, planName string) (Org, error) {
	o := Org{Name: name, Plan: planName}
	err := pgfailover.QueryRow(ctx, s.pool, pgfailover.Local, `INSERT INTO orgs (name, plan) SELECT $1, name FROM plans WHERE name = $2 RETURNING id::text`,
		name, planName).Scan(&o.ID)
	if errors.Is(err, pgx.ErrNoRows) {
		return Org{}, apperr.Errorf(apperr.ENOTFOUND, "unknown plan %q", planName)
	}
	if err != nil {
		return Org{}, fmt.Errorf("creating org: %w", err)
	}
	return o, nil
}

// SetOrgPlan moves the organisation orgID, a UUID, to another existing plan. A move to
// another plan is audited in the organisation's audit trail as org.plan_changed by
// ActorOperator, with the plans before and after; a move to the plan it is on changes
// nothing and audits nothing. A move to a plan without API access commits Synced
// (planCommit), even to the plan it is on.
func (s *Store) SetOrgPlan(ctx context.Context, orgID, planName string) (Org, error) {
	tx, err := pgfailover.Begin(ctx, s.pool, pgfailover.Local)
	if err != nil {
		return Org{}, fmt.Errorf("beginning transaction: %w", err)
	}
	defer tx.Rollback(ctx)
	var apiRateLimit int
	err = tx.QueryRow(ctx, `SELECT api_rate_limit FROM plans WHERE name = $1`, planName).Scan(&apiRateLimit)
	if errors.Is(err, pgx.ErrNoRows) {
		return Org{}, apperr.Errorf(apperr.ENOTFOUND, "unknown plan %q", planName)
	}
	if err != nil {
		return Org{}, fmt.Errorf("looking up plan: %w", err)
	}
	o := Org{Plan: planName}
	var from string
	err = tx.QueryRow(ctx, `SELECT id::text, name, plan FROM orgs WHERE id = $1 FOR UPDATE`, orgID).Scan(&o.ID, &o.Name, &from)
	if errors.Is(err, pgx.ErrNoRows) {
		return Org{}, apperr.Errorf(apperr.ENOTFOUND, "unknown org %s", orgID)
	}
	if err != nil {
		return Org{}, fmt.Errorf("setting plan: %w", err)
	}
	commit := planCommit(apiRateLimit)
	if from == planName && commit == pgfailover.Local {
		return o, nil
	}
	if commit == pgfailover.Synced {
		if err := pgfailover.Sync(ctx, tx); err != nil {
			return Org{}, fmt.Errorf("setting plan: %w", err)
		}
	}
	if from != planName {
		_, err = tx.Exec(ctx, `WITH o AS (UPDATE orgs SET plan = $2 WHERE id = $1)
INSERT INTO audit_events (org_id, action, actor, changes)
VALUES ($1, $3, $4, jsonb_build_object('plan', jsonb_build_object('from', $5::text, 'to', $2::text)))`,
			orgID, planName, ActionOrgPlanChanged, ActorOperator, from)
		if err != nil {
			return Org{}, fmt.Errorf("setting plan: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return Org{}, fmt.Errorf("setting plan: %w", err)
	}
	return o, nil
}

// OrgExists returns apperr.ENOTFOUND when there is no organisation orgID, a UUID.
func (s *Store) OrgExists(ctx context.Context, orgID string) error {
	var exists bool
	if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM orgs WHERE id = $1)`, orgID).Scan(&exists); err != nil {
		return fmt.Errorf("looking up org: %w", err)
	}
	if !exists {
		return apperr.Errorf(apperr.ENOTFOUND, "unknown org %s", orgID)
	}
	return nil
}

// OrgListing is an organisation as `org list` prints it.
type OrgListing struct {
	Org
	CreatedAt time.Time `json:"created_at"`
}

// Orgs returns every organisation, oldest first.
func (s *Store) Orgs(ctx context.Context) ([]OrgListing, error) {
	rows, err := s.pool.Query(ctx, `SELECT id::text, name, plan, created_at FROM orgs ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("listing orgs: %w", err)
	}
	orgs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (OrgListing, error) {
		var o OrgListing
		err := row.Scan(&o.ID, &o.Name, &o.Plan, &o.CreatedAt)
		o.CreatedAt = o.CreatedAt.UTC()
		return o, err
	})
	if err != nil {
		return nil, fmt.Errorf("listing orgs: %w", err)
	}
	return orgs, nil
}

// CreateUser creates a user with hasher's hash of pw. Emails are unique, whatever their
// case.
func (s *Store) CreateUser(ctx context.Context, hasher *password.Hasher, email, pw string) (User, error) {
	encoded, err := hasher.Hash(ctx, pw)
	if err != nil {
		return User{}, fmt.Errorf("hashing password: %w", err)
	}
	u := User{Email: email}
	err = pgfailover.QueryRow(ctx, s.pool, pgfailover.Local, `INSERT INTO users (email, password_hash) VALUES ($1, $2) RETURNING id::text`,
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
	tx, err := pgfailover.Begin(ctx, s.pool, pgfailover.Local)
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
