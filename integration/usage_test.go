package integration

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keygate/keygate/keystore"
)

// usageRow is a row the tests add to the usage record.
type usageRow struct {
	key     string
	at      time.Time
	outcome keystore.Outcome
	status  int
	n       int
}

// recordUsage adds rows to org's usage record as a gateway does: counted by a
// keystore.Usage, then flushed.
func (s *Stack) recordUsage(org string, rows ...usageRow) {
	s.t.Helper()
	pool, err := pgxpool.New(context.Background(), s.dbURL)
	if err != nil {
		s.t.Fatal(err)
	}
	defer pool.Close()
	u := keystore.NewUsage(pool, keystore.UsageOptions{})
	for _, r := range rows {
		for range r.n {
			u.Record(org, r.key, r.at, r.outcome, r.status, 1)
		}
	}
	if err := u.Flush(context.Background()); err != nil {
		s.t.Fatal(err)
	}
}

// TestUsageIsReadThroughTheGateway reads the usage record as a person does, through
// the gateway's catch-all route: every answer is checked against dashboard.yaml.
func TestUsageIsReadThroughTheGateway(t *testing.T) {
	s := newStack(t)
	org, owner := s.newOwner("pro")
	id, _ := owner.createKey(org.ID, "ci", "Editor", nil)
	now := time.Now().UTC().Truncate(time.Minute)
	s.recordUsage(org.ID,
		usageRow{id, now, keystore.OutcomeProxied, 200, 5},
		usageRow{id, now, keystore.OutcomeRateLimited, 429, 2},
	)
	minute := now.Format(time.RFC3339)
	hour := now.Truncate(time.Hour).Format(time.RFC3339)
	path := "/orgs/" + org.ID + "/usage"

	// from and to explicit: the default range moves with the clock.
	r := owner.do("GET", path+"?granularity=minute&key_id="+id+"&from="+now.Add(-59*time.Minute).Format(time.RFC3339)+
		"&to="+now.Add(time.Minute).Format(time.RFC3339), nil, nil)
	want := fmt.Sprintf(`{"granularity":"minute","from":%q,"to":%q,"data":[`+
		`{"key_id":%q,"start":%q,"outcome":"proxied","status":200,"count":5,"units":5},`+
		`{"key_id":%q,"start":%q,"outcome":"rate_limited","status":429,"count":2,"units":2}]}`,
		now.Add(-59*time.Minute).Format(time.RFC3339), now.Add(time.Minute).Format(time.RFC3339), id, minute, id, minute)
	if r.Status != 200 || !jsonEqual(r.Body, []byte(want)) {
		t.Errorf("by minute: %d %s\nwant %s", r.Status, r.Body, want)
	}
	r = owner.do("GET", path, nil, nil)
	if r.Status != 200 || !strings.Contains(string(r.Body), fmt.Sprintf(`{"key_id":%q,"start":%q,"outcome":"proxied","status":200,"count":5,"units":5}`, id, hour)) {
		t.Errorf("by hour: %d %s", r.Status, r.Body)
	}
	r = owner.do("GET", path+"?granularity=day", nil, http.Header{"Accept": {"text/csv"}})
	day := now.Truncate(24 * time.Hour).Format(time.RFC3339)
	wantCSV := "key_id,start,outcome,status,count,units\r\n" + id + "," + day + ",proxied,200,5,5\r\n" + id + "," + day + ",rate_limited,429,2,2\r\n"
	if r.Status != 200 || string(r.Body) != wantCSV || r.Header.Get("Content-Type") != "text/csv; charset=utf-8" {
		t.Errorf("CSV: %d %s %q\nwant %q", r.Status, r.Header.Get("Content-Type"), r.Body, wantCSV)
	}

	wantError(t, owner.do("GET", path+"?granularity=week", nil, nil), 400,
		`{"error":"invalid_request","message":"granularity: must be minute, hour or day"}`)
	other, otherOwner := s.newOwner("pro")
	otherID, _ := otherOwner.createKey(other.ID, "theirs", "Viewer", nil)
	wantError(t, otherOwner.do("GET", path, nil, nil), 404, `{"error":"not found"}`)
	wantError(t, owner.do("GET", path+"?key_id="+otherID, nil, nil), 404, `{"error":"not found"}`)
	wantError(t, s.raw("GET", s.URL(0)+path, nil, nil), 401, `{"error":"unauthenticated"}`)
}
