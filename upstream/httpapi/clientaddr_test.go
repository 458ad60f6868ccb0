package httpapi_test

import (
	"net/netip"
	"testing"

	"github.com/keygate/keygate/upstream/httpapi"
	"github.com/keygate/keygate/upstream/internal/upstreamtest"
)

func TestSessionCookieIsSecureThroughATrustedProxySayingHTTPS(t *testing.T) {
	tenNet := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	for _, tc := range []struct {
		name    string
		trusted []netip.Prefix
		secure  bool
		headers []string
		want    bool
	}{
		{"plain HTTP, no proxy trusted", nil, false, nil, false},
		{"X-Forwarded-Proto from an untrusted peer", nil, false, []string{"X-Forwarded-Proto", "https"}, false},
		{"X-Forwarded-Proto https from a trusted proxy", loopback, false, []string{"X-Forwarded-Proto", "https"}, true},
		{"X-Forwarded-Proto http from a trusted proxy", loopback, false, []string{"X-Forwarded-Proto", "http"}, false},
		{"trusted proxy without X-Forwarded-Proto", loopback, false, nil, false},
		{"peer outside the trusted networks", tenNet, false, []string{"X-Forwarded-Proto", "https"}, false},
		{"--secure-cookies", nil, true, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := upstreamtest.NewEnv(t, func(c *httpapi.Config) {
				c.TrustedProxies = tc.trusted
				c.SecureCookies = tc.secure
			})
			email, password := e.User()
			r := e.Anon().With(tc.headers...).Do("POST", "/auth/login", upstreamtest.JSONBody(map[string]string{"email": email, "password": password}))
			upstreamtest.WantStatus(t, r, 204)
			cookies := r.Cookies()
			if len(cookies) != 1 || cookies[0].Secure != tc.want {
				t.Errorf("cookies = %v, want one session cookie with Secure=%v", cookies, tc.want)
			}
			// Logging out clears the cookie with the same attributes.
			r = e.Anon().With(tc.headers...).Do("POST", "/auth/logout", "")
			if cookies := r.Cookies(); len(cookies) != 1 || cookies[0].Secure != tc.want {
				t.Errorf("logout cookies = %v, want Secure=%v", cookies, tc.want)
			}
		})
	}
}
