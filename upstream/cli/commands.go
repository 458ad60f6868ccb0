package cli

import (
	"context"
	"flag"
	"math"
	"regexp"
	"slices"
	"strings"
	"unicode"

	"github.com/keygate/keygate/internal/version"
	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/schema"
	"github.com/keygate/keygate/upstream/apperr"
	"github.com/keygate/keygate/upstream/password"
	"github.com/keygate/keygate/upstream/store"
)

// The commands of the command line (docs/configuration.md). Each operator command
// parses its flags and checks them once, here. It then runs its write of package
// store through withPool. serve is in serve.go.

// command is one subcommand. It has its words ("plan put"), a line of description, and
// what it does with the arguments after its words.
type command struct {
	name    string
	summary string
	run     func(c *cli, name string, args []string) error
}

var commands = []command{
	{"serve", "serve the upstream's HTTP interface", (*cli).serve},
	{"migrate", "apply the database schema to DATABASE_URL (idempotent)", (*cli).migrate},
	{"version", "print the version of this binary", (*cli).version},
	{"plan list", "print every plan", (*cli).planList},
	{"plan get", "print one plan (plan get P, or --name P)", (*cli).planGet},
	{"plan put", "create a plan or replace its limits", (*cli).planPut},
	{"plan set", "change the given limits of a plan, keeping the others", (*cli).planSet},
	{"org create", "create an organisation on a plan", (*cli).orgCreate},
	{"org set-plan", "move an organisation to another plan", (*cli).orgSetPlan},
	{"user create", "create a user, the password read from standard input", (*cli).userCreate},
	{"member add", "make a user a member of an organisation, or change their role", (*cli).memberAdd},
	{"org list", "print every organisation", (*cli).orgList},
	{"key list", "print an organisation's keys", (*cli).keyList},
	{"key revoke", "revoke an organisation's key, from its next request on", (*cli).keyRevoke},
	{"scope list", "print the scopes keys may carry", (*cli).scopeList},
	{"scope put", "add a scope keys may carry, or change its description", (*cli).scopePut},
	{"scope delete", "remove a scope no live key holds", (*cli).scopeDelete},
	{"audit list", "print the operators' audit: changes to plans and scopes", (*cli).auditList},
	{"key replay-revocations", "after a restore, end again the keys the audit trail ended since the backup", (*cli).keyReplayRevocations},
}

// withPool runs op on a store on a small pool of DATABASE_URL. store.DefaultDatabaseTimeout
// bounds each database wait. withPool prints what op returns as one line of JSON.
// Commands check their flags before they call it. So bad flags are reported without a
// database. withKeys (operators.go) is the same with the keys' store.
func (c *cli) withPool(op func(ctx context.Context, st *store.Store) (any, error)) error {
	return c.withKeys(func(ctx context.Context, st *store.Store, _ *keystore.Store) (any, error) { return op(ctx, st) })
}

func (c *cli) migrate(name string, args []string) error {
	fs := c.flags(name, "",
		`Applies every migration of the schema not yet applied to DATABASE_URL. Idempotent; safe to run from several processes at once. Prints {"schema_version":N}.`)
	if err := c.parse(fs, args); err != nil {
		return err
	}
	dbURL, err := c.databaseURL()
	if err != nil {
		return err
	}
	if err := schema.Migrate(c.ctx, dbURL); err != nil {
		return err
	}
	return c.withPool(func(ctx context.Context, st *store.Store) (any, error) {
		v, err := st.SchemaVersion(ctx)
		return struct {
			SchemaVersion int `json:"schema_version"`
		}{v}, err
	})
}

func (c *cli) version(name string, args []string) error {
	fs := c.flags(name, "", `Prints the version of this binary, {"version":"v0.1.0"}: a release's tag, or the Go pseudo-version of the commit it was built from. Needs no database.`)
	if err := c.parse(fs, args); err != nil {
		return err
	}
	return c.printJSON(struct {
		Version string `json:"version"`
	}{version.String()})
}

func (c *cli) planList(name string, args []string) error {
	fs := c.flags(name, "", `Prints every plan, ordered by name, as {"plans":[…]}; each plan as plan get prints it.`)
	if err := c.parse(fs, args); err != nil {
		return err
	}
	return c.withPool(func(ctx context.Context, st *store.Store) (any, error) {
		plans, err := st.Plans(ctx)
		return struct {
			Plans []store.Plan `json:"plans"`
		}{plans}, err
	})
}

func (c *cli) planGet(name string, args []string) error {
	fs := c.flags(name, "P | --name P",
		`Prints plan P: {"name","api_rate_limit","max_monitors","min_interval_seconds","locations","check_types","org_rate_limit","api_requests_per_month",`+
			`"api_rate_limit_per_second","api_rate_limit_per_hour","api_rate_limit_per_day"}.`)
	planName := fs.String("name", "", "plan name `P` (required, or the first argument)")
	if err := c.parse(fs, positionalName(args), "name"); err != nil {
		return err
	}
	return c.withPool(func(ctx context.Context, st *store.Store) (any, error) {
		return st.Plan(ctx, *planName)
	})
}

func (c *cli) planPut(name string, args []string) error {
	fs := c.flags(name, planSynopsis(true),
		"Creates plan P, or replaces all the limits of an existing plan P: an optional limit left out is -1 (none), whatever it was. To change some limits and keep the others, use plan set. Prints the plan as JSON.")
	var p store.Plan
	required := planFlags(fs, &p, true)
	if err := c.parse(fs, args, required...); err != nil {
		return err
	}
	if err := checkPlan(p); err != nil {
		return err
	}
	return c.withPool(func(ctx context.Context, st *store.Store) (any, error) {
		return st.PutPlan(ctx, p)
	})
}

func (c *cli) planSet(name string, args []string) error {
	fs := c.flags(name, planSynopsis(false),
		"Changes the limits of the existing plan P that are given, at least one, and keeps the others as they are. Prints the plan as JSON.\n\nexample: upstream plan set --name pro --org-rate-limit 2000")
	var given store.Plan
	planFlags(fs, &given, false)
	if err := c.parse(fs, args, "name"); err != nil {
		return err
	}
	var changed []planLimit
	fs.Visit(func(f *flag.Flag) {
		for _, l := range planLimits {
			if l.flag == f.Name {
				changed = append(changed, l)
			}
		}
	})
	if len(changed) == 0 {
		return usageErrorf("give at least one limit to change (see --help)")
	}
	// The flags are checked as far as they can be before the database is asked.
	probe := store.Plan{Name: given.Name, MinIntervalSeconds: store.MinInterval, OrgRateLimit: -1, APIRequestsPerMonth: -1,
		APIRateLimitPerSecond: -1, APIRateLimitPerHour: -1, APIRateLimitPerDay: -1,
		Locations: store.MonitorLocations[:1], CheckTypes: store.MonitorTypes[:1]}
	setPlanLimits(&probe, &given, changed)
	if err := checkPlan(probe); err != nil {
		return err
	}
	return c.withPool(func(ctx context.Context, st *store.Store) (any, error) {
		return st.UpdatePlan(ctx, given.Name, func(p *store.Plan) error {
			setPlanLimits(p, &given, changed)
			return checkPlan(*p)
		})
	})
}

// planLimit is a limit of a plan as plan put and plan set take it: its flag, the
// flag's help with its placeholder in backquotes, and the field the flag sets. A
// required limit is one every plan has, which plan put requires; the others are -1,
// none, when left out.
type planLimit struct {
	flag, help string
	required   bool
	field      func(p *store.Plan) any // *int, *int64 or *[]string
}

// planLimits are the limits of a plan, in the order of plan put's and plan set's
// synopses.
var planLimits = []planLimit{
	{"api-rate-limit", "API requests per key per minute, `N`: 0 no API access, -1 unlimited", true,
		func(p *store.Plan) any { return &p.APIRateLimit }},
	{"max-monitors", "live monitors per organisation, `M`: -1 for no cap", true,
		func(p *store.Plan) any { return &p.MaxMonitors }},
	{"min-interval", "smallest monitor interval in seconds, `S`: 10..86400", true,
		func(p *store.Plan) any { return &p.MinIntervalSeconds }},
	{"locations", "comma-separated probe locations, `a,b`: " + strings.Join(store.MonitorLocations, ","), true,
		func(p *store.Plan) any { return &p.Locations }},
	{"check-types", "comma-separated check types, `x,y`: " + strings.Join(store.MonitorTypes, ","), true,
		func(p *store.Plan) any { return &p.CheckTypes }},
	{"org-rate-limit", "API requests per minute of all an organisation's keys together, `N`: -1 none", false,
		func(p *store.Plan) any { return &p.OrgRateLimit }},
	{"api-requests-per-month", "API requests per UTC calendar month of all an organisation's keys together, `N`: -1 none", false,
		func(p *store.Plan) any { return &p.APIRequestsPerMonth }},
	{"api-rate-limit-per-second", "API requests per key per second, beside the minute, `N`: -1 none", false,
		func(p *store.Plan) any { return &p.APIRateLimitPerSecond }},
	{"api-rate-limit-per-hour", "API requests per key per hour, beside the minute, `N`: -1 none", false,
		func(p *store.Plan) any { return &p.APIRateLimitPerHour }},
	{"api-rate-limit-per-day", "API requests per key per UTC day, beside the minute, `N`: -1 none", false,
		func(p *store.Plan) any { return &p.APIRateLimitPerDay }},
}

// planNameHelp is the help of --name, which both plan put and plan set require.
const planNameHelp = "plan name `P`, [a-z][a-z0-9_-]{0,62} (required)"

// planFlags defines on fs the flags of a plan's name and limits, into p, for plan put
// (put) and plan set alike, and returns the flags plan put requires.
func planFlags(fs *flag.FlagSet, p *store.Plan, put bool) (required []string) {
	fs.StringVar(&p.Name, "name", "", planNameHelp)
	required = append(required, "name")
	for _, l := range planLimits {
		help, def := l.help, -1
		if l.required {
			def = 0
			required = append(required, l.flag)
			if put {
				help += " (required)"
			}
		}
		switch v := l.field(p).(type) {
		case *int:
			fs.IntVar(v, l.flag, def, help)
		case *int64:
			fs.Int64Var(v, l.flag, int64(def), help)
		case *[]string:
			fs.Var((*listFlag)(v), l.flag, help)
		}
	}
	return required
}

// planSynopsis is plan put's (put) or plan set's synopsis: --name and each limit with
// its placeholder, in brackets where the command does not require it.
func planSynopsis(put bool) string {
	name, _ := flag.UnquoteUsage(&flag.Flag{Usage: planNameHelp})
	words := []string{"--name " + name}
	for _, l := range planLimits {
		arg, _ := flag.UnquoteUsage(&flag.Flag{Usage: l.help})
		w := "--" + l.flag + " " + arg
		if !put || !l.required {
			w = "[" + w + "]"
		}
		words = append(words, w)
	}
	return strings.Join(words, " ")
}

// setPlanLimits copies into p the limits of given that are in changed.
func setPlanLimits(p, given *store.Plan, changed []planLimit) {
	for _, l := range changed {
		switch v := l.field(p).(type) {
		case *int:
			*v = *l.field(given).(*int)
		case *int64:
			*v = *l.field(given).(*int64)
		case *[]string:
			*v = *l.field(given).(*[]string)
		}
	}
}

// listFlag is a flag of comma-separated values, split as splitList splits them.
type listFlag []string

func (l *listFlag) String() string {
	if l == nil {
		return ""
	}
	return strings.Join(*l, ",")
}

func (l *listFlag) Set(s string) error {
	*l = splitList(s)
	return nil
}

func (c *cli) orgCreate(name string, args []string) error {
	fs := c.flags(name, "--name NAME --plan P",
		`Creates an organisation on plan P. Prints {"id","name","plan"}.`)
	orgName := fs.String("name", "", "organisation `name`, 1..200 characters (required)")
	planName := fs.String("plan", "", "`plan` name, e.g. free, pro or enterprise (required)")
	if err := c.parse(fs, args, "name", "plan"); err != nil {
		return err
	}
	if err := checkOrgName(*orgName); err != nil {
		return err
	}
	return c.withPool(func(ctx context.Context, st *store.Store) (any, error) {
		return st.CreateOrg(ctx, *orgName, *planName)
	})
}

func (c *cli) orgSetPlan(name string, args []string) error {
	fs := c.flags(name, "--org ID --plan P",
		`Moves organisation ID to plan P; its API keys and monitors follow the new plan's limits from the next request. Prints {"id","name","plan"}.`)
	orgID := fs.String("org", "", "organisation `id` (required)")
	planName := fs.String("plan", "", "`plan` name (required)")
	if err := c.parse(fs, args, "org", "plan"); err != nil {
		return err
	}
	if !store.ValidUUID(*orgID) {
		return apperr.Invalid("--org", "must be an org id (a UUID)")
	}
	return c.withPool(func(ctx context.Context, st *store.Store) (any, error) {
		return st.SetOrgPlan(ctx, *orgID, *planName)
	})
}

func (c *cli) userCreate(name string, args []string) error {
	fs := c.flags(name, "--email E --password-stdin",
		`Creates a user. The password is the first line of standard input, without its line ending, at least 10 characters; it is stored as an argon2id hash. Prints {"id","email"}.

example: printf '%s\n' "$PASSWORD" | upstream user create --email ada@example.com --password-stdin`)
	email := fs.String("email", "", "the user's `email`, unique whatever its case (required)")
	fromStdin := fs.Bool("password-stdin", false, "read the password from the first line of standard input (required)")
	if err := c.parse(fs, args, "email", "password-stdin"); err != nil {
		return err
	}
	if !*fromStdin {
		return usageErrorf("--password-stdin is required: the password is read from standard input, never from the command line")
	}
	if err := checkEmail(*email); err != nil {
		return err
	}
	pw, err := readPasswordLine(c.stdin)
	if err != nil {
		return err
	}
	if err := password.CheckNew(pw); err != nil {
		return err
	}
	return c.withPool(func(ctx context.Context, st *store.Store) (any, error) {
		return st.CreateUser(ctx, password.NewHasher(), *email, pw)
	})
}

func (c *cli) memberAdd(name string, args []string) error {
	fs := c.flags(name, "--org ID --email E --role Owner|Admin|Editor|Viewer",
		`Makes the user with email E a member of organisation ID with the role; a user who is already a member gets the new role. Prints {"org_id","user_id","email","role"}.`)
	orgID := fs.String("org", "", "organisation `id` (required)")
	email := fs.String("email", "", "the user's `email` (required)")
	role := fs.String("role", "", "`role`: Owner, Admin, Editor or Viewer (required)")
	if err := c.parse(fs, args, "org", "email", "role"); err != nil {
		return err
	}
	if err := checkMember(*orgID, *email, *role); err != nil {
		return err
	}
	return c.withPool(func(ctx context.Context, st *store.Store) (any, error) {
		return st.AddMember(ctx, *orgID, *email, *role)
	})
}

var planNameRE = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,62}$`)

// checkPlan reports the first thing wrong with p, naming its flag.
func checkPlan(p store.Plan) error {
	switch {
	case !planNameRE.MatchString(p.Name):
		return apperr.Invalid("--name", "must match [a-z][a-z0-9_-]{0,62}")
	case p.APIRateLimit < -1:
		return apperr.Invalid("--api-rate-limit", "must be -1 (unlimited), 0 (no API access) or a positive number of requests a minute")
	case p.MaxMonitors < -1:
		return apperr.Invalid("--max-monitors", "must be -1 (no cap) or a number of monitors")
	case p.MinIntervalSeconds < store.MinInterval || p.MinIntervalSeconds > store.MaxInterval:
		return apperr.Invalid("--min-interval", "must be from %d to %d seconds", store.MinInterval, store.MaxInterval)
	case p.OrgRateLimit != -1 && (p.OrgRateLimit < 1 || p.OrgRateLimit > math.MaxInt32):
		return apperr.Invalid("--org-rate-limit", "must be -1 (none) or a number of requests a minute from 1 to %d", math.MaxInt32)
	case p.APIRequestsPerMonth != -1 && p.APIRequestsPerMonth < 1:
		return apperr.Invalid("--api-requests-per-month", "must be -1 (none) or a positive number of requests a month")
	}
	for _, w := range []struct {
		flag, unit string
		limit      int
	}{
		{"--api-rate-limit-per-second", "a second", p.APIRateLimitPerSecond},
		{"--api-rate-limit-per-hour", "an hour", p.APIRateLimitPerHour},
		{"--api-rate-limit-per-day", "a day", p.APIRateLimitPerDay},
	} {
		switch {
		case w.limit == 0:
			return apperr.Invalid(w.flag, "must be -1 (none) or a positive number of requests %s; 0 is not a limit: a plan without API access is --api-rate-limit 0", w.unit)
		case w.limit != -1 && (w.limit < 1 || w.limit > math.MaxInt32):
			return apperr.Invalid(w.flag, "must be -1 (none) or a number of requests %s from 1 to %d", w.unit, math.MaxInt32)
		}
	}
	if err := checkList("--locations", p.Locations, store.MonitorLocations); err != nil {
		return err
	}
	return checkList("--check-types", p.CheckTypes, store.MonitorTypes)
}

// checkList checks that list is non-empty, without repeats, and drawn from known.
func checkList(flag string, list, known []string) error {
	if len(list) == 0 {
		return apperr.Invalid(flag, "must list at least one of %s", strings.Join(known, ","))
	}
	for i, v := range list {
		if !slices.Contains(known, v) {
			return apperr.Invalid(flag, "unknown value %q; known: %s", v, strings.Join(known, ","))
		}
		if slices.Contains(list[:i], v) {
			return apperr.Invalid(flag, "lists %q more than once", v)
		}
	}
	return nil
}

// checkOrgName checks an organisation's name: 1 to 200 characters, none a control
// character.
func checkOrgName(name string) error {
	if n := len([]rune(name)); n < 1 || n > 200 || strings.IndexFunc(name, unicode.IsControl) >= 0 {
		return apperr.Invalid("--name", "must be 1 to 200 characters, none of them control characters")
	}
	return nil
}

// checkEmail checks the shape of an email address. It has 3 to 254 characters, no white
// space and no control character. It has an @ with something on both sides. Whether
// it receives mail is not this program's business.
func checkEmail(email string) error {
	at := strings.LastIndexByte(email, '@')
	if len(email) < 3 || len(email) > 254 || at < 1 || at == len(email)-1 ||
		strings.IndexFunc(email, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0 {
		return apperr.Invalid("--email", "must be an email address")
	}
	return nil
}

// checkMember checks the input of `member add`.
func checkMember(orgID, email, role string) error {
	switch {
	case !store.ValidUUID(orgID):
		return apperr.Invalid("--org", "must be an org id (a UUID)")
	case !store.ValidMemberRole(role):
		return apperr.Invalid("--role", "must be one of Owner, Admin, Editor, Viewer")
	}
	return checkEmail(email)
}
