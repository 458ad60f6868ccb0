package integration

import (
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"
)

const featureGatedAPI = `{"error":"feature_gated","feature":"api","upgrade":true}`

func TestAPIOffPlanIsGatedEverywhereAndPlanChangesApplyAtOnce(t *testing.T) {
	s := newStack(t)
	free, owner := s.newOwner("free")

	// No key can be created on a plan without API access.
	wantError(t, owner.do("POST", "/orgs/"+free.ID+"/api-keys", map[string]any{"name": "k", "role": "Admin"}, nil),
		403, featureGatedAPI)

	// A key made while on pro stops working the moment the org moves to free.
	s.cli("", "org", "set-plan", "--org", free.ID, "--plan", "pro")
	_, key := owner.createKey(free.ID, "k", "Admin", nil)
	if r := s.api(key, 0).do("GET", "/v1/me", nil); r.Status != 200 {
		t.Fatalf("on pro: %d %s", r.Status, r.Body)
	}
	s.cli("", "org", "set-plan", "--org", free.ID, "--plan", "free")
	a := s.api(key, 0)
	for _, rq := range []struct{ method, path string }{
		{"GET", "/v1/me"}, {"GET", "/v1/monitors"}, {"POST", "/v1/monitors"},
		{"GET", "/v1/monitors/00000000-0000-0000-0000-000000000000"}, {"DELETE", "/v1/monitors/x"}, {"GET", "/v1/nowhere"},
	} {
		r := a.do(rq.method, rq.path, nil)
		wantError(t, r, 403, featureGatedAPI)
		if r.Header.Get("RateLimit") != "" || r.Header.Get("RateLimit-Policy") != "" {
			t.Errorf("%s %s on an API-off plan carries rate limit headers", rq.method, rq.path)
		}
	}
	s.cli("", "org", "set-plan", "--org", free.ID, "--plan", "pro")
	if r := a.do("GET", "/v1/me", nil); r.Status != 200 {
		t.Errorf("back on pro: %d %s", r.Status, r.Body)
	}
}

var rateLimitRE = regexp.MustCompile(`^"default";r=(\d+);t=(\d+)$`)

// secondsLeft is what S should be now: the whole seconds left in the UTC minute,
// rounded up.
func secondsLeft() int {
	ms := time.Now().UnixMilli() % 60000
	return int((60000 - ms + 999) / 1000)
}

func TestRateLimitIsOneBudgetAcrossGatewaysAndPerKey(t *testing.T) {
	s := newStack(t)
	const n = 20
	s.cli("", "plan", "put", "--name", "tiny", "--api-rate-limit", strconv.Itoa(n), "--max-monitors", "10",
		"--min-interval", "60", "--locations", "us-east", "--check-types", "http")
	org, owner := s.newOwner("tiny")
	_, key := owner.createKey(org.ID, "a", "Viewer", nil)
	_, other := owner.createKey(org.ID, "b", "Viewer", nil)

	waitForWindowRoom(15)
	// 3n concurrent requests, split over both gateways: exactly n pass.
	var (
		mu       sync.Mutex
		statuses = map[int]int{}
		limited  []Resp
		wg       sync.WaitGroup
	)
	for i := range 3 * n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := s.api(key, i%2).do("GET", "/v1/me", nil)
			mu.Lock()
			defer mu.Unlock()
			statuses[r.Status]++
			if r.Status == 429 {
				limited = append(limited, r)
			}
		}()
	}
	wg.Wait()
	if statuses[200] != n || statuses[429] != 2*n {
		t.Fatalf("statuses %v, want %d × 200 and %d × 429 across the two gateways", statuses, n, 2*n)
	}
	for _, r := range limited[:3] {
		s := secondsLeft()
		retry, err := strconv.Atoi(r.Header.Get("Retry-After"))
		if err != nil {
			t.Fatalf("Retry-After %q", r.Header.Get("Retry-After"))
		}
		if retry < 1 || retry > 60 || retry < s-1 || retry > s+1 {
			t.Errorf("Retry-After %d, want the %d seconds left in the window", retry, s)
		}
		wantError(t, r, 429, fmt.Sprintf(`{"error":"rate_limited","retryAfter":%d,"budget":"key","window":"minute"}`, retry))
		if got := r.Header.Get("RateLimit-Policy"); got != fmt.Sprintf(`"default";q=%d;w=60`, n) {
			t.Errorf("RateLimit-Policy %q", got)
		}
		if got := r.Header.Get("RateLimit"); got != fmt.Sprintf(`"default";r=0;t=%d`, retry) {
			t.Errorf("RateLimit %q on a 429 with Retry-After %d", got, retry)
		}
	}

	// The other key of the same org has its own budget, with headers counting down.
	for i := 1; i <= 3; i++ {
		r := s.api(other, 1).do("GET", "/v1/me", nil)
		if r.Status != 200 {
			t.Fatalf("the second key: %d %s", r.Status, r.Body)
		}
		m := rateLimitRE.FindStringSubmatch(r.Header.Get("RateLimit"))
		if m == nil || m[1] != strconv.Itoa(n-i) {
			t.Errorf("request %d of the second key: RateLimit %q, want r=%d", i, r.Header.Get("RateLimit"), n-i)
		}
		if got := r.Header.Get("RateLimit-Policy"); got != fmt.Sprintf(`"default";q=%d;w=60`, n) {
			t.Errorf("RateLimit-Policy %q", got)
		}
	}

	// Proxied responses and refusals of a limited key carry the headers too.
	proxied := s.api(other, 0).do("GET", "/v1/monitors", nil)
	if proxied.Status != 200 || !rateLimitRE.MatchString(proxied.Header.Get("RateLimit")) {
		t.Errorf("proxied list: %d, RateLimit %q", proxied.Status, proxied.Header.Get("RateLimit"))
	}
	forbidden := s.api(other, 0).do("POST", "/v1/monitors", map[string]any{})
	wantError(t, forbidden, 403, `{"error":"forbidden","reason":"role","required_role":"Editor"}`)
	if !rateLimitRE.MatchString(forbidden.Header.Get("RateLimit")) {
		t.Errorf("403 forbidden of a limited key: RateLimit %q", forbidden.Header.Get("RateLimit"))
	}
}

func TestRetryAfterIsTheTimeLeftInTheWindow(t *testing.T) {
	// Most of its time is waiting for the window to end: it waits beside the other
	// waiting tests (see the package doc).
	t.Parallel()
	s := newStack(t)
	s.cli("", "plan", "put", "--name", "one", "--api-rate-limit", "1", "--max-monitors", "10",
		"--min-interval", "60", "--locations", "us-east", "--check-types", "http")
	org, key := s.newKey("pro", "Admin")
	s.cli("", "org", "set-plan", "--org", org.ID, "--plan", "one")

	waitForWindowRoom(5)
	a := s.api(key, 0)
	if r := a.do("GET", "/v1/me", nil); r.Status != 200 {
		t.Fatalf("first request: %d %s", r.Status, r.Body)
	}
	r := a.do("GET", "/v1/me", nil)
	want := secondsLeft()
	retry, _ := strconv.Atoi(r.Header.Get("Retry-After"))
	if r.Status != 429 || retry < want-1 || retry > want+1 {
		t.Fatalf("second request: %d, Retry-After %q, want 429 with about %d", r.Status, r.Header.Get("Retry-After"), want)
	}
	body := r.JSON(t)
	if body["retryAfter"] != float64(retry) {
		t.Errorf("retryAfter %v differs from Retry-After %d", body["retryAfter"], retry)
	}
	// After waiting Retry-After seconds the key may go again: a time the test must let pass.
	time.Sleep(time.Duration(retry)*time.Second + 100*time.Millisecond)
	if r := a.do("GET", "/v1/me", nil); r.Status != 200 {
		t.Errorf("after waiting Retry-After: %d %s", r.Status, r.Body)
	}
}

func TestUnlimitedPlanHasNoCapAndNoHeaders(t *testing.T) {
	s := newStack(t)
	_, key := s.newKey("enterprise", "Admin")
	var wg sync.WaitGroup
	var mu sync.Mutex
	bad := 0
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := s.api(key, i%2).do("GET", "/v1/me", nil)
			if r.Status != http.StatusOK || r.Header.Get("RateLimit") != "" || r.Header.Get("RateLimit-Policy") != "" {
				mu.Lock()
				bad++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if bad != 0 {
		t.Errorf("%d of 200 requests on an unlimited plan were refused or carried rate limit headers", bad)
	}
}
