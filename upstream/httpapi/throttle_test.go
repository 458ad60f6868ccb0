package httpapi

import (
	"context"
	"net/http"
	"net/netip"
	"sync"
	"testing"
	"time"
)

// fakeClock is a Config.Now that moves only when told.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Now().Truncate(time.Second)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// loopback is the trusted proxy of the throttle tests: the test client connects from it
// and names the client address in X-Forwarded-For.
var loopback = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}

// newThrottleEnv is a test server trusting loopback, with a one-minute window, 3
// failures per (email, address) and 5 per address, on clock.
func newThrottleEnv(t *testing.T, clock *fakeClock) *testEnv {
	return newTestEnv(t, func(c *Config) {
		c.TrustedProxies = loopback
		c.LoginThrottle = LoginThrottle{Window: time.Minute, PerEmail: 3, PerClient: 5}
		c.Now = clock.Now
	})
}

// loginFrom posts a login as the client at addr, behind the trusted proxy.
func (e *testEnv) loginFrom(addr, email, password string) response {
	e.t.Helper()
	return e.anon().with("X-Forwarded-For", "198.51.100.250, "+addr).
		do("POST", "/auth/login", jsonBody(map[string]string{"email": email, "password": password}))
}

func TestLoginThrottleRefusesWithoutHashingAndSparesOtherAddresses(t *testing.T) {
	clock := newFakeClock()
	e := newThrottleEnv(t, clock)
	email, password := e.user()
	const attacker, owner = "203.0.113.1", "203.0.113.2"

	for i := range 3 {
		want(t, e.loginFrom(attacker, email, "wrong password"), 401, `{"error":"invalid credentials"}`)
		clock.Advance(time.Duration(i+1) * time.Second)
	}
	// The first failure was 6 s ago: it leaves the window in 54 s. The right password
	// is refused too, and no argon2id runs.
	before := e.srv.passwords.derivations.Load()
	r := e.loginFrom(attacker, email, password)
	want(t, r, http.StatusTooManyRequests, `{"error":"rate_limited","retryAfter":54}`)
	if got := r.header.Get("Retry-After"); got != "54" {
		t.Errorf("Retry-After = %q, want 54", got)
	}
	if n := e.srv.passwords.derivations.Load() - before; n != 0 {
		t.Errorf("a throttled login ran argon2id %d times", n)
	}

	// The owner, at another address, logs in.
	want(t, e.loginFrom(owner, email, password), 204, "")

	// Once the oldest failure leaves the window, one more attempt is allowed.
	clock.Advance(53 * time.Second)
	want(t, e.loginFrom(attacker, email, password), 429, `{"error":"rate_limited","retryAfter":1}`)
	clock.Advance(time.Second)
	want(t, e.loginFrom(attacker, email, password), 204, "")

	// A success forgets the pair's failures: three more may fail before the next 429.
	for range 3 {
		want(t, e.loginFrom(attacker, email, "wrong password"), 401, `{"error":"invalid credentials"}`)
	}
	want(t, e.loginFrom(attacker, email, password), 429, `{"error":"rate_limited","retryAfter":60}`)
}

func TestLoginThrottleCountsEveryEmailOfAnAddress(t *testing.T) {
	clock := newFakeClock()
	e := newThrottleEnv(t, clock)
	email, password := e.user()
	const sprayer = "2001:db8::7"
	for i := range 5 {
		want(t, e.loginFrom(sprayer, "nobody"+string(rune('a'+i))+"@example.com", "wrong password"), 401,
			`{"error":"invalid credentials"}`)
	}
	want(t, e.loginFrom(sprayer, email, password), 429, `{"error":"rate_limited","retryAfter":60}`)
	want(t, e.loginFrom("2001:db8:0:1::8", email, password), 204, "") // another /64
}

func TestLoginThrottleIsExactUnderConcurrentGuesses(t *testing.T) {
	// Many instances' reservations racing for one address: exactly the limit pass.
	clock := newFakeClock()
	e := newThrottleEnv(t, clock)
	email := emailKey("victim@example.com")
	start := make(chan struct{})
	passed := make(chan int64, 40)
	var wg sync.WaitGroup
	for range cap(passed) {
		wg.Go(func() {
			<-start
			id, wait, err := e.srv.reserveLogin(context.Background(), "203.0.113.9", email, clock.Now())
			if err != nil {
				t.Error(err)
			}
			if wait == 0 {
				passed <- id
			}
		})
	}
	close(start)
	wg.Wait()
	close(passed)
	if n := len(passed); n != 3 {
		t.Errorf("%d of %d concurrent attempts passed, want 3", n, cap(passed))
	}
	if n := scalar[int](e, `SELECT count(*) FROM login_attempts`); n != 3 {
		t.Errorf("%d attempts recorded, want 3", n)
	}
}

func TestLoginThrottleIgnoresForwardedForFromAnUntrustedPeer(t *testing.T) {
	clock := newFakeClock()
	e := newTestEnv(t, func(c *Config) {
		c.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
		c.LoginThrottle = LoginThrottle{Window: time.Minute, PerEmail: 3, PerClient: 5}
		c.Now = clock.Now
	})
	email, password := e.user()
	for i := range 3 {
		want(t, e.loginFrom("203.0.113."+string(rune('1'+i)), email, "wrong password"), 401, `{"error":"invalid credentials"}`)
	}
	// Every attempt counted against the connection's address, 127.0.0.1.
	want(t, e.loginFrom("203.0.113.9", email, password), 429, `{"error":"rate_limited","retryAfter":60}`)
	if got := scalar[string](e, `SELECT DISTINCT client FROM login_attempts`); got != "127.0.0.1" {
		t.Errorf("attempts recorded for %q, want 127.0.0.1", got)
	}
}

func TestLoginThrottleCountsAnIPv6AddressByItsSlash64(t *testing.T) {
	// An IPv6 client has a /64 to pick addresses from: each must not be a new budget.
	clock := newFakeClock()
	e := newThrottleEnv(t, clock)
	email, password := e.user()
	for i := range 3 {
		addr := "2001:db8:1:2::" + string(rune('1'+i))
		want(t, e.loginFrom(addr, email, "wrong password"), 401, `{"error":"invalid credentials"}`)
	}
	want(t, e.loginFrom("2001:db8:1:2:aaaa:bbbb:cccc:dddd", email, password), 429, `{"error":"rate_limited","retryAfter":60}`)
	if got := scalar[string](e, `SELECT DISTINCT client FROM login_attempts`); got != "2001:db8:1:2::/64" {
		t.Errorf("attempts recorded for %q, want 2001:db8:1:2::/64", got)
	}
	// The next /64 is another client.
	wantStatus(t, e.loginFrom("2001:db8:1:3::1", email, password), 204)
}

func TestThrottleClient(t *testing.T) {
	for in, want := range map[string]string{
		"203.0.113.7":                   "203.0.113.7",
		"::1":                           "::1",
		"2001:db8:1:2:3:4:5:6":          "2001:db8:1:2::/64",
		"2001:db8:1:2::":                "2001:db8:1:2::/64",
		"fe80::1":                       "fe80::/64",
		"2001:db8:ffff:ffff:ffff::ffff": "2001:db8:ffff:ffff::/64",
	} {
		if got := throttleClient(netip.MustParseAddr(in)); got != want {
			t.Errorf("throttleClient(%s) = %q, want %q", in, got, want)
		}
	}
}
