// Package clientip finds a request's client address behind proxies: the address the
// gateway checks a key's allowed networks against, and the upstream's login throttle
// counts. Both take it the same way (docs/security.md, The client address): the
// connection's peer, unless the peer is a trusted proxy; then the rightmost address
// of X-Forwarded-For that is not a trusted proxy. Entries left of it were written by
// a party nobody trusts, the client included, so a client never chooses its address.
package clientip

import (
	"net"
	"net/netip"
	"slices"
	"strings"
)

// Resolve returns the client address of a request whose connection came from peer,
// with values the fields of its client IP header (X-Forwarded-For), in order, and
// trusted the trusted proxies' networks. It is peer when peer is not a trusted
// proxy (peerTrusted false), and when the header names no client (RightmostUntrusted).
func Resolve(peer netip.Addr, peerTrusted bool, values []string, trusted []netip.Prefix) netip.Addr {
	if !peerTrusted {
		return peer
	}
	if addr, ok := RightmostUntrusted(values, trusted); ok {
		return addr
	}
	return peer
}

// RightmostUntrusted walks the entries of a client IP header's fields, joined in
// order, from the right. It returns the first entry that is not a trusted proxy. ok is
// false when an entry cannot be read before one is found, or when every entry is a
// trusted proxy: the header then names no client that can be proven.
func RightmostUntrusted(values []string, trusted []netip.Prefix) (netip.Addr, bool) {
	for _, field := range slices.Backward(values) {
		rest := field
		for rest != "" {
			var entry string
			if i := strings.LastIndexByte(rest, ','); i >= 0 {
				entry, rest = rest[i+1:], rest[:i]
			} else {
				entry, rest = rest, ""
			}
			addr, ok := Parse(entry)
			if !ok {
				return netip.Addr{}, false
			}
			if !Trusted(addr, trusted) {
				return addr, true
			}
		}
	}
	return netip.Addr{}, false
}

// Parse reads one address as proxies and servers write them: a bare IPv4 or IPv6
// address, host:port, [v6]:port or [v6], with an optional IPv6 zone, which it drops,
// and white space around it. An IPv4-mapped IPv6 address is returned as IPv4.
func Parse(s string) (netip.Addr, bool) {
	s = strings.TrimSpace(s)
	if host, _, err := net.SplitHostPort(s); err == nil {
		s = host
	} else if len(s) > 2 && s[0] == '[' && s[len(s)-1] == ']' {
		s = s[1 : len(s)-1]
	}
	s, _, _ = strings.Cut(s, "%")
	addr, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, false
	}
	return addr.Unmap(), true
}

// Trusted reports whether addr is in one of the trusted networks.
func Trusted(addr netip.Addr, trusted []netip.Prefix) bool {
	for _, p := range trusted {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}
