package httpapi

import (
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// fromTrustedProxy reports whether r's connection comes from one of the trusted
// proxies, and returns the connection's address.
func (s *Server) fromTrustedProxy(r *http.Request) (netip.Addr, bool) {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}, false
	}
	a = a.Unmap()
	for _, p := range s.trustedProxies {
		if p.Contains(a) {
			return a, true
		}
	}
	return a, false
}

// clientAddr returns the client login throttling counts r against: the address of
// the last hop of X-Forwarded-For when the connection comes from a trusted proxy (the
// address that proxy saw; earlier hops are the client's to write), otherwise the
// connection's own address. A trusted proxy that sends no usable X-Forwarded-For
// leaves its own address. See throttleClient for IPv6.
func (s *Server) clientAddr(r *http.Request) string {
	conn, trusted := s.fromTrustedProxy(r)
	if trusted {
		if hop := lastHop(r.Header.Values("X-Forwarded-For")); hop != "" {
			if a, err := netip.ParseAddr(hop); err == nil {
				return throttleClient(a.Unmap())
			}
		}
	}
	if !conn.IsValid() {
		return r.RemoteAddr
	}
	return throttleClient(conn)
}

// throttleClient is the client an address belongs to: the address itself for IPv4
// and IPv6 loopback, its /64 for any other IPv6 address. A /64 is one subscriber's
// network (the smallest prefix ISPs assign): counting its 2^64 addresses one by one
// would give an attacker 2^64 fresh budgets.
func throttleClient(a netip.Addr) string {
	if !a.Is6() || a.IsLoopback() {
		return a.String()
	}
	return netip.PrefixFrom(a, 64).Masked().String()
}

// secureRequest reports whether r reached the service over TLS: directly, or through a
// trusted proxy that says so in X-Forwarded-Proto, or by the operator's word
// (--secure-cookies).
func (s *Server) secureRequest(r *http.Request) bool {
	if s.secure || r.TLS != nil {
		return true
	}
	_, trusted := s.fromTrustedProxy(r)
	return trusted && strings.EqualFold(lastHop(r.Header.Values("X-Forwarded-Proto")), "https")
}

// lastHop returns the last comma-separated item of the last of values, trimmed.
func lastHop(values []string) string {
	if len(values) == 0 {
		return ""
	}
	v := values[len(values)-1]
	if i := strings.LastIndexByte(v, ','); i >= 0 {
		v = v[i+1:]
	}
	return strings.TrimSpace(v)
}
