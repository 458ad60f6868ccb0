package webhook_test

import (
	"context"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keygate/keygate/upstream/internal/upstreamtest"
	"github.com/keygate/keygate/upstream/store"
	"github.com/keygate/keygate/upstream/webhook"
)

func TestTestEventsAreLimitedPerEndpoint(t *testing.T) {
	e := newEnv(t)
	rc := newReceiver(t, nil)
	ep, other := e.addEndpoint(t, rc.URL), e.addEndpoint(t, rc.URL)
	test := func(ep endpoint) upstreamtest.Response {
		return e.owner.Do("POST", "/orgs/"+e.org+"/webhooks/"+ep.ID+"/test", "")
	}
	for range store.TestsPerMinute {
		upstreamtest.WantStatus(t, test(ep), 202)
	}
	for _, tc := range []struct {
		after time.Duration
		retry int
	}{{0, 60}, {30 * time.Second, 30}, {29*time.Second + 500*time.Millisecond, 1}} {
		e.clock.Advance(tc.after)
		r := test(ep)
		upstreamtest.Want(t, r, 429, `{"error":"rate_limited","retryAfter":`+strconv.Itoa(tc.retry)+`}`)
		if got := r.Header.Get("Retry-After"); got != strconv.Itoa(tc.retry) {
			t.Errorf("Retry-After %q, want %d", got, tc.retry)
		}
	}
	upstreamtest.WantStatus(t, test(other), 202) // another endpoint's tests count apart
	e.clock.Advance(time.Second)
	upstreamtest.WantStatus(t, test(ep), 202) // a new minute
	if n := upstreamtest.Scalar[int](e.Env, `SELECT count(*) FROM webhook_deliveries WHERE endpoint_id = $1`, ep.ID); n != store.TestsPerMinute+1 {
		t.Errorf("%d test events written, want %d: a refused test writes none", n, store.TestsPerMinute+1)
	}
}

func TestA410DisablesTheEndpointAtOnce(t *testing.T) {
	e := newEnv(t)
	rc := newReceiver(t, func(int) int { return http.StatusGone })
	ep := e.addEndpoint(t, rc.URL)
	e.sendTest(t, ep)
	e.sendTest(t, ep)
	d := e.dispatcher(open)
	d.PerEndpoint = 1 // one attempt, then the endpoint is disabled before the next
	drain(t, d)
	if n := len(rc.requests()); n != 1 {
		t.Errorf("the receiver got %d requests, want 1: after its 410 nothing more is sent", n)
	}
	r := e.owner.Do("GET", "/orgs/"+e.org+"/webhooks/"+ep.ID, "")
	var got struct {
		Enabled        bool    `json:"enabled"`
		DisabledReason *string `json:"disabled_reason"`
	}
	r.Decode(t, &got)
	if got.Enabled || got.DisabledReason == nil || *got.DisabledReason != "gone" {
		t.Errorf("endpoint %s, want disabled as gone", r.Body)
	}
	if n := upstreamtest.Scalar[int](e.Env, `SELECT count(*) FROM audit_events WHERE action = 'webhook.disabled' AND actor = 'webhook-dispatcher' AND webhook_id = $1`, ep.ID); n != 1 {
		t.Errorf("%d webhook.disabled audit events, want 1", n)
	}
	page := e.owner.Do("GET", "/dashboard/orgs/"+e.org+"/webhooks", "")
	if !strings.Contains(page.Body, "disabled: the receiver answered 410 Gone") {
		t.Errorf("the webhooks page does not say the endpoint is gone:\n%s", page.Body)
	}
	// Enabled again, it gets what waited.
	rc.mu.Lock()
	rc.answer = nil
	rc.mu.Unlock()
	upstreamtest.WantStatus(t, e.owner.Do("PATCH", "/orgs/"+e.org+"/webhooks/"+ep.ID, `{"enabled":true}`), 200)
	e.clock.Advance(webhook.Schedule[0])
	drain(t, d)
	if n := upstreamtest.Scalar[int](e.Env, `SELECT count(*) FROM webhook_deliveries WHERE state = 'delivered'`); n != 2 {
		t.Errorf("%d deliveries delivered after enabling, want 2", n)
	}
}

func TestAnAnswersHeaderIsReadWithABound(t *testing.T) {
	e := newEnv(t)
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Padding", strings.Repeat("x", webhook.MaxAnswerHeader))
		w.WriteHeader(http.StatusNoContent)
	}))
	defer rc.Close()
	ep := e.addEndpoint(t, rc.URL)
	e.sendTest(t, ep)
	drain(t, e.dispatcher(open))
	if got := upstreamtest.Scalar[string](e.Env, `SELECT error FROM webhook_attempts`); got != "the answer's header is over 16 KiB" {
		t.Errorf("attempt error %q, want the header refused", got)
	}
}

// TestASecondRotationWithinADayEndsTheFirstSecretsOverlap rotates twice: the secret
// before the first rotation stops signing at once, which is how its overlap is ended
// after a leak.
func TestASecondRotationWithinADayEndsTheFirstSecretsOverlap(t *testing.T) {
	e := newEnv(t)
	rc := newReceiver(t, nil)
	first := e.addEndpoint(t, rc.URL)
	rotate := func() endpoint {
		r := e.owner.Do("POST", "/orgs/"+e.org+"/webhooks/"+first.ID+"/rotate-secret", "")
		upstreamtest.WantStatus(t, r, 200)
		var ep endpoint
		r.Decode(t, &ep)
		return ep
	}
	second := rotate()
	e.clock.Advance(time.Hour)
	third := rotate()
	e.sendTest(t, first)
	drain(t, e.dispatcher(open))
	got := rc.requests()
	if len(got) != 1 || len(strings.Fields(got[0].Signature)) != 2 {
		t.Fatalf("requests %+v, want one signed twice", got)
	}
	ts, _ := strconv.ParseInt(got[0].Timestamp, 10, 64)
	for _, tc := range []struct {
		name, secret string
		signs        bool
	}{{"the first", first.Secret, false}, {"the second", second.Secret, true}, {"the third", third.Secret, true}} {
		if webhook.Verify(tc.secret, got[0].Signature, got[0].ID, ts, got[0].Body) != tc.signs {
			t.Errorf("%s secret signs: %v, want %v", tc.name, !tc.signs, tc.signs)
		}
	}
}

// TestTheQuotasFirstRefusalSendsThe100Notice records a request the monthly quota
// refused while the month's count is below its limit, as a request that costs more
// than what is left is: the 100 % notice goes out then, once.
func TestTheQuotasFirstRefusalSendsThe100Notice(t *testing.T) {
	e := newEnv(t)
	rc := newReceiver(t, nil)
	ep := e.addEndpoint(t, rc.URL, "quota.threshold")
	e.Plan(store.Plan{Name: "metered", APIRateLimit: 600, MaxMonitors: 10, MinIntervalSeconds: 60,
		Locations: []string{"us-east"}, CheckTypes: []string{"http"}, APIRequestsPerMonth: 1000})
	e.SetPlan(e.org, "metered")
	d := e.dispatcher(open)
	record := func(outcome string, status, count int) {
		e.Exec(`INSERT INTO usage_minutes (org_id, key_id, start, outcome, status, count) VALUES ($1, 'AAAAbbbbCCCCdddd', date_trunc('minute', $2::timestamptz), $3, $4, $5)
ON CONFLICT (org_id, start, key_id, outcome, status) DO UPDATE SET count = usage_minutes.count + EXCLUDED.count`, e.org, e.clock.Now(), outcome, status, count)
		if err := d.Notices(context.Background()); err != nil {
			t.Fatal(err)
		}
		drain(t, d)
	}
	record("proxied", 200, 700)
	if n := len(rc.requests()); n != 0 {
		t.Fatalf("%d notices at 70 %%", n)
	}
	record("quota_exceeded", 402, 1)
	record("quota_exceeded", 402, 1)
	got := rc.requests()
	if len(got) != 1 {
		t.Fatalf("%d notices after the refusals, want 1", len(got))
	}
	_, data := verify(t, ep.Secret, got[0])
	if data["threshold_percent"] != float64(100) || data["used"] != float64(700) || data["limit"] != float64(1000) {
		t.Errorf("notice %v, want 100 %% with used 700 of 1000", data)
	}
	record("proxied", 200, 200) // 90 %: the 80 % notice still comes, after
	if n := len(rc.requests()); n != 2 {
		t.Errorf("%d notices, want 2", n)
	}
}

// TestALeakReportsURLIsRedactedEverywhere reports two keys at URLs that hold them,
// one percent-encoded: no secret is in the report's answer, the audit trail, the
// key.leaked delivery or the deliveries list.
func TestALeakReportsURLIsRedactedEverywhere(t *testing.T) {
	e := newEnv(t)
	rc := newReceiver(t, nil)
	ep := e.addEndpoint(t, rc.URL, "key.leaked")
	var fulls, urls []string
	for i := range 2 {
		r := e.owner.Do("POST", "/orgs/"+e.org+"/api-keys", `{"name":"leaky `+strconv.Itoa(i)+`","role":"Viewer"}`)
		upstreamtest.WantStatus(t, r, 201)
		var k struct{ Key string }
		r.Decode(t, &k)
		fulls = append(fulls, k.Key)
	}
	urls = append(urls, "https://paste.example.com/raw?token="+fulls[0]+"&x=1",
		"https://gist.example.com/"+strings.NewReplacer("_", "%5F", ".", "%2E").Replace(fulls[1]))
	r := e.Anon().With("Authorization", "Bearer "+leakToken).Do("POST", "/security/leaked-keys",
		upstreamtest.JSONBody([]map[string]string{{"token": fulls[0], "url": urls[0]}, {"token": fulls[1], "url": urls[1]}}))
	upstreamtest.WantStatus(t, r, 200)
	drain(t, e.dispatcher(open))

	delivered := ""
	for _, g := range rc.requests() {
		delivered += string(g.Body) + "\n"
	}
	seen := map[string]string{
		"the report's answer": r.Body,
		"the audit trail":     e.owner.Do("GET", "/orgs/"+e.org+"/audit-events", "").Body,
		"the audit page":      e.owner.Do("GET", "/dashboard/orgs/"+e.org+"/audit", "").Body,
		"the deliveries":      e.owner.Do("GET", "/orgs/"+e.org+"/webhooks/"+ep.ID+"/deliveries", "").Body,
		"the delivered body":  delivered,
	}
	for where, text := range seen {
		for _, full := range fulls {
			_, secret, _ := strings.Cut(full, ".")
			if strings.Contains(text, secret) {
				t.Errorf("%s holds a key's secret:\n%s", where, text)
			}
		}
		if strings.Count(text, ".REDACTED") < 2 {
			t.Errorf("%s does not show both URLs redacted:\n%s", where, text)
		}
	}
	if n := len(rc.requests()); n != 2 {
		t.Errorf("%d key.leaked deliveries, want 2", n)
	}
}

// eventCursor is the cursor of the audit trail's and the deliveries' pages at id.
func eventCursor(id string) string { return base64.RawURLEncoding.EncodeToString([]byte("e" + id)) }

// TestCursorsAndIDsPast2To31 pages the deliveries and the audit trail whose ids are
// past 2³¹, retries such a delivery, and asks for cursors at the edges of bigint.
func TestCursorsAndIDsPast2To31(t *testing.T) {
	e := newEnv(t)
	e.Exec(`ALTER TABLE webhook_deliveries ALTER COLUMN id RESTART WITH 3000000000`)
	e.Exec(`ALTER TABLE audit_events ALTER COLUMN id RESTART WITH 3000000000`)
	rc := newReceiver(t, nil)
	ep := e.addEndpoint(t, rc.URL)
	e.enqueue(e.org, ep, 3)
	upstreamtest.WantStatus(t, e.owner.Do("PATCH", "/orgs/"+e.org+"/webhooks/"+ep.ID, `{"description":"a"}`), 200)
	upstreamtest.WantStatus(t, e.owner.Do("PATCH", "/orgs/"+e.org+"/webhooks/"+ep.ID, `{"description":"b"}`), 200)

	for _, list := range []string{"/webhooks/" + ep.ID + "/deliveries", "/audit-events"} {
		t.Run(list, func(t *testing.T) {
			path := "/orgs/" + e.org + list
			var ids []string
			cursor := ""
			for range 4 {
				r := e.owner.Do("GET", path+"?limit=1"+cursor, "")
				upstreamtest.WantStatus(t, r, 200)
				var page struct {
					Data []struct {
						ID string `json:"id"`
					} `json:"data"`
					NextCursor *string `json:"next_cursor"`
				}
				r.Decode(t, &page)
				for _, d := range page.Data {
					ids = append(ids, d.ID)
				}
				if page.NextCursor == nil {
					break
				}
				cursor = "&cursor=" + *page.NextCursor
			}
			if len(ids) != 3 || ids[0] <= ids[1] || ids[1] <= ids[2] || ids[2] < "3000000000" {
				t.Errorf("ids %v, want three past 2³¹, newest first", ids)
			}
			for _, tc := range []struct {
				id     string
				status int
				n      int
			}{{"2147483648", 200, 0}, {"3000000001", 200, 1}, {"9223372036854775807", 200, 3}} {
				r := e.owner.Do("GET", path+"?cursor="+eventCursor(tc.id), "")
				var page struct {
					Data []any `json:"data"`
				}
				r.Decode(t, &page)
				if r.Status != tc.status || len(page.Data) != tc.n {
					t.Errorf("cursor at %s: %d with %d items, want %d with %d: %s", tc.id, r.Status, len(page.Data), tc.status, tc.n, r.Body)
				}
			}
			upstreamtest.Want(t, e.owner.Do("GET", path+"?cursor="+eventCursor("9223372036854775808"), ""), 400,
				`{"error":"invalid_request","message":"cursor: is not a cursor this API returned"}`)
		})
	}
	retry := "/orgs/" + e.org + "/webhooks/" + ep.ID + "/deliveries/"
	upstreamtest.WantStatus(t, e.owner.Do("POST", retry+"3000000001/retry", ""), 202)
	for _, id := range []string{"2147483648", "9223372036854775807", "9223372036854775808"} {
		upstreamtest.Want(t, e.owner.Do("POST", retry+id+"/retry", ""), 404, `{"error":"delivery not found"}`)
	}
	page := e.owner.Do("GET", "/dashboard/orgs/"+e.org+"/audit?cursor="+eventCursor("2147483648"), "")
	upstreamtest.WantStatus(t, page, 200)
}
