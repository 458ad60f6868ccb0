package integration

// Budgets and restricted keys, end to end: a key's own minute limit, the organisation's
// minute ceiling and its monthly quota, counted by two gateways on real Redis (single
// and Cluster) and PostgreSQL; and keys limited to networks. Every burst is sent by
// several clients at once, split over both gateways: the counts are exact, not
// approximately right.

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/keygate/keygate/keystore"
)

// bodyQuotaExceeded is the 402 of an organisation whose month of limit is spent by
// requests of cost 1: all of it used.
func bodyQuotaExceeded(limit int) string {
	return fmt.Sprintf(`{"error":"quota_exceeded","metric":"api_requests","upgrade":true,"limit":%d,"used":%[1]d}`, limit)
}

// burstWorkers is how many clients send a burst at once.
const burstWorkers = 8

// onEachRedis runs f on a stack of its own for each Redis the gateways can count on:
// the single server and the 3-master Cluster of scripts/stack.sh. The two run at once:
// they share no Redis, and each has its own database and organisations. The gateways
// have more option lines, if given.
func onEachRedis(t *testing.T, f func(t *testing.T, s *Stack), options ...string) {
	for _, mode := range []string{"single", "cluster"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			f(t, newBudgetStack(t, mode, options...))
		})
	}
}

// newBudgetStack is a stack whose two gateways count on the Redis of mode and write
// the usage record every second, so that a test can wait for it, with more option
// lines, if given.
func newBudgetStack(t *testing.T, mode string, options ...string) *Stack {
	t.Helper()
	o := stackOptions{redisMode: mode, gwOptions: strings.Join(append([]string{"usage_flush_interval 1s"}, options...), "\n\t\t\t")}
	if mode == "cluster" {
		if o.redisURL = os.Getenv("REDIS_CLUSTER_URL"); o.redisURL == "" {
			t.Fatal("REDIS_CLUSTER_URL is not set: run the tests with `make test` (scripts/stack.sh up-cluster)")
		}
	}
	return newStackWith(t, o)
}

// budgetPlan creates or replaces plan name: perKey requests a minute per key (-1
// unlimited), perOrg a minute across the org's keys and perMonth a UTC month (-1 none).
func (s *Stack) budgetPlan(name string, perKey, perOrg int, perMonth int64) {
	s.t.Helper()
	s.cli("", "plan", "put", "--name", name, "--api-rate-limit", strconv.Itoa(perKey),
		"--org-rate-limit", strconv.Itoa(perOrg), "--api-requests-per-month", strconv.FormatInt(perMonth, 10),
		"--max-monitors", "10", "--min-interval", "60", "--locations", "us-east", "--check-types", "http")
}

// createKeyWith creates a key with more fields of the create body (rate_limit,
// allowed_cidrs) and returns its id and full key.
func (c *Client) createKeyWith(orgID, name, role string, fields map[string]any) (id, key string) {
	c.s.t.Helper()
	body := map[string]any{"name": name, "role": role}
	maps.Copy(body, fields)
	r := c.do("POST", "/orgs/"+orgID+"/api-keys", body, nil)
	if r.Status != http.StatusCreated {
		c.s.t.Fatalf("creating a key with %v: %d %s", fields, r.Status, r.Body)
	}
	v := r.JSON(c.s.t)
	id, key = v["id"].(string), v["key"].(string)
	c.s.neverLog(key)
	if _, secret, ok := strings.Cut(key, "."); ok {
		c.s.neverLog(secret)
	}
	return id, key
}

// calls returns n GET path of key, alternating between gateways 0 and 1.
func calls(key, path string, n int) []call {
	out := make([]call, n)
	for i := range out {
		out[i] = call{key: key, gw: i % 2, method: "GET", path: path}
	}
	return out
}

// interleave returns the calls of each list in turn: one of each, then the next.
func interleave(lists ...[]call) []call {
	var out []call
	for i := 0; ; i++ {
		more := false
		for _, l := range lists {
			if i < len(l) {
				out, more = append(out, l[i]), true
			}
		}
		if !more {
			return out
		}
	}
}

// answer is a response, with when its request was sent and when it arrived.
type answer struct {
	Resp
	sent, at time.Time
}

// send sends c and returns its answer.
func (s *Stack) send(c call) answer {
	s.t.Helper()
	sent := time.Now()
	r := s.api(c.key, c.gw).do(c.method, c.path, c.body)
	return answer{r, sent, time.Now()}
}

// burst sends cs from burstWorkers clients at once and returns the answers in the
// order of cs.
func (s *Stack) burst(cs []call) []answer {
	s.t.Helper()
	out := make([]answer, len(cs))
	next := make(chan int)
	var wg sync.WaitGroup
	for range burstWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				out[i] = s.send(cs[i])
			}
		}()
	}
	for i := range cs {
		next <- i
	}
	close(next)
	wg.Wait()
	return out
}

// statuses counts the answers by status.
func statuses(as []answer) map[int]int {
	n := map[int]int{}
	for _, a := range as {
		n[a.Status]++
	}
	return n
}

// wantStatuses fails the test unless as has exactly want's statuses.
func wantStatuses(t *testing.T, what string, as []answer, want map[int]int) {
	t.Helper()
	if got := statuses(as); !maps.Equal(got, want) {
		t.Fatalf("%s: statuses %v, want %v", what, got, want)
	}
}

// secondsLeftAt is S at instant at: the whole seconds left in its UTC minute,
// rounded up.
func secondsLeftAt(at time.Time) int {
	ms := at.UnixMilli() % 60000
	return int((60000 - ms + 999) / 1000)
}

// nearS reports whether t is the S of the minute window of answer a: the whole
// seconds left in it, rounded up, at some instant between a's request and its answer
// (a second either way for the rounding).
func nearS(t int, a answer) bool {
	return t >= 1 && t <= 60 && t >= secondsLeftAt(a.at)-1 && t <= secondsLeftAt(a.sent)+1
}

// left is the r an item of the RateLimit field should have: budget its name
// ("default", "org"), r its requests left, or -1 for any.
type left struct {
	budget string
	r      int
}

var rateLimitItemRE = regexp.MustCompile(`^"([a-z]+)";r=(\d+);t=(\d+)$`)

// wantRateLimit checks the RateLimit-Policy field of a, exactly, and its RateLimit
// field: one item per budget of items, in order, each with its r, and every t the
// seconds left in the minute window.
func wantRateLimit(t *testing.T, what string, a answer, policy string, items ...left) {
	t.Helper()
	if got := a.Header.Get("RateLimit-Policy"); got != policy {
		t.Errorf("%s: RateLimit-Policy %q, want %q", what, got, policy)
	}
	got := a.Header.Get("RateLimit")
	parts := strings.Split(got, ", ")
	if len(a.Header.Values("RateLimit")) != 1 || len(parts) != len(items) {
		t.Errorf("%s: RateLimit %q, want %d item(s) %v", what, a.Header.Values("RateLimit"), len(items), items)
		return
	}
	for i, p := range parts {
		m := rateLimitItemRE.FindStringSubmatch(p)
		if m == nil {
			t.Errorf("%s: RateLimit %q: item %q is not \"name\";r=N;t=S", what, got, p)
			continue
		}
		r, _ := strconv.Atoi(m[2])
		tt, _ := strconv.Atoi(m[3])
		if m[1] != items[i].budget || (items[i].r >= 0 && r != items[i].r) || !nearS(tt, a) {
			t.Errorf("%s: RateLimit %q, want item %d %q with r=%d and t the %d seconds left", what, got, i, items[i].budget, items[i].r, secondsLeftAt(a.at))
		}
	}
}

// rOf returns the r of the item of budget in a's RateLimit field, or -1.
func rOf(a answer, budget string) int {
	for _, p := range strings.Split(a.Header.Get("RateLimit"), ", ") {
		if m := rateLimitItemRE.FindStringSubmatch(p); m != nil && m[1] == budget {
			r, _ := strconv.Atoi(m[2])
			return r
		}
	}
	return -1
}

// want429 checks a 429 of a minute budget: the body with retryAfter, Retry-After the
// same, both the seconds left in the minute window, and the budget that refused it
// ("key" or "org").
func want429(t *testing.T, a answer, budget string) {
	t.Helper()
	retry, err := strconv.Atoi(a.Header.Get("Retry-After"))
	if err != nil || !nearS(retry, a) {
		t.Errorf("Retry-After %q, want the %d seconds left in the window", a.Header.Get("Retry-After"), secondsLeftAt(a.at))
	}
	wantError(t, a.Resp, http.StatusTooManyRequests, fmt.Sprintf(`{"error":"rate_limited","retryAfter":%d,"budget":%q,"window":"minute"}`, retry, budget))
}

// want402 checks the 402 of a month of limit spent: exactly its body, and no
// Retry-After (no waiting within the minute helps).
func want402(t *testing.T, a answer, limit int) {
	t.Helper()
	body := bodyQuotaExceeded(limit)
	wantError(t, a.Resp, http.StatusPaymentRequired, body)
	if string(a.Body) != body {
		t.Errorf("402 body %q, want exactly %q", a.Body, body)
	}
	if v := a.Header.Values("Retry-After"); len(v) != 0 {
		t.Errorf("a 402 carries Retry-After %q", v)
	}
}

// me sends GET /v1/me of key to gateway gw, now.
func (s *Stack) me(key string, gw int) answer {
	s.t.Helper()
	return s.send(call{key, gw, "GET", "/v1/me", nil})
}

// limits is the "limits" member of GET /v1/me; nil is JSON null.
type limits struct {
	PerMinute     *int64 `json:"per_minute"`
	OrgPerMinute  *int64 `json:"org_per_minute"`
	PerMonth      *int64 `json:"per_month"`
	UsedThisMonth *int64 `json:"used_this_month"`
}

// lim builds the limits a test expects: -1 for null.
func lim(perMinute, orgPerMinute, perMonth, used int64) string {
	v := func(n int64) string {
		if n < 0 {
			return "null"
		}
		return strconv.FormatInt(n, 10)
	}
	return fmt.Sprintf(`{"per_minute":%s,"per_second":null,"per_hour":null,"per_day":null,"org_per_minute":%s,"per_month":%s,"used_this_month":%s}`,
		v(perMinute), v(orgPerMinute), v(perMonth), v(used))
}

// proMe is the GET /v1/me body of a key with role of orgID on the pro plan: its
// minute limit, and no organisation budget.
func proMe(orgID, role string) string {
	return fmt.Sprintf(`{"org_id":%q,"role":%q,"scopes":null,"limits":%s}`, orgID, role, lim(600, -1, -1, -1))
}

// wantMeLimits checks a GET /v1/me 200: the whole body, its limits as lim gives them.
func wantMeLimits(t *testing.T, what string, a answer, orgID, role, limits string) {
	t.Helper()
	want := fmt.Sprintf(`{"org_id":%q,"role":%q,"scopes":null,"limits":%s}`, orgID, role, limits)
	if a.Status != http.StatusOK || !jsonEqual(a.Body, []byte(want)) {
		t.Errorf("%s: GET /v1/me answered %d %s, want 200 %s", what, a.Status, a.Body, want)
	}
}

// usedThisMonth is the limits.used_this_month of a GET /v1/me 200, or -1.
func usedThisMonth(t *testing.T, a answer) int64 {
	t.Helper()
	var v struct{ Limits limits }
	if err := json.Unmarshal(a.Body, &v); err != nil || v.Limits.UsedThisMonth == nil {
		t.Errorf("GET /v1/me answered %d %s, without limits.used_this_month", a.Status, a.Body)
		return -1
	}
	return *v.Limits.UsedThisMonth
}

// sleepToNextMinute sleeps until just after the next UTC minute starts.
func sleepToNextMinute() {
	now := time.Now()
	time.Sleep(time.Duration(60-now.Unix()%60)*time.Second - time.Duration(now.Nanosecond()) + 50*time.Millisecond)
}

// waitForMonthRoom sleeps into the next UTC month when less than need is left in this
// one, so that a test's requests all count in one month.
func waitForMonthRoom(need time.Duration) {
	now := time.Now().UTC()
	waitPast(time.Date(now.Year(), now.Month()+1, 1, 0, 0, 0, 0, time.UTC), need)
}

// waitForDayRoom is waitForMonthRoom for a UTC day.
func waitForDayRoom(need time.Duration) {
	waitPast(time.Now().UTC().Truncate(24*time.Hour).Add(24*time.Hour), need)
}

// waitPast sleeps until just after next when it is less than need away.
func waitPast(next time.Time, need time.Duration) {
	if d := time.Until(next); d < need {
		time.Sleep(d + 50*time.Millisecond)
	}
}

// waitForUsage waits until the usage record of org, read through its owner, holds
// exactly want (key_id outcome status → count) since from: the gateways have
// written every request counted so far.
func waitForUsage(t *testing.T, owner *Client, orgID string, from time.Time, want map[string]int64) {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if maps.Equal(owner.usageTotals(orgID, from), want) {
			return
		}
	}
	wantTotals(t, "the usage record", owner.usageTotals(orgID, from), want)
	t.FailNow()
}

// flushRedis empties the gateways' Redis: FLUSHALL, on every master of a Cluster.
func (s *Stack) flushRedis() {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var err error
	if s.redisMode == "cluster" {
		opts, perr := redis.ParseClusterURL(s.redisURL)
		if perr != nil {
			s.t.Fatal(perr)
		}
		cc := redis.NewClusterClient(opts)
		defer cc.Close()
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return c.FlushAll(ctx).Err() })
	} else {
		opts, perr := redis.ParseURL(s.redisURL)
		if perr != nil {
			s.t.Fatal(perr)
		}
		c := redis.NewClient(opts)
		defer c.Close()
		err = c.FlushAll(ctx).Err()
	}
	if err != nil {
		s.t.Fatalf("FLUSHALL: %v", err)
	}
}

// TestBudgetAKeysOwnLimitPassesExactlyItsNumber gives keys a rate_limit below their
// plan's, on a plan with organisation budgets and on one without: exactly that many
// pass across both gateways. The requests the key's minute refuses count neither in
// the organisation's minute nor in its month.
func TestBudgetAKeysOwnLimitPassesExactlyItsNumber(t *testing.T) {
	onEachRedis(t, func(t *testing.T, s *Stack) {
		s.budgetPlan("budgets", 20, 100, 1000)
		s.budgetPlan("plain", 13, -1, -1)
		org, owner := s.newOwner("budgets")
		_, own := owner.createKeyWith(org.ID, "own", "Viewer", map[string]any{"rate_limit": 7})
		_, other := owner.createKey(org.ID, "other", "Viewer", nil)
		plainOrg, plainOwner := s.newOwner("plain")
		_, plainOwn := plainOwner.createKeyWith(plainOrg.ID, "own", "Viewer", map[string]any{"rate_limit": 7})
		waitForMonthRoom(5 * time.Minute)

		waitForWindowRoom(15)
		as := s.burst(calls(own, "/v1/me", 21))
		wantStatuses(t, "a key of 7 on a plan of 20 with organisation budgets", as, map[int]int{200: 7, 429: 14})
		var keyLeft, orgLeft []int
		for _, a := range as {
			if a.Status == http.StatusOK {
				keyLeft, orgLeft = append(keyLeft, rOf(a, "default")), append(orgLeft, rOf(a, "org"))
				wantRateLimit(t, "a 200", a, `"default";q=7;w=60, "org";q=100;w=60`, left{"default", -1}, left{"org", -1})
				continue
			}
			want429(t, a, "key")
			// Refused by its key: the organisation's minute has the 7 that passed, and
			// this one is not among them.
			wantRateLimit(t, "a 429 of the key's minute", a, `"default";q=7;w=60, "org";q=100;w=60`, left{"default", 0}, left{"org", 93})
		}
		slices.Sort(keyLeft)
		slices.Sort(orgLeft)
		if !slices.Equal(keyLeft, []int{0, 1, 2, 3, 4, 5, 6}) || !slices.Equal(orgLeft, []int{93, 94, 95, 96, 97, 98, 99}) {
			t.Errorf("the 7 that passed had r of the key %v and of the org %v, want 0…6 and 93…99 once each", keyLeft, orgLeft)
		}
		// The other key of the org: its own budget; the org's minute and month hold
		// the 7 that passed, then this one.
		a := s.me(other, 1)
		wantMeLimits(t, "the org's other key", a, org.ID, "Viewer", lim(20, 100, 1000, 8))
		wantRateLimit(t, "the org's other key", a, `"default";q=20;w=60, "org";q=100;w=60`, left{"default", 19}, left{"org", 92})

		as = s.burst(calls(plainOwn, "/v1/me", 21))
		wantStatuses(t, "a key of 7 on a plan of 13 without organisation budgets", as, map[int]int{200: 7, 429: 14})
		for _, a := range as {
			if a.Status == http.StatusOK {
				wantRateLimit(t, "a 200", a, `"default";q=7;w=60`, left{"default", -1})
				continue
			}
			want429(t, a, "key")
			wantRateLimit(t, "a 429", a, `"default";q=7;w=60`, left{"default", 0})
		}
	})
}

// TestBudgetTheOrgCeilingPassesExactlyItsNumberAcrossKeysAndGateways sends the
// requests of three keys, each well within its own minute, through both gateways: the
// organisation's ceiling lets exactly its number through. Each key's minute counts
// its requests the ceiling refused; another organisation on the same plan has a
// ceiling of its own.
func TestBudgetTheOrgCeilingPassesExactlyItsNumberAcrossKeysAndGateways(t *testing.T) {
	onEachRedis(t, func(t *testing.T, s *Stack) {
		s.budgetPlan("ceiling", 20, 13, -1)
		org, owner := s.newOwner("ceiling")
		keys := make([]string, 3)
		var lists [][]call
		for i := range keys {
			_, keys[i] = owner.createKey(org.ID, fmt.Sprintf("k%d", i), "Viewer", nil)
			lists = append(lists, calls(keys[i], []string{"/v1/me", "/v1/monitors"}[i%2], 10))
		}
		otherOrg, otherOwner := s.newOwner("ceiling")
		_, otherKey := otherOwner.createKey(otherOrg.ID, "k", "Admin", nil)

		waitForWindowRoom(15)
		as := s.burst(interleave(lists...))
		wantStatuses(t, "30 requests of three keys against a ceiling of 13", as, map[int]int{200: 13, 429: 17})
		var orgLeft []int
		for _, a := range as {
			if a.Status == http.StatusOK {
				orgLeft = append(orgLeft, rOf(a, "org"))
				wantRateLimit(t, "a 200", a, `"default";q=20;w=60, "org";q=13;w=60`, left{"default", -1}, left{"org", -1})
				continue
			}
			want429(t, a, "org")
			wantRateLimit(t, "a 429 of the org's minute", a, `"default";q=20;w=60, "org";q=13;w=60`, left{"default", -1}, left{"org", 0})
		}
		slices.Sort(orgLeft)
		if !slices.Equal(orgLeft, []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}) {
			t.Errorf("the 13 that passed had r of the org %v, want 0…12 once each", orgLeft)
		}
		// The first key's minute counted its 10, passed or refused, and now its 11th.
		a := s.me(keys[0], 0)
		want429(t, a, "org")
		wantRateLimit(t, "the first key after the burst", a, `"default";q=20;w=60, "org";q=13;w=60`, left{"default", 9}, left{"org", 0})
		a = s.me(otherKey, 1)
		wantMeLimits(t, "another org on the plan", a, otherOrg.ID, "Admin", lim(20, 13, -1, -1))
		wantRateLimit(t, "another org on the plan", a, `"default";q=20;w=60, "org";q=13;w=60`, left{"default", 19}, left{"org", 12})
	})
}

// TestBudgetTheMonthlyQuotaPassesExactlyItsNumberThen402 spends an organisation's
// month over two minutes: in the first its minute ceiling refuses some requests, which
// the month does not count; in the second exactly what is left of the month passes,
// and then every request gets the 402, with the minute's RateLimit fields and no
// Retry-After. The usage record and the metrics have each refusal.
func TestBudgetTheMonthlyQuotaPassesExactlyItsNumberThen402(t *testing.T) {
	onEachRedis(t, func(t *testing.T, s *Stack) {
		s.budgetPlan("monthly", 50, 13, 20)
		org, owner := s.newOwner("monthly")
		ids := make([]string, 3)
		keys := make([]string, 3)
		var first, second [][]call
		for i := range keys {
			ids[i], keys[i] = owner.createKey(org.ID, fmt.Sprintf("k%d", i), "Admin", nil)
			path := []string{"/v1/me", "/v1/monitors"}[i%2]
			first, second = append(first, calls(keys[i], path, 8)), append(second, calls(keys[i], path, 3))
		}
		waitForMonthRoom(5 * time.Minute)
		start := time.Now()
		quotaBefore := s.gatewayMetric(0, `keygate_requests_total{outcome="quota_exceeded"}`) +
			s.gatewayMetric(1, `keygate_requests_total{outcome="quota_exceeded"}`)

		waitForWindowRoom(15)
		cs1 := interleave(first...)
		as1 := s.burst(cs1)
		wantStatuses(t, "the first minute: 24 requests against a ceiling of 13", as1, map[int]int{200: 13, 429: 11})
		for _, a := range as1 {
			if a.Status == http.StatusTooManyRequests {
				want429(t, a, "org")
			}
		}
		// A new minute: the month has the 13 that passed, not the 11 refused.
		sleepToNextMinute()
		cs2 := interleave(second...)
		as2 := s.burst(cs2)
		wantStatuses(t, "the second minute: 9 requests, 7 left in the month", as2, map[int]int{200: 7, 402: 2})
		for _, a := range as2 {
			if a.Status == http.StatusPaymentRequired {
				want402(t, a, 20)
				wantRateLimit(t, "a 402", a, `"default";q=50;w=60, "org";q=13;w=60`, left{"default", -1}, left{"org", -1})
			}
		}
		// Spent, whatever the route, key or gateway. A 402 passed both minutes, which
		// counted it: the org's 13th request of this minute is the last it lets by.
		cs3 := []call{
			{keys[0], 0, "GET", "/v1/me", nil},
			{keys[1], 1, "POST", "/v1/monitors", newMonitor("m")},
			{keys[2], 0, "GET", "/v1/nowhere", nil},
			{keys[0], 1, "DELETE", "/v1/monitors/00000000-0000-4000-8000-000000000000", nil},
			{keys[1], 0, "GET", "/v1/me", nil},
		}
		var as3 []answer
		for i, c := range cs3 {
			a := s.send(c)
			as3 = append(as3, a)
			if i < len(cs3)-1 {
				want402(t, a, 20)
				wantRateLimit(t, "a 402", a, `"default";q=50;w=60, "org";q=13;w=60`, left{"default", -1}, left{"org", 12 - len(as2) - i})
			} else {
				want429(t, a, "org")
				wantRateLimit(t, "the org's 14th of the minute", a, `"default";q=50;w=60, "org";q=13;w=60`, left{"default", 50 - 3 - 2}, left{"org", 0})
			}
		}

		// The record has each request under its key: what passed, each 429 and each 402.
		idOf := map[string]string{}
		for i := range keys {
			idOf[keys[i]] = ids[i]
		}
		want := map[string]int64{}
		tally(want, idOf, cs1, as1)
		tally(want, idOf, cs2, as2)
		tally(want, idOf, cs3, as3)
		waitForUsage(t, owner, org.ID, start, want)
		quotaAfter := s.gatewayMetric(0, `keygate_requests_total{outcome="quota_exceeded"}`) +
			s.gatewayMetric(1, `keygate_requests_total{outcome="quota_exceeded"}`)
		if got := quotaAfter - quotaBefore; got != 2+4 {
			t.Errorf("keygate_requests_total{outcome=\"quota_exceeded\"} grew by %v on the two gateways, want 6", got)
		}
	})
}

// tally adds to record what the usage record should hold of calls cs answered as:
// "key_id outcome status" → count, idOf giving each full key's id.
func tally(record map[string]int64, idOf map[string]string, cs []call, as []answer) {
	for i, a := range as {
		var outcome string
		switch {
		case a.Status == http.StatusTooManyRequests:
			outcome = "rate_limited"
		case a.Status == http.StatusPaymentRequired:
			outcome = "quota_exceeded"
		case cs[i].method == "GET" && cs[i].path == "/v1/me":
			outcome = "me"
		default:
			outcome = "proxied"
		}
		record[fmt.Sprintf("%s %s %d", idOf[cs[i].key], outcome, a.Status)]++
	}
}

// TestBudgetTheMonthSurvivesFlushall spends part of an organisation's month, lets the
// gateways write it to the usage record, and empties Redis: the month is re-seeded
// from the record, so exactly what was left of it passes, then the 402. After a second
// FLUSHALL the spent month stays spent. The record's requests that passed every budget
// (me, proxied, a Viewer's 403) count; a 429 does not.
func TestBudgetTheMonthSurvivesFlushall(t *testing.T) {
	onEachRedis(t, func(t *testing.T, s *Stack) {
		s.budgetPlan("month11", 50, -1, 11)
		org, owner := s.newOwner("month11")
		viewerID, viewer := owner.createKeyWith(org.ID, "viewer", "Viewer", map[string]any{"rate_limit": 3})
		adminID, admin := owner.createKey(org.ID, "admin", "Admin", nil)
		waitForMonthRoom(5 * time.Minute)
		start := time.Now()

		waitForWindowRoom(15)
		for i, st := range []struct {
			method, path string
			body         any
			status       int
		}{
			{"GET", "/v1/me", nil, 200},
			{"GET", "/v1/monitors", nil, 200},
			{"POST", "/v1/monitors", newMonitor("m"), 403},
			{"GET", "/v1/me", nil, 429}, // the viewer's own minute: not in the month
		} {
			if r := s.api(viewer, i%2).do(st.method, st.path, st.body); r.Status != st.status {
				t.Fatalf("the viewer's %s %s: %d %s, want %d", st.method, st.path, r.Status, r.Body, st.status)
			}
		}
		for i := range 3 {
			a := s.me(admin, i%2)
			wantMeLimits(t, "the admin key", a, org.ID, "Admin", lim(50, -1, 11, int64(4+i)))
			wantRateLimit(t, "the admin key", a, `"default";q=50;w=60`, left{"default", 49 - i})
		}
		waitForUsage(t, owner, org.ID, start, map[string]int64{
			viewerID + " me 200":           1,
			viewerID + " proxied 200":      1,
			viewerID + " forbidden 403":    1,
			viewerID + " rate_limited 429": 1,
			adminID + " me 200":            3,
		})

		s.flushRedis()
		as := s.burst(calls(admin, "/v1/me", 10))
		wantStatuses(t, "after FLUSHALL, 10 requests with 5 left in the month", as, map[int]int{200: 5, 402: 5})
		var used []int64
		for _, a := range as {
			if a.Status == http.StatusOK {
				used = append(used, usedThisMonth(t, a))
			} else {
				want402(t, a, 11)
			}
		}
		slices.Sort(used)
		if !slices.Equal(used, []int64{7, 8, 9, 10, 11}) {
			t.Errorf("after FLUSHALL the 5 that passed had used_this_month %v, want 7…11 once each", used)
		}
		waitForUsage(t, owner, org.ID, start, map[string]int64{
			viewerID + " me 200":            1,
			viewerID + " proxied 200":       1,
			viewerID + " forbidden 403":     1,
			viewerID + " rate_limited 429":  1,
			adminID + " me 200":             8,
			adminID + " quota_exceeded 402": 5,
		})

		s.flushRedis()
		for _, key := range []string{admin, viewer, admin} { // the viewer's 3 a minute: 2
			for gw := range 2 {
				want402(t, s.me(key, gw), 11)
			}
		}
	})
}

// TestBudgetHeadersAndMeLimitsOfEachKindOfPlan reads GET /v1/me of a key on each kind
// of plan: RateLimit-Policy and RateLimit list each minute budget that applies, the
// key's first as "default", and limits shows each budget, null where none applies. A
// plan without organisation budgets answers as it always has, but for limits.
func TestBudgetHeadersAndMeLimitsOfEachKindOfPlan(t *testing.T) {
	s := newBudgetStack(t, "single")
	s.budgetPlan("both", 20, 100, 1000)
	s.budgetPlan("org-only", 20, 100, -1)
	s.budgetPlan("month-only", 20, -1, 1000)
	s.budgetPlan("unlimited-org", -1, 100, -1)
	s.budgetPlan("unlimited-month", -1, -1, 1000)
	waitForMonthRoom(5 * time.Minute)
	waitForWindowRoom(15)
	for _, tc := range []struct {
		plan   string
		fields map[string]any
		policy string
		items  []left
		limits string
	}{
		{"both", map[string]any{"rate_limit": 7}, `"default";q=7;w=60, "org";q=100;w=60`, []left{{"default", 6}, {"org", 99}}, lim(7, 100, 1000, 1)},
		{"org-only", nil, `"default";q=20;w=60, "org";q=100;w=60`, []left{{"default", 19}, {"org", 99}}, lim(20, 100, -1, -1)},
		{"month-only", nil, `"default";q=20;w=60`, []left{{"default", 19}}, lim(20, -1, 1000, 1)},
		{"pro", nil, `"default";q=600;w=60`, []left{{"default", 599}}, lim(600, -1, -1, -1)},
		{"pro", map[string]any{"rate_limit": 11}, `"default";q=11;w=60`, []left{{"default", 10}}, lim(11, -1, -1, -1)},
		{"unlimited-org", nil, `"org";q=100;w=60`, []left{{"org", 99}}, lim(-1, 100, -1, -1)},
		{"enterprise", nil, "", nil, lim(-1, -1, -1, -1)},
		{"unlimited-month", nil, "", nil, lim(-1, -1, 1000, 1)},
	} {
		t.Run(fmt.Sprintf("%s %v", tc.plan, tc.fields), func(t *testing.T) {
			org, owner := s.newOwner(tc.plan)
			_, key := owner.createKeyWith(org.ID, "k", "Admin", tc.fields)
			a := s.me(key, 0)
			wantMeLimits(t, "GET /v1/me", a, org.ID, "Admin", tc.limits)
			if tc.items == nil {
				if a.Header.Values("RateLimit") != nil || a.Header.Values("RateLimit-Policy") != nil {
					t.Errorf("a key without a minute budget: RateLimit %q, RateLimit-Policy %q", a.Header.Values("RateLimit"), a.Header.Values("RateLimit-Policy"))
				}
				return
			}
			wantRateLimit(t, "GET /v1/me", a, tc.policy, tc.items...)
			// Answers of the upstream carry them too.
			b := s.send(call{key, 1, "GET", "/v1/monitors", nil})
			next := slices.Clone(tc.items)
			for i := range next {
				next[i].r--
			}
			if b.Status != http.StatusOK {
				t.Fatalf("GET /v1/monitors: %d %s", b.Status, b.Body)
			}
			wantRateLimit(t, "GET /v1/monitors", b, tc.policy, next...)
		})
	}
}

// TestBudgetAPlanWithoutOrganisationBudgetsAnswersAsBefore pins every answer of a key
// on a plan with a minute limit and neither organisation budget: the same status,
// header fields and body as before budgets were added, GET /v1/me gaining only its
// limits.
func TestBudgetAPlanWithoutOrganisationBudgetsAnswersAsBefore(t *testing.T) {
	s := newBudgetStack(t, "single")
	s.budgetPlan("seven", 7, -1, -1)
	org, owner := s.newOwner("seven")
	_, viewer := owner.createKey(org.ID, "v", "Viewer", nil)

	waitForWindowRoom(15)
	var as []answer
	for i, c := range []call{
		{viewer, 0, "GET", "/v1/me", nil},
		{viewer, 1, "GET", "/v1/monitors", nil},
		{viewer, 0, "POST", "/v1/monitors", newMonitor("m")},
		{viewer, 1, "GET", "/v1/me", nil},
		{viewer, 0, "GET", "/v1/me", nil},
		{viewer, 1, "GET", "/v1/me", nil},
		{viewer, 0, "GET", "/v1/me", nil},
		{viewer, 1, "GET", "/v1/me", nil},
		{viewer, 0, "POST", "/v1/monitors", newMonitor("m")},
	} {
		a := s.send(c)
		as = append(as, a)
		what := fmt.Sprintf("request %d, %s %s", i+1, c.method, c.path)
		if i < 7 {
			wantRateLimit(t, what, a, `"default";q=7;w=60`, left{"default", 6 - i})
		} else {
			wantRateLimit(t, what, a, `"default";q=7;w=60`, left{"default", 0})
		}
	}
	wantMeLimits(t, "GET /v1/me", as[0], org.ID, "Viewer", lim(7, -1, -1, -1))
	wantHeaderNames(t, "GET /v1/me", as[0], "Cache-Control", "Content-Length", "Content-Type", "Date", "Ratelimit", "Ratelimit-Policy", "Server", "X-Content-Type-Options")
	if as[1].Status != http.StatusOK || !jsonEqual(as[1].Body, []byte(`{"data":[],"next_cursor":null}`)) {
		t.Errorf("GET /v1/monitors: %d %s", as[1].Status, as[1].Body)
	}
	wantError(t, as[2].Resp, http.StatusForbidden, `{"error":"forbidden","reason":"role","required_role":"Editor"}`)
	wantHeaderNames(t, "a 403", as[2], "Cache-Control", "Content-Length", "Content-Type", "Date", "Ratelimit", "Ratelimit-Policy", "Server", "X-Content-Type-Options")
	for _, a := range as[7:] {
		want429(t, a, "key")
		wantHeaderNames(t, "a 429", a, "Cache-Control", "Content-Length", "Content-Type", "Date", "Ratelimit", "Ratelimit-Policy", "Retry-After", "Server", "X-Content-Type-Options")
	}
}

// wantHeaderNames fails unless a has exactly the header fields names, in Go's
// canonical form.
func wantHeaderNames(t *testing.T, what string, a answer, names ...string) {
	t.Helper()
	got := slices.Sorted(maps.Keys(a.Header))
	if !slices.Equal(got, names) {
		t.Errorf("%s: header fields %v, want %v", what, got, names)
	}
}

// unknownKeyLike returns a key of key's shape, with a valid checksum, that no key
// has: the answer of an unknown key.
func unknownKeyLike(key string) string {
	prefix, rest, _ := strings.Cut(key, "_live_")
	id, secret, _ := strings.Cut(rest, ".")
	body := prefix + "_live_" + randomAlnum(len(id)) + "." + secret[:len(secret)-keystore.ChecksumLen]
	return body + keystore.Checksum(body)
}

// wrongSecretOf returns key with another secret, with a valid checksum: a key found
// whose secret does not match.
func wrongSecretOf(key string) string {
	id, _, _ := strings.Cut(key, ".")
	b := make([]byte, 32)
	rand.Read(b)
	body := id + "." + base64.RawURLEncoding.EncodeToString(b)
	return body + keystore.Checksum(body)
}

func randomAlnum(n int) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, n)
	rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}

// wantSameAnswer fails unless got is want byte for byte: the status, every header
// field but Date, and the body. It reports whether they are.
func wantSameAnswer(t *testing.T, what string, got, want Resp) bool {
	t.Helper()
	strip := func(h http.Header) http.Header {
		h = h.Clone()
		h.Del("Date")
		return h
	}
	if got.Status != want.Status || !maps.EqualFunc(strip(got.Header), strip(want.Header), slices.Equal) || string(got.Body) != string(want.Body) {
		t.Errorf("%s: answered\n%d %v %q\nwant, as an unknown key,\n%d %v %q", what, got.Status, strip(got.Header), got.Body, want.Status, strip(want.Header), want.Body)
		return false
	}
	return true
}

// accessLogged counts the access log entries of gateway gw with outcome, by key_id.
func (s *Stack) accessLogged(gw int, outcome string) map[string]int {
	s.t.Helper()
	n := map[string]int{}
	for _, line := range strings.Split(s.gateways[gw].proc.logs(), "\n") {
		var e struct {
			Logger  string `json:"logger"`
			Outcome string `json:"outcome"`
			KeyID   string `json:"key_id"`
		}
		if json.Unmarshal([]byte(line), &e) == nil && strings.HasPrefix(e.Logger, "http.log.access") && e.Outcome == outcome {
			n[e.KeyID]++
		}
	}
	return n
}

// TestRestrictedKeyOutsideItsNetworksIsAnUnknownKey uses keys from the loopback
// address, outside their allowed_cidrs: on every route and both gateways the answer is
// the unknown key's 401, byte for byte (even for an org without API access, which an
// allowed key would learn with a 403). No budget counts it: not the key's minute, not
// the org's minute, not its month. It is recorded as ip_denied in the metrics, the
// access log and the usage record.
func TestRestrictedKeyOutsideItsNetworksIsAnUnknownKey(t *testing.T) {
	onEachRedis(t, func(t *testing.T, s *Stack) {
		s.budgetPlan("restricted", 20, 50, 100)
		org, owner := s.newOwner("restricted")
		hereID, here := owner.createKeyWith(org.ID, "here", "Admin", map[string]any{"allowed_cidrs": []string{"127.0.0.0/8"}})
		deniedID, denied := owner.createKeyWith(org.ID, "elsewhere", "Admin", map[string]any{"allowed_cidrs": []string{"10.0.0.0/8", "2001:db8::/32"}})
		revokedID, revoked := owner.createKey(org.ID, "revoked", "Admin", nil)
		if r := owner.do("DELETE", "/orgs/"+org.ID+"/api-keys/"+revokedID, nil, nil); r.Status != http.StatusNoContent {
			t.Fatalf("revoking: %d %s", r.Status, r.Body)
		}
		gatedOrg, gatedOwner := s.newOwner("pro")
		gatedID, gated := gatedOwner.createKeyWith(gatedOrg.ID, "gated", "Admin", map[string]any{"allowed_cidrs": []string{"10.0.0.0/8"}})
		s.cli("", "org", "set-plan", "--org", gatedOrg.ID, "--plan", "free")
		waitForMonthRoom(5 * time.Minute)
		start := time.Now()
		var metricBefore [2]float64
		for gw := range 2 {
			metricBefore[gw] = s.gatewayMetric(gw, `keygate_requests_total{outcome="ip_denied"}`)
		}

		waitForWindowRoom(20)
		a := s.me(here, 0)
		wantMeLimits(t, "the allowed key", a, org.ID, "Admin", lim(20, 50, 100, 1))
		wantRateLimit(t, "the allowed key", a, `"default";q=20;w=60, "org";q=50;w=60`, left{"default", 19}, left{"org", 49})

		unknown := map[string]string{"an unknown key": unknownKeyLike(denied), "a wrong secret": wrongSecretOf(denied), "a revoked key": revoked}
		var sent [2]int
		for gw := range 2 {
			for _, rq := range []call{
				{"", gw, "GET", "/v1/me", nil},
				{"", gw, "GET", "/v1/monitors", nil},
				{"", gw, "POST", "/v1/monitors", newMonitor("m")},
				{"", gw, "DELETE", "/v1/monitors/00000000-0000-4000-8000-000000000000", nil},
				{"", gw, "GET", "/v1/nowhere", nil},
			} {
				for _, key := range []string{denied, gated} {
					got := s.api(key, gw).do(rq.method, rq.path, rq.body)
					sent[gw]++
					for _, name := range slices.Sorted(maps.Keys(unknown)) {
						what := fmt.Sprintf("%s %s on gateway %d", rq.method, rq.path, gw)
						if key == gated {
							what += " of an org without API access"
						}
						if !wantSameAnswer(t, what+", against "+name, got, s.api(unknown[name], gw).do(rq.method, rq.path, rq.body)) {
							break
						}
					}
				}
			}
		}

		// Nothing counted: the org's minute and month have only the allowed key's.
		a = s.me(here, 1)
		wantMeLimits(t, "the allowed key again", a, org.ID, "Admin", lim(20, 50, 100, 2))
		wantRateLimit(t, "the allowed key again", a, `"default";q=20;w=60, "org";q=50;w=60`, left{"default", 18}, left{"org", 48})
		// Nor the key's own minute: let in, its first request counts as its first.
		if r := owner.do("PATCH", "/orgs/"+org.ID+"/api-keys/"+deniedID, map[string]any{"allowed_cidrs": []string{"10.0.0.0/8", "127.0.0.1"}}, nil); r.Status != http.StatusOK {
			t.Fatalf("PATCH: %d %s", r.Status, r.Body)
		}
		a = s.me(denied, 0)
		wantMeLimits(t, "the key let in", a, org.ID, "Admin", lim(20, 50, 100, 3))
		wantRateLimit(t, "the key let in", a, `"default";q=20;w=60, "org";q=50;w=60`, left{"default", 19}, left{"org", 47})

		for gw := range 2 {
			if got := s.gatewayMetric(gw, `keygate_requests_total{outcome="ip_denied"}`) - metricBefore[gw]; got != float64(sent[gw]) {
				t.Errorf("gateway %d: keygate_requests_total{outcome=\"ip_denied\"} grew by %v, want %d", gw, got, sent[gw])
			}
			if got, want := s.accessLogged(gw, "ip_denied"), map[string]int{deniedID: sent[gw] / 2, gatedID: sent[gw] / 2}; !maps.Equal(got, want) {
				t.Errorf("gateway %d: the access log has ip_denied entries by key_id %v, want %v", gw, got, want)
			}
		}
		waitForUsage(t, owner, org.ID, start, map[string]int64{
			hereID + " me 200":          2,
			deniedID + " ip_denied 401": int64(sent[0]+sent[1]) / 2,
			deniedID + " me 200":        1,
		})
		waitForUsage(t, gatedOwner, gatedOrg.ID, start, map[string]int64{gatedID + " ip_denied 401": int64(sent[0]+sent[1]) / 2})
	})
}

// TestRestrictedKeyHonoursTrustedProxies checks a key's networks against the client
// address: from X-Forwarded-For when the request comes from one of the server's
// trusted_proxies, its rightmost entry that is not a trusted proxy (an IPv4-mapped IPv6
// address counts as the IPv4 one; an unreadable entry leaves the connection's), and
// from the connection on a gateway that trusts no proxy.
func TestRestrictedKeyHonoursTrustedProxies(t *testing.T) {
	s := newStackWith(t, stackOptions{globalOptions: "servers {\n\t\ttrusted_proxies static 127.0.0.1/32\n\t}"})
	s.globalOptions = ""
	s.startGateway("open") // gateway 2 trusts no proxy
	org, owner := s.newOwner("pro")
	_, loopback := owner.createKeyWith(org.ID, "loopback", "Admin", map[string]any{"allowed_cidrs": []string{"127.0.0.0/8"}})
	_, ten := owner.createKeyWith(org.ID, "ten", "Admin", map[string]any{"allowed_cidrs": []string{"10.0.0.0/8"}})
	unknown := unknownKeyLike(ten)
	send := func(gw int, key, forwardedFor string) Resp {
		h := http.Header{"Authorization": {"Bearer " + key}}
		if forwardedFor != "" {
			h.Set("X-Forwarded-For", forwardedFor)
		}
		return s.raw("GET", s.URL(gw)+"/v1/me", nil, h)
	}
	for _, tc := range []struct {
		gw           int
		key, name    string
		forwardedFor string
		allowed      bool
	}{
		{0, ten, "10.0.0.0/8", "10.1.2.3", true},
		{1, ten, "10.0.0.0/8", "::ffff:10.1.2.3", true},
		{0, ten, "10.0.0.0/8", "", false},
		{1, ten, "10.0.0.0/8", "192.0.2.1", false},
		{0, loopback, "127.0.0.0/8", "10.1.2.3", false},
		{1, loopback, "127.0.0.0/8", "", true},
		{2, ten, "10.0.0.0/8", "10.1.2.3", false},
		{2, loopback, "127.0.0.0/8", "10.1.2.3", true},
		// The rightmost entry that is not a trusted proxy, whatever the client put
		// left of it.
		{0, ten, "10.0.0.0/8", "10.1.2.3, 203.0.113.5", false},
		{1, ten, "10.0.0.0/8", "203.0.113.5, 10.1.2.3", true},
		{0, ten, "10.0.0.0/8", "203.0.113.5, [::ffff:10.1.2.3]:1234", true},
		{1, ten, "10.0.0.0/8", "10.1.2.3, zz", false},
	} {
		what := fmt.Sprintf("a key of %s with X-Forwarded-For %q on gateway %d", tc.name, tc.forwardedFor, tc.gw)
		got := send(tc.gw, tc.key, tc.forwardedFor)
		if tc.allowed {
			if got.Status != http.StatusOK {
				t.Errorf("%s: %d %s, want 200", what, got.Status, got.Body)
			}
			continue
		}
		wantSameAnswer(t, what, got, send(tc.gw, unknown, tc.forwardedFor))
	}
}
