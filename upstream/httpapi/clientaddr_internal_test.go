package httpapi

import (
	"net/netip"
	"testing"
)

func TestThrottleClient(t *testing.T) {
	for in, want := range map[string]string{
		"203.0.113.7":                   "203.0.113.7",
		"::1":                           "::1",
		"2001:db8:1:2:3:4:5:6":          "2001:db8:1:2::/64",
		"2001:db8:1:2::":                "2001:db8:1:2::/64",
		"fe80::1":                       "fe80::/64",
		"2001:db8:ffff:ffff:ffff::ffff": "2001:db8:ffff:ffff::/64",
	} {
		if got := throttleClient(netip.MustParseAddr(in)); got != want {
			t.Errorf("throttleClient(%s) = %q, want %q", in, got, want)
		}
	}
}
