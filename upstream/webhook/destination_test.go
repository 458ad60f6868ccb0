package webhook_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keygate/keygate/upstream/httpapi"
	"github.com/keygate/keygate/upstream/internal/upstreamtest"
	"github.com/keygate/keygate/upstream/store"
	"github.com/keygate/keygate/upstream/webhook"
)

// transition are the IPv6 spellings of IPv4 addresses that are not public, and other
// blocks of the special-purpose registries, that a filter judging IPv6 by Go's netip
// predicates alone lets through.
var transition = []string{
	"::127.0.0.1",         // IPv4-compatible loopback
	"::ffff:127.0.0.1",    // IPv4-mapped loopback
	"::ffff:10.0.0.1",     // IPv4-mapped private
	"64:ff9b::a9fe:a9fe",  // NAT64 of 169.254.169.254
	"64:ff9b:1::7f00:1",   // local-use NAT64 of 127.0.0.1
	"64:ff9b:1::a00:1",    // local-use NAT64 of 10.0.0.1
	"2002:7f00:1::",       // 6to4 of 127.0.0.1
	"2002:a9fe:a9fe::",    // 6to4 of 169.254.169.254
	"2001:0:4136:e378::1", // Teredo
	"100::1",              // discard-only
	"fec0::1",             // site-local
	"2001:db8::1",         // documentation
	"3fff::1",             // documentation
	"5f00::1",             // SRv6 SIDs
	"2001:2::1",           // benchmarking
	"2620:4f:8000::1",     // AS112
	"4000::1",             // not global unicast (outside 2000::/3)
	"fe80::1",             // link-local
	"fd00::1",             // unique local
	"ff02::1",             // multicast
	"::",                  // unspecified
	"::1",                 // loopback
	"192.88.99.1",         // 6to4 relay anycast
	"192.0.0.9",           // IETF protocol assignments
	"192.31.196.1",        // AS112
	"192.52.193.1",        // AMT
	"192.175.48.1",        // AS112
	"198.18.0.1",          // benchmarking
	"240.0.0.1",           // reserved
	"255.255.255.255",     // limited broadcast
}

func TestPublicRefusesEverySpecialPurposeRange(t *testing.T) {
	for _, tc := range []struct {
		addr   string
		public bool
	}{
		{"93.184.215.14", true},
		{"1.1.1.1", true},
		{"2606:2800:21f:cb07:6820:80da:af6b:8b2c", true},
		{"2a00:1450:4001:80b::200e", true},
		{"127.0.0.1", false},
		{"127.8.9.10", false},
		{"10.1.2.3", false},
		{"172.16.0.1", false},
		{"192.168.1.1", false},
		{"169.254.169.254", false},
		{"224.0.0.1", false},
		{"0.0.0.0", false},
		{"100.64.0.1", false},
		{"192.0.2.1", false},
		{"203.0.113.9", false},
		{"198.51.100.1", false},
	} {
		if got := webhook.Public(netip.MustParseAddr(tc.addr)); got != tc.public {
			t.Errorf("Public(%s) = %v, want %v", tc.addr, got, tc.public)
		}
	}
	for _, a := range transition {
		if webhook.Public(netip.MustParseAddr(a)) {
			t.Errorf("Public(%s) = true, want false", a)
		}
	}
}

// refusedURL is the 400 body of a URL whose address is refused.
func refusedURL(detail string) string {
	return `{"error":"invalid_request","message":` + upstreamtest.JSONBody("url: must not resolve to a loopback, private, link-local, multicast "+
		"or special-purpose address ("+detail+"; serve --webhook-allow-private allows it)") + `}`
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
	cases := []struct{ name, url, want string }{
		{"loopback", "https://127.0.0.1/hook", refusedURL("127.0.0.1")},
		{"loopback v6", "https://[::1]:8443/hook", refusedURL("::1")},
		{"private", "https://10.0.0.7/hook", refusedURL("10.0.0.7")},
		{"link-local metadata", "https://169.254.169.254/latest", refusedURL("169.254.169.254")},
		{"multicast", "https://224.0.0.251/", refusedURL("224.0.0.251")},
		{"IPv4-compatible loopback", "https://[::127.0.0.1]/h", refusedURL("::7f00:1")},
		{"local-use NAT64 loopback", "https://[64:ff9b:1::7f00:1]/h", refusedURL("64:ff9b:1::7f00:1")},
		{"6to4 loopback", "https://[2002:7f00:1::]/h", refusedURL("2002:7f00:1::")},
		{"local-use NAT64 private", "https://[64:ff9b:1::a00:1]/h", refusedURL("64:ff9b:1::a00:1")},
		{"6to4 metadata", "https://[2002:a9fe:a9fe::]/h", refusedURL("2002:a9fe:a9fe::")},
		{"IPv4-mapped", "https://[::ffff:127.0.0.1]/h", refusedURL("::ffff:127.0.0.1")},
		{"a name resolving to loopback", "https://localhost/hook", ""},
		{"a decimal IPv4 address", "https://2130706433/hook", bad("must name a host by a DNS name or an IP address")},
		{"a hexadecimal IPv4 address", "https://0x7f.1/hook", bad("must name a host by a DNS name or an IP address")},
		{"a zone", "https://[fe80::1%25eth0]/hook", bad("must name a host by a DNS name or an IP address")},
		{"a port out of range", "https://example.com:65536/hook", bad("must have a port from 1 to 65535")},
		{"http", "http://example.com/hook", bad("must be https (serve --webhook-allow-http allows http)")},
		{"another scheme", "ftp://example.com/hook", bad("must be an https URL")},
		{"relative", "/hook", bad("must be an absolute URL")},
		{"credentials", "https://u:p@example.com/hook", bad("must not carry a user name or password")},
	}
	for _, a := range transition {
		if addr := netip.MustParseAddr(a); addr.Is6() {
			cases = append(cases, struct{ name, url, want string }{a, "https://[" + a + "]/h", refusedURL(addr.String())})
		} else {
			cases = append(cases, struct{ name, url, want string }{a, "https://" + a + "/h", refusedURL(a)})
		}
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := owner.Do("POST", "/orgs/"+org+"/webhooks", upstreamtest.JSONBody(map[string]string{"url": tc.url}))
			if tc.want == "" {
				// localhost resolves to 127.0.0.1, ::1 or both, in the order of the
				// resolver: the message names one of them.
				upstreamtest.WantStatus(t, r, 400)
				if !strings.Contains(string(r.Body), "(localhost is ") || !strings.Contains(string(r.Body), "--webhook-allow-private") {
					t.Errorf("body %s, want it to name the address and the flag", r.Body)
				}
				return
			}
			upstreamtest.Want(t, r, 400, tc.want)
		})
	}
	if n := upstreamtest.Scalar[int](e, `SELECT count(*) FROM webhook_endpoints`); n != 0 {
		t.Errorf("%d endpoints saved", n)
	}
}

// hangingResolver is a resolver whose DNS server, on loopback, reads every query and
// answers none.
func hangingResolver(t *testing.T) *net.Resolver {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 512)
		for {
			if _, _, err := pc.ReadFrom(buf); err != nil {
				return
			}
		}
	}()
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", pc.LocalAddr().String())
	}}
}

// TestCheapChecksComeFirstAndResolutionIsBounded saves URLs while the resolver never
// answers: what needs no lookup is refused at once, and a name is given up after
// ResolveTimeout.
func TestCheapChecksComeFirstAndResolutionIsBounded(t *testing.T) {
	defer webhook.SetResolver(hangingResolver(t))()
	for _, tc := range []struct {
		url, want string
		within    time.Duration
	}{
		{"http://hook.example.com/h", "must be https (serve --webhook-allow-http allows http)", time.Second},
		{"https://hook.example.com:0/h", "must have a port from 1 to 65535", time.Second},
		{"https://hook.example.com/h#x", "must not have a fragment", time.Second},
		{"https://[64:ff9b::7f00:1]/h", "must not resolve to a loopback, private, link-local, multicast or special-purpose address (64:ff9b::7f00:1; serve --webhook-allow-private allows it)", time.Second},
		{"https://hook.example.com/h", "host hook.example.com does not resolve within 2s", webhook.ResolveTimeout + 3*time.Second},
	} {
		start := time.Now()
		err := webhook.Policy{}.CheckURL(context.Background(), tc.url)
		took := time.Since(start)
		if err == nil || err.Error() != tc.want {
			t.Errorf("%s: %v, want %q", tc.url, err, tc.want)
		}
		if took > tc.within {
			t.Errorf("%s: answered after %v, want within %v", tc.url, took, tc.within)
		}
	}
}

// TestTheDialerRefusesEverySpellingBeforeConnecting calls the dialer's check with the
// addresses a name may resolve to at delivery: each is refused before a connection is
// made, so none is dialled here.
func TestTheDialerRefusesEverySpellingBeforeConnecting(t *testing.T) {
	for _, a := range append([]string{"127.0.0.1", "10.0.0.1", "169.254.169.254"}, transition...) {
		addr := netip.AddrPortFrom(netip.MustParseAddr(a), 443).String()
		if err := webhook.Control("tcp", addr, nil); !errors.Is(err, webhook.ErrRefusedAddress) {
			t.Errorf("control(%s) = %v, want ErrRefusedAddress", addr, err)
		}
	}
	for _, a := range []string{"93.184.215.14:443", "[2a00:1450:4001:80b::200e]:443"} {
		if err := webhook.Control("tcp", a, nil); err != nil {
			t.Errorf("control(%s) = %v, want nil", a, err)
		}
	}
}

// TestNonPublicAddressesAreRefusedBeforeConnecting saves a loopback receiver's URL
// under a policy that allows it, then delivers under one that does not: the dialer
// refuses it before connecting, and the receiver sees nothing. Every host here
// stands for a loopback address, so that nothing else is dialled were the check to
// fail.
func TestNonPublicAddressesAreRefusedBeforeConnecting(t *testing.T) {
	for _, host := range []string{"127.0.0.1", "localhost", "[::ffff:127.0.0.1]", "[::1]"} {
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
	upstreamtest.Want(t, owner.Do("POST", "/orgs/"+org+"/webhooks", `{"url":"http://192.0.2.1/hook"}`), 400, refusedURL("192.0.2.1"))
	if err := (webhook.Policy{AllowHTTP: true}).CheckURL(context.Background(), "http://93.184.215.14/hook"); err != nil {
		t.Errorf("http to a public address: %v", err)
	}
	if err := (webhook.Policy{}).CheckURL(context.Background(), "http://93.184.215.14/hook"); err == nil {
		t.Error("http accepted without AllowHTTP")
	}
}
