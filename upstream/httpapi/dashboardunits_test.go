package httpapi_test

import (
	"regexp"
	"strings"
	"testing"

	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/upstream/internal/upstreamtest"
)

var (
	usageKeyUnits = regexp.MustCompile(`data-testid="usage-key-units">([^<]*)<`)
	usageAllUnits = regexp.MustCompile(`data-testid="usage-units">([^<]*)<`)
)

// TestUsagePageShowsEachKeysUnits: the key table has each key's units beside its
// requests, and their sum, the numbers GET /orgs/{orgId}/usage gives.
func TestUsagePageShowsEachKeysUnits(t *testing.T) {
	u := newUsageEnv(t)
	u.recordUnits(t, u.ka, usageNow, keystore.OutcomeProxied, 201, 3, 4)
	u.recordUnits(t, u.kb, usageNow, keystore.OutcomeMe, 200, 1, 1)
	u.recordUnits(t, u.kb, usageNow, keystore.OutcomeRateLimited, 429, 2, 5)

	r := u.viewer.Do("GET", "/dashboard/orgs/"+u.org+"/usage", "")
	upstreamtest.WantStatus(t, r, 200)
	page := r.Body
	if !strings.Contains(page, `<th scope="col">Total</th><th scope="col">Units</th></tr></thead>`) {
		t.Error("the key table has no Units column after Total")
	}
	var rows []string
	ids, units := usageKeyRow.FindAllStringSubmatch(page, -1), usageKeyUnits.FindAllStringSubmatch(page, -1)
	if len(ids) != len(units) {
		t.Fatalf("%d key rows, %d units", len(ids), len(units))
	}
	for i := range ids {
		rows = append(rows, ids[i][1]+"="+units[i][1])
	}
	// The busiest by requests first: 3 each, so by name (both "k"), then id.
	if got, want := strings.Join(rows, " "), u.ka+"=12 "+u.kb+"=11"; got != want {
		t.Errorf("key units %s, want %s", got, want)
	}
	if m := usageAllUnits.FindStringSubmatch(page); m == nil || m[1] != "23" {
		t.Errorf("all keys' units %v, want 23", m)
	}

	var body struct {
		Data []struct {
			KeyID string `json:"key_id"`
			Count int64  `json:"count"`
			Units int64  `json:"units"`
		} `json:"data"`
	}
	a := u.viewer.Do("GET", "/orgs/"+u.org+"/usage", "")
	upstreamtest.WantStatus(t, a, 200)
	a.Decode(t, &body)
	api := map[string]int64{}
	for _, d := range body.Data {
		api[d.KeyID] += d.Units
	}
	if api[u.ka] != 12 || api[u.kb] != 11 {
		t.Errorf("the API's units: %v, want %s=12, %s=11", api, u.ka, u.kb)
	}
}
