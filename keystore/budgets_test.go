package keystore_test

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"

	"github.com/keygate/keygate/keystore"
)

// sameKey reports whether a and b are the same key with the same budgets and
// networks. An empty and a nil list of networks are the same: anywhere.
func sameKey(a, b keystore.Key) bool {
	return a.ID == b.ID && a.OrgID == b.OrgID && a.Role == b.Role && a.RateLimit == b.RateLimit &&
		a.OrgRateLimit == b.OrgRateLimit && a.MonthlyQuota == b.MonthlyQuota &&
		slices.Equal(a.AllowedCIDRs, b.AllowedCIDRs)
}

// TestVerifyFindsTheKeysBudgetsAndNetworks: the lookup returns the key's minute limit
// (the smaller of its own and its plan's), the plan's organisation budgets and the
// key's networks, through the store and the batcher alike.
func TestVerifyFindsTheKeysBudgetsAndNetworks(t *testing.T) {
	ctx := context.Background()
	s, pool, _ := newStore(t, "pro")
	var plans []string
	for _, tc := range []struct {
		name                string
		plan, own, wantRate int // plan's api_rate_limit; the key's own (0: none)
	}{
		{"the plan's limit", 600, 0, 600},
		{"a smaller own limit", 600, 20, 20},
		{"an own limit on an unlimited plan", -1, 5000, 5000},
		{"an unlimited plan", -1, 0, -1},
		{"a plan lowered under the own limit", 600, 600, 50}, // the plan goes to 50 below
		{"no API access, whatever the key says", 600, 20, 0}, // the plan goes to 0 below
	} {
		plan := "budget" + string(rune('a'+len(plans)))
		plans = append(plans, plan)
		t.Run(tc.name, func(t *testing.T) {
			org := newPlanOrg(t, pool, plan, tc.plan)
			if _, err := pool.Exec(ctx, `UPDATE plans SET org_rate_limit = 1000, api_requests_per_month = 100000 WHERE name = $1`, plan); err != nil {
				t.Fatal(err)
			}
			nk := keystore.NewKey{OrgID: org, Name: "k", Role: keystore.RoleViewer,
				AllowedCIDRs: prefixes(t, "192.0.2.0/24", "2001:db8::/32")}
			if tc.own > 0 {
				nk.RateLimit = intp(tc.own)
			}
			rec, full := create(t, s, nk)
			if tc.wantRate != tc.plan {
				if _, err := pool.Exec(ctx, `UPDATE plans SET api_rate_limit = $2 WHERE name = $1 AND $2 <> -1`, plan, min(tc.wantRate, tc.plan)); err != nil {
					t.Fatal(err)
				}
			}
			want := keystore.Key{ID: rec.ID, OrgID: org, Role: keystore.RoleViewer, RateLimit: tc.wantRate,
				OrgRateLimit: 1000, MonthlyQuota: 100000, AllowedCIDRs: nk.AllowedCIDRs}
			for kind, v := range verifiers(s) {
				k, ok, err := v.Verify(ctx, full)
				if err != nil || !ok || !sameKey(k, want) {
					t.Errorf("%s: Verify = %+v, %v, %v; want %+v", kind, k, ok, err, want)
				}
			}
		})
	}
}

// TestKeysLookedUpTogetherKeepTheirOwnNetworks: the keys of one batch each get their own
// list of networks, none another's.
func TestKeysLookedUpTogetherKeepTheirOwnNetworks(t *testing.T) {
	ctx := context.Background()
	s, _, org := newStore(t, "pro")
	b := keystore.NewBatcher(s, keystore.BatcherOptions{Lanes: 1})
	const n = 16
	full := make([]string, n)
	want := make([][]netip.Prefix, n)
	for i := range n {
		want[i] = prefixes(t, fmt.Sprintf("10.%d.0.0/16", i))
		if i%4 == 0 {
			want[i] = nil // anywhere
		}
		_, full[i] = create(t, s, keystore.NewKey{OrgID: org, Name: "k", Role: keystore.RoleAdmin, AllowedCIDRs: want[i]})
	}
	for range 20 {
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				k, ok, err := b.Verify(ctx, full[i])
				if err != nil || !ok || !slices.Equal(k.AllowedCIDRs, want[i]) {
					t.Errorf("key %d: Verify = %v, %v, networks %v; want %v", i, ok, err, k.AllowedCIDRs, want[i])
				}
			})
		}
		wg.Wait()
	}
}

func TestAllowsAddr(t *testing.T) {
	k := keystore.Key{AllowedCIDRs: prefixes(t, "192.0.2.0/24", "2001:db8::/32")}
	for addr, want := range map[string]bool{
		"192.0.2.7":           true,
		"::ffff:192.0.2.7":    true, // IPv4-mapped, as a proxy may forward it
		"192.0.3.1":           false,
		"2001:db8::1":         true,
		"2001:db9::1":         false,
		"::ffff:198.51.100.1": false,
	} {
		if got := k.AllowsAddr(netip.MustParseAddr(addr)); got != want {
			t.Errorf("AllowsAddr(%s) = %v, want %v", addr, got, want)
		}
	}
	anywhere := keystore.Key{}
	if !anywhere.AllowsAddr(netip.MustParseAddr("203.0.113.9")) || !anywhere.AllowsAddr(netip.Addr{}) {
		t.Error("a key without networks refuses an address")
	}
}
