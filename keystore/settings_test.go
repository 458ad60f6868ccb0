package keystore_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keygate/keygate/keystore"
)

func intp(n int) *int { return &n }

func prefixes(t *testing.T, ss ...string) []netip.Prefix {
	t.Helper()
	out := []netip.Prefix{}
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

// wantSetting fails unless err is the *SettingError of field with reason.
func wantSetting(t *testing.T, err error, field, reason string) {
	t.Helper()
	var se *keystore.SettingError
	if !errors.As(err, &se) || se.Field != field || se.Reason != reason {
		t.Errorf("error %v, want %s: %s", err, field, reason)
	}
}

func TestParseAllowedCIDRsKeepsTheCanonicalFormInOrder(t *testing.T) {
	got, err := keystore.ParseAllowedCIDRs([]string{"2001:DB8::/32", "192.0.2.7", "2001:db8:0:0::1", "10.0.0.0/8", "0.0.0.0/0"})
	if err != nil {
		t.Fatal(err)
	}
	want := prefixes(t, "2001:db8::/32", "192.0.2.7/32", "2001:db8::1/128", "10.0.0.0/8", "0.0.0.0/0")
	if !slices.Equal(got, want) {
		t.Errorf("ParseAllowedCIDRs = %v, want %v", got, want)
	}
	if got, err := keystore.ParseAllowedCIDRs(nil); err != nil || got == nil || len(got) != 0 {
		t.Errorf("ParseAllowedCIDRs(nil) = %#v, %v; want an empty list", got, err)
	}
	many := make([]string, keystore.MaxAllowedCIDRs)
	for i := range many {
		many[i] = fmt.Sprintf("10.%d.0.0/16", i)
	}
	if got, err := keystore.ParseAllowedCIDRs(many); err != nil || len(got) != keystore.MaxAllowedCIDRs {
		t.Errorf("32 networks: %d, %v", len(got), err)
	}
}

func TestParseAllowedCIDRsRefusesWhatCannotBeMeant(t *testing.T) {
	many := make([]string, keystore.MaxAllowedCIDRs+1)
	for i := range many {
		many[i] = fmt.Sprintf("10.%d.0.0/16", i)
	}
	for _, tc := range []struct {
		name   string
		list   []string
		reason string
	}{
		{"33 networks", many, "must list at most 32 networks"},
		{"33 networks, one malformed", append(many[:32:32], "nope"), "must list at most 32 networks"},
		{"an empty string", []string{""}, `"" is not an IPv4 or IPv6 CIDR such as 192.0.2.0/24`},
		{"a word", []string{"office"}, `"office" is not an IPv4 or IPv6 CIDR such as 192.0.2.0/24`},
		{"three octets", []string{"10.0.0/8"}, `"10.0.0/8" is not an IPv4 or IPv6 CIDR such as 192.0.2.0/24`},
		{"a prefix too long", []string{"10.0.0.0/33"}, `"10.0.0.0/33" is not an IPv4 or IPv6 CIDR such as 192.0.2.0/24`},
		{"an octet over 255", []string{"10.0.0.256/32"}, `"10.0.0.256/32" is not an IPv4 or IPv6 CIDR such as 192.0.2.0/24`},
		{"a leading zero", []string{"010.0.0.0/8"}, `"010.0.0.0/8" is not an IPv4 or IPv6 CIDR such as 192.0.2.0/24`},
		{"white space", []string{" 10.0.0.0/8"}, `" 10.0.0.0/8" is not an IPv4 or IPv6 CIDR such as 192.0.2.0/24`},
		{"a zone", []string{"fe80::1%eth0"}, `"fe80::1%eth0" is not an IPv4 or IPv6 CIDR such as 192.0.2.0/24`},
		{"a zone with a prefix", []string{"fe80::%eth0/64"}, `"fe80::%eth0/64" is not an IPv4 or IPv6 CIDR such as 192.0.2.0/24`},
		{"a host name", []string{"example.com"}, `"example.com" is not an IPv4 or IPv6 CIDR such as 192.0.2.0/24`},
		{"bits set after the prefix", []string{"10.0.0.1/8"}, "10.0.0.1/8 has bits set after its prefix length: write 10.0.0.0/8 for the network, or 10.0.0.1/32 for the one address"},
		{"IPv6 bits set after the prefix", []string{"2001:db8::1/32"}, "2001:db8::1/32 has bits set after its prefix length: write 2001:db8::/32 for the network, or 2001:db8::1/128 for the one address"},
		{"an IPv4-mapped network", []string{"::ffff:10.0.0.0/104"}, "::ffff:10.0.0.0/104 is an IPv4-mapped IPv6 network: write it as IPv4"},
		{"an IPv4-mapped address", []string{"::ffff:192.0.2.7"}, "::ffff:192.0.2.7/128 is an IPv4-mapped IPv6 network: write it as IPv4"},
		{"the same network twice", []string{"10.0.0.0/8", "192.0.2.0/24", "10.0.0.0/8"}, "lists 10.0.0.0/8 more than once"},
		{"an address and its /32", []string{"192.0.2.7", "192.0.2.7/32"}, "lists 192.0.2.7/32 more than once"},
		{"two spellings of one IPv6 network", []string{"2001:DB8::/32", "2001:db8:0::/32"}, "lists 2001:db8::/32 more than once"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := keystore.ParseAllowedCIDRs(tc.list)
			if got != nil {
				t.Errorf("returned %v with the error", got)
			}
			wantSetting(t, err, "allowed_cidrs", tc.reason)
		})
	}
}

// newUser returns the id of a new user: the actor of a roll is the new key's creator.
func newUser(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var id string
	if err := pool.QueryRow(context.Background(), `INSERT INTO users (email, password_hash)
VALUES ('ada@example.com', '$argon2id$v=19$m=1,t=1,p=1$AAAA$AAAA') RETURNING id::text`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// newPlanOrg creates plan with apiRateLimit and an org on it, and returns the org's id.
func newPlanOrg(t *testing.T, pool *pgxpool.Pool, plan string, apiRateLimit int) string {
	t.Helper()
	_, err := pool.Exec(context.Background(), `INSERT INTO plans (name, api_rate_limit, max_monitors, min_interval_seconds, locations, check_types)
VALUES ($1, $2, 1, 60, '{us-east}', '{http}')`, plan, apiRateLimit)
	if err != nil {
		t.Fatal(err)
	}
	return newOrg(t, pool, plan)
}

func TestCreateStoresTheSettingsAndListReturnsThem(t *testing.T) {
	ctx := context.Background()
	s, _, org := newStore(t, "pro")
	cidrs := prefixes(t, "192.0.2.0/24", "2001:db8::/32")
	a, fullA := create(t, s, keystore.NewKey{OrgID: org, Name: "narrow", Role: keystore.RoleAdmin, RateLimit: intp(20), AllowedCIDRs: cidrs})
	b, _ := create(t, s, keystore.NewKey{OrgID: org, Name: "plain", Role: keystore.RoleAdmin})
	if a.RateLimit == nil || *a.RateLimit != 20 || !slices.Equal(a.AllowedCIDRs, cidrs) {
		t.Errorf("Create returned rate limit %v, networks %v", a.RateLimit, a.AllowedCIDRs)
	}
	if b.RateLimit != nil || b.AllowedCIDRs == nil || len(b.AllowedCIDRs) != 0 {
		t.Errorf("a key without settings: rate limit %v, networks %#v; want nil and empty", b.RateLimit, b.AllowedCIDRs)
	}
	list, err := s.List(ctx, org)
	if err != nil || len(list) != 2 {
		t.Fatalf("List = %v, %v", list, err)
	}
	if list[0].RateLimit == nil || *list[0].RateLimit != 20 || !slices.Equal(list[0].AllowedCIDRs, cidrs) {
		t.Errorf("List: rate limit %v, networks %v", list[0].RateLimit, list[0].AllowedCIDRs)
	}
	if list[1].RateLimit != nil || list[1].AllowedCIDRs == nil || len(list[1].AllowedCIDRs) != 0 {
		t.Errorf("List of a key without settings: %v, %#v", list[1].RateLimit, list[1].AllowedCIDRs)
	}
	if _, ok, err := s.Verify(ctx, fullA); !ok || err != nil {
		t.Errorf("a key with settings does not verify: %v, %v", ok, err)
	}
}

func TestCreateChecksTheRateLimitAgainstThePlan(t *testing.T) {
	ctx := context.Background()
	s, pool, pro := newStore(t, "pro") // 600 a minute
	enterprise, free := newOrg(t, pool, "enterprise"), newOrg(t, pool, "free")
	for _, tc := range []struct {
		name   string
		org    string
		limit  int
		reason string // "" for accepted
	}{
		{"the plan's own", pro, 600, ""},
		{"one", pro, 1, ""},
		{"over the plan's", pro, 601, "must be from 1 to 600, the plan's api_rate_limit"},
		{"zero", pro, 0, "must be from 1 to 600, the plan's api_rate_limit"},
		{"negative", pro, -1, "must be from 1 to 600, the plan's api_rate_limit"},
		{"any on an unlimited plan", enterprise, 1_000_000_000, ""},
		{"zero on an unlimited plan", enterprise, 0, "must be a positive integer"},
		{"over 32 bits on an unlimited plan", enterprise, 1 << 31, "must be a positive integer"},
		{"any on a plan without API", free, 1, "must be null: the plan has no API access"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := count(t, pool, `SELECT count(*) FROM api_keys`)
			rec, _, err := s.Create(ctx, keystore.NewKey{OrgID: tc.org, Name: "k", Role: keystore.RoleViewer, RateLimit: intp(tc.limit)})
			if tc.reason == "" {
				if err != nil || rec.RateLimit == nil || *rec.RateLimit != tc.limit {
					t.Errorf("Create = %v, %v; want rate limit %d", rec.RateLimit, err, tc.limit)
				}
				return
			}
			wantSetting(t, err, "rate_limit", tc.reason)
			if after := count(t, pool, `SELECT count(*) FROM api_keys`); after != before {
				t.Errorf("a refused key was stored: %d keys, then %d", before, after)
			}
		})
	}
	// A bad list is refused the same way by Create, whoever built it.
	_, _, err := s.Create(ctx, keystore.NewKey{OrgID: pro, Name: "k", Role: keystore.RoleViewer,
		AllowedCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.1/8")}})
	wantSetting(t, err, "allowed_cidrs", "10.0.0.1/8 has bits set after its prefix length: write 10.0.0.0/8 for the network, or 10.0.0.1/32 for the one address")
}

func count(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// auditedChanges returns the changes of the key.updated events of keyID, oldest first,
// as their JSON.
func auditedChanges(t *testing.T, s *keystore.Store, org, keyID string) []string {
	t.Helper()
	events, err := s.Events(context.Background(), org, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range slices.Backward(events) {
		if e.Action != keystore.ActionUpdated || e.KeyID != keyID {
			continue
		}
		b, err := json.Marshal(e.Changes)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, e.Actor+" "+string(b))
	}
	return out
}

func TestUpdateChangesTheSettingsItSetsAndAuditsWhatChanged(t *testing.T) {
	ctx := context.Background()
	s, pool, org := newStore(t, "pro")
	k, full := create(t, s, keystore.NewKey{OrgID: org, Name: "k", Role: keystore.RoleEditor})
	steps := []struct {
		name   string
		u      keystore.Update
		limit  *int
		cidrs  []netip.Prefix
		change string // the event's changes, "" for none
	}{
		{"a rate limit", keystore.Update{SetRateLimit: true, RateLimit: intp(30)}, intp(30), nil,
			`{"rate_limit":{"from":null,"to":30}}`},
		{"networks, the limit left alone", keystore.Update{SetAllowedCIDRs: true, AllowedCIDRs: prefixes(t, "192.0.2.0/24", "2001:db8::/48")}, intp(30), prefixes(t, "192.0.2.0/24", "2001:db8::/48"),
			`{"allowed_cidrs":{"from":[],"to":["192.0.2.0/24","2001:db8::/48"]}}`},
		{"the same values again", keystore.Update{SetRateLimit: true, RateLimit: intp(30), SetAllowedCIDRs: true, AllowedCIDRs: prefixes(t, "192.0.2.0/24", "2001:db8::/48")}, intp(30), prefixes(t, "192.0.2.0/24", "2001:db8::/48"),
			""},
		{"both, back to the plan's and anywhere", keystore.Update{SetRateLimit: true, SetAllowedCIDRs: true}, nil, nil,
			`{"rate_limit":{"from":30,"to":null},"allowed_cidrs":{"from":["192.0.2.0/24","2001:db8::/48"],"to":[]}}`},
	}
	var want []string
	for _, st := range steps {
		rec, err := s.Update(ctx, org, k.ID, st.u, "user-1")
		if err != nil {
			t.Fatalf("%s: Update: %v", st.name, err)
		}
		wantCIDRs := st.cidrs
		if wantCIDRs == nil {
			wantCIDRs = []netip.Prefix{}
		}
		if !equalLimit(rec.RateLimit, st.limit) || !slices.Equal(rec.AllowedCIDRs, wantCIDRs) || rec.ID != k.ID || rec.Name != "k" {
			t.Errorf("%s: Update returned %+v", st.name, rec)
		}
		list, _ := s.List(ctx, org)
		if !equalLimit(list[0].RateLimit, st.limit) || !slices.Equal(list[0].AllowedCIDRs, wantCIDRs) {
			t.Errorf("%s: List has %v, %v", st.name, list[0].RateLimit, list[0].AllowedCIDRs)
		}
		if st.change != "" {
			want = append(want, "user-1 "+st.change)
		}
		if got := auditedChanges(t, s, org, k.ID); !slices.Equal(got, want) {
			t.Errorf("%s: audited %q, want %q", st.name, got, want)
		}
	}
	if _, ok, _ := s.Verify(ctx, full); !ok {
		t.Error("an updated key no longer verifies")
	}
	if n := count(t, pool, `SELECT count(*) FROM audit_events WHERE action = 'key.updated' AND changes IS NULL`); n != 0 {
		t.Errorf("%d key.updated events without changes", n)
	}
}

func equalLimit(a, b *int) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }

func TestUpdateRefusesAndChangesNothing(t *testing.T) {
	ctx := context.Background()
	s, pool, org := newStore(t, "pro")
	other := newOrg(t, pool, "pro")
	k, _ := create(t, s, keystore.NewKey{OrgID: org, Name: "k", Role: keystore.RoleEditor, RateLimit: intp(10), AllowedCIDRs: prefixes(t, "192.0.2.0/24")})
	foreign, _ := create(t, s, keystore.NewKey{OrgID: other, Name: "theirs", Role: keystore.RoleEditor})
	revoked, _ := create(t, s, keystore.NewKey{OrgID: org, Name: "gone", Role: keystore.RoleEditor})
	if _, err := s.Revoke(ctx, org, revoked.ID, "test"); err != nil {
		t.Fatal(err)
	}
	expired, _ := create(t, s, keystore.NewKey{OrgID: org, Name: "old", Role: keystore.RoleEditor})
	if _, err := pool.Exec(ctx, `UPDATE api_keys SET expires_at = now() - interval '1 second' WHERE key_id = $1`, expired.ID); err != nil {
		t.Fatal(err)
	}
	setLimit := keystore.Update{SetRateLimit: true, RateLimit: intp(20)}
	for _, tc := range []struct {
		name, org, keyID string
		u                keystore.Update
		check            func(t *testing.T, err error)
	}{
		{"nothing set", org, k.ID, keystore.Update{}, func(t *testing.T, err error) {
			if !errors.Is(err, keystore.ErrNoChange) {
				t.Errorf("error %v, want ErrNoChange", err)
			}
		}},
		{"over the plan's", org, k.ID, keystore.Update{SetRateLimit: true, RateLimit: intp(601), SetAllowedCIDRs: true}, func(t *testing.T, err error) {
			wantSetting(t, err, "rate_limit", "must be from 1 to 600, the plan's api_rate_limit")
		}},
		{"zero", org, k.ID, keystore.Update{SetRateLimit: true, RateLimit: intp(0)}, func(t *testing.T, err error) {
			wantSetting(t, err, "rate_limit", "must be from 1 to 600, the plan's api_rate_limit")
		}},
		{"a duplicate network", org, k.ID, keystore.Update{SetRateLimit: true, RateLimit: intp(5), SetAllowedCIDRs: true, AllowedCIDRs: prefixes(t, "10.0.0.0/8", "10.0.0.0/8")}, func(t *testing.T, err error) {
			wantSetting(t, err, "allowed_cidrs", "lists 10.0.0.0/8 more than once")
		}},
		{"a bad value and an unknown key", org, "BBBBBBBBBBBBBBBBBBBBBB", keystore.Update{SetRateLimit: true, RateLimit: intp(0)}, func(t *testing.T, err error) {
			wantSetting(t, err, "rate_limit", "must be from 1 to 600, the plan's api_rate_limit")
		}},
		{"another org's key", org, foreign.ID, setLimit, wantErr(keystore.ErrNotFound)},
		{"the key through the other org", other, k.ID, setLimit, wantErr(keystore.ErrNotFound)},
		{"an unknown key", org, "BBBBBBBBBBBBBBBBBBBBBB", setLimit, wantErr(keystore.ErrNotFound)},
		{"a malformed key id", org, "nope", setLimit, wantErr(keystore.ErrNotFound)},
		{"a revoked key", org, revoked.ID, setLimit, wantErr(keystore.ErrNotLive)},
		{"an expired key", org, expired.ID, setLimit, wantErr(keystore.ErrNotLive)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.Update(ctx, tc.org, tc.keyID, tc.u, "user-1")
			tc.check(t, err)
		})
	}
	if n := count(t, pool, `SELECT count(*) FROM audit_events WHERE action = 'key.updated'`); n != 0 {
		t.Errorf("%d key.updated events after refusals only", n)
	}
	var changed int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM api_keys WHERE rate_limit IS DISTINCT FROM CASE key_id WHEN $1 THEN 10 END
		OR allowed_cidrs <> CASE key_id WHEN $1 THEN '{192.0.2.0/24}'::cidr[] ELSE '{}' END`, k.ID).Scan(&changed); err != nil {
		t.Fatal(err)
	}
	if changed != 0 {
		t.Errorf("%d keys changed by refused updates", changed)
	}
}

func wantErr(want error) func(t *testing.T, err error) {
	return func(t *testing.T, err error) {
		t.Helper()
		if !errors.Is(err, want) {
			t.Errorf("error %v, want %v", err, want)
		}
	}
}

// TestTheRateLimitIsCheckedAgainstThePlanOfTheMomentOfTheWrite lowers the plan in a
// transaction that commits while a key's update waits: the update sees the lowered
// plan, not the one committed when it began.
func TestTheRateLimitIsCheckedAgainstThePlanOfTheMomentOfTheWrite(t *testing.T) {
	ctx := context.Background()
	s, pool, _ := newStore(t, "pro")
	org := newPlanOrg(t, pool, "team", 600)
	k, _ := create(t, s, keystore.NewKey{OrgID: org, Name: "k", Role: keystore.RoleEditor})
	for _, op := range []struct {
		name string
		do   func() error
	}{
		{"update", func() error {
			_, err := s.Update(ctx, org, k.ID, keystore.Update{SetRateLimit: true, RateLimit: intp(500)}, "user-1")
			return err
		}},
		{"create", func() error {
			_, _, err := s.Create(ctx, keystore.NewKey{OrgID: org, Name: "n", Role: keystore.RoleEditor, RateLimit: intp(500)})
			return err
		}},
	} {
		t.Run(op.name, func(t *testing.T) {
			if _, err := pool.Exec(ctx, `UPDATE plans SET api_rate_limit = 600 WHERE name = 'team'`); err != nil {
				t.Fatal(err)
			}
			lower := holdLocks(t, pool, `UPDATE plans SET api_rate_limit = 100 WHERE name = 'team'`)
			done := make(chan error, 1)
			go func() { done <- op.do() }()
			select {
			case err := <-done:
				t.Fatalf("the %s did not wait for the plan's change: %v", op.name, err)
			case <-time.After(300 * time.Millisecond):
			}
			if err := lower.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			wantSetting(t, <-done, "rate_limit", "must be from 1 to 100, the plan's api_rate_limit")
		})
	}
	if n := count(t, pool, `SELECT count(*) FROM api_keys WHERE rate_limit IS NOT NULL`); n != 0 {
		t.Errorf("%d keys got a rate limit over their plan's", n)
	}
}

func TestRollKeepsTheSettings(t *testing.T) {
	ctx := context.Background()
	s, pool, org := newStore(t, "pro")
	cidrs := prefixes(t, "192.0.2.0/24")
	k, _ := create(t, s, keystore.NewKey{OrgID: org, Name: "k", Role: keystore.RoleEditor, RateLimit: intp(7), AllowedCIDRs: cidrs})
	rolled, _, err := s.Roll(ctx, org, k.ID, 0, newUser(t, pool))
	if err != nil {
		t.Fatal(err)
	}
	if rolled.RateLimit == nil || *rolled.RateLimit != 7 || !slices.Equal(rolled.AllowedCIDRs, cidrs) {
		t.Errorf("the rolled key has rate limit %v, networks %v; want 7, %v", rolled.RateLimit, rolled.AllowedCIDRs, cidrs)
	}
}

func TestTheDatabaseRefusesSettingsOutsideTheRules(t *testing.T) {
	ctx := context.Background()
	s, pool, org := newStore(t, "pro")
	k, _ := create(t, s, keystore.NewKey{OrgID: org, Name: "k", Role: keystore.RoleEditor})
	many := make([]string, 33)
	for i := range many {
		many[i] = fmt.Sprintf("10.%d.0.0/16", i)
	}
	for _, sql := range []string{
		`UPDATE api_keys SET rate_limit = 0 WHERE key_id = $1`,
		`UPDATE api_keys SET rate_limit = -1 WHERE key_id = $1`,
		`UPDATE api_keys SET allowed_cidrs = NULL WHERE key_id = $1`,
		`UPDATE api_keys SET allowed_cidrs = '{NULL}' WHERE key_id = $1`,
		`UPDATE api_keys SET allowed_cidrs = '{10.0.0.1/8}' WHERE key_id = $1`,
		`UPDATE api_keys SET allowed_cidrs = '{` + strings.Join(many, ",") + `}' WHERE key_id = $1`,
		`UPDATE plans SET org_rate_limit = 0 WHERE $1 <> ''`,
		`UPDATE plans SET org_rate_limit = -2 WHERE $1 <> ''`,
		`UPDATE plans SET api_requests_per_month = 0 WHERE $1 <> ''`,
		`INSERT INTO audit_events (org_id, action, key_id, actor) SELECT org_id, 'key.updated', key_id, 'x' FROM api_keys WHERE key_id = $1`,
		`INSERT INTO audit_events (org_id, action, key_id, actor, changes) SELECT org_id, 'key.revoked', key_id, 'x', '{}' FROM api_keys WHERE key_id = $1`,
		`INSERT INTO audit_events (org_id, action, key_id, actor, changes) SELECT org_id, 'key.updated', key_id, 'x', '[]' FROM api_keys WHERE key_id = $1`,
	} {
		if _, err := pool.Exec(ctx, sql, k.ID); err == nil {
			t.Errorf("the database accepted %s", sql)
		}
	}
}
