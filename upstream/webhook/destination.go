// Package webhook delivers an organisation's events to its webhook endpoints as the
// Standard Webhooks specification says (docs/webhooks.md). It checks an endpoint's
// URL when saved and its address at every connection, signs each body, and runs the
// dispatcher that takes deliveries from the outbox of package store.
package webhook

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
)

// Policy is what the operator allows of an endpoint's URL. The zero Policy is the
// production one: https only, public addresses only.
type Policy struct {
	// AllowHTTP accepts http URLs as well as https ones.
	AllowHTTP bool
	// AllowPrivate accepts loopback, private, link-local and multicast destinations.
	AllowPrivate bool
}

// ErrRefusedAddress is a destination the policy refuses: a loopback, private,
// link-local, multicast or unspecified address.
var ErrRefusedAddress = errors.New("webhook: the destination address is not public")

// CheckURL checks raw as an endpoint's URL: absolute, http(s) as the policy allows,
// without credentials, and with a host whose every address the policy allows. A host
// name is resolved now; the connection checks the address again (Dialer). The error's
// text is safe to show the caller.
func (p Policy) CheckURL(ctx context.Context, raw string) error {
	if len(raw) > 2048 {
		return errors.New("must be at most 2048 characters")
	}
	u, err := url.Parse(raw)
	if err != nil || !u.IsAbs() || u.Host == "" || u.Opaque != "" {
		return errors.New("must be an absolute URL")
	}
	switch {
	case u.Scheme == "https":
	case u.Scheme == "http" && p.AllowHTTP:
	case u.Scheme == "http":
		return errors.New("must be https")
	default:
		return errors.New("must be an https URL")
	}
	if u.User != nil {
		return errors.New("must not carry a user name or password")
	}
	if u.Fragment != "" {
		return errors.New("must not have a fragment")
	}
	host := u.Hostname()
	if host == "" {
		return errors.New("must name a host")
	}
	if p.AllowPrivate {
		return nil
	}
	addrs, err := resolve(ctx, host)
	if err != nil {
		return fmt.Errorf("host %s does not resolve", host)
	}
	for _, a := range addrs {
		if !Public(a) {
			return fmt.Errorf("must not resolve to a loopback, private, link-local or multicast address (%s is %s)", host, a)
		}
	}
	return nil
}

// resolve returns host's addresses; an IP literal is its own.
func resolve(ctx context.Context, host string) ([]netip.Addr, error) {
	if a, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		return []netip.Addr{a}, nil
	}
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil, err
	}
	if len(addrs) == 0 {
		return nil, errors.New("no address")
	}
	return addrs, nil
}

// nonPublic are the ranges Go's netip predicates leave out that are not on the
// internet either: "this network", shared address space (carrier-grade NAT), the
// IETF's protocol assignments, documentation and benchmarking ranges, and IPv4's
// reserved block.
var nonPublic = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("192.0.2.0/24"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("198.51.100.0/24"),
	netip.MustParsePrefix("203.0.113.0/24"),
	netip.MustParsePrefix("240.0.0.0/4"),
	netip.MustParsePrefix("64:ff9b::/96"),
	netip.MustParsePrefix("2001:db8::/32"),
}

// Public reports whether a is an address a webhook may be sent to without
// AllowPrivate: not loopback, private, link-local, multicast, unspecified or reserved.
// An IPv4-mapped IPv6 address is judged as its IPv4 address.
func Public(a netip.Addr) bool {
	a = a.Unmap()
	if !a.IsValid() || a.IsLoopback() || a.IsPrivate() || a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() ||
		a.IsInterfaceLocalMulticast() || a.IsMulticast() || a.IsUnspecified() {
		return false
	}
	for _, p := range nonPublic {
		if p.Contains(a) {
			return false
		}
	}
	return true
}

// control is a net.Dialer Control function. It refuses a connection to an address
// that is not Public before the connection is made, whatever name led to it: a name
// that resolved to a public address when saved may resolve elsewhere now.
func control(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: %s", ErrRefusedAddress, address)
	}
	if !Public(ap.Addr()) {
		return fmt.Errorf("%w: %s", ErrRefusedAddress, ap.Addr())
	}
	return nil
}
