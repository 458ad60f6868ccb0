package httpapi_test

import (
	"fmt"
	"html"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/upstream/internal/upstreamtest"
	"github.com/keygate/keygate/upstream/store"
)

// settingsCells returns the keys page's minute limit and networks of the key id, their
// markup without tags' attributes beyond what they show.
func settingsCells(t *testing.T, page, id string) (limit, cidrs string) {
	t.Helper()
	return rowPart(t, page, id, "key-rate-limit", "</span>"), rowPart(t, page, id, "key-cidrs", "</td>")
}

// rowPart returns what the element of testid holds in the keys page's row of the key
// id, up to end.
func rowPart(t *testing.T, page, id, testid, end string) string {
	t.Helper()
	_, row, ok := strings.Cut(page, `data-key-id="`+id+`"`)
	if !ok {
		t.Fatalf("no row of %s on the page:\n%s", id, page)
	}
	_, rest, ok := strings.Cut(row, `data-testid="`+testid+`">`)
	if !ok {
		t.Fatalf("no %s in the row of %s", testid, id)
	}
	v, _, _ := strings.Cut(rest, end)
	return v
}

func TestDashboardCreatesAKeyWithItsOwnLimitAndNetworks(t *testing.T) {
	_, org, owner := upstreamtest.NewOrgEnv(t, "pro", store.RoleOwner)
	page := owner.Do("GET", "/dashboard/orgs/"+org, "").Body
	for _, field := range []string{
		`<label for="key-rate-limit">`, `id="key-rate-limit" name="rate_limit" type="number" min="1" max="600"`,
		`<label for="key-cidrs">`, `<textarea id="key-cidrs" name="allowed_cidrs"`,
		`The plan allows 600 requests a minute per key.`,
	} {
		if !strings.Contains(page, field) {
			t.Errorf("the keys page lacks %s", field)
		}
	}

	r := form(owner).Do("POST", "/dashboard/orgs/"+org+"/keys", url.Values{"name": {"ci"}, "role": {"Editor"},
		"rate_limit": {" 20 "}, "allowed_cidrs": {"192.0.2.0/24,\r\n 2001:DB8::/32\r\n\r\n198.51.100.7,"}}.Encode())
	if r.Status != http.StatusCreated {
		t.Fatalf("create: %d %s", r.Status, r.Body)
	}
	var list struct {
		Data []struct {
			ID           string   `json:"id"`
			RateLimit    *int     `json:"rate_limit"`
			AllowedCIDRs []string `json:"allowed_cidrs"`
		} `json:"data"`
	}
	owner.Do("GET", "/orgs/"+org+"/api-keys", "").Decode(t, &list)
	if len(list.Data) != 1 || list.Data[0].RateLimit == nil || *list.Data[0].RateLimit != 20 ||
		strings.Join(list.Data[0].AllowedCIDRs, " ") != "192.0.2.0/24 2001:db8::/32 198.51.100.7/32" {
		t.Fatalf("the form created %+v", list.Data)
	}
	id := list.Data[0].ID
	limit, cidrs := settingsCells(t, r.Body, id)
	if limit != "20" || cidrs != "<code>192.0.2.0/24</code><br><code>2001:<wbr>db8:<wbr>:<wbr>/32</code><br><code>198.51.100.7/32</code>" {
		t.Errorf("the row shows limit %q, networks %q", limit, cidrs)
	}
	// The settings form shows the stored values.
	if !strings.Contains(r.Body, `value="20" data-testid="edit-rate-limit"`) ||
		!strings.Contains(r.Body, "data-testid=\"edit-cidrs\">192.0.2.0/24\n2001:db8::/32\n198.51.100.7/32</textarea>") {
		t.Errorf("the settings form does not hold the key's values:\n%s", r.Body)
	}

	// Empty fields are the plan's limit and anywhere.
	r = form(owner).Do("POST", "/dashboard/orgs/"+org+"/keys", url.Values{"name": {"plain"}, "role": {"Editor"}, "rate_limit": {""}, "allowed_cidrs": {" \r\n "}}.Encode())
	if r.Status != http.StatusCreated {
		t.Fatalf("create: %d %s", r.Status, r.Body)
	}
	owner.Do("GET", "/orgs/"+org+"/api-keys", "").Decode(t, &list)
	if len(list.Data) != 2 || list.Data[1].RateLimit != nil || len(list.Data[1].AllowedCIDRs) != 0 {
		t.Fatalf("the form with empty settings created %+v", list.Data)
	}
	if limit, cidrs := settingsCells(t, r.Body, list.Data[1].ID); limit != "plan" || cidrs != "anywhere" {
		t.Errorf("a key without settings shows %q, %q", limit, cidrs)
	}
}

func TestDashboardSettingsFormUpdatesTheKeyAsPATCHDoes(t *testing.T) {
	e, org, owner := upstreamtest.NewOrgEnv(t, "pro", store.RoleOwner)
	id, full := dashboardKey(t, owner, org, "ci")
	settings := "/dashboard/orgs/" + org + "/keys/" + id + "/settings"

	r := form(owner).Do("POST", settings, url.Values{"rate_limit": {"30"}, "allowed_cidrs": {"10.0.0.0/8\n192.0.2.7"}}.Encode())
	if r.Status != http.StatusSeeOther || r.Header.Get("Location") != "/dashboard/orgs/"+org {
		t.Fatalf("settings form: %d to %q: %s", r.Status, r.Header.Get("Location"), r.Body)
	}
	if got := listEntry(t, owner, org, id); !strings.Contains(got, `"allowed_cidrs":["10.0.0.0/8","192.0.2.7/32"]`) || !strings.Contains(got, `"rate_limit":30,`) {
		t.Errorf("after the form the key is %s", got)
	}
	page := owner.Do("GET", "/dashboard/orgs/"+org, "").Body
	if limit, cidrs := settingsCells(t, page, id); limit != "30" || cidrs != "<code>10.0.0.0/8</code><br><code>192.0.2.7/32</code>" {
		t.Errorf("the row shows %q, %q", limit, cidrs)
	}

	// Both fields emptied: the plan's limit, anywhere.
	r = form(owner).Do("POST", settings, url.Values{"rate_limit": {""}, "allowed_cidrs": {""}}.Encode())
	if r.Status != http.StatusSeeOther {
		t.Fatalf("settings form: %d %s", r.Status, r.Body)
	}
	if got := listEntry(t, owner, org, id); !strings.Contains(got, `"allowed_cidrs":[]`) || !strings.Contains(got, `"rate_limit":null`) {
		t.Errorf("after emptying the form the key is %s", got)
	}
	// The trail says what changed, in words.
	audit := owner.Do("GET", "/dashboard/orgs/"+org+"/audit", "").Body
	for _, words := range []string{
		"rate limit: plan&#39;s → 30 a minute; allowed networks: anywhere → 10.0.0.0/8, 192.0.2.7/32",
		"rate limit: 30 a minute → plan&#39;s; allowed networks: 10.0.0.0/8, 192.0.2.7/32 → anywhere",
	} {
		if !strings.Contains(audit, `data-testid="audit-changes">`+words+`<`) {
			t.Errorf("the audit page does not say %q:\n%s", words, audit)
		}
	}
	if !liveKey(e, full) {
		t.Error("the key stopped working")
	}
}

// TestDashboardSettingsAreCheckedAsTheJSONBodies sends the create and settings forms
// with bad settings. Each is refused with the JSON API's message for the same value,
// on the keys page, the settings form open with what was typed, and nothing changes.
func TestDashboardSettingsAreCheckedAsTheJSONBodies(t *testing.T) {
	e, org, owner := upstreamtest.NewOrgEnv(t, "pro", store.RoleOwner)
	id, _ := dashboardKey(t, owner, org, "kept")
	many := make([]string, 33)
	for i := range many {
		many[i] = fmt.Sprintf("10.%d.0.0/16", i)
	}
	manyJSON := `["` + strings.Join(many, `","`) + `"]`
	for _, tc := range []struct {
		name         string
		limit, cidrs string // the form's fields
		json         string // the JSON members of the same values; "" when JSON cannot say them
		message      string
	}{
		{"a rate limit of 0", "0", "", `"rate_limit":0`, "rate_limit: must be from 1 to 600, the plan's api_rate_limit"},
		{"a negative rate limit", "-3", "", `"rate_limit":-3`, "rate_limit: must be from 1 to 600, the plan's api_rate_limit"},
		{"a rate limit over the plan's", "601", "", `"rate_limit":601`, "rate_limit: must be from 1 to 600, the plan's api_rate_limit"},
		{"a rate limit beyond 32 bits", "99999999999", "", `"rate_limit":99999999999`, "rate_limit: must be an integer"},
		{"a rate limit that is no number", "fast", "", "", "rate_limit: must be a whole number of requests a minute"},
		{"a fractional rate limit", "1.5", "", "", "rate_limit: must be a whole number of requests a minute"},
		{"a malformed network", "", "10.0.0.0/8,10.0.0/8", `"allowed_cidrs":["10.0.0.0/8","10.0.0/8"]`, `allowed_cidrs: "10.0.0/8" is not an IPv4 or IPv6 CIDR such as 192.0.2.0/24`},
		{"networks separated by spaces", "", "10.0.0.0/8 192.0.2.0/24", `"allowed_cidrs":["10.0.0.0/8 192.0.2.0/24"]`, `allowed_cidrs: "10.0.0.0/8 192.0.2.0/24" is not an IPv4 or IPv6 CIDR such as 192.0.2.0/24`},
		{"bits after the prefix", "", "192.0.2.1/24", `"allowed_cidrs":["192.0.2.1/24"]`, "allowed_cidrs: 192.0.2.1/24 has bits set after its prefix length: write 192.0.2.0/24 for the network, or 192.0.2.1/32 for the one address"},
		{"33 networks", "", strings.Join(many, "\n"), `"allowed_cidrs":` + manyJSON, "allowed_cidrs: must list at most 32 networks"},
		{"a network twice", "", "192.0.2.0/24\n192.0.2.0/24", `"allowed_cidrs":["192.0.2.0/24","192.0.2.0/24"]`, "allowed_cidrs: lists 192.0.2.0/24 more than once"},
		// The rate limit's range depends on the plan, read when the key is written: after
		// every field's own checks.
		{"a malformed network before a rate limit of 0", "0", "nope", `"rate_limit":0,"allowed_cidrs":["nope"]`, `allowed_cidrs: "nope" is not an IPv4 or IPv6 CIDR such as 192.0.2.0/24`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := keysAndTrail(e)
			values := url.Values{"rate_limit": {tc.limit}, "allowed_cidrs": {tc.cidrs}}
			words := "Please check the form: " + tc.message + "."
			for _, door := range []struct{ path, body string }{
				{"/dashboard/orgs/" + org + "/keys/" + id + "/settings", values.Encode()},
				{"/dashboard/orgs/" + org + "/keys", url.Values{"name": {"new"}, "role": {"Admin"}, "rate_limit": {tc.limit}, "allowed_cidrs": {tc.cidrs}}.Encode()},
			} {
				r := form(owner).Do("POST", door.path, door.body)
				if r.Status != http.StatusBadRequest || !strings.Contains(r.Body, html.EscapeString(words)) {
					t.Errorf("%s: %d, want 400 with %q: %s", door.path, r.Status, words, r.Body)
				}
				// The form sent comes back as it was typed.
				if strings.HasSuffix(door.path, "/settings") {
					if !strings.Contains(r.Body, `<details class="settings" open>`) ||
						!strings.Contains(r.Body, `value="`+tc.limit+`" data-testid="edit-rate-limit"`) ||
						!strings.Contains(r.Body, `data-testid="edit-cidrs">`+tc.cidrs+`</textarea>`) {
						t.Errorf("the settings form is not open with what was typed:\n%s", r.Body)
					}
				} else if !strings.Contains(r.Body, `value="`+tc.limit+`" data-testid="create-key-rate-limit"`) ||
					!strings.Contains(r.Body, `data-testid="create-key-cidrs">`+tc.cidrs+`</textarea>`) {
					t.Errorf("the create form does not hold what was typed:\n%s", r.Body)
				}
			}
			if tc.json != "" {
				upstreamtest.Want(t, owner.Do("PATCH", "/orgs/"+org+"/api-keys/"+id, "{"+tc.json+"}"), 400, badRequest(tc.message))
				upstreamtest.Want(t, owner.Do("POST", "/orgs/"+org+"/api-keys", `{"name":"new","role":"Admin",`+tc.json+"}"), 400, badRequest(tc.message))
			}
			if after := keysAndTrail(e); after != before {
				t.Errorf("a refused form changed keys or trail: %s, then %s", before, after)
			}
		})
	}
}

func TestDashboardSettingsAreForOwnersAndAdminsOnly(t *testing.T) {
	e, org, owner := upstreamtest.NewOrgEnv(t, "pro", store.RoleOwner)
	id, _ := dashboardKey(t, owner, org, "shared")
	other := e.Org("pro")
	outsider := e.Person(store.RoleOwner, other)
	for _, role := range []string{store.RoleEditor, store.RoleViewer} {
		t.Run(role, func(t *testing.T) {
			m := e.Person(role, org)
			page := m.Do("GET", "/dashboard/orgs/"+org, "").Body
			if limit, cidrs := settingsCells(t, page, id); limit != "plan" || cidrs != "anywhere" {
				t.Errorf("%s sees %q, %q", role, limit, cidrs)
			}
			for _, control := range []string{`data-testid="edit-settings"`, `data-testid="create-key-rate-limit"`} {
				if strings.Contains(page, control) {
					t.Errorf("%s sees %s", role, control)
				}
			}
			before := keysAndTrail(e)
			if r := form(m).Do("POST", "/dashboard/orgs/"+org+"/keys/"+id+"/settings", "rate_limit=5&allowed_cidrs="); r.Status != http.StatusForbidden {
				t.Errorf("%s settings form: %d", role, r.Status)
			}
			if after := keysAndTrail(e); after != before {
				t.Errorf("%s changed the key", role)
			}
		})
	}
	if r := form(outsider).Do("POST", "/dashboard/orgs/"+org+"/keys/"+id+"/settings", "rate_limit=5"); r.Status != http.StatusNotFound {
		t.Errorf("an outsider's settings form: %d, want 404", r.Status)
	}
	if r := form(owner).Do("POST", "/dashboard/orgs/"+org+"/keys/BBBBBBBBBBBBBBBBBBBBBB/settings", "rate_limit=5"); r.Status != http.StatusNotFound ||
		!strings.Contains(r.Body, "There is no such page, or it is not yours to see.") {
		t.Errorf("an unknown key's settings form: %d %s", r.Status, r.Body)
	}
	if r := form(owner).With("Sec-Fetch-Site", "cross-site").Do("POST", "/dashboard/orgs/"+org+"/keys/"+id+"/settings", "rate_limit=5"); r.Status != http.StatusForbidden {
		t.Errorf("a cross-site settings form: %d, want 403", r.Status)
	}
	if got := listEntry(t, owner, org, id); !strings.Contains(got, `"rate_limit":null`) {
		t.Errorf("the refused forms changed the key: %s", got)
	}
}

func TestUsagePageShowsTheMonthAgainstThePlansQuota(t *testing.T) {
	u := newUsageEnv(t)
	u.fill(t) // 29 requests in March that count; 3 refused ones that do not
	u.record(t, u.ka, time.Date(2026, 2, 28, 23, 59, 0, 0, time.UTC), keystore.OutcomeProxied, 200, 7)
	page := u.viewer.Do("GET", "/dashboard/orgs/"+u.org+"/usage", "").Body
	if strings.Contains(page, `data-testid="usage-month"`) {
		t.Errorf("a plan without a quota shows the month:\n%s", page)
	}

	u.e.Plan(store.Plan{Name: "metered", APIRateLimit: 60, MaxMonitors: 1, MinIntervalSeconds: 60,
		Locations: []string{"us-east"}, CheckTypes: []string{"http"}, APIRequestsPerMonth: 40})
	u.e.SetPlan(u.org, "metered")
	monthLine := func() string {
		t.Helper()
		page := u.viewer.Do("GET", "/dashboard/orgs/"+u.org+"/usage?range=30d", "").Body
		_, rest, ok := strings.Cut(page, `<p data-testid="usage-month">`)
		if !ok {
			t.Fatalf("no month on the usage page:\n%s", page)
		}
		line, _, _ := strings.Cut(rest, "</p>")
		_, meter, _ := strings.Cut(rest, "<meter ")
		meter, _, _ = strings.Cut(meter, ">")
		return line + " | " + meter
	}
	if got, want := monthLine(), `<strong>29</strong> of 40 requests in 2026-03 (UTC), 72 %. It starts afresh on 1 April 2026. | `+
		`min="0" max="40" value="29" high="36" aria-labelledby="month-title" data-testid="usage-month-meter"`; got != want {
		t.Errorf("the month says\n%s\nwant\n%s", got, want)
	}
	u.record(t, u.kb, usageNow, keystore.OutcomeProxied, 200, 12)
	if got, want := monthLine(), `<strong>41</strong> of 40 requests in 2026-03 (UTC), 102 %. The quota is spent: every key of the organisation is refused (402) until 1 April 2026. | `+
		`min="0" max="40" value="40" high="36" aria-labelledby="month-title" data-testid="usage-month-meter"`; got != want {
		t.Errorf("the month says\n%s\nwant\n%s", got, want)
	}
}
