package caddymodule

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/keygate/keygate/keystore"
)

// TestTheServersTrustedProxiesAreReadable: clientAddr reads the server's trusted
// proxies from where this Caddy keeps them. A Caddy that moved them fails here, not
// silently in production.
func TestTheServersTrustedProxiesAreReadable(t *testing.T) {
	if trustedProxiesField < 0 {
		t.Fatal("caddyhttp.Server has no trustedProxies field of type IPRangeSource")
	}
}

// TestAllowedNetworksAreCheckedAgainstTheRightmostUntrustedAddress checks a key's
// allowed_cidrs against the rightmost X-Forwarded-For address that is not a trusted
// proxy, with and without trusted_proxies_strict, through Caddy in this process. The
// client writes the left of the header itself, so the leftmost entry never counts.
func TestAllowedNetworksAreCheckedAgainstTheRightmostUntrustedAddress(t *testing.T) {
	d := newDB(t)
	org := d.org("pro")
	restricted := func(cidr string) string {
		t.Helper()
		_, full, err := d.store.Create(context.Background(), keystore.NewKey{
			OrgID: org, Name: "restricted", Role: keystore.RoleEditor,
			AllowedCIDRs: []netip.Prefix{netip.MustParsePrefix(cidr)},
		})
		if err != nil {
			t.Fatal(err)
		}
		return full
	}
	ten, loopback := restricted("10.9.0.0/16"), restricted("127.0.0.0/8")
	up := newUpstream(t)
	gc := gatewayConfig{handler: gatewayOptions(d.url, nil), upstream: up.addr()}
	gw := startGateway(t, gc)
	listen := strings.TrimPrefix(gw.base, "http://")

	// The test's connections come from 127.0.0.1, the first trusted proxy. 10.0.0.0/24
	// is a second tier of proxies.
	type tc struct {
		name      string
		key       string
		forwarded []string // one X-Forwarded-For field each
		allowed   bool
	}
	behindProxies := []tc{
		{"the client's own leftmost entry", ten, []string{"10.9.1.1, 203.0.113.5"}, false},
		{"the rightmost entry", ten, []string{"203.0.113.5, 10.9.1.1"}, true},
		{"behind a second trusted proxy", ten, []string{"203.0.113.5, 10.9.1.1, 10.0.0.7"}, true},
		{"a forged hop left of the real client", ten, []string{"10.9.1.1, 203.0.113.5, 10.0.0.7"}, false},
		{"IPv4-mapped", ten, []string{"::ffff:10.9.1.1"}, true},
		{"IPv4-mapped with a port", ten, []string{"[::ffff:10.9.1.1]:1234"}, true},
		{"IPv4 with a port", ten, []string{"203.0.113.5, 10.9.1.1:1234"}, true},
		{"IPv4-mapped outside", ten, []string{"10.9.1.1, ::ffff:203.0.113.5"}, false},
		{"two fields, the client's first", ten, []string{"10.9.1.1", "203.0.113.5"}, false},
		{"two fields, the client's last", ten, []string{"203.0.113.5", "10.9.1.1"}, true},
		{"garbage as the last hop", ten, []string{"10.9.1.1, zz"}, false},
		{"garbage behind a trusted proxy", ten, []string{"10.9.1.1, zz, 10.0.0.7"}, false},
		{"an empty entry", ten, []string{"10.9.1.1, "}, false},
		{"every entry a trusted proxy", ten, []string{"10.0.0.7"}, false},
		{"no X-Forwarded-For", ten, nil, false},
		{"garbage falls back to the connection", loopback, []string{"zz"}, true},
		{"trusted entries fall back to the connection", loopback, []string{"10.0.0.7, 10.0.0.8"}, true},
		{"a client outside the connection's network", loopback, []string{"203.0.113.5"}, false},
	}
	noProxies := []tc{
		{"X-Forwarded-For ignored", ten, []string{"10.9.1.1"}, false},
		{"the connection's address", loopback, []string{"203.0.113.5"}, true},
	}
	for _, variant := range []struct {
		name   string
		config gatewayConfig
		cases  []tc
	}{
		{"trusted_proxies", gatewayConfig{trustedProxies: []string{"127.0.0.1/32", "10.0.0.0/24"}}, behindProxies},
		{"trusted_proxies_strict", gatewayConfig{trustedProxies: []string{"127.0.0.1/32", "10.0.0.0/24"}, trustedStrict: true}, behindProxies},
		{"no trusted proxies", gatewayConfig{}, noProxies},
	} {
		cfg := gc
		cfg.trustedProxies, cfg.trustedStrict = variant.config.trustedProxies, variant.config.trustedStrict
		gw.reload(t, caddyConfig(listen, gw.logPath, cfg))
		for _, c := range variant.cases {
			t.Run(fmt.Sprintf("%s/%s", variant.name, c.name), func(t *testing.T) {
				hdr := http.Header{"X-Forwarded-For": c.forwarded}
				if c.forwarded == nil {
					hdr = nil
				}
				res, body := gw.do(t, http.MethodGet, "/v1/me", "Bearer "+c.key, hdr, "")
				if c.allowed {
					if res.StatusCode != http.StatusOK {
						t.Errorf("X-Forwarded-For %q: %d %s, want 200", c.forwarded, res.StatusCode, body)
					}
					return
				}
				wantJSONError(t, res, body, http.StatusUnauthorized, `{"error":"api key unauthenticated"}`)
				if got := res.Header.Get("WWW-Authenticate"); got != "Bearer" {
					t.Errorf("WWW-Authenticate %q, want Bearer", got)
				}
			})
		}
	}
}
