package httpapi_test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/keygate/keygate/internal/testkit/testenv"
	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/upstream/httpapi"
	"github.com/keygate/keygate/upstream/internal/upstreamtest"
	"github.com/keygate/keygate/upstream/store"
)

// usageNow is the clock of the usage tests: 10:20:30 UTC.
var usageNow = time.Date(2026, 3, 15, 10, 20, 30, 0, time.UTC)

// usageEnv is an org with two keys, ka < kb, and a Viewer of it, on a server whose
// clock is usageNow.
type usageEnv struct {
	e        *upstreamtest.Env
	org      string
	ka, kb   string
	viewer   *upstreamtest.Client
	recorder *keystore.Usage
}

func newUsageEnv(t *testing.T) *usageEnv {
	t.Helper()
	e := upstreamtest.NewEnv(t, func(c *httpapi.Config) { c.Now = func() time.Time { return usageNow } })
	u := &usageEnv{e: e, org: e.Org("pro"), recorder: keystore.NewUsage(e.Pool, keystore.UsageOptions{})}
	for _, id := range []*string{&u.ka, &u.kb} {
		rec, _, err := e.Keys.Create(context.Background(), keystore.NewKey{OrgID: u.org, Name: "k", Role: keystore.RoleViewer})
		if err != nil {
			t.Fatal(err)
		}
		*id = rec.ID
	}
	if u.kb < u.ka {
		u.ka, u.kb = u.kb, u.ka
	}
	u.viewer = e.Person(store.RoleViewer, u.org)
	return u
}

// record counts n requests of key at at, and flushes them, as a gateway does.
func (u *usageEnv) record(t *testing.T, key string, at time.Time, outcome keystore.Outcome, status, n int) {
	t.Helper()
	u.recordUnits(t, key, at, outcome, status, n, 1)
}

// recordUnits counts n requests of units each, as record does.
func (u *usageEnv) recordUnits(t *testing.T, key string, at time.Time, outcome keystore.Outcome, status, n, units int) {
	t.Helper()
	for range n {
		u.recorder.Record(u.org, key, at, outcome, status, units)
	}
	if err := u.recorder.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// fill records the usage the tests read: in the default hour range and out of it.
func (u *usageEnv) fill(t *testing.T) {
	t.Helper()
	u.record(t, u.kb, usageNow, keystore.OutcomeProxied, 200, 17)
	u.record(t, u.ka, usageNow, keystore.OutcomeProxied, 200, 2)
	u.record(t, u.ka, usageNow.Add(-time.Minute), keystore.OutcomeRateLimited, 429, 3)
	u.record(t, u.ka, usageNow.Add(-time.Minute), keystore.OutcomeMe, 200, 1)
	u.record(t, u.kb, usageNow.Add(-23*time.Hour), keystore.OutcomeForbidden, 403, 4)         // 11:20 yesterday: in
	u.record(t, u.kb, usageNow.Add(-23*time.Hour-21*time.Minute), keystore.OutcomeMe, 200, 5) // 10:59 yesterday: out
}

func TestUsageAnswersTheOrgsRowsAsJSON(t *testing.T) {
	u := newUsageEnv(t)
	u.fill(t)
	u.recordUnits(t, u.kb, usageNow, keystore.OutcomeProxied, 201, 2, 5) // a route of cost 5
	// Another org's usage is not in it.
	other := u.e.Org("pro")
	u.recorder.Record(other, u.ka, usageNow, keystore.OutcomeProxied, 200, 1)
	want := `{"granularity":"hour","from":"2026-03-14T11:00:00Z","to":"2026-03-15T11:00:00Z","data":[` +
		`{"key_id":"` + u.kb + `","start":"2026-03-14T11:00:00Z","outcome":"forbidden","status":403,"count":4,"units":4},` +
		`{"key_id":"` + u.ka + `","start":"2026-03-15T10:00:00Z","outcome":"me","status":200,"count":1,"units":1},` +
		`{"key_id":"` + u.ka + `","start":"2026-03-15T10:00:00Z","outcome":"proxied","status":200,"count":2,"units":2},` +
		`{"key_id":"` + u.ka + `","start":"2026-03-15T10:00:00Z","outcome":"rate_limited","status":429,"count":3,"units":3},` +
		`{"key_id":"` + u.kb + `","start":"2026-03-15T10:00:00Z","outcome":"proxied","status":200,"count":17,"units":17},` +
		`{"key_id":"` + u.kb + `","start":"2026-03-15T10:00:00Z","outcome":"proxied","status":201,"count":2,"units":10}]}`
	// The same answer before and after a roll-up, and with every parameter at its default.
	for _, path := range []string{"", "?granularity=hour", "?from=2026-03-14T11:00:00Z&to=2026-03-15T11:00:00Z",
		"?to=2026-03-15T11:00:00Z", "?from=2026-03-14T12:00:00%2B01:00", "?granularity=&from=&to=&key_id=&format="} {
		r := u.viewer.Do("GET", "/orgs/"+u.org+"/usage"+path, "")
		upstreamtest.Want(t, r, 200, want)
		if path == "" {
			if _, err := u.e.Store.RollUpUsage(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	}

	// By minute and by day, one key.
	r := u.viewer.Do("GET", "/orgs/"+u.org+"/usage?granularity=minute&key_id="+u.ka, "")
	upstreamtest.Want(t, r, 200, `{"granularity":"minute","from":"2026-03-15T09:21:00Z","to":"2026-03-15T10:21:00Z","data":[`+
		`{"key_id":"`+u.ka+`","start":"2026-03-15T10:19:00Z","outcome":"me","status":200,"count":1,"units":1},`+
		`{"key_id":"`+u.ka+`","start":"2026-03-15T10:19:00Z","outcome":"rate_limited","status":429,"count":3,"units":3},`+
		`{"key_id":"`+u.ka+`","start":"2026-03-15T10:20:00Z","outcome":"proxied","status":200,"count":2,"units":2}]}`)
	r = u.viewer.Do("GET", "/orgs/"+u.org+"/usage?granularity=day&key_id="+u.kb, "")
	upstreamtest.Want(t, r, 200, `{"granularity":"day","from":"2026-02-14T00:00:00Z","to":"2026-03-16T00:00:00Z","data":[`+
		`{"key_id":"`+u.kb+`","start":"2026-03-14T00:00:00Z","outcome":"forbidden","status":403,"count":4,"units":4},`+
		`{"key_id":"`+u.kb+`","start":"2026-03-14T00:00:00Z","outcome":"me","status":200,"count":5,"units":5},`+
		`{"key_id":"`+u.kb+`","start":"2026-03-15T00:00:00Z","outcome":"proxied","status":200,"count":17,"units":17},`+
		`{"key_id":"`+u.kb+`","start":"2026-03-15T00:00:00Z","outcome":"proxied","status":201,"count":2,"units":10}]}`)
	// Nothing in the range: no rows, never rows of 0.
	r = u.viewer.Do("GET", "/orgs/"+u.org+"/usage?granularity=minute&from=2026-03-15T10:00:00Z&to=2026-03-15T10:19:00Z", "")
	upstreamtest.Want(t, r, 200, `{"granularity":"minute","from":"2026-03-15T10:00:00Z","to":"2026-03-15T10:19:00Z","data":[]}`)
	if got := r.Header.Get("Cache-Control"); got != "no-store" {
		t.Errorf("Cache-Control = %q, want no-store", got)
	}
}

func TestUsageAnswersCSVWhenAsked(t *testing.T) {
	u := newUsageEnv(t)
	u.fill(t)
	u.recordUnits(t, u.ka, usageNow, keystore.OutcomeRateLimited, 429, 2, 3) // a route of cost 3
	want := "key_id,start,outcome,status,count,units\r\n" +
		u.kb + ",2026-03-14T11:00:00Z,forbidden,403,4,4\r\n" +
		u.ka + ",2026-03-15T10:00:00Z,me,200,1,1\r\n" +
		u.ka + ",2026-03-15T10:00:00Z,proxied,200,2,2\r\n" +
		u.ka + ",2026-03-15T10:00:00Z,rate_limited,429,5,9\r\n" +
		u.kb + ",2026-03-15T10:00:00Z,proxied,200,17,17\r\n"
	for _, tc := range []struct {
		name, query, accept string
		csv                 bool
	}{
		{"format=csv", "?format=csv", "", true},
		{"Accept: text/csv", "", "text/csv", true},
		{"text/csv preferred", "", "text/csv, application/json;q=0.5", true},
		{"JSON first", "", "application/json, text/csv", false},
		{"text/csv refused", "", "text/csv;q=0, */*", false},
		{"anything", "", "*/*", false},
		{"format=json over Accept", "?format=json", "text/csv", false},
		{"format=csv over Accept", "?format=csv", "application/json", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := u.viewer
			if tc.accept != "" {
				c = c.With("Accept", tc.accept)
			}
			r := c.Do("GET", "/orgs/"+u.org+"/usage"+tc.query, "")
			if !tc.csv {
				upstreamtest.WantStatus(t, r, 200)
				if ct := r.Header.Get("Content-Type"); ct != "application/json" {
					t.Errorf("Content-Type = %q, want JSON", ct)
				}
				return
			}
			if r.Status != 200 || r.Body != want {
				t.Errorf("got %d %q\nwant 200 %q", r.Status, r.Body, want)
			}
			for name, want := range map[string]string{
				"Content-Type":        "text/csv; charset=utf-8",
				"Content-Disposition": `attachment; filename="usage-` + u.org + `-hour-20260314T1100Z.csv"`,
				"Vary":                "Accept",
				"Cache-Control":       "no-store",
			} {
				if got := r.Header.Get(name); got != want {
					t.Errorf("%s = %q, want %q", name, got, want)
				}
			}
		})
	}
	// No rows: the header line alone.
	r := u.viewer.Do("GET", "/orgs/"+u.org+"/usage?format=csv&from=2020-01-01T00:00:00Z&to=2020-01-02T00:00:00Z", "")
	if r.Status != 200 || r.Body != "key_id,start,outcome,status,count,units\r\n" {
		t.Errorf("an empty range: %d %q", r.Status, r.Body)
	}
}

func TestUsageRefusesEveryBadParameterByName(t *testing.T) {
	u := newUsageEnv(t)
	bad := func(msg string) string { return `{"error":"invalid_request","message":"` + msg + `"}` }
	for _, tc := range []struct{ query, body string }{
		{"granularity=week", bad("granularity: must be minute, hour or day")},
		{"granularity=Hour", bad("granularity: must be minute, hour or day")},
		{"from=yesterday", bad("from: must be an RFC 3339 time such as 2026-03-14T15:00:00Z (in a URL, + is %2B)")},
		{"to=2026-03-15", bad("to: must be an RFC 3339 time such as 2026-03-14T15:00:00Z (in a URL, + is %2B)")},
		{"from=2026-03-15T10:00:00+01:00", bad("from: must be an RFC 3339 time such as 2026-03-14T15:00:00Z (in a URL, + is %2B)")},
		{"from=2026-03-15T09:30:00Z", bad("from: must be a whole hour (UTC)")},
		{"from=2026-03-15T09:00:00%2B05:30", bad("from: must be a whole hour (UTC)")},
		{"granularity=minute&to=2026-03-15T10:20:30Z", bad("to: must be a whole minute")},
		{"granularity=minute&from=2026-03-15T10:20:00.5Z", bad("from: must be a whole minute")},
		{"granularity=day&from=2026-03-15T01:00:00Z", bad("from: must be a UTC midnight")},
		{"from=2026-03-15T11:00:00Z", bad("to: must be after from")},
		{"from=2026-03-15T10:00:00Z&to=2026-03-15T10:00:00Z", bad("to: must be after from")},
		{"from=2026-03-15T10:00:00Z&to=2026-03-15T09:00:00Z", bad("to: must be after from")},
		{"granularity=minute&from=2026-03-13T10:00:00Z&to=2026-03-15T10:01:00Z", bad("to: must be at most 48 hours after from with granularity minute")},
		{"from=2025-02-08T10:00:00Z&to=2026-03-15T11:00:00Z", bad("to: must be at most 400 days after from with granularity hour")},
		{"granularity=day&from=2024-01-01T00:00:00Z", bad("to: must be at most 800 days after from with granularity day")},
		{"key_id=not-a-key", bad("key_id: is not a key id")},
		{"key_id=short", bad("key_id: is not a key id")},
		{"format=xml", bad("format: must be json or csv")},
		{"format=CSV", bad("format: must be json or csv")},
		{"keyid=x", bad("keyid: unknown parameter; the parameters are from, to, granularity, key_id, format")},
		{"zzz=1&granularity=week", bad("zzz: unknown parameter; the parameters are from, to, granularity, key_id, format")},
		{"granularity=hour&granularity=day", bad("granularity: given more than once")},
		{"from=2026-03-15T09:00:00Z&from=2026-03-15T08:00:00Z", bad("from: given more than once")},
	} {
		t.Run(tc.query, func(t *testing.T) {
			upstreamtest.Want(t, u.viewer.Do("GET", "/orgs/"+u.org+"/usage?"+tc.query, ""), 400, tc.body)
		})
	}
	// The longest spans themselves are allowed.
	for _, q := range []string{
		"granularity=minute&from=2026-03-13T10:01:00Z&to=2026-03-15T10:01:00Z",
		"from=2025-02-08T11:00:00Z&to=2026-03-15T11:00:00Z",
		"granularity=day&from=2024-01-06T00:00:00Z&to=2026-03-16T00:00:00Z",
	} {
		upstreamtest.Want(t, u.viewer.Do("GET", "/orgs/"+u.org+"/usage?"+q, ""), 200,
			fmt.Sprintf(`{"granularity":%q,"from":%q,"to":%q,"data":[]}`, granularityOf(q), paramOf(q, "from"), paramOf(q, "to")))
	}
}

func granularityOf(query string) string {
	if g := paramOf(query, "granularity"); g != "" {
		return g
	}
	return "hour"
}

func paramOf(query, name string) string {
	v, _ := url.ParseQuery(query)
	return v.Get(name)
}

func TestUsageIsForTheOrgsMembersAndTheirKeysOnly(t *testing.T) {
	u := newUsageEnv(t)
	other := u.e.Org("pro")
	theirs, _, err := u.e.Keys.Create(context.Background(), keystore.NewKey{OrgID: other, Name: "theirs", Role: keystore.RoleAdmin})
	if err != nil {
		t.Fatal(err)
	}
	u.recorder.Record(other, theirs.ID, usageNow, keystore.OutcomeProxied, 200, 1)
	if err := u.recorder.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	outsider := u.e.Person(store.RoleOwner, other)
	notFound := `{"error":"not found"}`
	for _, tc := range []struct {
		name   string
		c      *upstreamtest.Client
		path   string
		status int
		body   string
	}{
		{"another org's member", outsider, "/orgs/" + u.org + "/usage", 404, notFound},
		{"another org's key", u.viewer, "/orgs/" + u.org + "/usage?key_id=" + theirs.ID, 404, notFound},
		{"an unknown key", u.viewer, "/orgs/" + u.org + "/usage?key_id=" + strings.Repeat("Q", 22), 404, notFound},
		{"an unknown org", u.viewer, "/orgs/0b8e0f0a-5d5e-4c4e-9a57-2f1d9b2c9e11/usage", 404, notFound},
		{"not an org id", u.viewer, "/orgs/acme/usage", 404, notFound},
		{"no session", u.e.Anon(), "/orgs/" + u.org + "/usage", 401, `{"error":"unauthenticated"}`},
		{"the member's own key", u.viewer, "/orgs/" + u.org + "/usage?key_id=" + u.ka, 200,
			`{"granularity":"hour","from":"2026-03-14T11:00:00Z","to":"2026-03-15T11:00:00Z","data":[]}`},
		{"the outsider's own org", outsider, "/orgs/" + other + "/usage?granularity=minute&from=2026-03-15T10:20:00Z&to=2026-03-15T10:21:00Z", 200,
			`{"granularity":"minute","from":"2026-03-15T10:20:00Z","to":"2026-03-15T10:21:00Z","data":[` +
				`{"key_id":"` + theirs.ID + `","start":"2026-03-15T10:20:00Z","outcome":"proxied","status":200,"count":1,"units":1}]}`},
		{"a bad parameter after the membership", outsider, "/orgs/" + u.org + "/usage?granularity=week", 404, notFound},
		{"a wrong method", u.viewer, "/orgs/" + u.org + "/usage", 405, `{"error":"method not allowed"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			method := "GET"
			if tc.status == 405 {
				method = "POST"
			}
			upstreamtest.Want(t, tc.c.Do(method, tc.path, ""), tc.status, tc.body)
		})
	}
}

func TestUsageRefusesARangeOfTooManyRows(t *testing.T) {
	u := newUsageEnv(t)
	u.e.Exec(`INSERT INTO usage_minutes (org_id, key_id, start, outcome, status, count)
		SELECT $1, $2, $3::timestamptz - i * interval '1 minute', 'proxied', 100 + i % 400, 1 FROM generate_series(0, 2879) i`,
		u.org, u.ka, usageNow.Truncate(time.Minute))
	for k := range 35 {
		u.e.Exec(`INSERT INTO usage_minutes (org_id, key_id, start, outcome, status, count)
			SELECT org_id, $1, start, outcome, status, count FROM usage_minutes WHERE key_id = $2`, fmt.Sprintf("key%013d", k), u.ka)
	}
	// 36 keys of 2880 minutes: 103,680 rows.
	r := u.viewer.Do("GET", "/orgs/"+u.org+"/usage?granularity=minute&from=2026-03-13T10:21:00Z&to=2026-03-15T10:21:00Z", "")
	upstreamtest.Want(t, r, 400, `{"error":"invalid_request","message":"to: the range holds more than 100000 rows: read it in parts (from, to, key_id) or with a coarser granularity"}`)
	// One key's share is answered.
	r = u.viewer.Do("GET", "/orgs/"+u.org+"/usage?granularity=minute&from=2026-03-13T10:21:00Z&to=2026-03-15T10:21:00Z&key_id="+u.ka, "")
	upstreamtest.WantStatus(t, r, 200)
}

func TestRunUsageRollupRollsUpOnScheduleUntilStopped(t *testing.T) {
	u := newUsageEnv(t)
	u.record(t, u.ka, usageNow, keystore.OutcomeProxied, 200, 3)
	// A minute row past its retention, rolled up in full: deleted.
	u.e.Exec(`INSERT INTO usage_minutes (org_id, key_id, start, outcome, status, count, rolled)
		VALUES ($1, $2, $3, 'me', 200, 1, 1)`, u.org, u.kb, usageNow.Add(-50*time.Hour).Truncate(time.Minute))
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		u.e.Server.RunUsageRollup(ctx, 20*time.Millisecond)
	}()
	testenv.Eventually(t, 20*time.Second, "the usage record rolled up and purged", func() bool {
		return upstreamtest.Scalar[int](u.e, `SELECT count(*) FROM usage_minutes WHERE count > rolled OR key_id = $1`, u.kb) == 0
	})
	if n := upstreamtest.Scalar[int64](u.e, `SELECT sum(count) FROM usage_days`); n != 3 {
		t.Errorf("usage_days holds %d, want 3", n)
	}
	cancel()
	select {
	case <-stopped:
	case <-time.After(20 * time.Second):
		t.Fatal("RunUsageRollup did not return after its context ended")
	}
}
