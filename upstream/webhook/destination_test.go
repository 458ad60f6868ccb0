package webhook_test

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"testing"

	"github.com/keygate/keygate/upstream/httpapi"
	"github.com/keygate/keygate/upstream/internal/upstreamtest"
	"github.com/keygate/keygate/upstream/store"
	"github.com/keygate/keygate/upstream/webhook"
)

func TestPublicRefusesEveryNonPublicRange(t *testing.T) {
	for _, tc := range []struct {
		addr   string
		public bool
	}{
		{"93.184.215.14", true},
		{"2606:2800:21f:cb07:6820:80da:af6b:8b2c", true},
		{"127.0.0.1", false},
		{"127.8.9.10", false},
		{"::1", false},
		{"10.1.2.3", false},
		{"172.16.0.1", false},
		{"192.168.1.1", false},
		{"fd00::1", false},
		{"169.254.169.254", false},
		{"fe80::1", false},
		{"224.0.0.1", false},
		{"ff02::1", false},
		{"0.0.0.0", false},
		{"::", false},
		{"100.64.0.1", false},
		{"::ffff:127.0.0.1", false},
		{"::ffff:10.0.0.1", false},
		{"255.255.255.255", false},
	} {
		if got := webhook.Public(netip.MustParseAddr(tc.addr)); got != tc.public {
			t.Errorf("Public(%s) = %v, want %v", tc.addr, got, tc.public)
		}
	}
}

// TestNonPublicURLsAreRefusedWhenSaved saves only URLs whose addresses are refused
// before any connection: nothing here dials.
func TestNonPublicURLsAreRefusedWhenSaved(t *testing.T) {
	e := upstreamtest.NewEnv(t)
	org := e.Org("pro")
	owner := e.Person(store.RoleOwner, org)
	bad := func(msg string) string {
		return `{"error":"invalid_request","message":` + upstreamtest.JSONBody("url: "+msg) + `}`
	}
	for _, tc := range []struct{ name, url, want string }{
		{"loopback", "https://127.0.0.1/hook", bad("must not resolve to a loopback, private, link-local or multicast address (127.0.0.1 is 127.0.0.1)")},
		{"loopback v6", "https://[::1]:8443/hook", bad("must not resolve to a loopback, private, link-local or multicast address (::1 is ::1)")},
		{"private", "https://10.0.0.7/hook", bad("must not resolve to a loopback, private, link-local or multicast address (10.0.0.7 is 10.0.0.7)")},
		{"link-local metadata", "https://169.254.169.254/latest", bad("must not resolve to a loopback, private, link-local or multicast address (169.254.169.254 is 169.254.169.254)")},
		{"multicast", "https://224.0.0.251/", bad("must not resolve to a loopback, private, link-local or multicast address (224.0.0.251 is 224.0.0.251)")},
		{"a name resolving to loopback", "https://localhost/hook", ""},
		{"http", "http://example.com/hook", bad("must be https")},
		{"another scheme", "ftp://example.com/hook", bad("must be an https URL")},
		{"relative", "/hook", bad("must be an absolute URL")},
		{"credentials", "https://u:p@example.com/hook", bad("must not carry a user name or password")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := owner.Do("POST", "/orgs/"+org+"/webhooks", upstreamtest.JSONBody(map[string]string{"url": tc.url}))
			if tc.want == "" {
				// localhost resolves to 127.0.0.1, ::1 or both, in the order of the
				// resolver: the message names one of them.
				upstreamtest.WantStatus(t, r, 400)
				return
			}
			upstreamtest.Want(t, r, 400, tc.want)
		})
	}
	if n := upstreamtest.Scalar[int](e, `SELECT count(*) FROM webhook_endpoints`); n != 0 {
		t.Errorf("%d endpoints saved", n)
	}
}

// TestNonPublicAddressesAreRefusedBeforeConnecting saves a loopback receiver's URL
// under a policy that allows it, then delivers under one that does not: the dialer
// refuses it before connecting, and the receiver sees nothing.
func TestNonPublicAddressesAreRefusedBeforeConnecting(t *testing.T) {
	for _, host := range []string{"127.0.0.1", "localhost"} {
		t.Run(host, func(t *testing.T) {
			e := newEnv(t)
			rc := newReceiver(t, nil)
			port := rc.Listener.Addr().(*net.TCPAddr).Port
			ep := e.addEndpoint(t, "http://"+host+":"+strconv.Itoa(port)+"/hook")
			e.sendTest(t, ep)
			drain(t, e.dispatcher(webhook.Policy{AllowHTTP: true}))
			if n := len(rc.requests()); n != 0 {
				t.Fatalf("the receiver got %d requests", n)
			}
			got := upstreamtest.Scalar[string](e.Env, `SELECT error FROM webhook_attempts`)
			if got != "refused: the destination address is not public" {
				t.Errorf("attempt error %q", got)
			}
		})
	}
}

func TestARedirectIsNotFollowed(t *testing.T) {
	e := newEnv(t)
	target := newReceiver(t, nil)
	redirector := newReceiver(t, nil)
	redirector.Config.Handler = http.RedirectHandler(target.URL, http.StatusFound)
	ep := e.addEndpoint(t, redirector.URL)
	e.sendTest(t, ep)
	drain(t, e.dispatcher(open))
	if n := len(target.requests()); n != 0 {
		t.Errorf("the redirect's target got %d requests", n)
	}
	if code := upstreamtest.Scalar[int](e.Env, `SELECT status_code FROM webhook_attempts`); code != http.StatusFound {
		t.Errorf("attempt status %d, want 302", code)
	}
	if s := upstreamtest.Scalar[string](e.Env, `SELECT state FROM webhook_deliveries`); s != "pending" {
		t.Errorf("state %s, want pending: a redirect is not a delivery", s)
	}
}

func TestHTTPIsAcceptedOnlyWhereAllowed(t *testing.T) {
	e := upstreamtest.NewEnv(t, func(c *httpapi.Config) { c.Webhooks = webhook.Policy{AllowHTTP: true} })
	org := e.Org("pro")
	owner := e.Person(store.RoleOwner, org)
	// A documentation address is not public either: refused without a connection.
	upstreamtest.Want(t, owner.Do("POST", "/orgs/"+org+"/webhooks", `{"url":"http://192.0.2.1/hook"}`), 400,
		`{"error":"invalid_request","message":"url: must not resolve to a loopback, private, link-local or multicast address (192.0.2.1 is 192.0.2.1)"}`)
	if err := (webhook.Policy{AllowHTTP: true}).CheckURL(context.Background(), "http://93.184.215.14/hook"); err != nil {
		t.Errorf("http to a public address: %v", err)
	}
	if err := (webhook.Policy{}).CheckURL(context.Background(), "http://93.184.215.14/hook"); err == nil {
		t.Error("http accepted without AllowHTTP")
	}
}
