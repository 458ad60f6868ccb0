package cli

import (
	"context"
	"net/netip"
	"strings"
	"time"

	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/upstream/apperr"
	"github.com/keygate/keygate/upstream/store"
)

// The operator's commands for scopes, organisations, their keys and the operators'
// audit (docs/configuration.md). They run as the others do (commands.go): flags
// checked first, then one operation of package store or keystore through withPool,
// its result printed as one JSON object. A change to an organisation's keys is
// audited in its trail with the actor store.ActorOperator; a change to a plan or a
// scope in the operators' audit, which `audit list` prints.

func (c *cli) scopePut(name string, args []string) error {
	fs := c.flags(name, "--name S [--description TEXT]",
		`Adds scope S to the vocabulary keys' scopes are drawn from, or replaces its description. A gateway's route table names the scopes its routes need: each must be here for a key to carry it (docs/configuration.md, Scopes and route costs). Prints {"name","description","created"}.

example: upstream scope put --name reports:read --description "Read reports"`)
	scope := fs.String("name", "", "scope `S`, "+keystore.ScopeNamePattern+", at most 64 characters (required)")
	desc := fs.String("description", "", "what the scope allows, in words, at most 200 characters")
	if err := c.parse(fs, args, "name"); err != nil {
		return err
	}
	if !keystore.ValidScopeName(*scope) {
		return apperr.Invalid("--name", "must match %s, at most %d characters", keystore.ScopeNamePattern, keystore.MaxScopeLen)
	}
	if len([]rune(*desc)) > 200 {
		return apperr.Invalid("--description", "must be at most 200 characters")
	}
	return c.withPool(func(ctx context.Context, st *store.Store) (any, error) {
		created, err := st.PutScope(ctx, keystore.Scope{Name: *scope, Description: *desc})
		return struct {
			keystore.Scope
			Created bool `json:"created"`
		}{keystore.Scope{Name: *scope, Description: *desc}, created}, err
	})
}

func (c *cli) scopeList(name string, args []string) error {
	fs := c.flags(name, "", `Prints the vocabulary of scopes, in its order, as {"scopes":[{"name","description"}…]}.`)
	if err := c.parse(fs, args); err != nil {
		return err
	}
	return c.withKeys(func(ctx context.Context, _ *store.Store, keys *keystore.Store) (any, error) {
		list, err := keys.Scopes(ctx)
		return struct {
			Scopes []keystore.Scope `json:"scopes"`
		}{list}, err
	})
}

func (c *cli) scopeDelete(name string, args []string) error {
	fs := c.flags(name, "--name S",
		`Removes scope S from the vocabulary. Refused while a live key holds it: revoke the key, or take the scope from it, first. Prints the scope deleted, {"name","description"}.`)
	scope := fs.String("name", "", "scope `S` (required)")
	if err := c.parse(fs, args, "name"); err != nil {
		return err
	}
	return c.withPool(func(ctx context.Context, st *store.Store) (any, error) {
		return st.DeleteScope(ctx, *scope)
	})
}

func (c *cli) orgList(name string, args []string) error {
	fs := c.flags(name, "", `Prints every organisation, oldest first, as {"orgs":[{"id","name","plan","created_at"}…]}.`)
	if err := c.parse(fs, args); err != nil {
		return err
	}
	return c.withPool(func(ctx context.Context, st *store.Store) (any, error) {
		orgs, err := st.Orgs(ctx)
		return struct {
			Orgs []store.OrgListing `json:"orgs"`
		}{orgs}, err
	})
}

// keyListing is a key as `key list` prints it: never its secret nor its hash.
type keyListing struct {
	ID           string         `json:"id"`
	Name         string         `json:"name"`
	Role         string         `json:"role"`
	CreatedAt    time.Time      `json:"created_at"`
	ExpiresAt    *time.Time     `json:"expires_at"`
	RevokedAt    *time.Time     `json:"revoked_at"`
	LastUsedAt   *time.Time     `json:"last_used_at"`
	RateLimit    *int           `json:"rate_limit"`
	AllowedCIDRs []netip.Prefix `json:"allowed_cidrs"`
	Scopes       []string       `json:"scopes"`
}

func (c *cli) keyList(name string, args []string) error {
	fs := c.flags(name, "--org ID",
		`Prints every key of organisation ID, revoked and expired ones included, oldest first, as {"keys":[{"id","name","role","created_at","expires_at","revoked_at","last_used_at","rate_limit","allowed_cidrs","scopes"}…]}: what the dashboard's key list shows, never a secret.`)
	orgID := fs.String("org", "", "organisation `id` (required)")
	if err := c.parse(fs, args, "org"); err != nil {
		return err
	}
	if !store.ValidUUID(*orgID) {
		return apperr.Invalid("--org", "must be an org id (a UUID)")
	}
	return c.withKeys(func(ctx context.Context, st *store.Store, keys *keystore.Store) (any, error) {
		if err := st.OrgExists(ctx, *orgID); err != nil {
			return nil, err
		}
		recs, err := keys.List(ctx, *orgID)
		out := make([]keyListing, 0, len(recs))
		for _, r := range recs {
			cidrs := r.AllowedCIDRs
			if cidrs == nil {
				cidrs = []netip.Prefix{}
			}
			out = append(out, keyListing{ID: r.ID, Name: r.Name, Role: string(r.Role), CreatedAt: r.CreatedAt.UTC(),
				ExpiresAt: utc(r.ExpiresAt), RevokedAt: utc(r.RevokedAt), LastUsedAt: utc(r.LastUsedAt),
				RateLimit: r.RateLimit, AllowedCIDRs: cidrs, Scopes: r.Scopes})
		}
		return struct {
			Keys []keyListing `json:"keys"`
		}{out}, err
	})
}

func (c *cli) keyRevoke(name string, args []string) error {
	fs := c.flags(name, "--org ID --id KEYID",
		`Revokes key KEYID of organisation ID: the gateway refuses it from its next request on, as when revoked on the dashboard. Audited in the organisation's trail as key.revoked by operator. Revoking a revoked key changes nothing. Prints {"org_id","id","revoked":true}.`)
	orgID := fs.String("org", "", "organisation `id` (required)")
	keyID := fs.String("id", "", "the key's `id`, as key list prints it (required)")
	if err := c.parse(fs, args, "org", "id"); err != nil {
		return err
	}
	if !store.ValidUUID(*orgID) {
		return apperr.Invalid("--org", "must be an org id (a UUID)")
	}
	if !keystore.ValidKeyID(*keyID) {
		return apperr.Invalid("--id", "must be a key id: 16 to 64 letters and digits")
	}
	return c.withKeys(func(ctx context.Context, _ *store.Store, keys *keystore.Store) (any, error) {
		found, err := keys.Revoke(ctx, *orgID, *keyID, store.ActorOperator)
		if err == nil && !found {
			err = apperr.Errorf(apperr.ENOTFOUND, "organisation %s has no key %s", *orgID, *keyID)
		}
		return struct {
			OrgID   string `json:"org_id"`
			ID      string `json:"id"`
			Revoked bool   `json:"revoked"`
		}{*orgID, *keyID, true}, err
	})
}

func (c *cli) auditList(name string, args []string) error {
	fs := c.flags(name, "[--limit N] [--before ID]",
		`Prints the operators' audit, newest first: each change a plan or scope command made, as {"events":[{"id","action","subject","actor","changes":{"from","to"},"at"}…]}. action is plan.created, plan.updated, scope.created, scope.updated or scope.deleted; from is null for a creation, to for a deletion. A change to an organisation is in its own audit trail (the dashboard's).`)
	limit := fs.Int("limit", 50, "the most events to print, `N`: 1..1000")
	before := fs.Int64("before", 0, "print the events older than the one of `ID`, for the page after the last printed")
	if err := c.parse(fs, args); err != nil {
		return err
	}
	if *limit < 1 || *limit > 1000 {
		return apperr.Invalid("--limit", "must be from 1 to 1000")
	}
	if *before < 0 {
		return apperr.Invalid("--before", "must be an event's id")
	}
	return c.withPool(func(ctx context.Context, st *store.Store) (any, error) {
		events, err := st.OperatorEvents(ctx, *before, *limit)
		return struct {
			Events []store.OperatorEvent `json:"events"`
		}{events}, err
	})
}

// withKeys is withPool with the keys' store too, on the same pool. Its key format is
// the default's: nothing these commands do reads or writes a full key.
func (c *cli) withKeys(op func(ctx context.Context, st *store.Store, keys *keystore.Store) (any, error)) error {
	pool, err := c.connect(2, store.DefaultDatabaseTimeout, nil)
	if err != nil {
		return err
	}
	defer pool.Close()
	format, _ := keystore.NewFormat(keystore.DefaultPrefix)
	out, err := op(c.ctx, store.New(pool), keystore.New(pool, format))
	if err != nil {
		return err
	}
	return c.printJSON(out)
}

// utc is t in UTC, nil for nil.
func utc(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	return new(t.UTC())
}

// positionalName turns `plan get pro` into `plan get --name pro`: a first argument
// that is no flag is the name.
func positionalName(args []string) []string {
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		return append([]string{"--name", args[0]}, args[1:]...)
	}
	return args
}
