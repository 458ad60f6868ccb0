package keystore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/keygate/keygate/internal/pgfailover"
)

// A key's own settings, which narrow what its plan allows: its rate limits and the
// networks it may be used from. The rules of both live here, so that every program
// that writes them (the upstream's two doors, a Go caller) refuses the same values
// with the same words (docs/configuration.md, Budgets and restricted keys).

// The names of the settings, as the API and the audit trail spell them.
const (
	FieldRateLimit    = "rate_limit"
	FieldAllowedCIDRs = "allowed_cidrs"
)

// MaxAllowedCIDRs is the most networks a key's AllowedCIDRs may list.
const MaxAllowedCIDRs = 32

// SettingError is a value of a key's setting that breaks its rule. Field is
// FieldRateLimit, a Window's Field, FieldAllowedCIDRs or FieldScopes; Reason says what is wrong, in
// words fit for the person who sent it.
type SettingError struct {
	Field  string
	Reason string
}

func (e *SettingError) Error() string { return "keystore: " + e.Field + ": " + e.Reason }

func invalidSetting(field, format string, args ...any) *SettingError {
	return &SettingError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// checkRateLimit checks a key's own rate limit n, named field, against planLimit, its
// organisation's plan's limit in the same window (api_<field>): n is from 1 to
// planLimit, any positive 32-bit number where the plan has none (-1), and nothing on a
// plan without API access (0).
func checkRateLimit(field string, n, planLimit int) error {
	switch {
	case planLimit == 0:
		return invalidSetting(field, "must be null: the plan has no API access")
	case planLimit < 0 && (n < 1 || n > math.MaxInt32):
		return invalidSetting(field, "must be a positive integer")
	case planLimit > 0 && (n < 1 || n > planLimit):
		return invalidSetting(field, "must be from 1 to %d, the plan's api_%s", planLimit, field)
	}
	return nil
}

// ParseAllowedCIDRs parses the list of networks a key may be used from, in their
// order, each in its canonical form (a bare address is its one-address network). It
// refuses more than MaxAllowedCIDRs entries, an entry ParseCIDR refuses, and a network
// listed twice.
func ParseAllowedCIDRs(list []string) ([]netip.Prefix, error) {
	if len(list) > MaxAllowedCIDRs {
		return nil, tooManyCIDRs()
	}
	out := make([]netip.Prefix, 0, len(list))
	for _, s := range list {
		p, err := ParseCIDR(s)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	if err := checkAllowedCIDRs(out); err != nil {
		return nil, err
	}
	return out, nil
}

// ParseCIDR parses one network of a key's allowed list: an IPv4 or IPv6 CIDR
// (192.0.2.0/24, 2001:db8::/32), or a bare address, which is the network of that one
// address (/32 or /128). It refuses bits set after the prefix length (10.0.0.1/8: a
// typo for 10.0.0.1/32 would otherwise silently allow the whole /8), an IPv4-mapped
// IPv6 network (the gateway sees IPv4 clients as IPv4, so it would match nothing), a
// zone, and white space.
func ParseCIDR(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		a, aerr := netip.ParseAddr(s)
		if aerr != nil || a.Zone() != "" {
			return netip.Prefix{}, invalidSetting(FieldAllowedCIDRs, "%q is not an IPv4 or IPv6 CIDR such as 192.0.2.0/24", s)
		}
		p = netip.PrefixFrom(a, a.BitLen())
	}
	if err := checkCIDR(p); err != nil {
		return netip.Prefix{}, err
	}
	return p, nil
}

// checkCIDR checks one network of an allowed list: valid, without bits set after its
// prefix length, and not IPv4-mapped IPv6.
func checkCIDR(p netip.Prefix) error {
	switch {
	case !p.IsValid():
		return invalidSetting(FieldAllowedCIDRs, "lists an invalid network")
	case p.Addr().Is4In6():
		return invalidSetting(FieldAllowedCIDRs, "%s is an IPv4-mapped IPv6 network: write it as IPv4", p)
	case p.Masked() != p:
		return invalidSetting(FieldAllowedCIDRs, "%s has bits set after its prefix length: write %s for the network, or %s for the one address",
			p, p.Masked(), netip.PrefixFrom(p.Addr(), p.Addr().BitLen()))
	}
	return nil
}

// checkAllowedCIDRs checks a whole allowed list: at most MaxAllowedCIDRs networks, each
// one checkCIDR accepts, none twice.
func checkAllowedCIDRs(list []netip.Prefix) error {
	if len(list) > MaxAllowedCIDRs {
		return tooManyCIDRs()
	}
	for i, p := range list {
		if err := checkCIDR(p); err != nil {
			return err
		}
		if slices.Contains(list[:i], p) {
			return invalidSetting(FieldAllowedCIDRs, "lists %s more than once", p)
		}
	}
	return nil
}

func tooManyCIDRs() error {
	return invalidSetting(FieldAllowedCIDRs, "must list at most %d networks", MaxAllowedCIDRs)
}

// lockPlanLimits returns the limits orgID's plan gives each key, and share-locks the
// org's row and its plan's until tx ends, so that neither a plan change nor a move to
// another plan commits between this check and the write it guards. It answers
// ErrNotFound for an org that does not exist.
func lockPlanLimits(ctx context.Context, tx pgx.Tx, orgID string) (planLimits, error) {
	var p planLimits
	err := tx.QueryRow(ctx, `SELECT p.api_rate_limit, p.api_rate_limit_per_second, p.api_rate_limit_per_hour, p.api_rate_limit_per_day
FROM orgs o JOIN plans p ON p.name = o.plan
WHERE o.id = $1 FOR SHARE OF o, p`, orgID).Scan(&p.minute, &p.windows[PerSecond], &p.windows[PerHour], &p.windows[PerDay])
	if errors.Is(err, pgx.ErrNoRows) {
		return planLimits{}, ErrNotFound
	}
	if err != nil {
		return planLimits{}, fmt.Errorf("reading the plan's rate limits: %w", err)
	}
	return p, nil
}

// checkNewSettings checks the settings a key is created or updated with, in tx: the
// list of networks, then the rate limits against the plan of orgID at this moment.
// Limits all nil (the plan's) need no plan and read none.
func checkNewSettings(ctx context.Context, tx pgx.Tx, orgID string, rateLimit *int, windows WindowLimits, cidrs []netip.Prefix) error {
	if err := checkAllowedCIDRs(cidrs); err != nil {
		return err
	}
	if rateLimit == nil && windows == (WindowLimits{}) {
		return nil
	}
	p, err := lockPlanLimits(ctx, tx, orgID)
	if err != nil {
		return err
	}
	return p.checkLimits(rateLimit, windows)
}

// Update is a change of a key's own settings. A setting it does not set is left as
// it is.
type Update struct {
	// SetRateLimit says that RateLimit is the key's new own limit; nil is the plan's.
	SetRateLimit bool
	RateLimit    *int
	// SetWindowLimits says which of WindowLimits are the key's new own limits in its
	// windows; nil is the plan's.
	SetWindowLimits [NumWindows]bool
	WindowLimits    WindowLimits
	// SetAllowedCIDRs says that AllowedCIDRs is the key's new list; empty is anywhere.
	SetAllowedCIDRs bool
	AllowedCIDRs    []netip.Prefix
	// SetScopes says that Scopes are the key's new scopes, which ParseScopes has
	// passed; nil is everything its role allows.
	SetScopes bool
	Scopes    []string
}

// Changes is what a key.updated event changed: each setting that changed, before and
// after; or what an org.plan_changed changed, the organisation's plan. It is stored
// as the event's JSON, in this form.
type Changes struct {
	RateLimit          *RateLimitChange `json:"rate_limit,omitempty"`
	RateLimitPerSecond *RateLimitChange `json:"rate_limit_per_second,omitempty"`
	RateLimitPerHour   *RateLimitChange `json:"rate_limit_per_hour,omitempty"`
	RateLimitPerDay    *RateLimitChange `json:"rate_limit_per_day,omitempty"`
	AllowedCIDRs       *CIDRsChange     `json:"allowed_cidrs,omitempty"`
	Scopes             *ScopesChange    `json:"scopes,omitempty"`
	Plan               *PlanChange      `json:"plan,omitempty"`
}

// PlanChange is an organisation's plan before and after.
type PlanChange struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// Window returns the change of the key's own limit in w; nil if it did not change.
func (c *Changes) Window(w Window) *RateLimitChange { return *c.window(w) }

func (c *Changes) window(w Window) **RateLimitChange {
	return [NumWindows]**RateLimitChange{&c.RateLimitPerSecond, &c.RateLimitPerHour, &c.RateLimitPerDay}[w]
}

// RateLimitChange is a key's own rate limit before and after; nil is the plan's.
type RateLimitChange struct {
	From *int `json:"from"`
	To   *int `json:"to"`
}

// CIDRsChange is a key's allowed networks before and after; empty is anywhere.
type CIDRsChange struct {
	From []netip.Prefix `json:"from"`
	To   []netip.Prefix `json:"to"`
}

// ScopesChange is a key's scopes before and after; nil is everything its role allows.
type ScopesChange struct {
	From []string `json:"from"`
	To   []string `json:"to"`
}

// ErrNoChange is an Update that sets no setting.
var ErrNoChange = errors.New("keystore: the update sets no setting")

// Update changes the settings of the live key keyID of orgID that u sets, in one
// transaction, and returns the key's record. It checks them first (a *SettingError),
// the rate limit against the organisation's plan and the scopes against the
// vocabulary at this moment, then answers
// ErrNotFound for a key id the organisation does not have and ErrNotLive for a revoked
// or expired key. The settings that change are audited as one key.updated by actor,
// with what changed; an Update that changes nothing audits nothing. An Update that
// narrows the key's scopes or networks commits Synced, as a revocation does; any
// other commits Local.
func (s *Store) Update(ctx context.Context, orgID, keyID string, u Update, actor string) (Record, error) {
	if u.Empty() {
		return Record{}, ErrNoChange
	}
	if u.SetScopes {
		var err error
		if u.Scopes, err = ParseScopes(u.Scopes); err != nil {
			return Record{}, err
		}
	}
	if u.SetAllowedCIDRs && u.AllowedCIDRs == nil {
		u.AllowedCIDRs = []netip.Prefix{}
	}
	tx, err := pgfailover.Begin(ctx, s.pool, pgfailover.Local)
	if err != nil {
		return Record{}, fmt.Errorf("beginning transaction: %w", err)
	}
	defer tx.Rollback(ctx)
	var rateLimit *int
	if u.SetRateLimit {
		rateLimit = u.RateLimit
	}
	var windows WindowLimits
	for w, set := range u.SetWindowLimits {
		if set {
			windows[w] = u.WindowLimits[w]
		}
	}
	if err := checkNewSettings(ctx, tx, orgID, rateLimit, windows, u.AllowedCIDRs); err != nil {
		return Record{}, err
	}
	if u.Scopes, err = resolveScopes(ctx, tx, u.Scopes); err != nil {
		return Record{}, err
	}
	if !ValidKeyID(keyID) {
		return Record{}, ErrNotFound
	}

	var (
		live       bool
		oldLimit   *int
		oldWindows WindowLimits
		oldCIDRs   []netip.Prefix
		oldScopes  []string
	)
	err = tx.QueryRow(ctx, `SELECT revoked_at IS NULL AND (expires_at IS NULL OR expires_at > clock_timestamp()), rate_limit,
	rate_limit_per_second, rate_limit_per_hour, rate_limit_per_day, allowed_cidrs, scopes
FROM api_keys WHERE org_id = $1 AND key_id = $2 FOR UPDATE`, orgID, keyID).Scan(&live, &oldLimit,
		&oldWindows[PerSecond], &oldWindows[PerHour], &oldWindows[PerDay], &oldCIDRs, &oldScopes)
	if errors.Is(err, pgx.ErrNoRows) {
		return Record{}, ErrNotFound
	}
	if err != nil {
		return Record{}, fmt.Errorf("locking key: %w", err)
	}
	if !live {
		return Record{}, ErrNotLive
	}

	var ch Changes
	changed := false
	newLimit, newWindows, newCIDRs, newScopes := oldLimit, oldWindows, oldCIDRs, oldScopes
	if u.SetRateLimit && !equalLimits(oldLimit, u.RateLimit) {
		ch.RateLimit = &RateLimitChange{From: oldLimit, To: u.RateLimit}
		newLimit, changed = u.RateLimit, true
	}
	for w, set := range u.SetWindowLimits {
		if set && !equalLimits(oldWindows[w], u.WindowLimits[w]) {
			*ch.window(Window(w)) = &RateLimitChange{From: oldWindows[w], To: u.WindowLimits[w]}
			newWindows[w], changed = u.WindowLimits[w], true
		}
	}
	if u.SetAllowedCIDRs && !slices.Equal(oldCIDRs, u.AllowedCIDRs) {
		ch.AllowedCIDRs = &CIDRsChange{From: nonNil(oldCIDRs), To: u.AllowedCIDRs}
		newCIDRs, changed = u.AllowedCIDRs, true
	}
	if u.SetScopes && !equalScopes(oldScopes, u.Scopes) {
		ch.Scopes = &ScopesChange{From: oldScopes, To: u.Scopes}
		newScopes, changed = u.Scopes, true
	}
	var rec Record
	if !changed {
		rec, err = scanRecord(tx.QueryRow(ctx, `SELECT `+recordColumns+` FROM api_keys WHERE key_id = $1`, keyID))
	} else {
		rec, err = scanRecord(tx.QueryRow(ctx, `UPDATE api_keys SET rate_limit = $2, allowed_cidrs = $3, scopes = $4,
	rate_limit_per_second = $5, rate_limit_per_hour = $6, rate_limit_per_day = $7
WHERE key_id = $1 RETURNING `+recordColumns, keyID, newLimit, nonNil(newCIDRs), newScopes,
			newWindows[PerSecond], newWindows[PerHour], newWindows[PerDay]))
		if err == nil {
			err = audit(ctx, tx, Event{OrgID: orgID, Action: ActionUpdated, KeyID: keyID, Actor: actor, Changes: &ch})
		}
		if err == nil && ch.narrows() {
			err = pgfailover.Sync(ctx, tx)
		}
	}
	if err != nil {
		return Record{}, fmt.Errorf("updating key: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return Record{}, fmt.Errorf("committing key update: %w", err)
	}
	return rec, nil
}

// narrows reports whether the changes take access away: scopes or networks that no
// longer allow every request the old ones allowed. A rate limit takes no access away:
// it only counts.
func (ch *Changes) narrows() bool {
	return (ch.Scopes != nil && !coversScopes(ch.Scopes.To, ch.Scopes.From)) ||
		(ch.AllowedCIDRs != nil && !coversCIDRs(ch.AllowedCIDRs.To, ch.AllowedCIDRs.From))
}

// coversScopes reports whether the scopes to allow all that from allowed: nil (what
// the role allows) covers everything, and a list covers each scope it holds.
func coversScopes(to, from []string) bool {
	if to == nil {
		return true
	}
	if from == nil {
		return false
	}
	for _, s := range from {
		if !slices.Contains(to, s) {
			return false
		}
	}
	return true
}

// coversCIDRs reports whether the networks to hold every address from held: empty
// is anywhere, and a list holds each network within one of its own.
func coversCIDRs(to, from []netip.Prefix) bool {
	if len(to) == 0 {
		return true
	}
	if len(from) == 0 {
		return false
	}
next:
	for _, p := range from {
		for _, q := range to {
			if q.Bits() <= p.Bits() && q.Contains(p.Addr()) {
				continue next
			}
		}
		return false
	}
	return true
}

// Empty reports whether u sets no setting.
func (u *Update) Empty() bool {
	return !u.SetRateLimit && u.SetWindowLimits == [NumWindows]bool{} && !u.SetAllowedCIDRs && !u.SetScopes
}

func equalLimits(a, b *int) bool {
	return (a == nil && b == nil) || (a != nil && b != nil && *a == *b)
}

// equalScopes reports whether a and b are the same scopes: both nil (unscoped), or
// both the same list. Lists are kept in the vocabulary's order, so order is no matter.
func equalScopes(a, b []string) bool {
	return (a == nil) == (b == nil) && slices.Equal(a, b)
}

// nonNil returns list, or an empty list for nil: the JSON of a list is never null.
func nonNil(list []netip.Prefix) []netip.Prefix {
	if list == nil {
		return []netip.Prefix{}
	}
	return list
}
