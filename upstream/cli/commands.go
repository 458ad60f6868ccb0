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
	{"plan get", "print one plan", (*cli).planGet},
	{"plan put", "create a plan or replace its limits", (*cli).planPut},
	{"plan set", "change the given limits of a plan, keeping the others", (*cli).planSet},
	{"org create", "create an organisation on a plan", (*cli).orgCreate},
	{"org set-plan", "move an organisation to another plan", (*cli).orgSetPlan},
	{"user create", "create a user, the password read from standard input", (*cli).userCreate},
	{"member add", "make a user a member of an organisation, or change their role", (*cli).memberAdd},
}

// withPool runs op on a store on a small pool of DATABASE_URL. store.DefaultDatabaseTimeout
// bounds each database wait. withPool prints what op returns as one line of JSON.
// Commands check their flags before they call it. So bad flags are reported without a
// database.
func (c *cli) withPool(op func(ctx context.Context, st *store.Store) (any, error)) error {
	pool, err := c.connect(2, store.DefaultDatabaseTimeout)
	if err != nil {
		return err
	}
	defer pool.Close()
	out, err := op(c.ctx, store.New(pool))
	if err != nil {
		return err
	}
	return c.printJSON(out)
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
	fs := c.flags(name, "--name P",
		`Prints plan P: {"name","api_rate_limit","max_monitors","min_interval_seconds","locations","check_types","org_rate_limit","api_requests_per_month"}.`)
	planName := fs.String("name", "", "plan name `P` (required)")
	if err := c.parse(fs, args, "name"); err != nil {
		return err
	}
	return c.withPool(func(ctx context.Context, st *store.Store) (any, error) {
		return st.Plan(ctx, *planName)
	})
}

func (c *cli) planPut(name string, args []string) error {
	fs := c.flags(name,
		"--name P --api-rate-limit N --max-monitors M --min-interval S --locations a,b --check-types x,y [--org-rate-limit N] [--api-requests-per-month N]",
		"Creates plan P, or replaces all the limits of an existing plan P: an optional limit left out is -1 (none), whatever it was. To change some limits and keep the others, use plan set. Prints the plan as JSON.")
	var p store.Plan
	lists := planFlags(fs, &p, " (required)")
	if err := c.parse(fs, args, "name", "api-rate-limit", "max-monitors", "min-interval", "locations", "check-types"); err != nil {
		return err
	}
	lists.apply(fs, &p)
	if err := checkPlan(p); err != nil {
		return err
	}
	return c.withPool(func(ctx context.Context, st *store.Store) (any, error) {
		return st.PutPlan(ctx, p)
	})
}

func (c *cli) planSet(name string, args []string) error {
	fs := c.flags(name,
		"--name P [--api-rate-limit N] [--max-monitors M] [--min-interval S] [--locations a,b] [--check-types x,y] [--org-rate-limit N] [--api-requests-per-month N]",
		"Changes the limits of the existing plan P that are given, at least one, and keeps the others as they are. Prints the plan as JSON.\n\nexample: upstream plan set --name pro --org-rate-limit 2000")
	var given store.Plan
	lists := planFlags(fs, &given, "")
	if err := c.parse(fs, args, "name"); err != nil {
		return err
	}
	lists.apply(fs, &given)
	changed := map[string]bool{}
	fs.Visit(func(f *flag.Flag) {
		if f.Name != "name" {
			changed[f.Name] = true
		}
	})
	if len(changed) == 0 {
		return usageErrorf("give at least one limit to change (see --help)")
	}
	// The flags are checked as far as they can be before the database is asked.
	probe := store.Plan{Name: given.Name, MinIntervalSeconds: store.MinInterval, OrgRateLimit: -1, APIRequestsPerMonth: -1,
		Locations: store.MonitorLocations[:1], CheckTypes: store.MonitorTypes[:1]}
	setPlanLimits(&probe, given, changed)
	if err := checkPlan(probe); err != nil {
		return err
	}
	return c.withPool(func(ctx context.Context, st *store.Store) (any, error) {
		return st.UpdatePlan(ctx, given.Name, func(p *store.Plan) error {
			setPlanLimits(p, given, changed)
			return checkPlan(*p)
		})
	})
}

// planLists holds the comma-separated values of --locations and --check-types until
// apply splits them into the plan.
type planLists struct{ locations, checkTypes string }

// apply splits the list flags that fs was given into p.
func (l *planLists) apply(fs *flag.FlagSet, p *store.Plan) {
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "locations":
			p.Locations = splitList(l.locations)
		case "check-types":
			p.CheckTypes = splitList(l.checkTypes)
		}
	})
}

// planFlags defines the flags of a plan's name and limits on fs, into p, for plan put
// and plan set alike. required ends the help of the six limits every plan has.
func planFlags(fs *flag.FlagSet, p *store.Plan, required string) *planLists {
	var l planLists
	fs.StringVar(&p.Name, "name", "", "plan name `P`, [a-z][a-z0-9_-]{0,62} (required)")
	fs.IntVar(&p.APIRateLimit, "api-rate-limit", 0, "API requests per key per minute, `N`: 0 no API access, -1 unlimited"+required)
	fs.IntVar(&p.MaxMonitors, "max-monitors", 0, "live monitors per organisation, `M`: -1 for no cap"+required)
	fs.IntVar(&p.MinIntervalSeconds, "min-interval", 0, "smallest monitor interval in seconds, `S`: 10..86400"+required)
	fs.StringVar(&l.locations, "locations", "", "comma-separated probe locations, `a,b`: "+strings.Join(store.MonitorLocations, ",")+required)
	fs.StringVar(&l.checkTypes, "check-types", "", "comma-separated check types, `x,y`: "+strings.Join(store.MonitorTypes, ",")+required)
	fs.IntVar(&p.OrgRateLimit, "org-rate-limit", -1, "API requests per minute of all an organisation's keys together, `N`: -1 none")
	fs.Int64Var(&p.APIRequestsPerMonth, "api-requests-per-month", -1, "API requests per UTC calendar month of all an organisation's keys together, `N`: -1 none")
	return &l
}

// setPlanLimits copies into p the limits of given whose flags are in changed.
func setPlanLimits(p *store.Plan, given store.Plan, changed map[string]bool) {
	for name := range changed {
		switch name {
		case "api-rate-limit":
			p.APIRateLimit = given.APIRateLimit
		case "max-monitors":
			p.MaxMonitors = given.MaxMonitors
		case "min-interval":
			p.MinIntervalSeconds = given.MinIntervalSeconds
		case "locations":
			p.Locations = given.Locations
		case "check-types":
			p.CheckTypes = given.CheckTypes
		case "org-rate-limit":
			p.OrgRateLimit = given.OrgRateLimit
		case "api-requests-per-month":
			p.APIRequestsPerMonth = given.APIRequestsPerMonth
		}
	}
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
