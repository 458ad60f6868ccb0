package keystore

import (
	"fmt"
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

func TestSplitPresentsEachIDAndEachDigestOnce(t *testing.T) {
	sum := func(s string) [32]byte { return HashSecret(s) }
	var many []probe // beyond the scan, through the map
	for i := range 100 {
		many = append(many, probe{fmt.Sprint(i % 40), sum(fmt.Sprint(i % 30))})
	}
	for _, tc := range []struct {
		name   string
		probes []probe
		ids    int
		sums   int
	}{
		{"one", []probe{{"a", sum("x")}}, 1, 1},
		{"one key from many requests", []probe{{"a", sum("x")}, {"a", sum("x")}, {"a", sum("x")}}, 1, 1},
		{"one id, two secrets", []probe{{"a", sum("x")}, {"a", sum("y")}}, 1, 2},
		{"two keys", []probe{{"a", sum("x")}, {"b", sum("y")}, {"a", sum("x")}}, 2, 2},
		{"many", many, 40, 30},
	} {
		ids, sums := split(tc.probes)
		if len(ids) != tc.ids || len(sums) != tc.sums {
			t.Errorf("%s: %d ids and %d digests, want %d and %d", tc.name, len(ids), len(sums), tc.ids, tc.sums)
		}
		for _, p := range tc.probes {
			if !slices.Contains(ids, p.id) || !slices.ContainsFunc(sums, func(s []byte) bool { return string(s) == string(p.sum[:]) }) {
				t.Errorf("%s: %q or its digest is not presented", tc.name, p.id)
			}
		}
	}
}
