package httpapi

import (
	"net/netip"
	"testing"
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
			e := newTestEnv(t, func(c *Config) {
				c.TrustedProxies = tc.trusted
				c.SecureCookies = tc.secure
			})
			email, password := e.user()
			r := e.anon().with(tc.headers...).do("POST", "/auth/login", jsonBody(map[string]string{"email": email, "password": password}))
			wantStatus(t, r, 204)
			cookies := r.cookies()
			if len(cookies) != 1 || cookies[0].Secure != tc.want {
				t.Errorf("cookies = %v, want one session cookie with Secure=%v", cookies, tc.want)
			}
			// Logging out clears the cookie with the same attributes.
			r = e.anon().with(tc.headers...).do("POST", "/auth/logout", "")
			if cookies := r.cookies(); len(cookies) != 1 || cookies[0].Secure != tc.want {
				t.Errorf("logout cookies = %v, want Secure=%v", cookies, tc.want)
			}
		})
	}
}

func TestParseTrustedProxies(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		ok       bool
	}{
		{"", "[]", true},
		{DefaultTrustedProxies, "[127.0.0.0/8 ::1/128]", true},
		{" 10.1.2.3 , 192.168.7.9/16,::ffff:10.0.0.1", "[10.1.2.3/32 192.168.0.0/16 10.0.0.1/32]", true},
		{"10.0.0.0/33", "", false},
		{"caddy", "", false},
	} {
		got, err := parseTrustedProxies(tc.in)
		if (err == nil) != tc.ok {
			t.Errorf("parseTrustedProxies(%q): err %v", tc.in, err)
			continue
		}
		if s := fmtPrefixes(got); tc.ok && s != tc.want {
			t.Errorf("parseTrustedProxies(%q) = %s, want %s", tc.in, s, tc.want)
		}
	}
}
