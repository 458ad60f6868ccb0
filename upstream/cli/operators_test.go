package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/schema/schematest"
)

// wantRun runs the command line and checks its exit code, stdout (when want is not
// empty) and stderr.
func wantRun(t *testing.T, env map[string]string, code int, stdout, stderr string, args ...string) string {
	t.Helper()
	gotCode, out, errOut := run(t, env, "", args...)
	if gotCode != code {
		t.Errorf("upstream %s: exit %d, want %d (stderr %q)", strings.Join(args, " "), gotCode, code, errOut)
	}
	if stdout != "" && out != stdout+"\n" {
		t.Errorf("upstream %s: stdout %q\nwant   %q", strings.Join(args, " "), out, stdout+"\n")
	}
	if want := map[bool]string{true: "", false: stderr + "\n"}[stderr == ""]; errOut != want {
		t.Errorf("upstream %s: stderr %q\nwant   %q", strings.Join(args, " "), errOut, want)
	}
	return out
}

// TestScopeCommandsKeepTheVocabulary: scope put adds a scope or changes its
// description, scope list prints the vocabulary in order, and scope delete removes a
// scope no live key holds, refusing one a live key holds until the key is revoked.
func TestScopeCommandsKeepTheVocabulary(t *testing.T) {
	pool, dbURL := schematest.NewPool(t)
	env := map[string]string{"DATABASE_URL": dbURL}
	const seeded = `{"name":"monitors:read","description":"List and read monitors"},{"name":"monitors:write","description":"Create and change monitors"},{"name":"monitors:delete","description":"Delete monitors"}`
	wantRun(t, env, 0, `{"scopes":[`+seeded+`]}`, "", "scope", "list")
	wantRun(t, env, 0, `{"name":"reports:read","description":"","created":true}`, "", "scope", "put", "--name", "reports:read")
	wantRun(t, env, 0, `{"name":"reports:read","description":"Read reports","created":false}`, "", "scope", "put", "--name", "reports:read", "--description", "Read reports")
	wantRun(t, env, 0, `{"scopes":[`+seeded+`,{"name":"reports:read","description":"Read reports"}]}`, "", "scope", "list")
	wantRun(t, env, 2, "", "upstream scope put: --name: must match [a-z][a-z0-9_.:-]*, at most 64 characters", "scope", "put", "--name", "Reports")
	wantRun(t, env, 2, "", "upstream scope put: usage: --name is required (see --help)", "scope", "put")
	wantRun(t, env, 2, "", "upstream scope put: --description: must be at most 200 characters",
		"scope", "put", "--name", "x", "--description", strings.Repeat("d", 201))
	wantRun(t, env, 1, "", `upstream scope delete: unknown scope "reports:write"`, "scope", "delete", "--name", "reports:write")

	ctx := context.Background()
	format, _ := keystore.NewFormat(keystore.DefaultPrefix)
	keys := keystore.New(pool, format)
	var org string
	if err := pool.QueryRow(ctx, `INSERT INTO orgs (name, plan) VALUES ('Acme', 'pro') RETURNING id::text`).Scan(&org); err != nil {
		t.Fatal(err)
	}
	rec, _, err := keys.Create(ctx, keystore.NewKey{OrgID: org, Name: "r", Role: keystore.RoleViewer, Scopes: []string{"reports:read"}})
	if err != nil {
		t.Fatalf("a key with the scope the command added: %v", err)
	}
	wantRun(t, env, 1, "", "upstream scope delete: a live key holds scope reports:read: revoke them, or take the scope from them (the key PATCH), first",
		"scope", "delete", "--name", "reports:read")
	wantRun(t, env, 0, `{"org_id":"`+org+`","id":"`+rec.ID+`","revoked":true}`, "", "key", "revoke", "--org", org, "--id", rec.ID)
	wantRun(t, env, 0, `{"name":"reports:read","description":"Read reports"}`, "", "scope", "delete", "--name", "reports:read")
	wantRun(t, env, 0, `{"scopes":[`+seeded+`]}`, "", "scope", "list")
	_, _, err = keys.Create(ctx, keystore.NewKey{OrgID: org, Name: "r", Role: keystore.RoleViewer, Scopes: []string{"reports:read"}})
	if se, ok := err.(*keystore.SettingError); !ok || se.Reason != `"reports:read" is not a scope: use monitors:read, monitors:write or monitors:delete` {
		t.Errorf("a key with a deleted scope: %v", err)
	}
}

// TestOperatorsKeyCommandsAreInTheOrgsAuditTrail: org list and key list print what
// there is; key revoke revokes like the dashboard, once, and the organisation's audit
// trail names the operator as the actor of the revocation and of org set-plan.
func TestOperatorsKeyCommandsAreInTheOrgsAuditTrail(t *testing.T) {
	pool, dbURL := schematest.NewPool(t)
	env := map[string]string{"DATABASE_URL": dbURL}
	wantRun(t, env, 0, `{"orgs":[]}`, "", "org", "list")
	org := idOf(t, wantRun(t, env, 0, "", "", "org", "create", "--name", "Acme", "--plan", "pro"))
	out := wantRun(t, env, 0, "", "", "org", "list")
	var orgs struct {
		Orgs []struct{ ID, Name, Plan, CreatedAt string }
	}
	if err := json.Unmarshal([]byte(out), &orgs); err != nil || len(orgs.Orgs) != 1 || orgs.Orgs[0].ID != org || orgs.Orgs[0].Plan != "pro" {
		t.Errorf("org list printed %q", out)
	}
	wantRun(t, env, 0, `{"keys":[]}`, "", "key", "list", "--org", org)

	ctx := context.Background()
	format, _ := keystore.NewFormat(keystore.DefaultPrefix)
	rec, _, err := keystore.New(pool, format).Create(ctx, keystore.NewKey{OrgID: org, Name: "ci", Role: keystore.RoleEditor,
		Scopes: []string{"monitors:write", "monitors:read"}})
	if err != nil {
		t.Fatal(err)
	}
	keyJSON := fmt.Sprintf(`{"id":"%s","name":"ci","role":"Editor","created_at":"%s","expires_at":null,"revoked_at":%%s,"last_used_at":null,"rate_limit":null,"allowed_cidrs":[],"scopes":["monitors:read","monitors:write"]}`,
		rec.ID, rec.CreatedAt.UTC().Format("2006-01-02T15:04:05.999999999Z07:00"))
	wantRun(t, env, 0, `{"keys":[`+fmt.Sprintf(keyJSON, "null")+`]}`, "", "key", "list", "--org", org)

	for range 2 { // again: nothing more
		wantRun(t, env, 0, `{"org_id":"`+org+`","id":"`+rec.ID+`","revoked":true}`, "", "key", "revoke", "--org", org, "--id", rec.ID)
	}
	var revokedAt string
	if err := pool.QueryRow(ctx, `SELECT to_json(revoked_at AT TIME ZONE 'UTC')#>>'{}' FROM api_keys WHERE key_id = $1`, rec.ID).Scan(&revokedAt); err != nil {
		t.Fatal(err)
	}
	if out := wantRun(t, env, 0, "", "", "key", "list", "--org", org); !strings.Contains(out, `"revoked_at":"`) || strings.Contains(out, `"revoked_at":null`) {
		t.Errorf("key list after the revocation printed %q", out)
	}
	wantRun(t, env, 0, "", "", "org", "set-plan", "--org", org, "--plan", "enterprise")
	wantRun(t, env, 0, "", "", "org", "set-plan", "--org", org, "--plan", "enterprise") // no change: not audited

	events, err := keystore.New(pool, format).Events(ctx, org, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range events {
		s := e.Action + " by " + e.Actor
		if e.KeyID != "" {
			s += " of " + e.KeyID
		}
		if e.Changes != nil && e.Changes.Plan != nil {
			s += " from " + e.Changes.Plan.From + " to " + e.Changes.Plan.To
		}
		got = append(got, s)
	}
	if want := []string{"org.plan_changed by operator from pro to enterprise", "key.revoked by operator of " + rec.ID}; strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("the org's audit trail: %q, want %q", got, want)
	}

	for _, tc := range []struct {
		args   []string
		code   int
		stderr string
	}{
		{[]string{"key", "revoke", "--org", org, "--id", "NoSuchKeyNoSuchKey0001"}, 1, "upstream key revoke: organisation " + org + " has no key NoSuchKeyNoSuchKey0001"},
		{[]string{"key", "revoke", "--org", "00000000-0000-0000-0000-000000000000", "--id", rec.ID}, 1,
			"upstream key revoke: organisation 00000000-0000-0000-0000-000000000000 has no key " + rec.ID},
		{[]string{"key", "revoke", "--org", org, "--id", "mon_live_x"}, 2, "upstream key revoke: --id: must be a key id: 16 to 64 letters and digits"},
		{[]string{"key", "revoke", "--org", "acme", "--id", rec.ID}, 2, "upstream key revoke: --org: must be an org id (a UUID)"},
		{[]string{"key", "revoke", "--org", org}, 2, "upstream key revoke: usage: --id is required (see --help)"},
		{[]string{"key", "list", "--org", "00000000-0000-0000-0000-000000000000"}, 1, "upstream key list: unknown org 00000000-0000-0000-0000-000000000000"},
		{[]string{"key", "list"}, 2, "upstream key list: usage: --org is required (see --help)"},
	} {
		wantRun(t, env, tc.code, "", tc.stderr, tc.args...)
	}
}

// TestAuditListShowsPlanAndScopeChanges: plan put, plan set, scope put and scope
// delete each write one event of the operators' audit, with the plan or scope before
// and after; audit list prints them newest first, a page at a time.
func TestAuditListShowsPlanAndScopeChanges(t *testing.T) {
	_, dbURL := schematest.NewPool(t)
	env := map[string]string{"DATABASE_URL": dbURL}
	wantRun(t, env, 0, `{"events":[]}`, "", "audit", "list")
	const windows = `"api_rate_limit_per_second":-1,"api_rate_limit_per_hour":-1,"api_rate_limit_per_day":-1`
	const team = `{"name":"team","api_rate_limit":100,"max_monitors":10,"min_interval_seconds":60,"locations":["us-east"],"check_types":["http"],"org_rate_limit":-1,"api_requests_per_month":-1,` + windows + `}`
	wantRun(t, env, 0, team, "", "plan", "put", "--name", "team", "--api-rate-limit", "100", "--max-monitors", "10",
		"--min-interval", "60", "--locations", "us-east", "--check-types", "http")
	team2 := strings.Replace(team, `"max_monitors":10`, `"max_monitors":20`, 1)
	wantRun(t, env, 0, team2, "", "plan", "set", "--name", "team", "--max-monitors", "20")
	wantRun(t, env, 0, "", "", "plan", "put", "--name", "pro", "--api-rate-limit", "900", "--max-monitors", "100",
		"--min-interval", "60", "--locations", "us-east", "--check-types", "http")
	wantRun(t, env, 0, "", "", "scope", "put", "--name", "reports:read")
	wantRun(t, env, 0, "", "", "scope", "put", "--name", "reports:read") // no change: not audited
	wantRun(t, env, 0, "", "", "scope", "delete", "--name", "reports:read")
	wantRun(t, env, 1, "", `upstream plan set: unknown plan "gold"`, "plan", "set", "--name", "gold", "--max-monitors", "3") // not audited

	out := wantRun(t, env, 0, "", "", "audit", "list")
	var page struct {
		Events []struct {
			ID      int64
			Action  string
			Subject string
			Actor   string
			Changes struct{ From, To json.RawMessage }
			At      string
		}
	}
	if err := json.Unmarshal([]byte(out), &page); err != nil {
		t.Fatalf("audit list printed %q: %v", out, err)
	}
	var got []string
	for _, e := range page.Events {
		got = append(got, fmt.Sprintf("%s %s by %s: %s → %s", e.Action, e.Subject, e.Actor, e.Changes.From, e.Changes.To))
	}
	want := []string{
		`scope.deleted reports:read by operator: {"name":"reports:read","description":""} → null`,
		`scope.created reports:read by operator: null → {"name":"reports:read","description":""}`,
		`plan.updated pro by operator: {"name":"pro","api_rate_limit":600,"max_monitors":100,"min_interval_seconds":60,"locations":["us-east","eu-west","ap-southeast"],"check_types":["http","tcp","dns"],"org_rate_limit":-1,"api_requests_per_month":-1,` + windows + `} → ` +
			`{"name":"pro","api_rate_limit":900,"max_monitors":100,"min_interval_seconds":60,"locations":["us-east"],"check_types":["http"],"org_rate_limit":-1,"api_requests_per_month":-1,` + windows + `}`,
		`plan.updated team by operator: ` + team + ` → ` + team2,
		`plan.created team by operator: null → ` + team,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("audit list:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if len(page.Events) == len(want) {
		older := wantRun(t, env, 0, "", "", "audit", "list", "--limit", "2", "--before", fmt.Sprint(page.Events[2].ID))
		if !strings.Contains(older, `"plan.updated"`) || strings.Count(older, `"action"`) != 2 || strings.Contains(older, `"plan.updated","subject":"pro"`) {
			t.Errorf("audit list --limit 2 --before the third: %q", older)
		}
	}
	wantRun(t, env, 2, "", "upstream audit list: --limit: must be from 1 to 1000", "audit", "list", "--limit", "0")
}
