package integration

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/keygate/keygate/internal/testkit/testenv"
)

// usageUnits reads orgID's usage record by day over the UTC day of at, as
// "key outcome status" → "count/units".
func (c *Client) usageUnits(orgID string, at time.Time) map[string]string {
	c.s.t.Helper()
	day := at.UTC().Truncate(24 * time.Hour)
	q := url.Values{"granularity": {"day"}, "from": {day.Format(time.RFC3339)}, "to": {day.AddDate(0, 0, 1).Format(time.RFC3339)}}
	out := map[string]string{}
	for _, u := range c.usage(orgID, q) {
		out[u.name()] = fmt.Sprintf("%d/%d", u.Count, u.Units)
	}
	return out
}

// TestTheUsageRecordCountsEachRequestsUnits: two gateways with the operator's route
// table, where creating a monitor costs 5. The usage API gives each row's requests and
// their units: the cost of the route of every request decided once its route was
// weighed, proxied or refused (a budget, the role), and 1 for the others.
func TestTheUsageRecordCountsEachRequestsUnits(t *testing.T) {
	s := newStackWith(t, stackOptions{gwOptions: strings.Join([]string{
		"usage_flush_interval 1s",
		"route GET,HEAD /v1/monitors* scope monitors:read",
		"route POST /v1/monitors scope monitors:write cost 5",
		"route GET /v1/me",
	}, "\n\t\t\t")})
	org, owner := s.newOwner("pro")
	editorID, editor := owner.createKey(org.ID, "editor", "Editor", nil)
	smallID, small := owner.createKeyWith(org.ID, "small", "Editor", map[string]any{"rate_limit": 8})
	viewerID, viewer := owner.createKey(org.ID, "viewer", "Viewer", nil)

	waitForWindowRoom(20) // the small key's minute, and every request in one UTC day
	start := time.Now()
	s.sendSteps([]step{
		{call{editor, 0, "POST", "/v1/monitors", newMonitor("m0")}, http.StatusCreated},
		{call{editor, 1, "POST", "/v1/monitors", newMonitor("m1")}, http.StatusCreated},
		{call{editor, 1, "GET", "/v1/monitors", nil}, http.StatusOK},
		{call{editor, 0, "GET", "/v1/monitors", nil}, http.StatusOK},
		{call{editor, 1, "GET", "/v1/monitors", nil}, http.StatusOK},
		{call{editor, 0, "GET", "/v1/me", nil}, http.StatusOK},
		{call{small, 0, "POST", "/v1/monitors", newMonitor("m6")}, http.StatusCreated},
		{call{small, 1, "POST", "/v1/monitors", newMonitor("m7")}, http.StatusTooManyRequests}, // 5 with 3 left
		{call{viewer, 0, "POST", "/v1/monitors", newMonitor("m8")}, http.StatusForbidden},      // the role: after the budgets
	})
	want := map[string]string{
		editorID + " proxied 201":     "2/10",
		editorID + " proxied 200":     "3/3",
		editorID + " me 200":          "1/1",
		smallID + " proxied 201":      "1/5",
		smallID + " rate_limited 429": "1/5",
		viewerID + " forbidden 403":   "1/5",
	}
	var got map[string]string
	testenv.Eventually(t, 15*time.Second, "the usage record's units", func() bool {
		got = owner.usageUnits(org.ID, start)
		return fmt.Sprint(got) == fmt.Sprint(want)
	})

	// The CSV's last column is the units.
	r := owner.do("GET", "/orgs/"+org.ID+"/usage?format=csv&granularity=day&key_id="+editorID+
		"&from="+start.UTC().Truncate(24*time.Hour).Format(time.RFC3339), nil, nil)
	day := start.UTC().Truncate(24 * time.Hour).Format(time.RFC3339)
	wantCSV := "key_id,start,outcome,status,count,units\r\n" +
		editorID + "," + day + ",me,200,1,1\r\n" +
		editorID + "," + day + ",proxied,200,3,3\r\n" +
		editorID + "," + day + ",proxied,201,2,10\r\n"
	if r.Status != 200 || string(r.Body) != wantCSV {
		t.Errorf("CSV: %d %q\nwant %q", r.Status, r.Body, wantCSV)
	}
}
