package clientip

import (
	"net/netip"
	"testing"
)

// TestResolve: the client is the connection's peer unless the peer is trusted; then
// the rightmost X-Forwarded-For entry that is not, across the header's fields. An
// entry that cannot be read, or a header of trusted proxies only, leaves the peer.
func TestResolve(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}
	peer := netip.MustParseAddr("127.0.0.1")
	for _, tc := range []struct {
		name        string
		peerTrusted bool
		values      []string
		want        string
	}{
		{"an untrusted peer", false, []string{"203.0.113.1"}, "127.0.0.1"},
		{"no header", true, nil, "127.0.0.1"},
		{"one entry", true, []string{"203.0.113.1"}, "203.0.113.1"},
		{"the client's own entries left of it", true, []string{"198.51.100.9, 203.0.113.1"}, "203.0.113.1"},
		{"a balancer right of it", true, []string{"198.51.100.9, 203.0.113.1, 10.0.0.5"}, "203.0.113.1"},
		{"across fields", true, []string{"198.51.100.9, 203.0.113.1", "10.0.0.5"}, "203.0.113.1"},
		{"ports, brackets and zones", true, []string{"[2001:db8::1%eth0]:443", "10.0.0.5:80"}, "2001:db8::1"},
		{"an IPv4-mapped entry", true, []string{"::ffff:203.0.113.1"}, "203.0.113.1"},
		{"only trusted proxies", true, []string{"10.0.0.4, 10.0.0.5"}, "127.0.0.1"},
		{"an unreadable entry first", true, []string{"203.0.113.1, unknown"}, "127.0.0.1"},
		{"an unreadable entry left of the client", true, []string{"unknown, 203.0.113.1"}, "203.0.113.1"},
		{"an empty field", true, []string{""}, "127.0.0.1"},
	} {
		if got := Resolve(peer, tc.peerTrusted, tc.values, trusted); got.String() != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}
