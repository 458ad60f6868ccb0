package keystore_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/keygate/keygate/keystore"
)

// TestVerifyFindsTheKeysWindows: the lookup gives each of a key's windows beside its
// minute the smaller of its own limit and its plan's, -1 where neither has one,
// through the store and the batcher alike: the same query, no other.
func TestVerifyFindsTheKeysWindows(t *testing.T) {
	ctx := context.Background()
	s, pool, _ := newStore(t, "pro")
	for i, tc := range []struct {
		name      string
		plan, own [keystore.NumWindows]int // 0: none, -1 in the plan's column
		lower     int                      // the plan's second after the key is made; 0: unchanged
		want      [keystore.NumWindows]int
	}{
		{"none anywhere", [3]int{}, [3]int{}, 0, [3]int{-1, -1, -1}},
		{"the plan's", [3]int{20, 0, 100000}, [3]int{}, 0, [3]int{20, -1, 100000}},
		{"smaller own limits", [3]int{20, 500, 100000}, [3]int{2, 0, 40}, 0, [3]int{2, 500, 40}},
		{"own limits where the plan has none", [3]int{}, [3]int{5, 60, 0}, 0, [3]int{5, 60, -1}},
		{"a plan lowered under the own limit", [3]int{20, 0, 0}, [3]int{10, 0, 0}, 3, [3]int{3, -1, -1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plan := fmt.Sprintf("windows%d", i)
			org := newPlanOrg(t, pool, plan, 600)
			if _, err := pool.Exec(ctx, `UPDATE plans SET api_rate_limit_per_second = $2, api_rate_limit_per_hour = $3,
	api_rate_limit_per_day = $4 WHERE name = $1`, plan, none(tc.plan[0]), none(tc.plan[1]), none(tc.plan[2])); err != nil {
				t.Fatal(err)
			}
			nk := keystore.NewKey{OrgID: org, Name: "k", Role: keystore.RoleViewer}
			for w, n := range tc.own {
				if n > 0 {
					nk.WindowLimits[w] = intp(n)
				}
			}
			rec, full := create(t, s, nk)
			if tc.lower > 0 {
				if _, err := pool.Exec(ctx, `UPDATE plans SET api_rate_limit_per_second = $2 WHERE name = $1`, plan, tc.lower); err != nil {
					t.Fatal(err)
				}
			}
			for kind, v := range verifiers(s) {
				k, ok, err := v.Verify(ctx, full)
				if err != nil || !ok || k.ID != rec.ID || k.Windows != tc.want || k.RateLimit != 600 {
					t.Errorf("%s: Verify = %+v, %v, %v; want windows %v", kind, k, ok, err, tc.want)
				}
			}
		})
	}
}

// none is n, or -1 (none) for 0.
func none(n int) int {
	if n == 0 {
		return -1
	}
	return n
}

// TestAKeysWindowsAreCheckedStoredAndAudited: a key's own limits in its windows are
// checked against its plan's at creation and in an update, each from 1 to the plan's
// (any positive number where the plan has none), returned by List, changed by Update
// with each change audited, and kept by a roll.
func TestAKeysWindowsAreCheckedStoredAndAudited(t *testing.T) {
	ctx := context.Background()
	s, pool, _ := newStore(t, "pro")
	org := newPlanOrg(t, pool, "burst", 600)
	if _, err := pool.Exec(ctx, `UPDATE plans SET api_rate_limit_per_second = 50, api_rate_limit_per_day = 100000 WHERE name = 'burst'`); err != nil {
		t.Fatal(err)
	}
	free := newOrg(t, pool, "free")
	for _, tc := range []struct {
		name   string
		org    string
		w      keystore.Window
		limit  int
		field  string
		reason string // "" for accepted
	}{
		{"the plan's own second", org, keystore.PerSecond, 50, "rate_limit_per_second", ""},
		{"a second over the plan's", org, keystore.PerSecond, 51, "rate_limit_per_second", "must be from 1 to 50, the plan's api_rate_limit_per_second"},
		{"a zero day", org, keystore.PerDay, 0, "rate_limit_per_day", "must be from 1 to 100000, the plan's api_rate_limit_per_day"},
		{"any hour where the plan has none", org, keystore.PerHour, 1_000_000, "rate_limit_per_hour", ""},
		{"a zero hour where the plan has none", org, keystore.PerHour, 0, "rate_limit_per_hour", "must be a positive integer"},
		{"any window on a plan without API", free, keystore.PerDay, 5, "rate_limit_per_day", "must be null: the plan has no API access"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := count(t, pool, `SELECT count(*) FROM api_keys`)
			nk := keystore.NewKey{OrgID: tc.org, Name: "k", Role: keystore.RoleViewer}
			nk.WindowLimits[tc.w] = intp(tc.limit)
			rec, _, err := s.Create(ctx, nk)
			if tc.reason == "" {
				if err != nil || !equalLimit(rec.WindowLimits[tc.w], intp(tc.limit)) {
					t.Errorf("Create = %+v, %v; want %s %d", rec.WindowLimits, err, tc.field, tc.limit)
				}
				return
			}
			wantSetting(t, err, tc.field, tc.reason)
			if after := count(t, pool, `SELECT count(*) FROM api_keys`); after != before {
				t.Errorf("a refused key was stored: %d keys, then %d", before, after)
			}
		})
	}

	k, _ := create(t, s, keystore.NewKey{OrgID: org, Name: "windows", Role: keystore.RoleEditor,
		WindowLimits: keystore.WindowLimits{keystore.PerSecond: intp(2)}})
	user := newUser(t, pool)
	for _, st := range []struct {
		name   string
		u      keystore.Update
		want   keystore.WindowLimits
		change string // "" for none
	}{
		{"a day, the second left alone",
			keystore.Update{SetWindowLimits: [3]bool{keystore.PerDay: true}, WindowLimits: keystore.WindowLimits{keystore.PerDay: intp(40)}},
			keystore.WindowLimits{intp(2), nil, intp(40)}, `{"rate_limit_per_day":{"from":null,"to":40}}`},
		{"the same again", keystore.Update{SetWindowLimits: [3]bool{keystore.PerDay: true}, WindowLimits: keystore.WindowLimits{keystore.PerDay: intp(40)}},
			keystore.WindowLimits{intp(2), nil, intp(40)}, ""},
		{"the second back to the plan's, an hour and the minute",
			keystore.Update{SetRateLimit: true, RateLimit: intp(30), SetWindowLimits: [3]bool{true, true, false},
				WindowLimits: keystore.WindowLimits{nil, intp(900), nil}},
			keystore.WindowLimits{nil, intp(900), intp(40)},
			`{"rate_limit":{"from":null,"to":30},"rate_limit_per_second":{"from":2,"to":null},"rate_limit_per_hour":{"from":null,"to":900}}`},
	} {
		rec, err := s.Update(ctx, org, k.ID, st.u, user)
		if err != nil || !equalLimits(rec.WindowLimits, st.want) {
			t.Fatalf("%s: Update = %v, %v; want %v", st.name, rec.WindowLimits, err, st.want)
		}
		list, _ := s.List(ctx, org)
		if got := list[len(list)-1]; got.ID != k.ID || !equalLimits(got.WindowLimits, st.want) {
			t.Errorf("%s: List has %+v", st.name, got)
		}
		got := auditedChanges(t, s, org, k.ID)
		if last := ""; st.change != "" {
			if len(got) > 0 {
				last = got[len(got)-1]
			}
			if last != user+" "+st.change {
				t.Errorf("%s: audited %q, want %q last", st.name, got, st.change)
			}
		}
	}
	if got := auditedChanges(t, s, org, k.ID); len(got) != 2 {
		t.Errorf("audited %q; want the two updates that changed something", got)
	}
	// Over the plan's in an update: refused, nothing changed.
	_, err := s.Update(ctx, org, k.ID, keystore.Update{SetWindowLimits: [3]bool{true, false, false},
		WindowLimits: keystore.WindowLimits{intp(51), nil, nil}}, user)
	wantSetting(t, err, "rate_limit_per_second", "must be from 1 to 50, the plan's api_rate_limit_per_second")
	rolled, _, err := s.Roll(ctx, org, k.ID, 0, user)
	if err != nil || !equalLimits(rolled.WindowLimits, keystore.WindowLimits{nil, intp(900), intp(40)}) {
		t.Errorf("the rolled key's windows: %v, %v; want the key's", rolled.WindowLimits, err)
	}
}

func equalLimits(a, b keystore.WindowLimits) bool {
	return slices.EqualFunc(a[:], b[:], equalLimit)
}

// TestTheDatabaseRefusesWindowsOutsideTheRules: no plan's window is 0 or below -1,
// no key's own is 0 or negative.
func TestTheDatabaseRefusesWindowsOutsideTheRules(t *testing.T) {
	ctx := context.Background()
	s, pool, org := newStore(t, "pro")
	k, _ := create(t, s, keystore.NewKey{OrgID: org, Name: "k", Role: keystore.RoleEditor})
	for _, sql := range []string{
		`UPDATE api_keys SET rate_limit_per_second = 0 WHERE key_id = $1`,
		`UPDATE api_keys SET rate_limit_per_hour = -1 WHERE key_id = $1`,
		`UPDATE api_keys SET rate_limit_per_day = 0 WHERE key_id = $1`,
		`UPDATE plans SET api_rate_limit_per_second = 0 WHERE $1 <> ''`,
		`UPDATE plans SET api_rate_limit_per_hour = -2 WHERE $1 <> ''`,
		`UPDATE plans SET api_rate_limit_per_day = 0 WHERE $1 <> ''`,
	} {
		if _, err := pool.Exec(ctx, sql, k.ID); err == nil {
			t.Errorf("the database accepted %s", sql)
		}
	}
}
