package caddymodule

import (
	"net"
	"net/http"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"unsafe"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// clientAddr is the address a key's allowed_cidrs are checked against: the client as
// the gateway can prove it (docs/security.md, The client address). It is the
// connection's peer, unless the peer is one of the server's trusted_proxies. Then it
// is the rightmost address of the first client IP header present (by default
// X-Forwarded-For, every field of it joined in order) that is not a trusted proxy.
// That is what Caddy's trusted_proxies_strict gives, whatever the server's own
// setting: entries left of it were written by a party nobody trusts, the client
// included. An entry that cannot be read ends the walk at the connection's peer, as
// does a header whose entries are all trusted proxies. So a client never chooses the
// address. An IPv4-mapped IPv6 address is its IPv4 one. clientAddr is the zero Addr,
// which no network holds, when the peer's address cannot be read.
func clientAddr(r *http.Request) netip.Addr {
	peer, peerOK := parseHop(r.RemoteAddr)
	srv, _ := r.Context().Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server)
	if srv == nil {
		return peer
	}
	src, known := serverTrustedProxies(srv)
	if !known {
		// A Caddy whose Server no longer holds trusted proxies where this build
		// reads them (TestTheServersTrustedProxiesAreReadable): its client_ip
		// is the rightmost untrusted address only in strict mode.
		if srv.TrustedProxiesStrict > 0 {
			if s, _ := caddyhttp.GetVar(r.Context(), caddyhttp.ClientIPVarKey).(string); s != "" {
				addr, _ := parseHop(s)
				return addr
			}
		}
		return peer
	}
	if src == nil {
		return peer
	}
	ranges := src.GetIPRanges(r)
	unixPeer := srv.TrustedProxiesUnix && r.RemoteAddr == "@"
	if !unixPeer && (!peerOK || !trustedAddr(peer, ranges)) {
		return peer
	}
	headers := srv.ClientIPHeaders
	if len(headers) == 0 {
		headers = defaultClientIPHeaders
	}
	for _, name := range headers {
		values := r.Header.Values(name)
		if len(values) == 0 {
			continue
		}
		if addr, ok := rightmostUntrusted(values, ranges); ok {
			return addr
		}
		return peer
	}
	return peer
}

// defaultClientIPHeaders is Caddy's client_ip_headers when the server sets none.
var defaultClientIPHeaders = []string{"X-Forwarded-For"}

// rightmostUntrusted walks the entries of a client IP header's fields, joined in
// order, from the right. It returns the first entry that is not a trusted proxy. ok is
// false when an entry cannot be read before one is found, or when every entry is a
// trusted proxy: the header then names no client the gateway can prove.
func rightmostUntrusted(values []string, ranges []netip.Prefix) (netip.Addr, bool) {
	for _, field := range slices.Backward(values) {
		rest := field
		for rest != "" {
			var entry string
			if i := strings.LastIndexByte(rest, ','); i >= 0 {
				entry, rest = rest[i+1:], rest[:i]
			} else {
				entry, rest = rest, ""
			}
			addr, ok := parseHop(entry)
			if !ok {
				return netip.Addr{}, false
			}
			if !trustedAddr(addr, ranges) {
				return addr, true
			}
		}
	}
	return netip.Addr{}, false
}

// parseHop reads one address as proxies write them: a bare IPv4 or IPv6 address,
// host:port, [v6]:port or [v6], with an optional IPv6 zone, which it drops. An
// IPv4-mapped IPv6 address is returned as IPv4.
func parseHop(s string) (netip.Addr, bool) {
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

// trustedAddr reports whether addr is in one of the trusted proxies' ranges.
func trustedAddr(addr netip.Addr, ranges []netip.Prefix) bool {
	for _, p := range ranges {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

// trustedProxiesField is the index of caddyhttp.Server's trustedProxies, the
// provisioned source of its trusted_proxies, or -1 when this Caddy has none of that
// name and type. Caddy keeps the source unexported and clears the raw config once it
// loads it, so reading the field is the one way to honour the server's own list.
var trustedProxiesField = func() int {
	f, ok := reflect.TypeFor[caddyhttp.Server]().FieldByName("trustedProxies")
	if !ok || len(f.Index) != 1 || f.Type != reflect.TypeFor[caddyhttp.IPRangeSource]() {
		return -1
	}
	return f.Index[0]
}()

// serverTrustedProxies returns srv's trusted proxies source, nil when it has none.
// known is false when this Caddy's Server does not hold it where expected.
func serverTrustedProxies(srv *caddyhttp.Server) (src caddyhttp.IPRangeSource, known bool) {
	if trustedProxiesField < 0 {
		return nil, false
	}
	f := reflect.ValueOf(srv).Elem().Field(trustedProxiesField)
	return *(*caddyhttp.IPRangeSource)(unsafe.Pointer(f.UnsafeAddr())), true
}
