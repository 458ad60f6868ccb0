package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keygate/keygate/internal/testkit/testenv"
	"github.com/keygate/keygate/internal/version"
	"github.com/keygate/keygate/schema/schematest"
	"github.com/keygate/keygate/upstream/internal/upstreamtest"
	"github.com/keygate/keygate/upstream/store"
)

// run runs the command line with args and stdin against the environment env.
func run(t *testing.T, env map[string]string, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut strings.Builder
	code = Main(context.Background(), args, strings.NewReader(stdin), &out, &errOut, func(k string) string { return env[k] })
	return code, out.String(), errOut.String()
}

// startServe runs the command line with args and the environment env until ctx ends.
// It returns its standard error, where serve logs, and the channel of its exit code.
func startServe(ctx context.Context, env map[string]string, args ...string) (stderr io.Reader, done <-chan int) {
	pr, pw := io.Pipe()
	codes := make(chan int, 1)
	go func() {
		code := Main(ctx, args, strings.NewReader(""), io.Discard, pw, func(k string) string { return env[k] })
		pw.Close()
		codes <- code
	}()
	return pr, codes
}

// wantExit waits for the exit code of serve on done, and checks that it is 0. what
// follows the code in the failure's words.
func wantExit(t *testing.T, done <-chan int, what string) {
	t.Helper()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("serve exited %d%s", code, what)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not stop")
	}
}

// idOf returns the "id" of a command's JSON output.
func idOf(t *testing.T, stdout string) string {
	t.Helper()
	var v struct{ ID string }
	if err := json.Unmarshal([]byte(stdout), &v); err != nil || v.ID == "" {
		t.Fatalf("output %q has no id", stdout)
	}
	return v.ID
}

func TestPlanPutStoresTheBudgetsAndResetsThoseLeftOut(t *testing.T) {
	pool, dbURL := schematest.NewPool(t)
	env := map[string]string{"DATABASE_URL": dbURL}
	budgets := func() (org int, month int64) {
		t.Helper()
		if err := pool.QueryRow(context.Background(), `SELECT org_rate_limit, api_requests_per_month FROM plans WHERE name = 'team'`).Scan(&org, &month); err != nil {
			t.Fatal(err)
		}
		return org, month
	}
	put := []string{"plan", "put", "--name", "team", "--api-rate-limit", "100", "--max-monitors", "1", "--min-interval", "60", "--locations", "us-east", "--check-types", "http"}
	if code, _, stderr := run(t, env, "", append(put, "--org-rate-limit", "250", "--api-requests-per-month", "3000000000")...); code != 0 {
		t.Fatalf("plan put: %d %s", code, stderr)
	}
	if org, month := budgets(); org != 250 || month != 3000000000 {
		t.Errorf("stored org_rate_limit %d, api_requests_per_month %d; want 250, 3000000000", org, month)
	}
	// plan put replaces every limit: the budgets left out are none again.
	if code, _, stderr := run(t, env, "", put...); code != 0 {
		t.Fatalf("plan put: %d %s", code, stderr)
	}
	if org, month := budgets(); org != -1 || month != -1 {
		t.Errorf("after a put without them: org_rate_limit %d, api_requests_per_month %d; want -1, -1", org, month)
	}
}

// TestPlanWindowsAreSetShownAndZeroIsRefused: plan put and plan set take a key's
// second, hour and day beside its minute, -1 none and left out by plan put; plan get
// shows them; 0 is refused with the flag that means no API access.
func TestPlanWindowsAreSetShownAndZeroIsRefused(t *testing.T) {
	_, dbURL := schematest.NewPool(t)
	env := map[string]string{"DATABASE_URL": dbURL}
	put := []string{"plan", "put", "--name", "burst", "--api-rate-limit", "1000", "--max-monitors", "10", "--min-interval", "60",
		"--locations", "us-east", "--check-types", "http"}
	const plan = `{"name":"burst","api_rate_limit":1000,"max_monitors":10,"min_interval_seconds":60,"locations":["us-east"],"check_types":["http"],` +
		`"org_rate_limit":-1,"api_requests_per_month":-1,`
	zero := func(flag, unit string) string {
		return "upstream plan " + map[bool]string{true: "put", false: "set"}[flag == "--api-rate-limit-per-day"] + ": " + flag +
			": must be -1 (none) or a positive number of requests " + unit + "; 0 is not a limit: a plan without API access is --api-rate-limit 0"
	}
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{"plan put with a second and a day", append(put, "--api-rate-limit-per-second", "20", "--api-rate-limit-per-day", "100000"), 0,
			plan + `"api_rate_limit_per_second":20,"api_rate_limit_per_hour":-1,"api_rate_limit_per_day":100000}`, ""},
		{"plan set of an hour keeps the others", []string{"plan", "set", "--name", "burst", "--api-rate-limit-per-hour", "5000"}, 0,
			plan + `"api_rate_limit_per_second":20,"api_rate_limit_per_hour":5000,"api_rate_limit_per_day":100000}`, ""},
		{"plan set of a zero second", []string{"plan", "set", "--name", "burst", "--api-rate-limit-per-second", "0"}, 2, "",
			zero("--api-rate-limit-per-second", "a second")},
		{"plan set of a zero hour", []string{"plan", "set", "--name", "burst", "--api-rate-limit-per-hour", "0"}, 2, "",
			zero("--api-rate-limit-per-hour", "an hour")},
		{"plan put of a zero day", append(put, "--api-rate-limit-per-day", "0"), 2, "", zero("--api-rate-limit-per-day", "a day")},
		{"plan set of a second below -1", []string{"plan", "set", "--name", "burst", "--api-rate-limit-per-second", "-2"}, 2, "",
			"upstream plan set: --api-rate-limit-per-second: must be -1 (none) or a number of requests a second from 1 to 2147483647"},
		{"plan get after the refusals", []string{"plan", "get", "--name", "burst"}, 0,
			plan + `"api_rate_limit_per_second":20,"api_rate_limit_per_hour":5000,"api_rate_limit_per_day":100000}`, ""},
		{"plan set back to none", []string{"plan", "set", "--name", "burst", "--api-rate-limit-per-second", "-1"}, 0,
			plan + `"api_rate_limit_per_second":-1,"api_rate_limit_per_hour":5000,"api_rate_limit_per_day":100000}`, ""},
		{"plan put leaves out what it is not given", put, 0,
			plan + `"api_rate_limit_per_second":-1,"api_rate_limit_per_hour":-1,"api_rate_limit_per_day":-1}`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := run(t, env, "", tc.args...)
			want := map[bool]string{true: tc.stdout + "\n", false: ""}[tc.stdout != ""]
			if code != tc.code || stdout != want || stderr != map[bool]string{true: tc.stderr + "\n", false: ""}[tc.stderr != ""] {
				t.Errorf("exit %d, stdout %q, stderr %q; want %d, %q, %q", code, stdout, stderr, tc.code, tc.stdout, tc.stderr)
			}
		})
	}
}

// TestPlanListGetAndSet reads the seeded plans back, and changes one limit of a plan
// with plan set while the others keep what plan put gave them.
func TestPlanListGetAndSet(t *testing.T) {
	_, dbURL := schematest.NewPool(t)
	env := map[string]string{"DATABASE_URL": dbURL}
	const (
		free       = `{"name":"free","api_rate_limit":0,"max_monitors":5,"min_interval_seconds":300,"locations":["us-east"],"check_types":["http"],"org_rate_limit":-1,"api_requests_per_month":-1,"api_rate_limit_per_second":-1,"api_rate_limit_per_hour":-1,"api_rate_limit_per_day":-1}`
		enterprise = `{"name":"enterprise","api_rate_limit":-1,"max_monitors":-1,"min_interval_seconds":10,"locations":["us-east","us-west","eu-west","eu-central","ap-southeast"],"check_types":["http","tcp","dns","icmp"],"org_rate_limit":-1,"api_requests_per_month":-1,"api_rate_limit_per_second":-1,"api_rate_limit_per_hour":-1,"api_rate_limit_per_day":-1}`
		pro        = `{"name":"pro","api_rate_limit":600,"max_monitors":100,"min_interval_seconds":60,"locations":["us-east","eu-west","ap-southeast"],"check_types":["http","tcp","dns"],"org_rate_limit":-1,"api_requests_per_month":-1,"api_rate_limit_per_second":-1,"api_rate_limit_per_hour":-1,"api_rate_limit_per_day":-1}`
		team       = `{"name":"team","api_rate_limit":100,"max_monitors":10,"min_interval_seconds":60,"locations":["us-east"],"check_types":["http"],"org_rate_limit":250,"api_requests_per_month":1000000,"api_rate_limit_per_second":-1,"api_rate_limit_per_hour":-1,"api_rate_limit_per_day":-1}`
	)
	put := []string{"plan", "put", "--name", "team", "--api-rate-limit", "100", "--max-monitors", "10", "--min-interval", "60",
		"--locations", "us-east", "--check-types", "http", "--org-rate-limit", "250", "--api-requests-per-month", "1000000"}
	if code, stdout, stderr := run(t, env, "", put...); code != 0 || stdout != team+"\n" {
		t.Fatalf("plan put: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}

	// Each step runs on what the steps before it left.
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{"plan list", []string{"plan", "list"}, 0, `{"plans":[` + enterprise + "," + free + "," + pro + "," + team + `]}`, ""},
		{"plan get", []string{"plan", "get", "--name", "pro"}, 0, pro, ""},
		{"plan get of an unknown plan", []string{"plan", "get", "--name", "gold"}, 1, "", `upstream plan get: unknown plan "gold"`},
		{"plan get without a name", []string{"plan", "get"}, 2, "", "upstream plan get: usage: --name is required (see --help)"},
		{"plan list with an argument", []string{"plan", "list", "pro"}, 2, "", `upstream plan list: usage: unexpected argument "pro" (see --help)`},
		{"plan set of one limit keeps the others", []string{"plan", "set", "--name", "team", "--org-rate-limit", "500"}, 0,
			strings.Replace(team, `"org_rate_limit":250`, `"org_rate_limit":500`, 1), ""},
		{"plan set of two limits and a list", []string{"plan", "set", "--name", "team", "--max-monitors", "-1", "--check-types", "http,dns"}, 0,
			`{"name":"team","api_rate_limit":100,"max_monitors":-1,"min_interval_seconds":60,"locations":["us-east"],"check_types":["http","dns"],"org_rate_limit":500,"api_requests_per_month":1000000,"api_rate_limit_per_second":-1,"api_rate_limit_per_hour":-1,"api_rate_limit_per_day":-1}`, ""},
		{"plan set back to none", []string{"plan", "set", "--name", "team", "--api-requests-per-month", "-1"}, 0,
			`{"name":"team","api_rate_limit":100,"max_monitors":-1,"min_interval_seconds":60,"locations":["us-east"],"check_types":["http","dns"],"org_rate_limit":500,"api_requests_per_month":-1,"api_rate_limit_per_second":-1,"api_rate_limit_per_hour":-1,"api_rate_limit_per_day":-1}`, ""},
		{"plan get after the sets", []string{"plan", "get", "--name", "team"}, 0,
			`{"name":"team","api_rate_limit":100,"max_monitors":-1,"min_interval_seconds":60,"locations":["us-east"],"check_types":["http","dns"],"org_rate_limit":500,"api_requests_per_month":-1,"api_rate_limit_per_second":-1,"api_rate_limit_per_hour":-1,"api_rate_limit_per_day":-1}`, ""},
		{"plan set without a limit", []string{"plan", "set", "--name", "team"}, 2, "", "upstream plan set: usage: give at least one limit to change (see --help)"},
		{"plan set of an unknown plan", []string{"plan", "set", "--name", "gold", "--max-monitors", "3"}, 1, "", `upstream plan set: unknown plan "gold"`},
		{"plan set of a bad limit", []string{"plan", "set", "--name", "team", "--org-rate-limit", "0"}, 2, "",
			"upstream plan set: --org-rate-limit: must be -1 (none) or a number of requests a minute from 1 to 2147483647"},
		{"plan set of an empty list", []string{"plan", "set", "--name", "team", "--locations", ""}, 2, "",
			"upstream plan set: --locations: must list at least one of us-east,us-west,eu-west,eu-central,ap-southeast"},
		{"plan set of a bad name", []string{"plan", "set", "--name", "Team", "--max-monitors", "3"}, 2, "",
			"upstream plan set: --name: must match [a-z][a-z0-9_-]{0,62}"},
		{"plan get after the refusals", []string{"plan", "get", "--name", "team"}, 0,
			`{"name":"team","api_rate_limit":100,"max_monitors":-1,"min_interval_seconds":60,"locations":["us-east"],"check_types":["http","dns"],"org_rate_limit":500,"api_requests_per_month":-1,"api_rate_limit_per_second":-1,"api_rate_limit_per_hour":-1,"api_rate_limit_per_day":-1}`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := run(t, env, "", tc.args...)
			if code != tc.code {
				t.Errorf("exit code %d, want %d (stderr %q)", code, tc.code, stderr)
			}
			want := ""
			if tc.stdout != "" {
				want = tc.stdout + "\n"
			}
			if stdout != want {
				t.Errorf("stdout %q\nwant   %q", stdout, want)
			}
			want = ""
			if tc.stderr != "" {
				want = tc.stderr + "\n"
			}
			if stderr != want {
				t.Errorf("stderr %q\nwant   %q", stderr, want)
			}
		})
	}
}

func TestOperatorCommands(t *testing.T) {
	_, dbURL := schematest.NewPool(t)
	env := map[string]string{"DATABASE_URL": dbURL}

	code, out, _ := run(t, env, "", "org", "create", "--name", "Acme", "--plan", "pro")
	if code != 0 {
		t.Fatalf("org create: %d", code)
	}
	org := idOf(t, out)
	if out != `{"id":"`+org+`","name":"Acme","plan":"pro"}`+"\n" {
		t.Errorf("org create printed %q", out)
	}
	code, out, _ = run(t, env, "s3cret pass\r\nsecond line\n", "user", "create", "--email", "Ada@Example.com", "--password-stdin")
	if code != 0 {
		t.Fatalf("user create: %d", code)
	}
	user := idOf(t, out)
	if out != `{"id":"`+user+`","email":"Ada@Example.com"}`+"\n" {
		t.Errorf("user create printed %q", out)
	}

	for _, tc := range []struct {
		name   string
		args   []string
		stdin  string
		code   int
		stdout string
		stderr string
	}{
		{"plan put creates", []string{"plan", "put", "--name", "team", "--api-rate-limit", "120", "--max-monitors", "20", "--min-interval", "30", "--locations", "us-east,eu-central", "--check-types", "http,icmp"}, "", 0,
			`{"name":"team","api_rate_limit":120,"max_monitors":20,"min_interval_seconds":30,"locations":["us-east","eu-central"],"check_types":["http","icmp"],"org_rate_limit":-1,"api_requests_per_month":-1,"api_rate_limit_per_second":-1,"api_rate_limit_per_hour":-1,"api_rate_limit_per_day":-1}`, ""},
		{"plan put with budgets", []string{"plan", "put", "--name", "team", "--api-rate-limit", "120", "--max-monitors", "20", "--min-interval", "30", "--locations", "us-east", "--check-types", "http", "--org-rate-limit", "300", "--api-requests-per-month", "5000000000"}, "", 0,
			`{"name":"team","api_rate_limit":120,"max_monitors":20,"min_interval_seconds":30,"locations":["us-east"],"check_types":["http"],"org_rate_limit":300,"api_requests_per_month":5000000000,"api_rate_limit_per_second":-1,"api_rate_limit_per_hour":-1,"api_rate_limit_per_day":-1}`, ""},
		{"plan put replaces", []string{"plan", "put", "--name", "team", "--api-rate-limit", "-1", "--max-monitors", "-1", "--min-interval", "10", "--locations", "us-west", "--check-types", "dns"}, "", 0,
			`{"name":"team","api_rate_limit":-1,"max_monitors":-1,"min_interval_seconds":10,"locations":["us-west"],"check_types":["dns"],"org_rate_limit":-1,"api_requests_per_month":-1,"api_rate_limit_per_second":-1,"api_rate_limit_per_hour":-1,"api_rate_limit_per_day":-1}`, ""},
		{"plan put with an org rate limit of 0", []string{"plan", "put", "--name", "x", "--api-rate-limit", "1", "--max-monitors", "1", "--min-interval", "10", "--locations", "us-east", "--check-types", "http", "--org-rate-limit", "0"}, "", 2,
			"", "upstream plan put: --org-rate-limit: must be -1 (none) or a number of requests a minute from 1 to 2147483647"},
		{"plan put with an org rate limit of -2", []string{"plan", "put", "--name", "x", "--api-rate-limit", "1", "--max-monitors", "1", "--min-interval", "10", "--locations", "us-east", "--check-types", "http", "--org-rate-limit", "-2"}, "", 2,
			"", "upstream plan put: --org-rate-limit: must be -1 (none) or a number of requests a minute from 1 to 2147483647"},
		{"plan put with an org rate limit over 32 bits", []string{"plan", "put", "--name", "x", "--api-rate-limit", "1", "--max-monitors", "1", "--min-interval", "10", "--locations", "us-east", "--check-types", "http", "--org-rate-limit", "2147483648"}, "", 2,
			"", "upstream plan put: --org-rate-limit: must be -1 (none) or a number of requests a minute from 1 to 2147483647"},
		{"plan put with a monthly quota of 0", []string{"plan", "put", "--name", "x", "--api-rate-limit", "1", "--max-monitors", "1", "--min-interval", "10", "--locations", "us-east", "--check-types", "http", "--api-requests-per-month", "0"}, "", 2,
			"", "upstream plan put: --api-requests-per-month: must be -1 (none) or a positive number of requests a month"},
		{"plan put with a monthly quota of -5", []string{"plan", "put", "--name", "x", "--api-rate-limit", "1", "--max-monitors", "1", "--min-interval", "10", "--locations", "us-east", "--check-types", "http", "--api-requests-per-month", "-5"}, "", 2,
			"", "upstream plan put: --api-requests-per-month: must be -1 (none) or a positive number of requests a month"},
		{"plan put with a monthly quota that is no number", []string{"plan", "put", "--name", "x", "--api-requests-per-month", "1e6"}, "", 2,
			"", `upstream plan put: usage: invalid value "1e6" for flag -api-requests-per-month: parse error (see --help)`},
		{"plan put with a missing flag", []string{"plan", "put", "--name", "x", "--api-rate-limit", "1", "--max-monitors", "1", "--min-interval", "10", "--locations", "us-east"}, "", 2,
			"", "upstream plan put: usage: --check-types is required (see --help)"},
		{"plan put with an unknown location", []string{"plan", "put", "--name", "x", "--api-rate-limit", "1", "--max-monitors", "1", "--min-interval", "10", "--locations", "mars", "--check-types", "http"}, "", 2,
			"", `upstream plan put: --locations: unknown value "mars"; known: us-east,us-west,eu-west,eu-central,ap-southeast`},
		{"plan put with a bad name", []string{"plan", "put", "--name", "Pro", "--api-rate-limit", "1", "--max-monitors", "1", "--min-interval", "10", "--locations", "us-east", "--check-types", "http"}, "", 2,
			"", "upstream plan put: --name: must match [a-z][a-z0-9_-]{0,62}"},
		{"plan put with a short interval", []string{"plan", "put", "--name", "x", "--api-rate-limit", "1", "--max-monitors", "1", "--min-interval", "5", "--locations", "us-east", "--check-types", "http"}, "", 2,
			"", "upstream plan put: --min-interval: must be from 10 to 86400 seconds"},
		{"plan put with a bad number", []string{"plan", "put", "--name", "x", "--api-rate-limit", "lots"}, "", 2,
			"", `upstream plan put: usage: invalid value "lots" for flag -api-rate-limit: parse error (see --help)`},
		{"org create on an unknown plan", []string{"org", "create", "--name", "Acme", "--plan", "gold"}, "", 1,
			"", `upstream org create: unknown plan "gold"`},
		{"org create without a name", []string{"org", "create", "--plan", "pro"}, "", 2,
			"", "upstream org create: usage: --name is required (see --help)"},
		{"org set-plan", []string{"org", "set-plan", "--org", org, "--plan", "team"}, "", 0,
			`{"id":"` + org + `","name":"Acme","plan":"team"}`, ""},
		{"org set-plan to an unknown plan", []string{"org", "set-plan", "--org", org, "--plan", "gold"}, "", 1,
			"", `upstream org set-plan: unknown plan "gold"`},
		{"org set-plan of an unknown org", []string{"org", "set-plan", "--org", "00000000-0000-0000-0000-000000000000", "--plan", "pro"}, "", 1,
			"", "upstream org set-plan: unknown org 00000000-0000-0000-0000-000000000000"},
		{"org set-plan of a malformed org", []string{"org", "set-plan", "--org", "acme", "--plan", "pro"}, "", 2,
			"", "upstream org set-plan: --org: must be an org id (a UUID)"},
		{"user create with a duplicate email", []string{"user", "create", "--email", "ada@example.COM", "--password-stdin"}, "long enough pw\n", 1,
			"", "upstream user create: a user with email ada@example.COM already exists"},
		{"user create with an empty password", []string{"user", "create", "--email", "bob@example.com", "--password-stdin"}, "\nsecond\n", 2,
			"", "upstream user create: password: the first line of standard input is empty"},
		{"user create with a 9-character password", []string{"user", "create", "--email", "bob@example.com", "--password-stdin"}, "123456789\n", 2,
			"", "upstream user create: password: must be at least 10 characters"},
		{"user create with 9 characters in 18 bytes", []string{"user", "create", "--email", "bob@example.com", "--password-stdin"}, "ééééééééé\n", 2,
			"", "upstream user create: password: must be at least 10 characters"},
		{"user create with 9 characters in 27 bytes", []string{"user", "create", "--email", "bob@example.com", "--password-stdin"}, "日本語日本語日本語\n", 2,
			"", "upstream user create: password: must be at least 10 characters"},
		{"user create with 10 characters", []string{"user", "create", "--email", "ten@example.com", "--password-stdin"}, "1234567890\n", 0,
			"", ""},
		{"user create with 10 characters in 20 bytes", []string{"user", "create", "--email", "wide@example.com", "--password-stdin"}, "éééééééééé\n", 0,
			"", ""},
		{"user create with no input", []string{"user", "create", "--email", "bob@example.com", "--password-stdin"}, "", 2,
			"", "upstream user create: password: the first line of standard input is empty"},
		{"user create without --password-stdin", []string{"user", "create", "--email", "bob@example.com"}, "pw\n", 2,
			"", "upstream user create: usage: --password-stdin is required (see --help)"},
		{"user create with a password argument", []string{"user", "create", "--email", "bob@example.com", "--password", "pw"}, "", 2,
			"", "upstream user create: usage: flag provided but not defined: -password (see --help)"},
		{"user create with a bad email", []string{"user", "create", "--email", "bob", "--password-stdin"}, "pw\n", 2,
			"", "upstream user create: --email: must be an email address"},
		{"member add", []string{"member", "add", "--org", org, "--email", "ada@example.com", "--role", "Admin"}, "", 0,
			`{"org_id":"` + org + `","user_id":"` + user + `","email":"Ada@Example.com","role":"Admin"}`, ""},
		{"member add again changes the role", []string{"member", "add", "--org", org, "--email", "ADA@example.com", "--role", "Owner"}, "", 0,
			`{"org_id":"` + org + `","user_id":"` + user + `","email":"Ada@Example.com","role":"Owner"}`, ""},
		{"member add with a bad role", []string{"member", "add", "--org", org, "--email", "ada@example.com", "--role", "Boss"}, "", 2,
			"", "upstream member add: --role: must be one of Owner, Admin, Editor, Viewer"},
		{"member add of an unknown email", []string{"member", "add", "--org", org, "--email", "eve@example.com", "--role", "Viewer"}, "", 1,
			"", "upstream member add: no user with email eve@example.com"},
		{"member add to an unknown org", []string{"member", "add", "--org", "00000000-0000-0000-0000-000000000000", "--email", "ada@example.com", "--role", "Viewer"}, "", 1,
			"", "upstream member add: unknown org 00000000-0000-0000-0000-000000000000"},
		{"unknown command", []string{"frobnicate"}, "", 2,
			"", `upstream: usage: unknown command "frobnicate" (see upstream --help)`},
		{"unknown subcommand", []string{"org", "delete"}, "", 2,
			"", `upstream org: usage: unknown subcommand "delete"`},
		{"extra argument", []string{"org", "create", "--name", "A", "--plan", "pro", "extra"}, "", 2,
			"", `upstream org create: usage: unexpected argument "extra" (see --help)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := run(t, env, tc.stdin, tc.args...)
			if code != tc.code {
				t.Errorf("exit code %d, want %d (stderr %q)", code, tc.code, stderr)
			}
			if tc.stdout != "" && stdout != tc.stdout+"\n" {
				t.Errorf("stdout %q\nwant   %q", stdout, tc.stdout+"\n")
			}
			if tc.code != 0 && !strings.HasPrefix(stdout, "usage:") && stdout != "" {
				t.Errorf("a failure printed %q on stdout", stdout)
			}
			if stderr != "" && stderr != tc.stderr+"\n" || stderr == "" && tc.stderr != "" {
				t.Errorf("stderr %q\nwant   %q", stderr, tc.stderr+"\n")
			}
		})
	}

	// The password is the first line without its line ending. It logs in, and the
	// stored hash is argon2id.
	e := upstreamtest.NewEnvOn(t, dbURL)
	e.Login("ada@example.com", "s3cret pass")
	r := e.Anon().Do("POST", "/auth/login", `{"email":"ada@example.com","password":"s3cret pass\r"}`)
	upstreamtest.Want(t, r, 401, `{"error":"invalid credentials"}`)
	if hash := upstreamtest.Scalar[string](e, `SELECT password_hash FROM users WHERE id = $1`, user); !strings.HasPrefix(hash, "$argon2id$v=19$") {
		t.Errorf("stored hash %q", hash)
	}
	// Only the creates that succeeded made users: Ada's and the two of 10 characters.
	if n := upstreamtest.Scalar[int](e, `SELECT count(*) FROM users`); n != 3 {
		t.Errorf("%d users created, want 3", n)
	}
}

func TestEveryCommandHasHelp(t *testing.T) {
	for _, args := range [][]string{
		{"--help"}, {"help"}, {"serve", "--help"}, {"migrate", "--help"}, {"plan", "put", "--help"},
		{"version", "--help"}, {"plan", "list", "--help"}, {"plan", "get", "--help"}, {"plan", "set", "--help"},
		{"org", "create", "--help"}, {"org", "set-plan", "-h"}, {"user", "create", "--help"},
		{"member", "add", "--help"}, {"org", "--help"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			code, stdout, stderr := run(t, nil, "", args...)
			if code != 0 || stderr != "" || !strings.HasPrefix(stdout, "usage: upstream") {
				t.Errorf("exit %d, stdout %q, stderr %q; want usage on stdout and exit 0", code, stdout, stderr)
			}
			// The synopsis, the first line, names every flag the command has.
			synopsis, _, _ := strings.Cut(stdout, "\n")
			named := map[string]bool{}
			for _, m := range regexp.MustCompile(`--([a-z][a-z0-9-]*)`).FindAllStringSubmatch(synopsis, -1) {
				named[m[1]] = true
			}
			for _, m := range flagLine.FindAllStringSubmatch(stdout, -1) {
				if !named[m[1]] {
					t.Errorf("the synopsis %q does not name --%s", synopsis, m[1])
				}
			}
		})
	}
	code, stdout, stderr := run(t, nil, "")
	if code != 2 || !strings.HasPrefix(stdout, "usage: upstream") || stderr != "upstream: usage: a command is required\n" {
		t.Errorf("no command: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}

// TestPlanPutAndSetHelpSayWhichLimitsEachRequires reads the two commands' --help:
// plan put requires the limits every plan has and defaults the budgets to -1; plan
// set requires only the name.
func TestPlanPutAndSetHelpSayWhichLimitsEachRequires(t *testing.T) {
	const windowFlags = " [--api-rate-limit-per-second N] [--api-rate-limit-per-hour N] [--api-rate-limit-per-day N]"
	for _, tc := range []struct {
		command, synopsis, required string
	}{
		{"put", "usage: upstream plan put --name P --api-rate-limit N --max-monitors M --min-interval S --locations a,b --check-types x,y [--org-rate-limit N] [--api-requests-per-month N]" + windowFlags,
			"api-rate-limit,check-types,locations,max-monitors,min-interval,name"},
		{"set", "usage: upstream plan set --name P [--api-rate-limit N] [--max-monitors M] [--min-interval S] [--locations a,b] [--check-types x,y] [--org-rate-limit N] [--api-requests-per-month N]" + windowFlags,
			"name"},
	} {
		t.Run(tc.command, func(t *testing.T) {
			code, stdout, stderr := run(t, nil, "", "plan", tc.command, "--help")
			if code != 0 || stderr != "" {
				t.Fatalf("exit %d, stderr %q", code, stderr)
			}
			if synopsis, _, _ := strings.Cut(stdout, "\n"); synopsis != tc.synopsis {
				t.Errorf("synopsis %q, want %q", synopsis, tc.synopsis)
			}
			var required, defaults []string
			for _, m := range regexp.MustCompile(`(?m)^  -([a-z-]+) .*\n\s+(.*)$`).FindAllStringSubmatch(stdout, -1) {
				switch {
				case strings.HasSuffix(m[2], " (required)"):
					required = append(required, m[1])
				case strings.HasSuffix(m[2], " (default -1)"):
					defaults = append(defaults, m[1])
				}
			}
			if got := strings.Join(required, ","); got != tc.required {
				t.Errorf("required flags %s, want %s", got, tc.required)
			}
			if got := strings.Join(defaults, ","); got != "api-rate-limit-per-day,api-rate-limit-per-hour,api-rate-limit-per-second,api-requests-per-month,org-rate-limit" {
				t.Errorf("flags defaulting to -1: %s", got)
			}
		})
	}
}

func TestCommandsNeedTheirEnvironment(t *testing.T) {
	for _, tc := range []struct {
		name   string
		env    map[string]string
		args   []string
		stderr string
	}{
		{"migrate without DATABASE_URL", nil, []string{"migrate"},
			"upstream migrate: usage: DATABASE_URL is not set: set it to the postgres:// URL of the database\n"},
		{"org create without DATABASE_URL", nil, []string{"org", "create", "--name", "A", "--plan", "pro"},
			"upstream org create: usage: DATABASE_URL is not set: set it to the postgres:// URL of the database\n"},
		{"serve without DATABASE_URL", map[string]string{"GATEWAY_SECRET": "x"}, []string{"serve"},
			"upstream serve: usage: DATABASE_URL is not set: set it to the postgres:// URL of the database\n"},
		{"serve without GATEWAY_SECRET or --gateway-jwks", map[string]string{"DATABASE_URL": "postgres://localhost/x"}, []string{"serve"},
			"upstream serve: usage: neither GATEWAY_SECRET nor --gateway-jwks is set: set GATEWAY_SECRET to the gateway_secret of the gateway's configuration, or --gateway-jwks to its JWKS\n"},
		{"serve with an unreadable gateway key file", map[string]string{"DATABASE_URL": "postgres://localhost/x"}, []string{"serve", "--gateway-jwks", "/nonexistent/jwks.pem"},
			"upstream serve: usage: --gateway-jwks: gatewayauth: open /nonexistent/jwks.pem: no such file or directory\n"},
		{"serve with a bad key prefix", map[string]string{"KEY_PREFIX": "Mon"}, []string{"serve"},
			`upstream serve: usage: --key-prefix: key prefix must match [a-z][a-z0-9]{0,15}: "Mon"` + "\n"},
		{"serve with a bad session ttl", nil, []string{"serve", "--session-ttl", "0s"},
			"upstream serve: usage: --session-ttl must be positive\n"},
		{"serve with a bad database timeout", nil, []string{"serve", "--database-timeout", "0s"},
			"upstream serve: usage: --database-timeout must be positive\n"},
		{"serve with a bad purge interval", nil, []string{"serve", "--purge-interval", "-1s"},
			"upstream serve: usage: --purge-interval must be positive\n"},
		{"serve with a bad usage roll-up interval", nil, []string{"serve", "--usage-rollup-interval", "0s"},
			"upstream serve: usage: --usage-rollup-interval must be positive\n"},
		{"serve with a short leak report token", nil, []string{"serve", "--leak-report-token", "0123456789012345678901234567890"},
			"upstream serve: usage: --leak-report-token must be at least 32 characters\n"},
		{"serve with a short LEAK_REPORT_TOKEN", map[string]string{"LEAK_REPORT_TOKEN": "short"}, []string{"serve"},
			"upstream serve: usage: --leak-report-token must be at least 32 characters\n"},
		{"serve with a bad login window", nil, []string{"serve", "--login-window", "0s"},
			"upstream serve: usage: --login-window must be positive\n"},
		{"serve with no login failures allowed", nil, []string{"serve", "--login-failures-per-client", "0"},
			"upstream serve: usage: --login-failures-per-email and --login-failures-per-client must be positive\n"},
		{"serve with a bad trusted proxy", nil, []string{"serve", "--trusted-proxies", "127.0.0.1,caddy"},
			`upstream serve: usage: --trusted-proxies: "caddy" is neither a CIDR prefix nor an IP address` + "\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := run(t, tc.env, "", tc.args...)
			if code != 2 || stderr != tc.stderr {
				t.Errorf("exit %d, stderr %q; want 2, %q", code, stderr, tc.stderr)
			}
		})
	}
	code, _, stderr := run(t, map[string]string{"DATABASE_URL": "postgres://nobody@127.0.0.1:1/none?connect_timeout=2"}, "",
		"org", "create", "--name", "A", "--plan", "pro")
	if code != 1 || !strings.HasPrefix(stderr, "upstream org create: connecting to postgres: ") || strings.Count(stderr, "\n") != 1 {
		t.Errorf("unreachable database: exit %d, stderr %q", code, stderr)
	}
}

func TestMigrateIsIdempotentAndServeRefusesAnUnmigratedDatabase(t *testing.T) {
	dbURL := upstreamtest.EmptyDatabase(t)
	env := map[string]string{"DATABASE_URL": dbURL, "GATEWAY_SECRET": upstreamtest.GatewaySecret}

	code, _, stderr := run(t, env, "", "serve", "--addr", "127.0.0.1:0")
	if code != 1 || stderr != fmt.Sprintf("upstream serve: the database schema is at version 0 and this program needs %d: run `upstream migrate` first (or serve --migrate)\n", store.RequiredSchemaVersion) {
		t.Errorf("serve on an empty database: exit %d, stderr %q", code, stderr)
	}
	for range 2 {
		code, stdout, stderr := run(t, env, "", "migrate")
		if code != 0 || stdout != fmt.Sprintf(`{"schema_version":%d}`+"\n", store.RequiredSchemaVersion) || stderr != "" {
			t.Errorf("migrate: exit %d, stdout %q, stderr %q", code, stdout, stderr)
		}
	}
}

func TestServeServesUntilCancelled(t *testing.T) {
	dbURL := upstreamtest.EmptyDatabase(t)
	env := map[string]string{"DATABASE_URL": dbURL, "GATEWAY_SECRET": upstreamtest.GatewaySecret, "KEY_PREFIX": "acme"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, done := startServe(ctx, env, "serve", "--addr", "127.0.0.1:0", "--migrate", "--purge-interval", "50ms",
		"--usage-rollup-interval", "50ms", "--login-window", "1m", "--login-failures-per-email", "1", "--login-failures-per-client", "5")

	// The logs are read as they come, so that logging never blocks the server.
	logLines := make(chan string, 100)
	go func() {
		lines := bufio.NewScanner(pr)
		for lines.Scan() {
			logLines <- lines.Text()
		}
		close(logLines)
	}()
	var addr string
	for line := range logLines {
		var entry struct {
			Msg       string `json:"msg"`
			Addr      string `json:"addr"`
			KeyPrefix string `json:"key_prefix"`
			MaxConns  int    `json:"pool_max_conns"`
		}
		if err := json.Unmarshal([]byte(line), &entry); err != nil {
			t.Fatalf("log line %q is not JSON", line)
		}
		if entry.Msg == "serving" {
			addr = entry.Addr
			if entry.KeyPrefix != "acme" {
				t.Errorf("key prefix %q, want acme from KEY_PREFIX", entry.KeyPrefix)
			}
			if entry.MaxConns != store.DefaultMaxConns {
				t.Errorf("pool_max_conns %d, want %d", entry.MaxConns, store.DefaultMaxConns)
			}
			break
		}
	}
	if addr == "" {
		t.Fatal("serve did not log its address")
	}
	if !regexp.MustCompile(`^127\.0\.0\.1:\d+$`).MatchString(addr) {
		t.Errorf("address %q", addr)
	}
	res, err := http.Get("http://" + addr + "/nope")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 404 || res.Header.Get("Content-Type") != "application/json" {
		t.Errorf("GET /nope = %d %s", res.StatusCode, res.Header.Get("Content-Type"))
	}

	// The login throttle of the flags: one failure per (email, address) in a minute.
	for i, want := range []string{`{"error":"invalid credentials"}`, `{"error":"rate_limited","retryAfter":60}`} {
		res, err := http.Post("http://"+addr+"/auth/login", "application/json",
			strings.NewReader(`{"email":"nobody@example.com","password":"wrong password"}`))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if got := strings.TrimSpace(string(body)); got != want {
			t.Errorf("login %d = %d %s, want %s", i+1, res.StatusCode, got, want)
		}
	}

	// serve purges expired sessions on its own schedule.
	conn, err := pgx.Connect(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), `WITH u AS (INSERT INTO users (email, password_hash) VALUES ('a@example.com', '$argon2id$x') RETURNING id)
		INSERT INTO sessions (token_hash, user_id, expires_at) SELECT sha256('t'), id, now() - interval '1 second' FROM u`); err != nil {
		t.Fatal(err)
	}
	count := func(sql string) int {
		var n int
		if err := conn.QueryRow(context.Background(), sql).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	testenv.Eventually(t, 20*time.Second, "serve purging the expired session", func() bool {
		return count(`SELECT count(*) FROM sessions`) == 0
	})

	// serve rolls the usage record up on its own schedule.
	if _, err := conn.Exec(context.Background(), `INSERT INTO usage_minutes (org_id, key_id, start, outcome, status, count)
		VALUES (gen_random_uuid(), 'AAAAbbbbCCCCdddd', date_trunc('minute', now()), 'proxied', 200, 3)`); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, "serve rolling the usage record up", func() bool {
		return count(`SELECT coalesce(sum(count), 0) FROM usage_days`) == 3
	})

	cancel()
	var rest strings.Builder
	for line := range logLines {
		rest.WriteString(line + "\n")
	}
	wantExit(t, done, " after cancellation")
	if !strings.Contains(rest.String(), `"msg":"request"`) || !strings.Contains(rest.String(), `"msg":"stopped"`) {
		t.Errorf("logs after start:\n%s", rest.String())
	}
}

func TestVersionPrintsTheBinarysVersion(t *testing.T) {
	want := `{"version":"` + version.String() + `"}` + "\n"
	for _, args := range [][]string{{"version"}, {"--version"}} {
		// No environment: the version needs no database.
		code, stdout, stderr := run(t, nil, "", args...)
		if code != 0 || stdout != want || stderr != "" {
			t.Errorf("upstream %s: exit %d, stdout %q, stderr %q; want 0, %q", args[0], code, stdout, stderr, want)
		}
	}
	code, _, stderr := run(t, nil, "", "version", "extra")
	if code != 2 || stderr != "upstream version: usage: unexpected argument \"extra\" (see --help)\n" {
		t.Errorf("upstream version extra: exit %d, stderr %q", code, stderr)
	}
}
