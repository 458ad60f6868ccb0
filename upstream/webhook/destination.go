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
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Policy is what the operator allows of an endpoint's URL. The zero Policy is the
// production one: https only, public addresses only.
type Policy struct {
	// AllowHTTP accepts http URLs as well as https ones.
	AllowHTTP bool
	// AllowPrivate accepts every address, public or not.
	AllowPrivate bool
}

// ErrRefusedAddress is a destination the policy refuses: an address that is not
// Public.
var ErrRefusedAddress = errors.New("webhook: the destination address is not public")

// ResolveTimeout bounds the resolution of a URL's host name by CheckURL.
const ResolveTimeout = 2 * time.Second

// resolver resolves the host names of URLs; a seam for tests.
var resolver = net.DefaultResolver

// The refusals that name the serve flag allowing what they refuse.
const (
	needsHTTPS   = "must be https (serve --webhook-allow-http allows http)"
	needsPublic  = "must not resolve to a loopback, private, link-local, multicast or special-purpose address (%s; serve --webhook-allow-private allows it)"
	maxURLLength = 2048
)

// CheckURL checks raw as an endpoint's URL: absolute, http(s) as the policy allows,
// without credentials or fragment, with a valid port, and with a host whose every
// address the policy allows. Everything that needs no lookup is checked first; a
// host name is then resolved within ResolveTimeout, and the connection checks the
// address again (Client). The error's text is safe to show the caller.
func (p Policy) CheckURL(ctx context.Context, raw string) error {
	if len(raw) > maxURLLength {
		return fmt.Errorf("must be at most %d characters", maxURLLength)
	}
	u, err := url.Parse(raw)
	if err != nil || !u.IsAbs() || u.Host == "" || u.Opaque != "" {
		return errors.New("must be an absolute URL")
	}
	switch {
	case u.Scheme == "https":
	case u.Scheme == "http" && p.AllowHTTP:
	case u.Scheme == "http":
		return errors.New(needsHTTPS)
	default:
		return errors.New("must be an https URL")
	}
	if u.User != nil {
		return errors.New("must not carry a user name or password")
	}
	if u.Fragment != "" {
		return errors.New("must not have a fragment")
	}
	if port := u.Port(); port != "" {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return errors.New("must have a port from 1 to 65535")
		}
	}
	host := u.Hostname()
	if host == "" {
		return errors.New("must name a host")
	}
	addr, literal := parseLiteral(host)
	if !literal && !hostName(host) {
		return errors.New("must name a host by a DNS name or an IP address")
	}
	if p.AllowPrivate {
		return nil
	}
	if literal {
		if !Public(addr) {
			return fmt.Errorf(needsPublic, addr)
		}
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, ResolveTimeout)
	defer cancel()
	addrs, err := resolver.LookupNetIP(ctx, "ip", host)
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("host %s does not resolve within %v", host, ResolveTimeout)
	case err != nil || len(addrs) == 0:
		return fmt.Errorf("host %s does not resolve", host)
	}
	for _, a := range addrs {
		if !Public(a) {
			return fmt.Errorf(needsPublic, host+" is "+a.Unmap().String())
		}
	}
	return nil
}

// parseLiteral returns host's address when host is an IP literal (a zone is not one).
func parseLiteral(host string) (netip.Addr, bool) {
	a, err := netip.ParseAddr(host)
	if err != nil || a.Zone() != "" {
		return netip.Addr{}, false
	}
	return a, true
}

// hostName reports whether host is a DNS name: dot-separated labels of letters,
// digits and hyphens (and underscores, which DNS allows), whose last label is not a
// number. A host that ends in a number is an IPv4 address in one of the legacy
// spellings resolvers still read ("2130706433", "0x7f.1"), which is no name.
func hostName(host string) bool {
	host = strings.TrimSuffix(host, ".")
	if host == "" || len(host) > 253 {
		return false
	}
	labels := strings.Split(host, ".")
	for _, l := range labels {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for _, c := range l {
			if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	last := strings.ToLower(labels[len(labels)-1])
	if strings.HasPrefix(last, "0x") {
		return false
	}
	_, err := strconv.ParseUint(last, 10, 64)
	return err != nil
}

// globalUnicast is the only IPv6 block a webhook may go to: every other one is
// reserved, local, multicast, or carries an IPv4 address (IPv4-compatible,
// IPv4-mapped, NAT64, discard-only and the rest) that the dialer would not see.
var globalUnicast = netip.MustParsePrefix("2000::/3")

// special are the blocks of the IANA IPv4 and IPv6 Special-Purpose Address Registries
// that Go's netip predicates leave out, beside the rest of IPv4's reserved space. Of
// IPv6 only those inside globalUnicast are listed; the others are outside it anyway.
// 6to4 and Teredo addresses embed an IPv4 address the relay would carry the packet
// to, so they are refused whole.
var special = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),       // "this network"
	netip.MustParsePrefix("100.64.0.0/10"),   // shared address space (carrier-grade NAT)
	netip.MustParsePrefix("192.0.0.0/24"),    // IETF protocol assignments
	netip.MustParsePrefix("192.0.2.0/24"),    // documentation
	netip.MustParsePrefix("192.31.196.0/24"), // AS112
	netip.MustParsePrefix("192.52.193.0/24"), // AMT
	netip.MustParsePrefix("192.88.99.0/24"),  // 6to4 relay anycast
	netip.MustParsePrefix("192.175.48.0/24"), // AS112 direct delegation
	netip.MustParsePrefix("198.18.0.0/15"),   // benchmarking
	netip.MustParsePrefix("198.51.100.0/24"), // documentation
	netip.MustParsePrefix("203.0.113.0/24"),  // documentation
	netip.MustParsePrefix("240.0.0.0/4"),     // reserved, and the limited broadcast address
	netip.MustParsePrefix("2001::/23"),       // IETF protocol assignments, Teredo among them
	netip.MustParsePrefix("2001:db8::/32"),   // documentation
	netip.MustParsePrefix("2002::/16"),       // 6to4
	netip.MustParsePrefix("2620:4f:8000::/48"),
	netip.MustParsePrefix("3fff::/20"), // documentation
}

// Public reports whether a is an address a webhook may be sent to without
// AllowPrivate: an IPv4 address that is not loopback, private, link-local, multicast,
// unspecified or in a special-purpose block, or an IPv6 global unicast address
// outside the special-purpose blocks. An IPv4-mapped IPv6 address is not one; the
// dialer dials it as its IPv4 address, which Public judges as such there.
func Public(a netip.Addr) bool {
	if !a.IsValid() || a.Zone() != "" {
		return false
	}
	if a.Is6() && !globalUnicast.Contains(a) {
		return false
	}
	if a.IsLoopback() || a.IsPrivate() || a.IsLinkLocalUnicast() || a.IsMulticast() || a.IsUnspecified() {
		return false
	}
	for _, p := range special {
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
