package caddymodule

import (
	"net/http"
	"net/netip"
	"reflect"
	"unsafe"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/keygate/keygate/internal/clientip"
)

// clientAddr is the address a key's allowed_cidrs are checked against: the client as
// the gateway can prove it (docs/security.md, The client address). It is the
// connection's peer, unless the peer is one of the server's trusted_proxies. Then it
// is the rightmost address of the first client IP header present (by default
// X-Forwarded-For, every field of it joined in order) that is not a trusted proxy
// (package clientip). That is what Caddy's trusted_proxies_strict gives, whatever the
// server's own setting. An IPv4-mapped IPv6 address is its IPv4 one. clientAddr is
// the zero Addr, which no network holds, when the peer's address cannot be read.
func clientAddr(r *http.Request) netip.Addr {
	peer, peerOK := clientip.Parse(r.RemoteAddr)
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
				addr, _ := clientip.Parse(s)
				return addr
			}
		}
		return peer
	}
	if src == nil {
		return peer
	}
	ranges := src.GetIPRanges(r)
	trusted := srv.TrustedProxiesUnix && r.RemoteAddr == "@" || peerOK && clientip.Trusted(peer, ranges)
	headers := srv.ClientIPHeaders
	if len(headers) == 0 {
		headers = defaultClientIPHeaders
	}
	for _, name := range headers {
		if values := r.Header.Values(name); len(values) > 0 {
			return clientip.Resolve(peer, trusted, values, ranges)
		}
	}
	return peer
}

// defaultClientIPHeaders is Caddy's client_ip_headers when the server sets none.
var defaultClientIPHeaders = []string{"X-Forwarded-For"}

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
