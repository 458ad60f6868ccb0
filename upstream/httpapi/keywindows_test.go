package httpapi_test

import (
	"html"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/keygate/keygate/upstream/internal/upstreamtest"
	"github.com/keygate/keygate/upstream/store"
)

// burstOrg returns an owner of an org on a plan of 600 requests a minute, 50 a second
// and 100000 a day per key.
func burstOrg(t *testing.T) (e *upstreamtest.Env, org string, owner *upstreamtest.Client) {
	t.Helper()
	e = upstreamtest.NewEnv(t)
	e.Plan(store.Plan{Name: "burst", APIRateLimit: 600, MaxMonitors: 5, MinIntervalSeconds: 60,
		Locations: []string{"us-east"}, CheckTypes: []string{"http"}, APIRateLimitPerSecond: 50, APIRateLimitPerDay: 100000})
	org = e.Org("burst")
	return e, org, e.Person(store.RoleOwner, org)
}

// TestAKeysWindowsThroughTheJSONAPI: rate_limit_per_second, _per_hour and _per_day
// are taken at creation, listed, changed by the PATCH (null for the plan's) and
// audited with what changed; a value outside the plan's is refused with a message
// naming it, and changes nothing.
func TestAKeysWindowsThroughTheJSONAPI(t *testing.T) {
	e, org, owner := burstOrg(t)
	r := owner.Do("POST", "/orgs/"+org+"/api-keys", `{"name":"ci","role":"Editor","rate_limit_per_second":2,"rate_limit_per_day":40}`)
	upstreamtest.WantStatus(t, r, http.StatusCreated)
	var created struct{ ID string }
	r.Decode(t, &created)
	id := created.ID
	if got := listEntry(t, owner, org, id); !strings.Contains(got, `"rate_limit_per_day":40,"rate_limit_per_hour":null,"rate_limit_per_second":2,`) {
		t.Errorf("listed as %s", got)
	}
	r = owner.Do("PATCH", "/orgs/"+org+"/api-keys/"+id, `{"rate_limit_per_second":null,"rate_limit_per_hour":500}`)
	upstreamtest.WantStatus(t, r, http.StatusOK)
	if !strings.Contains(r.Body, `"rate_limit_per_second":null,"rate_limit_per_hour":500,"rate_limit_per_day":40,`) {
		t.Errorf("PATCH answered %s", r.Body)
	}
	events := owner.Do("GET", "/orgs/"+org+"/audit-events", "").Body
	if !strings.Contains(events, `"changes":{"rate_limit_per_second":{"from":2,"to":null},"rate_limit_per_hour":{"from":null,"to":500}}`) {
		t.Errorf("the trail does not hold the change: %s", events)
	}
	for _, tc := range []struct{ body, message string }{
		{`{"rate_limit_per_second":51}`, "rate_limit_per_second: must be from 1 to 50, the plan's api_rate_limit_per_second"},
		{`{"rate_limit_per_day":0}`, "rate_limit_per_day: must be from 1 to 100000, the plan's api_rate_limit_per_day"},
		{`{"rate_limit_per_hour":0}`, "rate_limit_per_hour: must be a positive integer"},
		{`{"rate_limit_per_hour":"5"}`, "rate_limit_per_hour: must be an integer, not a string"},
		{`{"rate_limit_per_minute":5}`, "rate_limit_per_minute: unknown field"},
	} {
		before := keysAndTrail(e)
		upstreamtest.Want(t, owner.Do("PATCH", "/orgs/"+org+"/api-keys/"+id, tc.body), 400, badRequest(tc.message))
		upstreamtest.Want(t, owner.Do("POST", "/orgs/"+org+"/api-keys", `{"name":"new","role":"Admin",`+tc.body[1:]), 400, badRequest(tc.message))
		if after := keysAndTrail(e); after != before {
			t.Errorf("%s changed keys or trail: %s, then %s", tc.body, before, after)
		}
	}
}

// TestTheDashboardShowsAndSetsAKeysWindows: the keys page states the plan's windows,
// the create form and each key's settings form take a key's own, bounded by the
// plan's, the row shows them, and the audit page says each change in words; a bad
// value is the JSON API's message, the form sent back as typed.
func TestTheDashboardShowsAndSetsAKeysWindows(t *testing.T) {
	e, org, owner := burstOrg(t)
	page := owner.Do("GET", "/dashboard/orgs/"+org, "").Body
	for _, want := range []string{
		`The plan allows 600 requests a minute per key, 50 a second per key, 100000 a day per key.`,
		`id="key-rate-limit-per-second" name="rate_limit_per_second" type="number" min="1" max="50"`,
		`id="key-rate-limit-per-hour" name="rate_limit_per_hour" type="number" min="1" inputmode`,
		`id="key-rate-limit-per-day" name="rate_limit_per_day" type="number" min="1" max="100000"`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the keys page lacks %s", want)
		}
	}
	r := form(owner).Do("POST", "/dashboard/orgs/"+org+"/keys", url.Values{"name": {"ci"}, "role": {"Editor"},
		"rate_limit_per_second": {" 2 "}, "rate_limit_per_day": {"40"}}.Encode())
	if r.Status != http.StatusCreated {
		t.Fatalf("create: %d %s", r.Status, r.Body)
	}
	var list struct{ Data []struct{ ID string } }
	owner.Do("GET", "/orgs/"+org+"/api-keys", "").Decode(t, &list)
	id := list.Data[0].ID
	if got := rowPart(t, r.Body, id, "key-limits", "</td>"); got != `<span data-testid="key-rate-limit">plan</span><br>`+
		`<span class="limit" data-testid="key-window-limit">2 a second</span><br><span class="limit" data-testid="key-window-limit">40 a day</span>` {
		t.Errorf("the row shows %s", got)
	}
	for _, want := range []string{`value="2" data-testid="edit-rate-limit-per-second"`, `value="" data-testid="edit-rate-limit-per-hour"`,
		`value="40" data-testid="edit-rate-limit-per-day"`} {
		if !strings.Contains(r.Body, want) {
			t.Errorf("the settings form lacks %s", want)
		}
	}
	settings := "/dashboard/orgs/" + org + "/keys/" + id + "/settings"
	r = form(owner).Do("POST", settings, url.Values{"rate_limit_per_second": {""}, "rate_limit_per_hour": {"900"}, "rate_limit_per_day": {"40"}}.Encode())
	if r.Status != http.StatusSeeOther {
		t.Fatalf("settings form: %d %s", r.Status, r.Body)
	}
	if got := listEntry(t, owner, org, id); !strings.Contains(got, `"rate_limit_per_day":40,"rate_limit_per_hour":900,"rate_limit_per_second":null,`) {
		t.Errorf("after the form the key is %s", got)
	}
	audit := owner.Do("GET", "/dashboard/orgs/"+org+"/audit", "").Body
	if words := "rate limit a second: 2 a second → plan&#39;s; rate limit an hour: plan&#39;s → 900 an hour"; !strings.Contains(audit, `data-testid="audit-changes">`+words+`<`) {
		t.Errorf("the audit page does not say %q:\n%s", words, audit)
	}
	before := keysAndTrail(e)
	r = form(owner).Do("POST", settings, url.Values{"rate_limit_per_second": {"51"}, "rate_limit_per_day": {"soon"}}.Encode())
	if words := "Please check the form: rate_limit_per_day: must be a whole number of requests a day."; r.Status != http.StatusBadRequest ||
		!strings.Contains(r.Body, html.EscapeString(words)) || !strings.Contains(r.Body, `value="soon" data-testid="edit-rate-limit-per-day"`) {
		t.Errorf("a bad settings form: %d, want 400 with %q and the form as typed: %s", r.Status, words, r.Body)
	}
	r = form(owner).Do("POST", settings, url.Values{"rate_limit_per_second": {"51"}}.Encode())
	if words := "Please check the form: rate_limit_per_second: must be from 1 to 50, the plan's api_rate_limit_per_second."; r.Status != http.StatusBadRequest ||
		!strings.Contains(r.Body, html.EscapeString(words)) {
		t.Errorf("a second over the plan's: %d, want 400 with %q: %s", r.Status, words, r.Body)
	}
	if after := keysAndTrail(e); after != before {
		t.Errorf("refused forms changed keys or trail: %s, then %s", before, after)
	}
}
