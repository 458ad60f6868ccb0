package httpapi_test

import (
	"encoding/csv"
	"encoding/json"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/keygate/keygate/upstream/internal/upstreamtest"
	"github.com/keygate/keygate/upstream/store"
)

// auditRows returns the events the audit page shows, as "action key-id" each: each
// event of these tests names a key.
func auditRows(t *testing.T, body string) []string {
	t.Helper()
	var rows []string
	for _, m := range regexp.MustCompile(`(?s)<tr data-testid="audit-row">.*?<td data-label="Event">([^<]+)</td>.*?data-key-id="([^"]+)"`).FindAllStringSubmatch(body, -1) {
		rows = append(rows, m[1]+" "+m[2])
	}
	return rows
}

// TestTheAuditPageFiltersAndExports: the audit page narrows the trail to an action or
// a key, and its exports give the events it shows, as JSON (the API's events) and as
// CSV. An action or key that is not one is a 400, and a format either.
func TestTheAuditPageFiltersAndExports(t *testing.T) {
	_, org, owner := upstreamtest.NewOrgEnv(t, "pro", store.RoleOwner)
	kept, _ := dashboardKey(t, owner, org, "kept")
	gone, _ := dashboardKey(t, owner, org, "gone")
	upstreamtest.WantStatus(t, owner.Do("DELETE", "/orgs/"+org+"/api-keys/"+gone, ""), 204)
	page := "/dashboard/orgs/" + org + "/audit"

	for _, tc := range []struct {
		query string
		want  []string
	}{
		{"", []string{"key.revoked " + gone, "key.created " + gone, "key.created " + kept}},
		{"?action=key.created", []string{"key.created " + gone, "key.created " + kept}},
		{"?key=" + gone, []string{"key.revoked " + gone, "key.created " + gone}},
		{"?action=key.revoked&key=" + kept, nil},
	} {
		r := owner.Do("GET", page+tc.query, "")
		upstreamtest.WantStatus(t, r, 200)
		if got := auditRows(t, r.Body); strings.Join(got, ", ") != strings.Join(tc.want, ", ") {
			t.Errorf("%s shows %q, want %q", page+tc.query, got, tc.want)
		}
		// The export keeps the filter.
		q := strings.TrimPrefix(tc.query, "?")
		r = owner.Do("GET", page+"/export?format=json&"+q, "")
		upstreamtest.WantStatus(t, r, 200)
		var events []struct {
			Action string
			KeyID  string `json:"key_id"`
		}
		if err := json.Unmarshal([]byte(r.Body), &events); err != nil {
			t.Fatalf("the JSON export of %q: %v: %s", q, err, r.Body)
		}
		var got []string
		for _, e := range events {
			got = append(got, e.Action+" "+e.KeyID)
		}
		if strings.Join(got, ", ") != strings.Join(tc.want, ", ") || !strings.HasPrefix(r.Body, "[") ||
			!strings.HasPrefix(r.Header.Get("Content-Disposition"), `attachment; filename="audit-`+org+`-`) {
			t.Errorf("the JSON export of %q: %q (%s), want %q", q, got, r.Header.Get("Content-Disposition"), tc.want)
		}
	}

	r := owner.Do("GET", page+"/export?format=csv&action=key.revoked", "")
	upstreamtest.WantStatus(t, r, 200)
	records, err := csv.NewReader(strings.NewReader(r.Body)).ReadAll()
	if err != nil || r.Header.Get("Content-Type") != "text/csv; charset=utf-8" || len(records) != 2 ||
		strings.Join(records[0], ",") != "id,at,action,key_id,new_key_id,webhook_id,actor,url,changes" ||
		records[1][2] != "key.revoked" || records[1][3] != gone {
		t.Errorf("the CSV export: %v %q %q", err, r.Header.Get("Content-Type"), records)
	}

	for _, bad := range []string{"?action=key.exploded", "?key=not-a-key", "/export?format=xml", "/export?format=json&action=key.exploded"} {
		if r := owner.Do("GET", page+bad, ""); r.Status != http.StatusBadRequest {
			t.Errorf("%s: %d, want 400", page+bad, r.Status)
		}
	}
}

// TestTheKeysPageSaysHowEachKeyEnds: times show day and minute (UTC); a rolled key is
// labelled rolled with its expiry, an expired one expired, a revoked one revoked.
func TestTheKeysPageSaysHowEachKeyEnds(t *testing.T) {
	e, org, owner := upstreamtest.NewOrgEnv(t, "pro", store.RoleOwner)
	live, _ := dashboardKey(t, owner, org, "live")
	rolled, _ := dashboardKey(t, owner, org, "rolled")
	expired, _ := dashboardKey(t, owner, org, "expired")
	revoked, _ := dashboardKey(t, owner, org, "revoked")
	upstreamtest.WantStatus(t, owner.Do("POST", "/orgs/"+org+"/api-keys/"+rolled+"/roll", `{"grace_seconds":3600}`), 201)
	e.Exec(`UPDATE api_keys SET expires_at = now() - interval '1 minute' WHERE key_id = $1`, expired)
	upstreamtest.WantStatus(t, owner.Do("DELETE", "/orgs/"+org+"/api-keys/"+revoked, ""), 204)

	r := owner.Do("GET", "/dashboard/orgs/"+org, "")
	upstreamtest.WantStatus(t, r, 200)
	when := `<time class="when" datetime="\d{4}-\d\d-\d\dT\d\d:\d\dZ"><span>\d{4}-\d\d-\d\d</span> <span>\d\d:\d\d</span></time>`
	for _, tc := range []struct{ id, ends string }{
		{live, `never`},
		{rolled, `<span class="state rolled" data-testid="key-state">rolled</span> expires ` + when},
		{expired, `<span class="state expired" data-testid="key-state">expired</span> ` + when},
		{revoked, `<span class="state revoked" data-testid="key-state">revoked</span> ` + when},
	} {
		row := regexp.MustCompile(`(?s)<tr data-testid="key-row" data-key-id="` + tc.id + `".*?</tr>`).FindString(r.Body)
		if !regexp.MustCompile(`<td data-label="Expires \(UTC\)" data-testid="key-ends">` + tc.ends + `</td>`).MatchString(row) {
			t.Errorf("key %s's row does not end %s:\n%s", tc.id, tc.ends, row)
		}
		if !regexp.MustCompile(`<td data-label="Created \(UTC\)" data-testid="key-created">` + when + `</td>`).MatchString(row) {
			t.Errorf("key %s's row has no creation day and minute:\n%s", tc.id, row)
		}
	}
	if !strings.Contains(r.Body, `<th scope="col">Created (UTC)</th><th scope="col">Expires (UTC)</th><th scope="col">Last used (UTC)</th>`) {
		t.Error("the keys table's time columns do not say UTC")
	}
}
