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
