package keystore_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/keystore/keystoretest"
)

// TestAKeysScopesFollowTheVocabularysOrder: a key is created with its scopes in the
// vocabulary's order, whatever the order given, so that two lists of the same scopes
// are equal; a scope the operator added takes its place after the others.
func TestAKeysScopesFollowTheVocabularysOrder(t *testing.T) {
	ctx := context.Background()
	s, pool, org := newStore(t, "pro")
	if _, err := pool.Exec(ctx, `INSERT INTO scopes (name) VALUES ('reports:read')`); err != nil {
		t.Fatal(err)
	}
	vocab, err := s.Scopes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []keystore.Scope{{"monitors:read", "List and read monitors"}, {"monitors:write", "Create and change monitors"},
		{"monitors:delete", "Delete monitors"}, {"reports:read", ""}}; !slices.Equal(vocab, want) {
		t.Errorf("Scopes = %q, want %q", vocab, want)
	}
	for _, tc := range []struct {
		name string
		in   []string
		want []string
	}{
		{"nil is unscoped", nil, nil},
		{"one", []string{"monitors:write"}, []string{"monitors:write"}},
		{"out of order", []string{"monitors:delete", "monitors:read"}, []string{"monitors:read", "monitors:delete"}},
		{"the operator's", []string{"reports:read", "monitors:write"}, []string{"monitors:write", "reports:read"}},
		{"every scope", []string{"reports:read", "monitors:write", "monitors:delete", "monitors:read"},
			[]string{"monitors:read", "monitors:write", "monitors:delete", "reports:read"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec, _ := create(t, s, keystore.NewKey{OrgID: org, Name: "k", Role: keystore.RoleEditor, Scopes: tc.in})
			if (rec.Scopes == nil) != (tc.want == nil) || !slices.Equal(rec.Scopes, tc.want) {
				t.Errorf("Create with %q = %#v; want %#v", tc.in, rec.Scopes, tc.want)
			}
		})
	}
}

func TestParseScopesRefusesWhatCannotBeMeant(t *testing.T) {
	for _, tc := range []struct {
		name   string
		in     []string
		reason string
	}{
		{"empty", []string{}, "must list at least one scope, or be null for everything the role allows"},
		{"another case", []string{"Monitors:Read"}, `"Monitors:Read" is not a scope: a scope matches [a-z][a-z0-9_.:-]*`},
		{"white space", []string{" monitors:read"}, `" monitors:read" is not a scope: a scope matches [a-z][a-z0-9_.:-]*`},
		{"empty string", []string{""}, `"" is not a scope: a scope matches [a-z][a-z0-9_.:-]*`},
		{"too long", []string{"a" + strings.Repeat("b", keystore.MaxScopeLen)}, `"a` + strings.Repeat("b", keystore.MaxScopeLen) +
			`" is not a scope: a scope matches [a-z][a-z0-9_.:-]*`},
		{"twice", []string{"monitors:read", "monitors:write", "monitors:read"}, "lists monitors:read more than once"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := keystore.ParseScopes(tc.in)
			if got != nil {
				t.Errorf("ParseScopes(%q) = %q, want nil", tc.in, got)
			}
			wantSetting(t, err, "scopes", tc.reason)
		})
	}
}

// TestScopesAreStoredListedVerifiedAndRolled: a key's scopes are what Create, List,
// both verifiers and a roll return, in the vocabulary's order; a key without scopes
// has nil everywhere.
func TestScopesAreStoredListedVerifiedAndRolled(t *testing.T) {
	ctx := context.Background()
	s, pool, org := newStore(t, "pro")
	want := []string{"monitors:read", "monitors:write"}
	scoped, fullScoped := create(t, s, keystore.NewKey{OrgID: org, Name: "ci", Role: keystore.RoleEditor,
		Scopes: []string{"monitors:write", "monitors:read"}})
	plain, fullPlain := create(t, s, keystore.NewKey{OrgID: org, Name: "plain", Role: keystore.RoleEditor})
	if !slices.Equal(scoped.Scopes, want) || plain.Scopes != nil {
		t.Errorf("Create returned scopes %#v and %#v; want %q and nil", scoped.Scopes, plain.Scopes, want)
	}
	list, err := s.List(ctx, org)
	if err != nil || len(list) != 2 {
		t.Fatalf("List = %v, %v", list, err)
	}
	if !slices.Equal(list[0].Scopes, want) || list[1].Scopes != nil {
		t.Errorf("List has scopes %#v and %#v; want %q and nil", list[0].Scopes, list[1].Scopes, want)
	}
	for kind, v := range verifiers(s) {
		k, ok, err := v.Verify(ctx, fullScoped)
		if err != nil || !ok || !slices.Equal(k.Scopes, want) {
			t.Errorf("%s: Verify of the scoped key = %v, %v, scopes %#v; want %q", kind, ok, err, k.Scopes, want)
		}
		k, ok, err = v.Verify(ctx, fullPlain)
		if err != nil || !ok || k.Scopes != nil {
			t.Errorf("%s: Verify of the unscoped key = %v, %v, scopes %#v; want nil", kind, ok, err, k.Scopes)
		}
	}
	actor := newUser(t, pool)
	rolled, fullRolled, err := s.Roll(ctx, org, scoped.ID, 0, actor)
	if err != nil || !slices.Equal(rolled.Scopes, want) {
		t.Fatalf("Roll = scopes %#v, %v; want %q", rolled.Scopes, err, want)
	}
	if k, ok, _ := s.Verify(ctx, fullRolled); !ok || !slices.Equal(k.Scopes, want) {
		t.Errorf("the rolled key verifies as %v with scopes %#v; want %q", ok, k.Scopes, want)
	}
	rolledPlain, _, err := s.Roll(ctx, org, plain.ID, 0, actor)
	if err != nil || rolledPlain.Scopes != nil {
		t.Errorf("Roll of the unscoped key = scopes %#v, %v; want nil", rolledPlain.Scopes, err)
	}
}

// TestUpdateChangesTheScopesFromTheNextLookupAndAuditsThem: each change of a key's
// scopes is seen by the next verification and audited with its before and after; the
// same scopes again change nothing and audit nothing.
func TestUpdateChangesTheScopesFromTheNextLookupAndAuditsThem(t *testing.T) {
	ctx := context.Background()
	s, _, org := newStore(t, "pro")
	k, full := create(t, s, keystore.NewKey{OrgID: org, Name: "k", Role: keystore.RoleAdmin, RateLimit: intp(30)})
	b := keystore.NewBatcher(s, keystore.BatcherOptions{Lanes: 1})
	steps := []struct {
		name   string
		u      keystore.Update
		scopes []string
		change string // the event's changes, "" for none
	}{
		{"scoped", keystore.Update{SetScopes: true, Scopes: []string{"monitors:read"}}, []string{"monitors:read"},
			`{"scopes":{"from":null,"to":["monitors:read"]}}`},
		{"the same again", keystore.Update{SetScopes: true, Scopes: []string{"monitors:read"}}, []string{"monitors:read"},
			""},
		{"widened, out of order", keystore.Update{SetScopes: true, Scopes: []string{"monitors:delete", "monitors:read"}}, []string{"monitors:read", "monitors:delete"},
			`{"scopes":{"from":["monitors:read"],"to":["monitors:read","monitors:delete"]}}`},
		{"with the rate limit", keystore.Update{SetRateLimit: true, RateLimit: intp(10), SetScopes: true, Scopes: []string{"monitors:write"}}, []string{"monitors:write"},
			`{"rate_limit":{"from":30,"to":10},"scopes":{"from":["monitors:read","monitors:delete"],"to":["monitors:write"]}}`},
		{"the rate limit alone leaves them", keystore.Update{SetRateLimit: true, RateLimit: intp(20)}, []string{"monitors:write"},
			`{"rate_limit":{"from":10,"to":20}}`},
		{"back to everything the role allows", keystore.Update{SetScopes: true}, nil,
			`{"scopes":{"from":["monitors:write"],"to":null}}`},
	}
	var want []string
	for _, st := range steps {
		rec, err := s.Update(ctx, org, k.ID, st.u, "user-1")
		if err != nil {
			t.Fatalf("%s: Update: %v", st.name, err)
		}
		if (rec.Scopes == nil) != (st.scopes == nil) || !slices.Equal(rec.Scopes, st.scopes) {
			t.Errorf("%s: Update returned scopes %#v, want %#v", st.name, rec.Scopes, st.scopes)
		}
		got, ok, err := b.Verify(ctx, full)
		if err != nil || !ok || (got.Scopes == nil) != (st.scopes == nil) || !slices.Equal(got.Scopes, st.scopes) {
			t.Errorf("%s: the next Verify = %v, %v, scopes %#v; want %#v", st.name, ok, err, got.Scopes, st.scopes)
		}
		if st.change != "" {
			want = append(want, "user-1 "+st.change)
		}
		if got := auditedChanges(t, s, org, k.ID); !slices.Equal(got, want) {
			t.Errorf("%s: audited %q, want %q", st.name, got, want)
		}
	}
}

func TestBadScopesAreRefusedAndChangeNothing(t *testing.T) {
	ctx := context.Background()
	s, pool, org := newStore(t, "pro")
	k, _ := create(t, s, keystore.NewKey{OrgID: org, Name: "k", Role: keystore.RoleEditor, Scopes: []string{"monitors:read"}})
	const unknown = `"monitors:admin" is not a scope: use monitors:read, monitors:write or monitors:delete`
	_, _, err := s.Create(ctx, keystore.NewKey{OrgID: org, Name: "n", Role: keystore.RoleEditor, Scopes: []string{"monitors:admin"}})
	wantSetting(t, err, "scopes", unknown)
	_, _, err = s.Create(ctx, keystore.NewKey{OrgID: org, Name: "n", Role: keystore.RoleEditor, Scopes: []string{}})
	wantSetting(t, err, "scopes", "must list at least one scope, or be null for everything the role allows")
	_, err = s.Update(ctx, org, k.ID, keystore.Update{SetRateLimit: true, RateLimit: intp(5), SetScopes: true, Scopes: []string{"monitors:admin"}}, "user-1")
	wantSetting(t, err, "scopes", unknown)
	_, err = s.Update(ctx, org, k.ID, keystore.Update{SetScopes: true, Scopes: []string{}}, "user-1")
	wantSetting(t, err, "scopes", "must list at least one scope, or be null for everything the role allows")
	if n := count(t, pool, `SELECT count(*) FROM api_keys`); n != 1 {
		t.Errorf("%d keys after refused creations, want 1", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM api_keys WHERE scopes = '{monitors:read}' AND rate_limit IS NULL`); n != 1 {
		t.Error("a refused update changed the key")
	}
	if n := count(t, pool, `SELECT count(*) FROM audit_events WHERE action = 'key.updated'`); n != 0 {
		t.Errorf("%d key.updated events after refusals only", n)
	}
	for _, sql := range []string{
		`UPDATE api_keys SET scopes = '{}' WHERE key_id = $1`,
		`UPDATE api_keys SET scopes = '{NULL}' WHERE key_id = $1`,
		`UPDATE api_keys SET scopes = '{monitors:read,NULL}' WHERE key_id = $1`,
	} {
		if _, err := pool.Exec(ctx, sql, k.ID); err == nil {
			t.Errorf("the database accepted %s", sql)
		}
	}
}

// TestKeysLookedUpTogetherKeepTheirOwnScopes: the keys of one batch each get their own
// scopes, none another's, and an unscoped key's stay nil.
func TestKeysLookedUpTogetherKeepTheirOwnScopes(t *testing.T) {
	ctx := context.Background()
	s, _, org := newStore(t, "pro")
	b := keystore.NewBatcher(s, keystore.BatcherOptions{Lanes: 1})
	const n = 16
	full := make([]string, n)
	want := make([][]string, n)
	for i := range n {
		if i%4 != 0 { // every fourth key unscoped
			want[i] = []string{[]string{keystore.ScopeMonitorsRead, keystore.ScopeMonitorsWrite, keystore.ScopeMonitorsDelete}[i%3]}
		}
		_, full[i] = create(t, s, keystore.NewKey{OrgID: org, Name: "k", Role: keystore.RoleAdmin, Scopes: want[i]})
	}
	for range 20 {
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				k, ok, err := b.Verify(ctx, full[i])
				if err != nil || !ok || (k.Scopes == nil) != (want[i] == nil) || !slices.Equal(k.Scopes, want[i]) {
					t.Errorf("key %d: Verify = %v, %v, scopes %#v; want %#v", i, ok, err, k.Scopes, want[i])
				}
			})
		}
		wg.Wait()
	}
	if st := b.Stats(); st.Lookups <= st.Queries {
		t.Errorf("no batch looked up more than one key (%d queries, %d lookups): the test proved nothing", st.Queries, st.Lookups)
	}
}

// TestAKeyWrittenByAReleaseWithoutScopesIsUnscoped writes a key as a release before
// scopes does, naming none of the new column: the migration adds it without a default,
// so the key has no scopes, and it is listed and verified as everything its role
// allows.
func TestAKeyWrittenByAReleaseWithoutScopesIsUnscoped(t *testing.T) {
	ctx := context.Background()
	s, pool, org := newStore(t, "pro")
	full, keyID, secret, err := keystoretest.Format(t, "mon").Generate()
	if err != nil {
		t.Fatal(err)
	}
	sum := keystore.HashSecret(secret)
	if _, err := pool.Exec(ctx, `INSERT INTO api_keys (key_id, org_id, name, role, secret_hash, rate_limit, allowed_cidrs)
VALUES ($1, $2, 'old', 'Editor', $3, NULL, '{}')`, keyID, org, sum[:]); err != nil {
		t.Fatal(err)
	}
	list, err := s.List(ctx, org)
	if err != nil || len(list) != 1 || list[0].Scopes != nil {
		t.Fatalf("List = %+v, %v; want the key without scopes", list, err)
	}
	for kind, v := range verifiers(s) {
		got, ok, err := v.Verify(ctx, full)
		if err != nil || !ok || got.Scopes != nil {
			t.Errorf("%s: Verify of the old release's key = %v, %v, scopes %#v; want nil", kind, ok, err, got.Scopes)
		}
	}
}
