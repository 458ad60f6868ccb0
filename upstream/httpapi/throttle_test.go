package httpapi_test

import (
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/keygate/keygate/upstream/httpapi"
	"github.com/keygate/keygate/upstream/internal/upstreamtest"
	"github.com/keygate/keygate/upstream/store"
)

// loopback is the trusted proxy of the throttle tests. The test client connects from
// it, and names the client address in X-Forwarded-For.
var loopback = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}

// newThrottleEnv is a test server on clock that trusts loopback. Its window is a
// minute. It allows 3 failures per (email, address) and 5 per address.
func newThrottleEnv(t *testing.T, clock *upstreamtest.Clock) *upstreamtest.Env {
	return upstreamtest.NewEnv(t, func(c *httpapi.Config) {
		c.TrustedProxies = loopback
		c.LoginThrottle = store.LoginThrottle{Window: time.Minute, PerEmail: 3, PerClient: 5}
		c.Now = clock.Now
	})
}

// loginFrom posts a login as the client at addr, behind the trusted proxy.
func loginFrom(e *upstreamtest.Env, addr, email, password string) upstreamtest.Response {
	e.T.Helper()
	return e.Anon().With("X-Forwarded-For", "198.51.100.250, "+addr).
		Do("POST", "/auth/login", upstreamtest.JSONBody(map[string]string{"email": email, "password": password}))
}

func TestLoginThrottleRefusesWithoutHashingAndSparesOtherAddresses(t *testing.T) {
	clock := upstreamtest.NewClock()
	e := newThrottleEnv(t, clock)
	email, password := e.User()
	const attacker, owner = "203.0.113.1", "203.0.113.2"

	for i := range 3 {
		upstreamtest.Want(t, loginFrom(e, attacker, email, "wrong password"), 401, `{"error":"invalid credentials"}`)
		clock.Advance(time.Duration(i+1) * time.Second)
	}
	// The first failure was 6 s ago: it leaves the window in 54 s. The right password
	// is refused too, and no argon2id runs.
	before := e.Server.Passwords().Derivations()
	r := loginFrom(e, attacker, email, password)
	upstreamtest.Want(t, r, http.StatusTooManyRequests, `{"error":"rate_limited","retryAfter":54}`)
	if got := r.Header.Get("Retry-After"); got != "54" {
		t.Errorf("Retry-After = %q, want 54", got)
	}
	if n := e.Server.Passwords().Derivations() - before; n != 0 {
		t.Errorf("a throttled login ran argon2id %d times", n)
	}

	// The owner, at another address, logs in.
	upstreamtest.Want(t, loginFrom(e, owner, email, password), 204, "")

	// Once the oldest failure leaves the window, one more attempt is allowed.
	clock.Advance(53 * time.Second)
	upstreamtest.Want(t, loginFrom(e, attacker, email, password), 429, `{"error":"rate_limited","retryAfter":1}`)
	clock.Advance(time.Second)
	upstreamtest.Want(t, loginFrom(e, attacker, email, password), 204, "")

	// A success forgets the pair's failures: three more may fail before the next 429.
	for range 3 {
		upstreamtest.Want(t, loginFrom(e, attacker, email, "wrong password"), 401, `{"error":"invalid credentials"}`)
	}
	upstreamtest.Want(t, loginFrom(e, attacker, email, password), 429, `{"error":"rate_limited","retryAfter":60}`)
}

func TestLoginThrottleCountsEveryEmailOfAnAddress(t *testing.T) {
	clock := upstreamtest.NewClock()
	e := newThrottleEnv(t, clock)
	email, password := e.User()
	const sprayer = "2001:db8::7"
	for i := range 5 {
		upstreamtest.Want(t, loginFrom(e, sprayer, "nobody"+string(rune('a'+i))+"@example.com", "wrong password"), 401,
			`{"error":"invalid credentials"}`)
	}
	upstreamtest.Want(t, loginFrom(e, sprayer, email, password), 429, `{"error":"rate_limited","retryAfter":60}`)
	upstreamtest.Want(t, loginFrom(e, "2001:db8:0:1::8", email, password), 204, "") // another /64
}

func TestLoginThrottleIgnoresForwardedForFromAnUntrustedPeer(t *testing.T) {
	clock := upstreamtest.NewClock()
	e := upstreamtest.NewEnv(t, func(c *httpapi.Config) {
		c.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
		c.LoginThrottle = store.LoginThrottle{Window: time.Minute, PerEmail: 3, PerClient: 5}
		c.Now = clock.Now
	})
	email, password := e.User()
	for i := range 3 {
		upstreamtest.Want(t, loginFrom(e, "203.0.113."+string(rune('1'+i)), email, "wrong password"), 401, `{"error":"invalid credentials"}`)
	}
	// Every attempt counted against the connection's address, 127.0.0.1.
	upstreamtest.Want(t, loginFrom(e, "203.0.113.9", email, password), 429, `{"error":"rate_limited","retryAfter":60}`)
	if got := upstreamtest.Scalar[string](e, `SELECT DISTINCT client FROM login_attempts`); got != "127.0.0.1" {
		t.Errorf("attempts recorded for %q, want 127.0.0.1", got)
	}
}

func TestLoginThrottleCountsAnIPv6AddressByItsSlash64(t *testing.T) {
	// An IPv6 client has a /64 to pick addresses from: each must not be a new budget.
	clock := upstreamtest.NewClock()
	e := newThrottleEnv(t, clock)
	email, password := e.User()
	for i := range 3 {
		addr := "2001:db8:1:2::" + string(rune('1'+i))
		upstreamtest.Want(t, loginFrom(e, addr, email, "wrong password"), 401, `{"error":"invalid credentials"}`)
	}
	upstreamtest.Want(t, loginFrom(e, "2001:db8:1:2:aaaa:bbbb:cccc:dddd", email, password), 429, `{"error":"rate_limited","retryAfter":60}`)
	if got := upstreamtest.Scalar[string](e, `SELECT DISTINCT client FROM login_attempts`); got != "2001:db8:1:2::/64" {
		t.Errorf("attempts recorded for %q, want 2001:db8:1:2::/64", got)
	}
	// The next /64 is another client.
	upstreamtest.WantStatus(t, loginFrom(e, "2001:db8:1:3::1", email, password), 204)
}

// TestLoginThrottleBehindATrustedBalancerCountsTheClient: the gateway appends the
// balancer's address to X-Forwarded-For, after the client's, which the balancer
// appended. With the balancer among the trusted proxies, the throttle passes over it
// to the rightmost untrusted entry: five wrong passwords from one client leave
// another client's right password alone, and whatever the client wrote further left
// is not its address.
func TestLoginThrottleBehindATrustedBalancerCountsTheClient(t *testing.T) {
	clock := upstreamtest.NewClock()
	e := upstreamtest.NewEnv(t, func(c *httpapi.Config) {
		c.TrustedProxies = append([]netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, loopback...)
		c.LoginThrottle = store.LoginThrottle{Window: time.Minute, PerEmail: 3, PerClient: 5}
		c.Now = clock.Now
	})
	email, password := e.User()
	const attacker, owner, balancer = "203.0.113.1", "203.0.113.2", "10.0.0.5"
	via := func(client, pw string) upstreamtest.Response {
		return e.Anon().With("X-Forwarded-For", "192.0.2.77, "+client+", "+balancer).
			Do("POST", "/auth/login", upstreamtest.JSONBody(map[string]string{"email": email, "password": pw}))
	}
	for i := range 5 {
		upstreamtest.WantStatus(t, via(attacker, "wrong password"), map[bool]int{true: 401, false: 429}[i < 3])
	}
	upstreamtest.Want(t, via(attacker, password), 429, `{"error":"rate_limited","retryAfter":60}`)
	upstreamtest.Want(t, via(owner, password), 204, "")
	if got := upstreamtest.Scalar[string](e, `SELECT string_agg(DISTINCT client, ',') FROM login_attempts`); got != attacker {
		t.Errorf("attempts recorded for %q, want %s", got, attacker)
	}
}
