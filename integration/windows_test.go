package integration

// A key's windows beside its minute, end to end: a second, a day, the plan's and a
// key's own, counted by two gateways on real Redis (single and Cluster) with the
// route's cost, and answered with the window that refused.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"
)

// windowRoutes weigh a monitor's creation 3 and its deletion 6.
var windowRoutes = []string{
	"route GET /v1/me",
	"route GET,HEAD /v1/monitors* scope monitors:read",
	"route POST /v1/monitors scope monitors:write cost 3",
	"route DELETE /v1/monitors/* scope monitors:delete cost 6",
}

// windowPlan creates or replaces plan name with 1000 requests a minute per key, room
// for 100 monitors, and the limits flags adds ("--api-rate-limit-per-second", "5").
func (s *Stack) windowPlan(name string, flags ...string) {
	s.t.Helper()
	s.cli("", append([]string{"plan", "put", "--name", name, "--api-rate-limit", "1000",
		"--max-monitors", "100", "--min-interval", "60", "--locations", "us-east", "--check-types", "http"}, flags...)...)
}

// inOneSecond sends cs all at once, each from a client of its own, at the start of a
// UTC second, until every request was sent and answered within that second (a busy
// machine may take longer; each try starts a fresh second), and returns the answers in
// the order of cs.
func (s *Stack) inOneSecond(cs []call) []answer {
	s.t.Helper()
	for try := 1; ; try++ {
		now := time.Now()
		time.Sleep(time.Second - time.Duration(now.Nanosecond()) + 10*time.Millisecond) // to the next second's start
		out := make([]answer, len(cs))
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range cs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				out[i] = s.send(cs[i])
			}()
		}
		close(start)
		wg.Wait()
		first, last := out[0].sent, out[0].at
		for _, a := range out {
			first, last = minTime(first, a.sent), maxTime(last, a.at)
		}
		if first.Unix() == last.Unix() {
			return out
		}
		if try == 10 {
			s.t.Fatalf("%d tries of %d requests, none within one second (the last from %v to %v)", try, len(cs), first, last)
		}
	}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// wantWindow429 checks a 429 of a key's window: exactly body (its retryAfter, if
// any, as %d) and Retry-After the same, or none when body has no retryAfter.
func wantWindow429(t *testing.T, what string, a answer, body string, retryAfter func(answer) (lo, hi int)) {
	t.Helper()
	if retryAfter == nil {
		wantError(t, a.Resp, http.StatusTooManyRequests, body)
		if v := a.Header.Values("Retry-After"); len(v) != 0 {
			t.Errorf("%s: Retry-After %q on a request that never fits", what, v)
		}
		return
	}
	retry, err := strconv.Atoi(a.Header.Get("Retry-After"))
	if lo, hi := retryAfter(a); err != nil || retry < lo || retry > hi {
		t.Errorf("%s: Retry-After %q, want %d to %d", what, a.Header.Get("Retry-After"), lo, hi)
	}
	wantError(t, a.Resp, http.StatusTooManyRequests, fmt.Sprintf(body, retry))
}

// oneSecond is the Retry-After of a refusal by a second.
func oneSecond(answer) (int, int) { return 1, 1 }

// toMidnight is the Retry-After of a refusal by a day: the whole seconds from a's
// request or answer to the next midnight UTC, rounded up.
func toMidnight(a answer) (int, int) {
	left := func(t time.Time) int {
		next := t.UTC().Truncate(24 * time.Hour).Add(24 * time.Hour)
		return int((next.Sub(t) + time.Second - 1) / time.Second)
	}
	return left(a.at), left(a.sent)
}

// wantPolicy checks a's RateLimit-Policy, exactly.
func wantPolicy(t *testing.T, what string, a answer, policy string) {
	t.Helper()
	if got := a.Header.Get("RateLimit-Policy"); got != policy {
		t.Errorf("%s: RateLimit-Policy %q, want %q", what, got, policy)
	}
}

// TestWindowsABurstOfFiveASecondPassesExactlyFive: a plan of 5 requests a second per
// key. 16 requests of one key at once, over two gateways, in one second: exactly 5
// pass and 11 are refused by the second, each told to retry in 1 second. Three
// requests of cost 3 at once: one passes. A request of cost 6 never fits in a second
// of 5: refused without Retry-After, whenever it comes.
func TestWindowsABurstOfFiveASecondPassesExactlyFive(t *testing.T) {
	onEachRedis(t, func(t *testing.T, s *Stack) {
		s.windowPlan("burst", "--api-rate-limit-per-second", "5")
		org, owner := s.newOwner("burst")
		_, key := owner.createKey(org.ID, "k", "Editor", nil)
		const policy = `"default";q=1000;w=60, "second";q=5;w=1`
		waitForWindowRoom(20)

		as := s.inOneSecond(calls(key, "/v1/me", 16))
		wantStatuses(t, "16 at once on a second of 5", as, map[int]int{200: 5, 429: 11})
		for _, a := range as {
			wantPolicy(t, "the burst", a, policy)
			if a.Status == http.StatusTooManyRequests {
				wantWindow429(t, "the burst", a, `{"error":"rate_limited","retryAfter":%d,"budget":"key","window":"second"}`, oneSecond)
			}
		}
		var creates []call
		for i := range 3 {
			creates = append(creates, call{key, i % 2, "POST", "/v1/monitors", newMonitor(fmt.Sprint("m", i))})
		}
		as = s.inOneSecond(creates)
		wantStatuses(t, "3 creates of cost 3 at once on a second of 5", as, map[int]int{201: 1, 429: 2})
		for _, a := range as {
			if a.Status == http.StatusTooManyRequests {
				wantWindow429(t, "a create", a, `{"error":"rate_limited","retryAfter":%d,"budget":"key","window":"second","cost":3}`, oneSecond)
			}
		}
		a := s.send(call{key, 1, "DELETE", "/v1/monitors/00000000-0000-4000-8000-000000000000", nil})
		wantWindow429(t, "a delete of cost 6", a, `{"error":"rate_limited","budget":"key","window":"second","cost":6,"limit":5,"fits":false}`, nil)
		wantPolicy(t, "a delete of cost 6", a, policy)
	}, windowRoutes...)
}

// TestWindowsADayOfFortyRefusesTheFortyFirstUnit: a plan of 40 requests a UTC day per
// key, under an organisation's minute. 13 creates of cost 3 pass over both gateways;
// the 40th unit passes; a create of 3 with 1 left, and then the 41st unit, are
// refused by the day, with Retry-After to midnight UTC. GET /v1/me and RateLimit list
// the day between the key's minute and the organisation's.
func TestWindowsADayOfFortyRefusesTheFortyFirstUnit(t *testing.T) {
	onEachRedis(t, func(t *testing.T, s *Stack) {
		s.windowPlan("daily", "--api-rate-limit-per-day", "40", "--org-rate-limit", "5000")
		org, owner := s.newOwner("daily")
		_, key := owner.createKey(org.ID, "k", "Editor", nil)
		const policy = `"default";q=1000;w=60, "day";q=40;w=86400, "org";q=5000;w=60`
		waitForDayRoom(2 * time.Minute)
		waitForWindowRoom(20)

		var creates []call
		for i := range 13 {
			creates = append(creates, call{key, i % 2, "POST", "/v1/monitors", newMonitor(fmt.Sprint("m", i))})
		}
		wantStatuses(t, "13 creates of cost 3 on a day of 40", s.burst(creates), map[int]int{201: 13})
		a := s.me(key, 0)
		var me struct{ Limits map[string]*int64 }
		if err := json.Unmarshal(a.Body, &me); a.Status != http.StatusOK || err != nil || me.Limits["per_day"] == nil ||
			*me.Limits["per_day"] != 40 || me.Limits["per_second"] != nil || me.Limits["per_hour"] != nil {
			t.Errorf("GET /v1/me: %d %s; want per_day 40, per_second and per_hour null", a.Status, a.Body)
		}
		wantPolicy(t, "GET /v1/me", a, policy)
		if r := rOf(a, "day"); r != 0 {
			t.Errorf("GET /v1/me, the 40th unit: RateLimit %q, want the day's r=0", a.Header.Get("RateLimit"))
		}
		a = s.send(call{key, 1, "POST", "/v1/monitors", newMonitor("m13")})
		wantWindow429(t, "a create with nothing left", a, `{"error":"rate_limited","retryAfter":%d,"budget":"key","window":"day","cost":3}`, toMidnight)
		a = s.me(key, 1)
		wantWindow429(t, "the 41st unit", a, `{"error":"rate_limited","retryAfter":%d,"budget":"key","window":"day"}`, toMidnight)
		wantPolicy(t, "the 41st unit", a, policy)
	}, windowRoutes...)
}

// TestWindowsAKeysOwnBurstUnderThePlans: a plan of 50 a second per key, a key with
// its own 2 a second. 8 requests of it at once, in one second: exactly 2 pass, and
// GET /v1/me says 2. Another key of the plan passes all 8.
func TestWindowsAKeysOwnBurstUnderThePlans(t *testing.T) {
	onEachRedis(t, func(t *testing.T, s *Stack) {
		s.windowPlan("fifty", "--api-rate-limit-per-second", "50")
		org, owner := s.newOwner("fifty")
		_, own := owner.createKeyWith(org.ID, "own", "Viewer", map[string]any{"rate_limit_per_second": 2})
		_, other := owner.createKey(org.ID, "other", "Viewer", nil)
		waitForWindowRoom(20)

		as := s.inOneSecond(calls(own, "/v1/monitors", 8))
		wantStatuses(t, "8 at once of a key of 2 a second", as, map[int]int{200: 2, 429: 6})
		for _, a := range as {
			wantPolicy(t, "the key's own", a, `"default";q=1000;w=60, "second";q=2;w=1`)
			if a.Status == http.StatusTooManyRequests {
				wantWindow429(t, "the key's own", a, `{"error":"rate_limited","retryAfter":%d,"budget":"key","window":"second"}`, oneSecond)
			}
		}
		as = s.inOneSecond(calls(other, "/v1/monitors", 8))
		wantStatuses(t, "8 at once of a key of the plan's 50 a second", as, map[int]int{200: 8})
		a := s.inOneSecond([]call{{own, 0, "GET", "/v1/me", nil}})[0]
		wantMeLimits(t, "the key's own", a, org.ID, "Viewer",
			`{"per_minute":1000,"per_second":2,"per_hour":null,"per_day":null,"org_per_minute":null,"per_month":null,"used_this_month":null}`)
	}, windowRoutes...)
}
