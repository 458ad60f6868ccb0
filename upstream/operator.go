package upstream

import (
	"strings"
)

// The operator commands of CONTRACT §7. Each parses its flags, calls the operation of
// admin.go on DATABASE_URL and prints the result as one JSON object.

func (c *cli) planPut(name string, args []string) error {
	fs := c.flags(name,
		"--name P --api-rate-limit N --max-monitors M --min-interval S --locations a,b --check-types x,y",
		"Creates plan P, or replaces all the limits of an existing plan P. Prints the plan as JSON.")
	var p planRecord
	var locations, checkTypes string
	fs.StringVar(&p.Name, "name", "", "plan name `P`, [a-z][a-z0-9_-]{0,62} (required)")
	fs.IntVar(&p.APIRateLimit, "api-rate-limit", 0, "API requests per key per minute, `N`: 0 no API access, -1 unlimited (required)")
	fs.IntVar(&p.MaxMonitors, "max-monitors", 0, "live monitors per organisation, `M`: -1 for no cap (required)")
	fs.IntVar(&p.MinIntervalSeconds, "min-interval", 0, "smallest monitor interval in seconds, `S`: 10..86400 (required)")
	fs.StringVar(&locations, "locations", "", "comma-separated probe locations, `a,b`: "+strings.Join(monitorLocations, ",")+" (required)")
	fs.StringVar(&checkTypes, "check-types", "", "comma-separated check types, `x,y`: "+strings.Join(monitorTypes, ",")+" (required)")
	if err := c.parse(fs, args, "name", "api-rate-limit", "max-monitors", "min-interval", "locations", "check-types"); err != nil {
		return err
	}
	p.Locations, p.CheckTypes = splitList(locations), splitList(checkTypes)
	if err := p.check(); err != nil {
		return err
	}
	pool, err := c.connect(2)
	if err != nil {
		return err
	}
	defer pool.Close()
	out, err := putPlan(c.ctx, pool, p)
	if err != nil {
		return err
	}
	return c.printJSON(out)
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
	pool, err := c.connect(2)
	if err != nil {
		return err
	}
	defer pool.Close()
	out, err := createOrg(c.ctx, pool, *orgName, *planName)
	if err != nil {
		return err
	}
	return c.printJSON(out)
}

func (c *cli) orgSetPlan(name string, args []string) error {
	fs := c.flags(name, "--org ID --plan P",
		`Moves organisation ID to plan P; its API keys and monitors follow the new plan's limits from the next request. Prints {"id","name","plan"}.`)
	orgID := fs.String("org", "", "organisation `id` (required)")
	planName := fs.String("plan", "", "`plan` name (required)")
	if err := c.parse(fs, args, "org", "plan"); err != nil {
		return err
	}
	if !validUUID(*orgID) {
		return invalid("--org", "must be an org id (a UUID)")
	}
	pool, err := c.connect(2)
	if err != nil {
		return err
	}
	defer pool.Close()
	out, err := setOrgPlan(c.ctx, pool, *orgID, *planName)
	if err != nil {
		return err
	}
	return c.printJSON(out)
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
	password, err := readPasswordLine(c.stdin)
	if err != nil {
		return err
	}
	if err := checkNewPassword(password); err != nil {
		return err
	}
	pool, err := c.connect(2)
	if err != nil {
		return err
	}
	defer pool.Close()
	out, err := createUser(c.ctx, pool, newPasswordHasher(), *email, password)
	if err != nil {
		return err
	}
	return c.printJSON(out)
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
	pool, err := c.connect(2)
	if err != nil {
		return err
	}
	defer pool.Close()
	out, err := addMember(c.ctx, pool, *orgID, *email, *role)
	if err != nil {
		return err
	}
	return c.printJSON(out)
}
