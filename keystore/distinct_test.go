package keystore

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
)

func TestDistinctKeepsFirstAppearancesInOrder(t *testing.T) {
	many := make([]string, 0, 100) // beyond the scan, through the map
	var manyWant []string
	for i := range 100 {
		many = append(many, fmt.Sprint(i%40))
		if i < 40 {
			manyWant = append(manyWant, fmt.Sprint(i))
		}
	}
	for _, tc := range []struct {
		name     string
		ids, out []string
	}{
		{"one", []string{"a"}, []string{"a"}},
		{"repeats", []string{"b", "a", "b", "c", "a"}, []string{"b", "a", "c"}},
		{"all the same", []string{"a", "a", "a"}, []string{"a"}},
		{"many", many, manyWant},
	} {
		if got := distinct(slices.Clone(tc.ids)); !slices.Equal(got, tc.out) {
			t.Errorf("%s: distinct(%v) = %v, want %v", tc.name, tc.ids, got, tc.out)
		}
	}
}

func TestSplitPresentsEachIDAndEachPairOfDigestAndAddressOnce(t *testing.T) {
	sum := func(s string) [32]byte { return HashSecret(s) }
	p := func(id, secret string) probe { return probe{id: id, sum: sum(secret)} }
	from := func(id, secret, addr string) probe {
		return probe{id: id, sum: sum(secret), addr: netip.MustParseAddr(addr)}
	}
	var many []probe // beyond the scan, through the map
	for i := range 100 {
		many = append(many, from(fmt.Sprint(i%40), fmt.Sprint(i%30), fmt.Sprintf("10.0.0.%d", i%2)))
	}
	for _, tc := range []struct {
		name   string
		probes []probe
		ids    int
		pairs  int
	}{
		{"one", []probe{p("a", "x")}, 1, 1},
		{"one key from many requests", []probe{p("a", "x"), p("a", "x"), p("a", "x")}, 1, 1},
		{"one id, two secrets", []probe{p("a", "x"), p("a", "y")}, 1, 2},
		{"two keys", []probe{p("a", "x"), p("b", "y"), p("a", "x")}, 2, 2},
		{"one key from two addresses", []probe{from("a", "x", "10.0.0.1"), from("a", "x", "10.0.0.2"), from("a", "x", "10.0.0.1")}, 1, 2},
		{"many", many, 40, 30},
	} {
		ids, sums, addrs := split(tc.probes)
		if len(ids) != tc.ids || len(sums) != tc.pairs || len(addrs) != tc.pairs {
			t.Errorf("%s: %d ids, %d digests and %d addresses, want %d, %d and %d",
				tc.name, len(ids), len(sums), len(addrs), tc.ids, tc.pairs, tc.pairs)
			continue
		}
		for _, pr := range tc.probes {
			paired := false
			for i := range sums {
				paired = paired || string(sums[i]) == string(pr.sum[:]) && addrs[i] == pr.addr
			}
			if !slices.Contains(ids, pr.id) || !paired {
				t.Errorf("%s: %q or its digest and address is not presented", tc.name, pr.id)
			}
		}
	}
}
