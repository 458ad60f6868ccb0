package httpapi_test

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/upstream/internal/upstreamtest"
	"github.com/keygate/keygate/upstream/store"
)

var (
	usageKeyRow   = regexp.MustCompile(`data-testid="usage-key-row" data-key-id="([A-Za-z0-9]+)"`)
	usageKeyTotal = regexp.MustCompile(`data-testid="usage-key-total">([^<]*)<`)
)

// keyTotals returns the usage page's key rows as "id=total" in their order.
func keyTotals(t *testing.T, page string) []string {
	t.Helper()
	ids, totals := usageKeyRow.FindAllStringSubmatch(page, -1), usageKeyTotal.FindAllStringSubmatch(page, -1)
	if len(ids) != len(totals) {
		t.Fatalf("%d key rows, %d totals", len(ids), len(totals))
	}
	var out []string
	for i := range ids {
		out = append(out, ids[i][1]+"="+totals[i][1])
	}
	return out
}

// apiTotals returns the requests of each key as GET /orgs/{orgId}/usage answers them.
func apiTotals(t *testing.T, c *upstreamtest.Client, org, query string) map[string]int64 {
	t.Helper()
	r := c.Do("GET", "/orgs/"+org+"/usage"+query, "")
	upstreamtest.WantStatus(t, r, 200)
	var body struct {
		Data []struct {
			KeyID string `json:"key_id"`
			Count int64  `json:"count"`
		} `json:"data"`
	}
	r.Decode(t, &body)
	totals := map[string]int64{}
	for _, d := range body.Data {
		totals[d.KeyID] += d.Count
	}
	return totals
}

func TestUsagePageShowsTheChartAndEachKeysTotals(t *testing.T) {
	u := newUsageEnv(t)
	u.fill(t)
	u.record(t, u.ka, usageNow, keystore.OutcomeProxied, 502, 2)
	// A key used from outside its networks gets a 401 like any bad key; the page tells
	// it apart by its outcome.
	u.record(t, u.ka, usageNow, keystore.OutcomeIPDenied, 401, 3)
	// A revoked key without requests has no row; one with requests has.
	idle, _, err := u.e.Keys.Create(context.Background(), keystore.NewKey{OrgID: u.org, Name: "idle", Role: keystore.RoleViewer})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := u.e.Keys.Revoke(context.Background(), u.org, idle.ID, "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := u.e.Keys.Revoke(context.Background(), u.org, u.kb, "test"); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name, query string
		bars        int
		title, desc string
		rows        []string
		api         string
	}{
		{"the last 24 hours", "", 24,
			"Requests of org 1 over the last 24 hours, by hour (UTC)",
			"32 requests in all: 20 served, 3 refused by a budget, 3 refused by address, 4 other client errors, 2 server errors. The table below the chart gives each hour&#39;s numbers.",
			[]string{u.kb + "=21", u.ka + "=11"}, "?granularity=hour"},
		{"the last 30 days", "?range=30d", 30,
			"Requests of org 1 over the last 30 days, by day (UTC)",
			"37 requests in all: 25 served, 3 refused by a budget, 3 refused by address, 4 other client errors, 2 server errors. The table below the chart gives each day&#39;s numbers.",
			[]string{u.kb + "=26", u.ka + "=11"}, "?granularity=day"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := u.viewer.Do("GET", "/dashboard/orgs/"+u.org+"/usage"+tc.query, "")
			upstreamtest.WantStatus(t, r, 200)
			page := r.Body
			if n := strings.Count(page, `<g class="bar">`); n != tc.bars {
				t.Errorf("%d bars, want %d", n, tc.bars)
			}
			for _, want := range []string{
				`<svg class="chart" data-testid="usage-chart" role="img" aria-labelledby="usage-chart-title usage-chart-desc"`,
				`<title id="usage-chart-title">` + tc.title + `</title>`,
				`<desc id="usage-chart-desc">` + tc.desc + `</desc>`,
				// The class has its colour, its legend entry and its column.
				`<rect class="address" `,
				`<span class="swatch address" aria-hidden="true"></span>Refused by address (401, outside the key&#39;s allowed networks): 3</li>`,
				`<th scope="col">Refused by address</th>`,
				`<td data-label="Refused by address">3</td>`,
			} {
				if !strings.Contains(page, want) {
					t.Errorf("the page lacks %s", want)
				}
			}
			if got := keyTotals(t, page); strings.Join(got, " ") != strings.Join(tc.rows, " ") {
				t.Errorf("key rows %v, want %v", got, tc.rows)
			}
			// The numbers of GET /orgs/{orgId}/usage with the same range.
			api := apiTotals(t, u.viewer, u.org, tc.api)
			for _, row := range keyTotals(t, page) {
				id, total, _ := strings.Cut(row, "=")
				if strconv.FormatInt(api[id], 10) != total {
					t.Errorf("key %s: the page says %s, the API %d", id, total, api[id])
				}
			}
			// Nothing the CSP would refuse: no inline style or script, nothing from
			// elsewhere.
			for _, bad := range []string{"style=", "<script>", "http://", "https://"} {
				if strings.Contains(page, bad) {
					t.Errorf("the page holds %q", bad)
				}
			}
		})
	}

	// The keys page shows each key's requests in the last 24 hours.
	r := u.viewer.Do("GET", "/dashboard/orgs/"+u.org, "")
	upstreamtest.WantStatus(t, r, 200)
	requests := regexp.MustCompile(`data-key-id="([A-Za-z0-9]+)"[^>]*>(?s:.*?)data-testid="key-requests">(\d+)<`).FindAllStringSubmatch(r.Body, -1)
	got := map[string]string{}
	for _, m := range requests {
		got[m[1]] = m[2]
	}
	if got[u.ka] != "11" || got[u.kb] != "21" || got[idle.ID] != "0" || len(got) != 3 {
		t.Errorf("the keys page's requests in 24 hours: %v; want %s=11, %s=21, %s=0", got, u.ka, u.kb, idle.ID)
	}
	if !strings.Contains(r.Body, `href="/dashboard/orgs/`+u.org+`/usage" data-testid="usage-link"`) {
		t.Error("the keys page does not link to the usage page")
	}
}

func TestUsagePageWithoutRequests(t *testing.T) {
	u := newUsageEnv(t)
	r := u.viewer.Do("GET", "/dashboard/orgs/"+u.org+"/usage", "")
	upstreamtest.WantStatus(t, r, 200)
	if got := keyTotals(t, r.Body); len(got) != 2 || got[0] != u.ka+"=0" || got[1] != u.kb+"=0" {
		t.Errorf("key rows %v, want both keys at 0", got)
	}
	if !strings.Contains(r.Body, `data-testid="usage-empty"`) {
		t.Error("the page does not say there were no requests")
	}
}

func TestUsagePageRefusesOutsidersAndBadRanges(t *testing.T) {
	u := newUsageEnv(t)
	outsider := u.e.Person(store.RoleOwner, u.e.Org("pro"))
	for _, tc := range []struct {
		name   string
		c      *upstreamtest.Client
		path   string
		status int
		says   string
	}{
		{"another org's member", outsider, "/dashboard/orgs/" + u.org + "/usage", 404, "There is no such page, or it is not yours to see."},
		{"a range it does not have", u.viewer, "/dashboard/orgs/" + u.org + "/usage?range=7d", 400, "range: must be 24h or 30d"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.c.Do("GET", tc.path, "")
			if r.Status != tc.status || !strings.Contains(r.Body, tc.says) {
				t.Errorf("got %d, want %d saying %q:\n%s", r.Status, tc.status, tc.says, r.Body)
			}
		})
	}
	r := u.e.Anon().Do("GET", "/dashboard/orgs/"+u.org+"/usage", "")
	if r.Status != 303 || r.Header.Get("Location") != "/dashboard" {
		t.Errorf("without a session: %d to %q, want 303 to the login", r.Status, r.Header.Get("Location"))
	}
}
