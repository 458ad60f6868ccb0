package webhook_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/keygate/keygate/upstream/httpapi"
	"github.com/keygate/keygate/upstream/internal/upstreamtest"
	"github.com/keygate/keygate/upstream/store"
	"github.com/keygate/keygate/upstream/webhook"
)

// leakToken is the leak report token of the test servers.
const leakToken = "leak-report-token-0123456789abcdef"

// received is one request a receiver got.
type received struct {
	ID, Timestamp, Signature, ContentType string
	Body                                  []byte
}

// receiver is a webhook receiver on loopback. answer gives the status of its nth
// request (from 0); it answers 204 when nil.
type receiver struct {
	*httptest.Server
	mu     sync.Mutex
	got    []received
	answer func(n int) int
}

func newReceiver(t *testing.T, answer func(n int) int) *receiver {
	t.Helper()
	rc := &receiver{answer: answer}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		rc.mu.Lock()
		n := len(rc.got)
		rc.got = append(rc.got, received{r.Header.Get("webhook-id"), r.Header.Get("webhook-timestamp"),
			r.Header.Get("webhook-signature"), r.Header.Get("Content-Type"), body})
		rc.mu.Unlock()
		status := http.StatusNoContent
		if rc.answer != nil {
			status = rc.answer(n)
		}
		w.WriteHeader(status)
	}))
	t.Cleanup(rc.Close)
	return rc
}

func (rc *receiver) requests() []received {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return slices.Clone(rc.got)
}

// env is a server whose webhooks may go to loopback over http, a clock, and a client
// of an org's Owner.
type env struct {
	*upstreamtest.Env
	org   string
	owner *upstreamtest.Client
	clock *upstreamtest.Clock
}

func newEnv(t *testing.T) *env {
	t.Helper()
	clock := upstreamtest.NewClock()
	// The database stamps events with its own now(); the clock runs a minute ahead so
	// that they are due to it.
	clock.Advance(time.Minute)
	e := upstreamtest.NewEnv(t, func(c *httpapi.Config) {
		c.Webhooks = webhook.Policy{AllowHTTP: true, AllowPrivate: true}
		c.LeakReportToken = leakToken
		c.Now = clock.Now
	})
	org := e.Org("pro")
	return &env{Env: e, org: org, owner: e.Person(store.RoleOwner, org), clock: clock}
}

// newRealEnv is newEnv on the real clock, for the tests of Run's timing.
func newRealEnv(t *testing.T) *env {
	t.Helper()
	e := upstreamtest.NewEnv(t, func(c *httpapi.Config) {
		c.Webhooks = open
		c.LeakReportToken = leakToken
	})
	org := e.Org("pro")
	return &env{Env: e, org: org, owner: e.Person(store.RoleOwner, org)}
}

// dispatcher returns a dispatcher of e under policy, on e's clock.
func (e *env) dispatcher(policy webhook.Policy) *webhook.Dispatcher {
	d := webhook.NewDispatcher(e.Store, e.Keys, policy, zap.NewNop(), nil)
	if e.clock != nil {
		d.Now = e.clock.Now
	}
	return d
}

// now is e's clock's time, or the real one.
func (e *env) now() time.Time {
	if e.clock != nil {
		return e.clock.Now()
	}
	return time.Now()
}

// enqueue writes n webhook.test events of org for ep through the outbox's own
// function, as many as a test needs: the API takes store.TestsPerMinute a minute.
func (e *env) enqueue(org string, ep endpoint, n int) {
	e.Exec(`SELECT webhook_enqueue($1::uuid, 'webhook.test', jsonb_build_object('org_id', $1::text, 'webhook_id', $2::text), $3::timestamptz, $2::uuid)
FROM generate_series(1, $4)`, org, ep.ID, e.now(), n)
}

var open = webhook.Policy{AllowHTTP: true, AllowPrivate: true}

// drain runs d until nothing is due.
func drain(t *testing.T, d *webhook.Dispatcher) {
	t.Helper()
	for {
		n, err := d.RunOnce(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
	}
}

// endpoint is a created endpoint: its id and secret.
type endpoint struct{ ID, Secret string }

func (e *env) addEndpoint(t *testing.T, url string, events ...string) endpoint {
	t.Helper()
	body := map[string]any{"url": url}
	if events != nil {
		body["events"] = events
	}
	r := e.owner.Do("POST", "/orgs/"+e.org+"/webhooks", upstreamtest.JSONBody(body))
	upstreamtest.WantStatus(t, r, 201)
	var ep endpoint
	r.Decode(t, &ep)
	return ep
}

func (e *env) sendTest(t *testing.T, ep endpoint) string {
	t.Helper()
	r := e.owner.Do("POST", "/orgs/"+e.org+"/webhooks/"+ep.ID+"/test", "")
	upstreamtest.WantStatus(t, r, 202)
	var v struct {
		EventID string `json:"event_id"`
	}
	r.Decode(t, &v)
	return v.EventID
}

// verify checks that got is signed by secret, and returns its body's type and data.
func verify(t *testing.T, secret string, got received) (string, map[string]any) {
	t.Helper()
	ts, err := strconv.ParseInt(got.Timestamp, 10, 64)
	if err != nil {
		t.Fatalf("webhook-timestamp %q: %v", got.Timestamp, err)
	}
	if !webhook.Verify(secret, got.Signature, got.ID, ts, got.Body) {
		t.Errorf("the signature %q of %s does not verify", got.Signature, got.ID)
	}
	if got.ContentType != "application/json" {
		t.Errorf("Content-Type = %q", got.ContentType)
	}
	var body struct {
		Type      string         `json:"type"`
		Timestamp string         `json:"timestamp"`
		Data      map[string]any `json:"data"`
	}
	if err := json.Unmarshal(got.Body, &body); err != nil {
		t.Fatalf("body %s: %v", got.Body, err)
	}
	if _, err := time.Parse(time.RFC3339Nano, body.Timestamp); err != nil {
		t.Errorf("timestamp %q: %v", body.Timestamp, err)
	}
	return body.Type, body.Data
}

func TestEveryEventTypeIsDeliveredSignedAndWithoutSecrets(t *testing.T) {
	e := newEnv(t)
	rc := newReceiver(t, nil)
	ep := e.addEndpoint(t, rc.URL)
	e.Plan(store.Plan{Name: "metered", APIRateLimit: 600, MaxMonitors: 10, MinIntervalSeconds: 60,
		Locations: []string{"us-east"}, CheckTypes: []string{"http"}, APIRequestsPerMonth: 100})
	e.SetPlan(e.org, "metered")

	var fulls []string
	create := func(body string) string {
		r := e.owner.Do("POST", "/orgs/"+e.org+"/api-keys", body)
		upstreamtest.WantStatus(t, r, 201)
		var k struct{ ID, Key string }
		r.Decode(t, &k)
		fulls = append(fulls, k.Key)
		return k.ID
	}
	rolled := create(`{"name":"ci","role":"Admin"}`)
	r := e.owner.Do("POST", "/orgs/"+e.org+"/api-keys/"+rolled+"/roll", `{"grace_seconds":3600}`)
	upstreamtest.WantStatus(t, r, 201)
	var nk struct{ ID, Key string }
	r.Decode(t, &nk)
	fulls = append(fulls, nk.Key)
	upstreamtest.WantStatus(t, e.owner.Do("DELETE", "/orgs/"+e.org+"/api-keys/"+nk.ID, ""), 204)
	leaked := create(`{"name":"leaky","role":"Viewer"}`)
	upstreamtest.WantStatus(t, e.Anon().With("Authorization", "Bearer "+leakToken).Do("POST", "/security/leaked-keys",
		upstreamtest.JSONBody([]map[string]string{{"token": fulls[len(fulls)-1], "url": "https://example.com/paste"}})), 200)
	expiring := create(`{"name":"soon","role":"Viewer","expires_at":"` + e.clock.Now().Add(72*time.Hour).UTC().Format(time.RFC3339) + `"}`)
	expired := create(`{"name":"gone","role":"Viewer"}`)
	e.Exec(`UPDATE api_keys SET expires_at = $2 WHERE key_id = $1`, expired, e.clock.Now().Add(-time.Hour))
	e.Exec(`INSERT INTO usage_minutes (org_id, key_id, start, outcome, status, count) VALUES ($1, $2, date_trunc('minute', $3::timestamptz), 'proxied', 200, 85)`,
		e.org, leaked, e.clock.Now())
	e.sendTest(t, ep)

	d := e.dispatcher(open)
	if err := d.Notices(context.Background()); err != nil {
		t.Fatal(err)
	}
	drain(t, d)

	// got is each delivered event's data by type and key.
	got := map[string]map[string]any{}
	for _, req := range rc.requests() {
		typ, data := verify(t, ep.Secret, req)
		if id, ok := data["key_id"].(string); ok {
			typ += ":" + id
		}
		if _, dup := got[typ]; dup {
			t.Errorf("%s delivered twice", typ)
		}
		got[typ] = data
		for _, full := range fulls {
			_, secret, _ := strings.Cut(full, ".")
			if strings.Contains(string(req.Body), secret) {
				t.Errorf("%s carries a key's secret: %s", typ, req.Body)
			}
		}
		if data["org_id"] != e.org {
			t.Errorf("%s: org_id %v, want %s", typ, data["org_id"], e.org)
		}
	}
	for _, tc := range []struct {
		typ  string
		want map[string]any
	}{
		{"key.created:" + rolled, map[string]any{"name": "ci", "role": "Admin"}},
		{"key.created:" + leaked, map[string]any{"name": "leaky", "role": "Viewer"}},
		{"key.created:" + expiring, map[string]any{"name": "soon"}},
		{"key.created:" + expired, map[string]any{"name": "gone", "expires_at": nil}},
		{"key.rolled:" + rolled, map[string]any{"new_key_id": nk.ID}},
		{"key.revoked:" + nk.ID, map[string]any{"name": "ci"}},
		{"key.leaked:" + leaked, map[string]any{"url": "https://example.com/paste"}},
		{"key.expiring:" + expiring, map[string]any{"notice": "7d"}},
		// The rolled key's grace of an hour ends within a day.
		{"key.expiring:" + rolled, map[string]any{"notice": "1d"}},
		{"key.expired:" + expired, map[string]any{"name": "gone"}},
		{"quota.threshold", map[string]any{"threshold_percent": float64(80), "used": float64(85), "limit": float64(100)}},
		{"webhook.test", map[string]any{"webhook_id": ep.ID}},
	} {
		data, ok := got[tc.typ]
		if !ok {
			t.Errorf("no %s delivered", tc.typ)
			continue
		}
		delete(got, tc.typ)
		for k, v := range tc.want {
			if data[k] != v {
				t.Errorf("%s: data.%s = %v, want %v", tc.typ, k, data[k], v)
			}
		}
	}
	for typ, data := range got {
		t.Errorf("unexpected %s %v", typ, data)
	}
}

func TestAnEndpointGetsOnlyTheTypesItChose(t *testing.T) {
	e := newEnv(t)
	rc := newReceiver(t, nil)
	ep := e.addEndpoint(t, rc.URL, "key.revoked")
	r := e.owner.Do("POST", "/orgs/"+e.org+"/api-keys", `{"name":"ci","role":"Admin"}`)
	var k struct{ ID string }
	r.Decode(t, &k)
	upstreamtest.WantStatus(t, e.owner.Do("DELETE", "/orgs/"+e.org+"/api-keys/"+k.ID, ""), 204)
	drain(t, e.dispatcher(open))
	got := rc.requests()
	if len(got) != 1 {
		t.Fatalf("%d requests, want 1", len(got))
	}
	if typ, _ := verify(t, ep.Secret, got[0]); typ != "key.revoked" {
		t.Errorf("type %s, want key.revoked", typ)
	}
	if n := upstreamtest.Scalar[int](e.Env, `SELECT count(*) FROM webhook_events`); n != 1 {
		t.Errorf("%d events in the outbox, want 1: an event no endpoint takes is not written", n)
	}
}

func TestAReceiverAnswering500Then204GetsTheSameIDTwice(t *testing.T) {
	e := newEnv(t)
	rc := newReceiver(t, func(n int) int {
		if n == 0 {
			return 500
		}
		return 204
	})
	ep := e.addEndpoint(t, rc.URL)
	id := e.sendTest(t, ep)
	d := e.dispatcher(open)
	drain(t, d)
	if n := len(rc.requests()); n != 1 {
		t.Fatalf("%d requests before the retry is due, want 1", n)
	}
	e.clock.Advance(webhook.Schedule[0])
	drain(t, d)
	got := rc.requests()
	if len(got) != 2 || got[0].ID != id || got[1].ID != id {
		t.Fatalf("requests %+v, want two with webhook-id %s", got, id)
	}
	if string(got[0].Body) != string(got[1].Body) {
		t.Errorf("the retry's body differs:\n%s\n%s", got[0].Body, got[1].Body)
	}
	for _, g := range got {
		verify(t, ep.Secret, g)
	}

	r := e.owner.Do("GET", "/orgs/"+e.org+"/webhooks/"+ep.ID+"/deliveries", "")
	upstreamtest.WantStatus(t, r, 200)
	var page struct {
		Data []struct {
			EventID   string `json:"event_id"`
			EventType string `json:"event_type"`
			State     string `json:"state"`
			Attempts  []struct {
				StatusCode *int    `json:"status_code"`
				Error      *string `json:"error"`
				DurationMS *int    `json:"duration_ms"`
			} `json:"attempts"`
		} `json:"data"`
		NextCursor *string `json:"next_cursor"`
	}
	r.Decode(t, &page)
	if len(page.Data) != 1 || page.NextCursor != nil {
		t.Fatalf("deliveries %s", r.Body)
	}
	dl := page.Data[0]
	if dl.EventID != id || dl.EventType != "webhook.test" || dl.State != "delivered" || len(dl.Attempts) != 2 ||
		*dl.Attempts[0].StatusCode != 500 || *dl.Attempts[1].StatusCode != 204 || dl.Attempts[0].Error != nil || dl.Attempts[0].DurationMS == nil {
		t.Errorf("deliveries %s", r.Body)
	}
}

func TestADeliveryFailsAfterTheLastAttemptOfTheSchedule(t *testing.T) {
	e := newEnv(t)
	rc := newReceiver(t, func(int) int { return 503 })
	ep := e.addEndpoint(t, rc.URL)
	e.sendTest(t, ep)
	d := e.dispatcher(open)
	var total time.Duration
	for i := range webhook.MaxAttempts {
		drain(t, d)
		if n := len(rc.requests()); n != i+1 {
			t.Fatalf("after %v: %d attempts, want %d", total, n, i+1)
		}
		if i < len(webhook.Schedule) {
			// Just before the wait ends, nothing is due.
			e.clock.Advance(webhook.Schedule[i] - time.Second)
			drain(t, d)
			if n := len(rc.requests()); n != i+1 {
				t.Fatalf("attempt %d came early", i+2)
			}
			e.clock.Advance(time.Second)
			total += webhook.Schedule[i]
		}
	}
	if total < 24*time.Hour {
		t.Errorf("the schedule spans %v, less than 24 hours", total)
	}
	e.clock.Advance(48 * time.Hour)
	drain(t, d)
	if n := len(rc.requests()); n != webhook.MaxAttempts {
		t.Errorf("%d attempts, want %d", n, webhook.MaxAttempts)
	}
	if s := upstreamtest.Scalar[string](e.Env, `SELECT state FROM webhook_deliveries`); s != "failed" {
		t.Errorf("state %s, want failed", s)
	}
}

func TestTwoDispatchersDeliverEachEventOnce(t *testing.T) {
	e := newEnv(t)
	rc := newReceiver(t, nil)
	ep := e.addEndpoint(t, rc.URL)
	const events = 40
	e.enqueue(e.org, ep, events)
	var wg sync.WaitGroup
	for range 2 {
		d := e.dispatcher(open)
		d.Slots = 3
		wg.Go(func() { drain(t, d) })
	}
	wg.Wait()
	seen := map[string]int{}
	for _, g := range rc.requests() {
		seen[g.ID]++
	}
	if len(seen) != events {
		t.Errorf("%d distinct events delivered, want %d", len(seen), events)
	}
	for id, n := range seen {
		if n != 1 {
			t.Errorf("%s delivered %d times", id, n)
		}
	}
}

func TestADispatcherStoppedMidwayLosesNothing(t *testing.T) {
	e := newEnv(t)
	arrived := make(chan struct{}, 1)
	stop := make(chan struct{})
	rc := newReceiver(t, func(n int) int {
		if n == 0 {
			arrived <- struct{}{}
			<-stop // held until the dispatcher has gone
		}
		return 204
	})
	defer close(stop)
	ep := e.addEndpoint(t, rc.URL)
	id := e.sendTest(t, ep)

	t.Run("stopped", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		var runErr error
		go func() {
			defer close(done)
			_, runErr = e.dispatcher(open).RunOnce(ctx)
		}()
		select {
		case <-arrived:
		case <-done:
			t.Fatalf("the dispatcher attempted nothing: %v", runErr)
		}
		cancel()
		<-done
		// Given back unattempted: another dispatcher takes it at once.
		drain(t, e.dispatcher(open))
		got := rc.requests()
		if len(got) != 2 || got[1].ID != id {
			t.Fatalf("requests %+v, want the event again", got)
		}
		if n := upstreamtest.Scalar[int](e.Env, `SELECT count(*) FROM webhook_attempts`); n != 1 {
			t.Errorf("%d attempts recorded, want 1: the cut-short one is not an attempt", n)
		}
	})

	t.Run("killed", func(t *testing.T) {
		id := e.sendTest(t, ep)
		// A dispatcher that claims and dies records nothing and gives nothing back.
		claims, err := e.Store.ClaimDeliveries(context.Background(), e.clock.Now(), 30*time.Second, store.Shares{Slots: 10, PerOrg: 4, PerEndpoint: 2})
		if err != nil || len(claims) != 1 {
			t.Fatalf("claims %v, %v", claims, err)
		}
		d := e.dispatcher(open)
		drain(t, d)
		if n := len(rc.requests()); n != 2 {
			t.Fatalf("a leased delivery was attempted again before its lease ended")
		}
		e.clock.Advance(time.Minute)
		drain(t, d)
		got := rc.requests()
		if len(got) != 3 || got[2].ID != id {
			t.Fatalf("requests %+v, want the event once more", got)
		}
	})
}

func TestRotatedSecretsBothSignForADay(t *testing.T) {
	e := newEnv(t)
	rc := newReceiver(t, nil)
	ep := e.addEndpoint(t, rc.URL)
	r := e.owner.Do("POST", "/orgs/"+e.org+"/webhooks/"+ep.ID+"/rotate-secret", "")
	upstreamtest.WantStatus(t, r, 200)
	var rotated endpoint
	r.Decode(t, &rotated)
	if rotated.Secret == ep.Secret || !strings.HasPrefix(rotated.Secret, "whsec_") {
		t.Fatalf("rotated secret %q", rotated.Secret)
	}
	d := e.dispatcher(open)
	e.sendTest(t, ep)
	drain(t, d)
	e.clock.Advance(store.SecretOverlap + time.Second)
	e.sendTest(t, ep)
	drain(t, d)
	got := rc.requests()
	if len(got) != 2 {
		t.Fatalf("%d requests", len(got))
	}
	if n := len(strings.Fields(got[0].Signature)); n != 2 {
		t.Errorf("during the overlap: %d signatures, want 2", n)
	}
	for _, secret := range []string{ep.Secret, rotated.Secret} {
		verify(t, secret, got[0])
	}
	if n := len(strings.Fields(got[1].Signature)); n != 1 {
		t.Errorf("after the overlap: %d signatures, want 1", n)
	}
	verify(t, rotated.Secret, got[1])
}

func TestAnEndpointFailingForThreeDaysIsDisabledAndAudited(t *testing.T) {
	e := newEnv(t)
	rc := newReceiver(t, func(int) int { return 500 })
	ep := e.addEndpoint(t, rc.URL)
	d := e.dispatcher(open)
	e.sendTest(t, ep)
	drain(t, d)
	e.clock.Advance(webhook.DisableAfter - time.Minute)
	e.sendTest(t, ep)
	drain(t, d)
	if !upstreamtest.Scalar[bool](e.Env, `SELECT enabled FROM webhook_endpoints`) {
		t.Fatal("disabled before 3 days of failures")
	}
	e.clock.Advance(time.Minute)
	drain(t, d) // the retries due now fail too, 3 days after the first failure
	upstreamtest.Want(t, e.owner.Do("POST", "/orgs/"+e.org+"/webhooks/"+ep.ID+"/test", ""), 409,
		`{"error":"conflict","message":"the webhook is disabled"}`)
	r := e.owner.Do("GET", "/orgs/"+e.org+"/webhooks/"+ep.ID, "")
	upstreamtest.WantStatus(t, r, 200)
	var got struct {
		Enabled        bool    `json:"enabled"`
		DisabledReason *string `json:"disabled_reason"`
	}
	r.Decode(t, &got)
	if got.Enabled || got.DisabledReason == nil || *got.DisabledReason != "failing" {
		t.Errorf("endpoint %s, want disabled for failing", r.Body)
	}
	if n := upstreamtest.Scalar[int](e.Env, `SELECT count(*) FROM audit_events WHERE action = 'webhook.disabled' AND actor = 'webhook-dispatcher' AND webhook_id = $1`, ep.ID); n != 1 {
		t.Errorf("%d webhook.disabled audit events, want 1", n)
	}
	before := len(rc.requests())
	e.clock.Advance(24 * time.Hour)
	drain(t, d)
	if n := len(rc.requests()); n != before {
		t.Errorf("a disabled endpoint got %d more requests", n-before)
	}
	// Enabled again, it gets what is pending.
	upstreamtest.WantStatus(t, e.owner.Do("PATCH", "/orgs/"+e.org+"/webhooks/"+ep.ID, `{"enabled":true}`), 200)
	drain(t, d)
	if n := len(rc.requests()); n == before {
		t.Error("the re-enabled endpoint got nothing")
	}
}

func TestQuotaThresholdsFireOnceEachPerMonth(t *testing.T) {
	e := newEnv(t)
	rc := newReceiver(t, nil)
	ep := e.addEndpoint(t, rc.URL, "quota.threshold")
	e.Plan(store.Plan{Name: "metered", APIRateLimit: 600, MaxMonitors: 10, MinIntervalSeconds: 60,
		Locations: []string{"us-east"}, CheckTypes: []string{"http"}, APIRequestsPerMonth: 1000})
	e.SetPlan(e.org, "metered")
	d := e.dispatcher(open)
	use := func(n int) {
		e.Exec(`INSERT INTO usage_minutes (org_id, key_id, start, outcome, status, count) VALUES ($1, 'AAAAbbbbCCCCdddd', date_trunc('minute', $2::timestamptz), 'proxied', 200, $3)
ON CONFLICT (org_id, start, key_id, outcome, status) DO UPDATE SET count = usage_minutes.count + EXCLUDED.count`, e.org, e.clock.Now(), n)
		if err := d.Notices(context.Background()); err != nil {
			t.Fatal(err)
		}
		drain(t, d)
	}
	thresholds := func() []float64 {
		var out []float64
		for _, g := range rc.requests() {
			_, data := verify(t, ep.Secret, g)
			out = append(out, data["threshold_percent"].(float64))
		}
		return out
	}
	for _, step := range []struct {
		use  int
		want []float64
	}{
		{799, nil},
		{1, []float64{80}},
		{100, []float64{80}},
		{100, []float64{80, 100}},
		{500, []float64{80, 100}},
	} {
		use(step.use)
		if got := thresholds(); !slices.Equal(got, step.want) {
			t.Fatalf("after %d more: thresholds %v, want %v", step.use, got, step.want)
		}
	}
	// A new month starts again from nothing: its count is below both.
	e.clock.Advance(32 * 24 * time.Hour)
	use(1)
	if got := thresholds(); len(got) != 2 {
		t.Errorf("thresholds %v fired in a month below them", got)
	}
}

func TestARetryIsOneMoreAttemptWithTheSameID(t *testing.T) {
	e := newEnv(t)
	failing := false
	var mu sync.Mutex
	rc := newReceiver(t, func(int) int {
		mu.Lock()
		defer mu.Unlock()
		if failing {
			return 500
		}
		return 204
	})
	ep := e.addEndpoint(t, rc.URL)
	id := e.sendTest(t, ep)
	d := e.dispatcher(open)
	drain(t, d)
	deliveryID := upstreamtest.Scalar[int64](e.Env, `SELECT id FROM webhook_deliveries`)
	retry := "/orgs/" + e.org + "/webhooks/" + ep.ID + "/deliveries/" + strconv.FormatInt(deliveryID, 10) + "/retry"

	mu.Lock()
	failing = true
	mu.Unlock()
	upstreamtest.WantStatus(t, e.owner.Do("POST", retry, ""), 202)
	drain(t, d)
	got := rc.requests()
	if len(got) != 2 || got[1].ID != id {
		t.Fatalf("requests %+v, want the event again", got)
	}
	// The retry of a delivered delivery is one attempt: failing, it fails at once.
	e.clock.Advance(48 * time.Hour)
	drain(t, d)
	if n := len(rc.requests()); n != 2 {
		t.Errorf("%d requests, want 2", n)
	}
	if s := upstreamtest.Scalar[string](e.Env, `SELECT state FROM webhook_deliveries`); s != "failed" {
		t.Errorf("state %s, want failed", s)
	}
	upstreamtest.Want(t, e.owner.Do("POST", "/orgs/"+e.org+"/webhooks/"+ep.ID+"/deliveries/99999/retry", ""), 404,
		`{"error":"delivery not found"}`)
	upstreamtest.Want(t, e.owner.Do("POST", "/orgs/"+e.org+"/webhooks/"+ep.ID+"/deliveries/x/retry", ""), 404,
		`{"error":"delivery not found"}`)
}

func TestDeliveriesArePagedNewestFirst(t *testing.T) {
	e := newEnv(t)
	rc := newReceiver(t, nil)
	ep := e.addEndpoint(t, rc.URL)
	var ids []string
	for range 3 {
		ids = append(ids, e.sendTest(t, ep))
	}
	path := "/orgs/" + e.org + "/webhooks/" + ep.ID + "/deliveries?limit=2"
	type page struct {
		Data []struct {
			EventID string         `json:"event_id"`
			State   string         `json:"state"`
			Event   map[string]any `json:"event"`
		} `json:"data"`
		NextCursor *string `json:"next_cursor"`
	}
	var first, second page
	e.owner.Do("GET", path, "").Decode(t, &first)
	if len(first.Data) != 2 || first.NextCursor == nil || first.Data[0].EventID != ids[2] || first.Data[1].EventID != ids[1] {
		t.Fatalf("first page %+v", first)
	}
	if first.Data[0].State != "pending" || first.Data[0].Event["type"] != "webhook.test" {
		t.Errorf("first delivery %+v", first.Data[0])
	}
	e.owner.Do("GET", path+"&cursor="+*first.NextCursor, "").Decode(t, &second)
	if len(second.Data) != 1 || second.NextCursor != nil || second.Data[0].EventID != ids[0] {
		t.Fatalf("second page %+v", second)
	}
	upstreamtest.Want(t, e.owner.Do("GET", path+"&cursor=zz", ""), 400,
		`{"error":"invalid_request","message":"cursor: is not a cursor this API returned"}`)
}

func TestFinishedEventsArePurgedAfterTheirRetention(t *testing.T) {
	e := newEnv(t)
	rc := newReceiver(t, func(n int) int {
		if n == 0 {
			return 204
		}
		return 500
	})
	ep := e.addEndpoint(t, rc.URL)
	delivered := e.sendTest(t, ep)
	d := e.dispatcher(open)
	drain(t, d)
	pending := e.sendTest(t, ep)
	drain(t, d) // fails, pending until its retries end
	e.Exec(`UPDATE webhook_deliveries SET next_attempt_at = next_attempt_at + interval '60 days' WHERE state = 'pending'`)
	e.clock.Advance(store.WebhookRetention - time.Hour)
	if err := d.Notices(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := upstreamtest.Scalar[int](e.Env, `SELECT count(*) FROM webhook_events`); n != 2 {
		t.Fatalf("%d events before the retention ends, want 2", n)
	}
	e.clock.Advance(2 * time.Hour)
	if err := d.Notices(context.Background()); err != nil {
		t.Fatal(err)
	}
	left := upstreamtest.Scalar[string](e.Env, `SELECT string_agg(id, ',') FROM webhook_events`)
	if left != pending {
		t.Errorf("events left %s, want only the pending %s (the delivered %s purged)", left, pending, delivered)
	}
	if n := upstreamtest.Scalar[int](e.Env, `SELECT count(*) FROM webhook_attempts a JOIN webhook_deliveries d ON d.id = a.delivery_id WHERE d.event_id = $1`, delivered); n != 0 {
		t.Errorf("%d attempts of the purged event left", n)
	}
}
