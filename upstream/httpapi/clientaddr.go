package httpapi

import (
	"net/http"
	"net/netip"
	"strings"

	"github.com/keygate/keygate/internal/clientip"
)

// fromTrustedProxy reports whether r's connection comes from one of the trusted
// proxies, and returns the connection's address.
func (s *Server) fromTrustedProxy(r *http.Request) (netip.Addr, bool) {
	a, ok := clientip.Parse(r.RemoteAddr)
	return a, ok && clientip.Trusted(a, s.trustedProxies)
}

// clientAddr returns the client the login throttle counts r against: the address
// the gateway would check a key's networks against (package clientip). From a
// trusted proxy, it is the rightmost X-Forwarded-For entry that is not a trusted
// proxy: the gateway and any balancer before it, named in --trusted-proxies, are
// passed over. Otherwise, or without such an entry, it is the connection's address.
// throttleClient then groups IPv6 addresses.
func (s *Server) clientAddr(r *http.Request) string {
	conn, trusted := s.fromTrustedProxy(r)
	if !conn.IsValid() {
		return r.RemoteAddr
	}
	return throttleClient(clientip.Resolve(conn, trusted, r.Header.Values("X-Forwarded-For"), s.trustedProxies))
}

// throttleClient is the client an address belongs to. An IPv4 address or IPv6
// loopback is its own client. Any other IPv6 address belongs to its /64. A /64 is one
// subscriber's network, the smallest prefix ISPs assign. Counting its addresses one by
// one would give an attacker 2^64 fresh budgets.
func throttleClient(a netip.Addr) string {
	if !a.Is6() || a.IsLoopback() {
		return a.String()
	}
	return netip.PrefixFrom(a, 64).Masked().String()
}

// secureRequest reports whether r reached the service over TLS. It did when it came
// directly over TLS, or from a trusted proxy saying so in X-Forwarded-Proto. The
// operator may also say so for every request (Config.SecureCookies).
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
