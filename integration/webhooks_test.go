package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/keygate/keygate/internal/testkit/testenv"
	"github.com/keygate/keygate/upstream/webhook"
)

// hook is one request a webhook receiver got.
type hook struct {
	id, timestamp, signature string
	body                     []byte
}

// TestWebhooksInABrowser adds an endpoint in the dashboard, sends a test event from
// the page and sees its delivery there; the receiver, a loopback server, verifies the
// signature with the secret the page showed once. The JSON API then shows the same
// delivery, checked against the OpenAPI document.
func TestWebhooksInABrowser(t *testing.T) {
	s := newStackWith(t, stackOptions{upstreamArgs: []string{"--webhook-allow-http", "--webhook-allow-private"}})
	base := s.URL(0)
	o := s.newOrg("pro")

	var mu sync.Mutex
	var got []hook
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, hook{r.Header.Get("webhook-id"), r.Header.Get("webhook-timestamp"), r.Header.Get("webhook-signature"), body})
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	defer rc.Close()

	owner := newTab(t, browser(t), base)
	owner.logIn(o.Email, o.Password)
	// logIn returns at the first h1, maybe still the login page's: the keys page must
	// have loaded before another navigation, or that one aborts the login's.
	owner.do("the keys page", chromedp.WaitVisible(tid("create-key-name")))
	owner.do("the webhooks page",
		chromedp.Navigate(base+"/dashboard/orgs/"+o.ID+"/webhooks"),
		chromedp.WaitVisible(tid("webhook-url")))
	owner.do("add an endpoint",
		chromedp.SendKeys(tid("webhook-url"), rc.URL+"/hook"),
		chromedp.SendKeys(tid("webhook-description"), "ops receiver"),
		clickThrough(tid("webhook-submit"), tid("webhook-secret")))
	secret := get(owner, "read the secret", chromedp.Text(tid("webhook-secret")))
	s.neverLog(secret)
	owner.screenshot("webhooks")
	owner.do("send a test event", clickThrough(tid("webhook-test"), tid("delivery-row")))

	// The dispatcher polls every second: the receiver gets the event, then the page,
	// refreshed, shows the delivery made.
	testenv.Eventually(t, 30*time.Second, "the receiver getting the test event", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) > 0
	})
	var state string
	if !testenv.Within(30*time.Second, func() bool {
		owner.do("refresh", clickThrough(tid("deliveries-refresh"), tid("delivery-row")))
		state = get(owner, "read the delivery's state", chromedp.Text(tid("delivery-state")))
		return state == "delivered"
	}) {
		t.Fatalf("the delivery is %q 30 s after the receiver got it", state)
	}
	eventID := get(owner, "the event id", chromedp.AttributeValue(tid("delivery-row"), "data-event-id")).Value
	owner.screenshot("webhook-deliveries")

	mu.Lock()
	hooks := append([]hook(nil), got...)
	mu.Unlock()
	if len(hooks) != 1 || hooks[0].id != eventID {
		t.Fatalf("the receiver got %d requests (%+v), want one of %s", len(hooks), hooks, eventID)
	}
	ts, err := strconv.ParseInt(hooks[0].timestamp, 10, 64)
	if err != nil || !webhook.Verify(secret, hooks[0].signature, hooks[0].id, ts, hooks[0].body) {
		t.Errorf("the signature %q does not verify with the page's secret", hooks[0].signature)
	}

	api := s.loginOwner(o)
	r := api.do("GET", "/orgs/"+o.ID+"/webhooks", nil, nil)
	list := r.JSON(t)["data"].([]any)
	if r.Status != 200 || len(list) != 1 {
		t.Fatalf("GET webhooks: %d %s", r.Status, r.Body)
	}
	id := list[0].(map[string]any)["id"].(string)
	r = api.do("GET", "/orgs/"+o.ID+"/webhooks/"+id+"/deliveries", nil, nil)
	deliveries := r.JSON(t)["data"].([]any)
	if r.Status != 200 || len(deliveries) != 1 || deliveries[0].(map[string]any)["state"] != "delivered" {
		t.Fatalf("GET deliveries: %d %s", r.Status, r.Body)
	}

	editAndDeleteInABrowser(t, owner, api, base, o, id, rc.URL)
}

// editAndDeleteInABrowser changes the endpoint id's URL, description and events on
// the webhooks page, sees the API show the change, and deletes it there.
func editAndDeleteInABrowser(t *testing.T, owner *tab, api *Client, base string, o Org, id, receiver string) {
	t.Helper()
	row := chromedp.CSS(`tr[data-webhook-id="` + id + `"] `)
	box := func(form chromedp.CSS, event string) chromedp.CSS {
		return form + chromedp.CSS(` input[value="`+event+`"]`)
	}
	owner.do("the webhooks page", chromedp.Navigate(base+"/dashboard/orgs/"+o.ID+"/webhooks"), chromedp.WaitVisible(row))
	// The stack allows http: the forms say so.
	if label := get(owner, "the URL's label", chromedp.Text(`label[for="webhook-url"]`)); label != "URL (http or https)" {
		t.Errorf("the create form's URL label is %q, want %q", label, "URL (http or https)")
	}
	if got := get(owner, "the events", chromedp.Text(row+tid("webhook-chosen"))); got != "all" {
		t.Errorf("the endpoint's events show %q, want all", got)
	}
	owner.do("open the edit form", chromedp.Click(row+tid("webhook-edit")), chromedp.WaitVisible(row+tid("save-webhook")))
	events := row + tid("edit-webhook-events")
	for _, e := range []string{"key.revoked", "key.leaked"} {
		if checked := get(owner, "the box of "+e, chromedp.JavascriptAttribute[bool](box(events, e), "checked")); checked {
			t.Errorf("the edit form checks %s for an endpoint of every type", e)
		}
	}
	owner.do("edit the endpoint",
		chromedp.SetValue(row+tid("edit-webhook-url"), receiver+"/moved"),
		chromedp.SetValue(row+tid("edit-webhook-description"), "moved receiver"),
		chromedp.Click(box(events, "key.revoked")),
		chromedp.Click(box(events, "key.leaked")),
		clickThrough(row+tid("save-webhook"), tid("webhook-url")))
	if got := get(owner, "the events", chromedp.Text(row+tid("webhook-chosen"))); got != "key.leaked, key.revoked" {
		t.Errorf("the endpoint's events show %q after the edit, want %q", got, "key.leaked, key.revoked")
	}
	r := api.do("GET", "/orgs/"+o.ID+"/webhooks/"+id, nil, nil)
	v := r.JSON(t)
	if r.Status != 200 || v["url"] != receiver+"/moved" || v["description"] != "moved receiver" ||
		fmt.Sprint(v["events"]) != "[key.leaked key.revoked]" {
		t.Errorf("GET the endpoint after the edit: %d %s", r.Status, r.Body)
	}

	// A URL the policy refuses is shown on the page, and changes nothing.
	owner.do("open the edit form again", chromedp.Click(row+tid("webhook-edit")), chromedp.WaitVisible(row+tid("save-webhook")))
	owner.do("edit to a bad URL",
		chromedp.SetValue(row+tid("edit-webhook-url"), "ftp://example.com/"),
		clickThrough(row+tid("save-webhook"), tid("webhook-url")))
	if page := owner.html(); !strings.Contains(page, "must be an https URL") {
		t.Errorf("the refusal is not on the page:\n%s", page)
	}
	if r := api.do("GET", "/orgs/"+o.ID+"/webhooks/"+id, nil, nil); r.JSON(t)["url"] != receiver+"/moved" {
		t.Errorf("a refused edit changed the endpoint: %s", r.Body)
	}

	owner.do("open the delete form", chromedp.Click(row+tid("webhook-delete")), chromedp.WaitVisible(row+tid("confirm-webhook-delete")))
	owner.do("delete the endpoint", clickThrough(row+tid("confirm-webhook-delete"), tid("webhook-url")))
	if n := get(owner, "the rows", chromedp.Evaluate[int](`document.querySelectorAll('[data-testid="webhook-row"]').length`)); n != 0 {
		t.Errorf("%d endpoint rows after the delete, want 0", n)
	}
	r = api.do("GET", "/orgs/"+o.ID+"/webhooks", nil, nil)
	if list := r.JSON(t)["data"].([]any); r.Status != 200 || len(list) != 0 {
		t.Errorf("GET webhooks after the delete: %d %s", r.Status, r.Body)
	}
}

// TestAnUpstreamKilledMidDeliveryLosesNothing kills the upstream (SIGKILL) while a
// receiver holds its attempt, starts it again, and sees the event delivered with the
// same webhook-id once the dead process's lease has ended.
func TestAnUpstreamKilledMidDeliveryLosesNothing(t *testing.T) {
	// Most of its time is waiting for the dead process's lease to end: it waits beside
	// the other waiting tests (see the package doc).
	t.Parallel()
	s := newStackWith(t, stackOptions{upstreamArgs: []string{"--webhook-allow-http", "--webhook-allow-private"}})
	o, owner := s.newOwner("pro")
	arrived, release := make(chan string, 4), make(chan struct{})
	var mu sync.Mutex
	var ids []string
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		ids = append(ids, r.Header.Get("webhook-id"))
		first := len(ids) == 1
		mu.Unlock()
		arrived <- r.Header.Get("webhook-id")
		if first {
			<-release // held until the upstream that sent it is dead
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer rc.Close()
	defer close(release)

	r := owner.do("POST", "/orgs/"+o.ID+"/webhooks", map[string]any{"url": rc.URL}, nil)
	if r.Status != 201 {
		t.Fatalf("create: %d %s", r.Status, r.Body)
	}
	webhookID := r.JSON(t)["id"].(string)
	r = owner.do("POST", "/orgs/"+o.ID+"/webhooks/"+webhookID+"/test", nil, nil)
	if r.Status != 202 {
		t.Fatalf("test: %d %s", r.Status, r.Body)
	}
	eventID := r.JSON(t)["event_id"].(string)
	select {
	case id := <-arrived:
		if id != eventID {
			t.Fatalf("first attempt of %s, want %s", id, eventID)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no attempt within 30 s")
	}
	s.upstream.cmd.Process.Kill()
	<-s.upstream.done
	s.startUpstream()
	// The killed process's claim lasts 30 s; then the new one takes it.
	select {
	case id := <-arrived:
		if id != eventID {
			t.Fatalf("second attempt of %s, want %s", id, eventID)
		}
	case <-time.After(90 * time.Second):
		t.Fatal("the event was not attempted again within 90 s of the restart")
	}
	testenv.Eventually(t, 30*time.Second, "the delivery recorded as delivered", func() bool {
		r := owner.do("GET", "/orgs/"+o.ID+"/webhooks/"+webhookID+"/deliveries", nil, nil)
		data, _ := r.JSON(t)["data"].([]any)
		return r.Status == 200 && len(data) == 1 && data[0].(map[string]any)["state"] == "delivered"
	})
}

// TestTheQuotasFirstRefusalSendsThe100NoticeThroughTheGateway: a plan of 10 requests
// a month, a route that costs 5, and 7 requests used. The costly request is refused
// 402 below 100 %; the organisation's endpoint then gets the month's 100 %
// quota.threshold event with the 7 used.
func TestTheQuotasFirstRefusalSendsThe100NoticeThroughTheGateway(t *testing.T) {
	s := newStackWith(t, stackOptions{
		upstreamArgs: []string{"--webhook-allow-http", "--webhook-allow-private"},
		gwOptions:    strings.Join([]string{"usage_flush_interval 1s", "route POST /v1/monitors cost 5"}, "\n\t\t\t"),
	})
	s.budgetPlan("ten", 600, -1, 10)
	o, owner := s.newOwner("ten")
	keyID, key := owner.createKey(o.ID, "k", "Admin", nil)
	notices := make(chan []byte, 4)
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		notices <- body
		w.WriteHeader(http.StatusNoContent)
	}))
	defer rc.Close()
	if r := owner.do("POST", "/orgs/"+o.ID+"/webhooks", map[string]any{"url": rc.URL, "events": []string{"quota.threshold"}}, nil); r.Status != 201 {
		t.Fatalf("create: %d %s", r.Status, r.Body)
	}
	waitForMonthRoom(5 * time.Minute)
	api := s.api(key, 0)
	for i := range 7 {
		if r := api.do("GET", "/v1/monitors", nil); r.Status != 200 {
			t.Fatalf("request %d: %d %s", i, r.Status, r.Body)
		}
	}
	wantError(t, api.do("POST", "/v1/monitors", newMonitor("costly")), http.StatusPaymentRequired,
		`{"error":"quota_exceeded","metric":"api_requests","upgrade":true,"limit":10,"used":7}`)
	// The dispatcher looks for notices when it starts, then once a minute: once the
	// refusal is in the usage record, a restart looks at once.
	testenv.Eventually(t, 30*time.Second, "the refusal in the usage record", func() bool {
		return owner.usageUnits(o.ID, time.Now())[keyID+" quota_exceeded 402"] == "1/5"
	})
	s.stopUpstream()
	s.startUpstream()

	select {
	case body := <-notices:
		var ev struct {
			Type string         `json:"type"`
			Data map[string]any `json:"data"`
		}
		if err := json.Unmarshal(body, &ev); err != nil {
			t.Fatal(err)
		}
		if ev.Type != "quota.threshold" || ev.Data["threshold_percent"] != float64(100) || ev.Data["used"] != float64(7) || ev.Data["limit"] != float64(10) {
			t.Errorf("notice %s, want the 100 %% threshold with 7 of 10 used", body)
		}
	case <-time.After(webhook.NoticeEvery + 30*time.Second):
		t.Fatalf("no notice within %v of the refusal", webhook.NoticeEvery+30*time.Second)
	}
}
