package upstream

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"unicode"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The operator's operations behind the CLI (CONTRACT §7). Each checks its input,
// changes the database in one statement or transaction, and returns what it wrote, which
// the CLI prints as JSON. Bad input is EINVALID, a missing referent ENOTFOUND, a
// duplicate ECONFLICT.

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

var planNameRE = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,62}$`)

// check reports the first thing wrong with p, naming its flag.
func (p planRecord) check() error {
	switch {
	case !planNameRE.MatchString(p.Name):
		return invalid("--name", "must match [a-z][a-z0-9_-]{0,62}")
	case p.APIRateLimit < -1:
		return invalid("--api-rate-limit", "must be -1 (unlimited), 0 (no API access) or a positive number of requests a minute")
	case p.MaxMonitors < -1:
		return invalid("--max-monitors", "must be -1 (no cap) or a number of monitors")
	case p.MinIntervalSeconds < minInterval || p.MinIntervalSeconds > maxInterval:
		return invalid("--min-interval", "must be from %d to %d seconds", minInterval, maxInterval)
	}
	if err := checkList("--locations", p.Locations, monitorLocations); err != nil {
		return err
	}
	return checkList("--check-types", p.CheckTypes, monitorTypes)
}

// checkList checks that list is non-empty, without repeats, and drawn from known.
func checkList(flag string, list, known []string) error {
	if len(list) == 0 {
		return invalid(flag, "must list at least one of %s", strings.Join(known, ","))
	}
	for i, v := range list {
		if !slices.Contains(known, v) {
			return invalid(flag, "unknown value %q; known: %s", v, strings.Join(known, ","))
		}
		if slices.Contains(list[:i], v) {
			return invalid(flag, "lists %q more than once", v)
		}
	}
	return nil
}

// putPlan creates the plan p.Name or replaces its limits.
func putPlan(ctx context.Context, pool *pgxpool.Pool, p planRecord) (planRecord, error) {
	if err := p.check(); err != nil {
		return planRecord{}, err
	}
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

// checkOrgName checks an organisation's name: 1 to 200 characters, no control ones.
func checkOrgName(name string) error {
	if n := len([]rune(name)); n < 1 || n > 200 || strings.IndexFunc(name, unicode.IsControl) >= 0 {
		return invalid("--name", "must be 1 to 200 characters, none of them control characters")
	}
	return nil
}

// createOrg creates an organisation on an existing plan.
func createOrg(ctx context.Context, pool *pgxpool.Pool, name, planName string) (orgRecord, error) {
	if err := checkOrgName(name); err != nil {
		return orgRecord{}, err
	}
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

// setOrgPlan moves an organisation to another existing plan.
func setOrgPlan(ctx context.Context, pool *pgxpool.Pool, orgID, planName string) (orgRecord, error) {
	if !validUUID(orgID) {
		return orgRecord{}, invalid("--org", "must be an org id (a UUID)")
	}
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

// checkEmail checks the shape of an email address: 3 to 254 characters, no white space
// or control characters, an @ with something on both sides. Whether it receives mail is
// not this program's business.
func checkEmail(email string) error {
	at := strings.LastIndexByte(email, '@')
	if len(email) < 3 || len(email) > 254 || at < 1 || at == len(email)-1 ||
		strings.IndexFunc(email, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0 {
		return invalid("--email", "must be an email address")
	}
	return nil
}

// createUser creates a user with an argon2id hash of password, which must pass
// checkNewPassword. Emails are unique whatever their case.
func createUser(ctx context.Context, pool *pgxpool.Pool, hasher *passwordHasher, email, password string) (userRecord, error) {
	if err := checkEmail(email); err != nil {
		return userRecord{}, err
	}
	if err := checkNewPassword(password); err != nil {
		return userRecord{}, err
	}
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

// checkMember checks the input of addMember.
func checkMember(orgID, email, role string) error {
	switch {
	case !validUUID(orgID):
		return invalid("--org", "must be an org id (a UUID)")
	case !validMemberRole(role):
		return invalid("--role", "must be one of Owner, Admin, Editor, Viewer")
	}
	return checkEmail(email)
}

// addMember makes the user with email a member of orgID with role; a user who is
// already a member gets the new role.
func addMember(ctx context.Context, pool *pgxpool.Pool, orgID, email, role string) (memberRecord, error) {
	if err := checkMember(orgID, email, role); err != nil {
		return memberRecord{}, err
	}
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
