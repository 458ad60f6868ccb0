package httpapi_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/upstream/httpapi"
	"github.com/keygate/keygate/upstream/internal/upstreamtest"
	"github.com/keygate/keygate/upstream/store"
)

// testLeakToken is the --leak-report-token of the leak report tests.
const testLeakToken = "leak-report-token-0123456789abcdefghij"

// newLeakEnv is a test server with the leak report route.
func newLeakEnv(t *testing.T) *upstreamtest.Env {
	t.Helper()
	return upstreamtest.NewEnv(t, func(c *httpapi.Config) { c.LeakReportToken = testLeakToken })
}

// reporter is a client authenticated for leak reports.
func reporter(e *upstreamtest.Env) *upstreamtest.Client {
	return e.Anon().With("Authorization", "Bearer "+testLeakToken)
}

// report builds a leak report body of token and url pairs.
func report(pairs ...string) string {
	var items []map[string]string
	for i := 0; i+1 < len(pairs); i += 2 {
		items = append(items, map[string]string{"token": pairs[i], "url": pairs[i+1]})
	}
	return upstreamtest.JSONBody(items)
}

func TestLeakReportRouteIsAbsentWithoutItsToken(t *testing.T) {
	e := upstreamtest.NewEnv(t)
	upstreamtest.Want(t, reporter(e).Do("POST", "/security/leaked-keys", report("x", "https://example.com")), 404, bodyNotFound)
	if _, err := httpapi.NewServer(httpapi.Config{Pool: e.Pool, Logger: e.Config.Logger, GatewaySecret: upstreamtest.GatewaySecret,
		KeyFormat: e.Config.KeyFormat, LeakReportToken: strings.Repeat("t", 31)}); err == nil {
		t.Error("NewServer accepted a leak report token of 31 characters")
	}
}

func TestLeakReportNeedsTheBearerToken(t *testing.T) {
	e := newLeakEnv(t)
	body := report("x", "https://example.com")
	for name, c := range map[string]*upstreamtest.Client{
		"no Authorization":    e.Anon(),
		"a wrong token":       e.Anon().With("Authorization", "Bearer "+testLeakToken+"x"),
		"a prefix":            e.Anon().With("Authorization", "Bearer "+testLeakToken[:31]),
		"an empty token":      e.Anon().With("Authorization", "Bearer "),
		"another scheme":      e.Anon().With("Authorization", "Basic "+testLeakToken),
		"the bare token":      e.Anon().With("Authorization", testLeakToken),
		"two headers":         reporter(e).With("Authorization", "Bearer "+testLeakToken),
		"a session":           e.Person(store.RoleOwner, e.Org("pro")),
		"the gateway secret":  e.Anon().With("Authorization", "Bearer "+upstreamtest.GatewaySecret),
		"the token as cookie": e.Anon().With("Cookie", "session="+testLeakToken),
	} {
		t.Run(name, func(t *testing.T) {
			r := c.Do("POST", "/security/leaked-keys", body)
			upstreamtest.Want(t, r, 401, bodyUnauthenticated)
			if r.Header.Get("WWW-Authenticate") != "Bearer" {
				t.Errorf("WWW-Authenticate = %q, want Bearer", r.Header.Get("WWW-Authenticate"))
			}
		})
	}
	upstreamtest.WantStatus(t, e.Anon().With("Authorization", "bearer "+testLeakToken).Do("POST", "/security/leaked-keys", body), 200)
	upstreamtest.Want(t, reporter(e).Do("GET", "/security/leaked-keys", ""), 405, `{"error":"method not allowed"}`)
}

func TestLeakReportValidatesItsBody(t *testing.T) {
	e := newLeakEnv(t)
	org := e.Org("pro")
	owner := e.Person(store.RoleOwner, org)
	_, full := newKey(t, owner, org, `{"name":"ci","role":"Admin"}`)
	bad := func(msg string) string {
		return `{"error":"invalid_request","message":` + upstreamtest.JSONBody(msg) + `}`
	}
	many := func(n int) string {
		var pairs []string
		for i := 0; i < n; i++ {
			pairs = append(pairs, fmt.Sprintf("mon_live_%022d.x", i), "https://example.com")
		}
		return report(pairs...)
	}
	for _, tc := range []struct {
		name, body string
		status     int
		want       string
	}{
		{"no body", "", 400, bad(`body: must be a JSON array of {"token","url"} objects`)},
		{"an object", `{"token":"x","url":"u"}`, 400, bad(`body: must be a JSON array of {"token","url"} objects`)},
		{"bad JSON", `[{"token":`, 400, bad("body: is not valid JSON")},
		{"an empty array", `[]`, 400, bad("body: must list 1 to 1000 reports")},
		{"two arrays", `[{"token":"x","url":"u"}][]`, 400, bad("body: must hold a single JSON array and nothing after it")},
		{"a string item", `["x"]`, 400, bad("[0]: must be an object, not a string")},
		{"no token", `[{"token":"x","url":"u"},{"url":"u"}]`, 400, bad("[1].token: required")},
		{"no url", `[{"token":"x"}]`, 400, bad("[0].url: required")},
		{"an empty token", `[{"token":"","url":"u"}]`, 400, bad("[0].token: must not be empty")},
		{"a number token", `[{"token":1,"url":"u"}]`, 400, bad("[0].token: must be a string, not a number")},
		{"an empty url", `[{"token":"x","url":""}]`, 400, bad("[0].url: must be 1 to 2048 characters long")},
		{"a url too long", `[{"token":"x","url":"` + strings.Repeat("u", 2049) + `"}]`, 400, bad("[0].url: must be 1 to 2048 characters long")},
		{"an unknown field", `[{"token":"x","url":"u","repo":"r"}]`, 400, bad("[0].repo: unknown field")},
		{"a live key then a bad item", report(full, "https://example.com") + `x`, 400, bad("body: must hold a single JSON array and nothing after it")},
		{"1001 reports", many(1001), 413, `{"error":"request_too_large"}`},
		{"a body over 4 MiB", `[{"token":"` + strings.Repeat("x", 4<<20) + `","url":"u"}]`, 413, `{"error":"request_too_large"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			upstreamtest.Want(t, reporter(e).Do("POST", "/security/leaked-keys", tc.body), tc.status, tc.want)
		})
	}
	if !verifies(t, e, full) {
		t.Error("a refused report revoked a key")
	}
	if n := upstreamtest.Scalar[int](e, `SELECT count(*) FROM audit_events WHERE action = 'key.leaked'`); n != 0 {
		t.Errorf("refused reports wrote %d key.leaked events", n)
	}
	// 1000 reports with URLs of 2048 characters are accepted.
	var pairs []string
	for i := 0; i < 1000; i++ {
		pairs = append(pairs, fmt.Sprintf("garbage %d", i), strings.Repeat("u", 2048))
	}
	r := reporter(e).Do("POST", "/security/leaked-keys", report(pairs...))
	upstreamtest.WantStatus(t, r, 200)
	if n := strings.Count(r.Body, `"outcome":"unknown"`); n != 1000 {
		t.Errorf("1000 garbage reports answered %d unknown", n)
	}
}

func TestLeakReportRevokesLiveKeysOnceAndNeverEchoesThem(t *testing.T) {
	e := newLeakEnv(t)
	org, other := e.Org("pro"), e.Org("pro")
	owner := e.Person(store.RoleOwner, org)
	otherOwner := e.Person(store.RoleOwner, other)
	liveID, live := newKey(t, owner, org, `{"name":"leaked","role":"Admin"}`)
	_, bystander := newKey(t, owner, org, `{"name":"bystander","role":"Admin"}`)
	foreignID, foreign := newKey(t, otherOwner, other, `{"name":"theirs","role":"Viewer"}`)
	revokedID, revoked := newKey(t, owner, org, `{"name":"revoked","role":"Viewer"}`)
	upstreamtest.WantStatus(t, owner.Do("DELETE", "/orgs/"+org+"/api-keys/"+revokedID, ""), 204)
	expiredID, expired := newKey(t, owner, org, `{"name":"expired","role":"Viewer"}`)
	e.Exec(`UPDATE api_keys SET expires_at = now() - interval '1 second' WHERE key_id = $1`, expiredID)
	// The bystander's id with the leaked key's secret: not the bystander's key.
	wrongSecret := bystander[:strings.IndexByte(bystander, '.')] + live[strings.IndexByte(live, '.'):]
	acme, _ := keystore.NewFormat("acme")
	// The live key's id and secret under another prefix. The checksum covers the
	// whole key, so it is the one that prefix needs.
	otherBody := "acme" + live[len("mon"):len(live)-keystore.ChecksumLen]
	otherPrefix := otherBody + keystore.Checksum(otherBody)
	if _, _, ok := acme.Parse(otherPrefix); !ok {
		t.Fatalf("%q does not parse as an acme key", otherPrefix)
	}
	eventsBefore := upstreamtest.Scalar[int](e, `SELECT count(*) FROM audit_events`)

	body := report(
		live, "https://github.com/a/b/blob/main/.env",
		"not a key", "https://pastebin.example/1",
		foreign, "https://gist.example/2",
		revoked, "https://example.com/3",
		expired, "https://example.com/4",
		wrongSecret, "https://example.com/5",
		otherPrefix, "https://example.com/6",
		live, "https://example.com/again",
	)
	r := reporter(e).Do("POST", "/security/leaked-keys", body)
	upstreamtest.Want(t, r, 200, `{"data":[`+
		`{"url":"https://github.com/a/b/blob/main/.env","outcome":"revoked"},`+
		`{"url":"https://pastebin.example/1","outcome":"unknown"},`+
		`{"url":"https://gist.example/2","outcome":"revoked"},`+
		`{"url":"https://example.com/3","outcome":"already_revoked"},`+
		`{"url":"https://example.com/4","outcome":"already_revoked"},`+
		`{"url":"https://example.com/5","outcome":"unknown"},`+
		`{"url":"https://example.com/6","outcome":"unknown"},`+
		`{"url":"https://example.com/again","outcome":"revoked"}]}`)
	for _, secret := range []string{live, foreign, revoked, bystander} {
		s := secret[strings.IndexByte(secret, '.')+1:]
		if strings.Contains(r.Body, s) {
			t.Errorf("the answer shows a secret")
		}
		for _, entry := range e.Logs.All() {
			if strings.Contains(fmt.Sprint(entry.ContextMap(), entry.Message), s) {
				t.Errorf("a log line shows a secret: %v", entry)
			}
		}
	}
	if verifies(t, e, live) || verifies(t, e, foreign) {
		t.Error("a leaked key still works")
	}
	if !verifies(t, e, bystander) {
		t.Error("a wrong secret revoked the key of its id")
	}

	// One key.leaked event per revoked key, in its own org, with its first report's URL.
	for _, tc := range []struct{ org, key, url string }{
		{org, liveID, "https://github.com/a/b/blob/main/.env"},
		{other, foreignID, "https://gist.example/2"},
	} {
		var page eventPage
		c := owner
		if tc.org == other {
			c = otherOwner
		}
		c.Do("GET", "/orgs/"+tc.org+"/audit-events?limit=1", "").Decode(t, &page)
		if len(page.Data) != 1 || page.Data[0].Action != "key.leaked" || page.Data[0].KeyID != tc.key ||
			page.Data[0].Actor != "leak-report" || page.Data[0].URL != tc.url || page.Data[0].NewKeyID != "" {
			t.Errorf("latest event of %s = %+v, want key.leaked of %s by leak-report at %s", tc.org, page.Data, tc.key, tc.url)
		}
	}
	if n := upstreamtest.Scalar[int](e, `SELECT count(*) FROM audit_events`); n != eventsBefore+2 {
		t.Errorf("the report wrote %d events, want 2", n-eventsBefore)
	}

	// Reporting again is answered already_revoked and changes nothing.
	revokedAt := upstreamtest.Scalar[string](e, `SELECT revoked_at::text FROM api_keys WHERE key_id = $1`, liveID)
	upstreamtest.Want(t, reporter(e).Do("POST", "/security/leaked-keys", report(live, "https://example.com/later")), 200,
		`{"data":[{"url":"https://example.com/later","outcome":"already_revoked"}]}`)
	if n := upstreamtest.Scalar[int](e, `SELECT count(*) FROM audit_events`); n != eventsBefore+2 {
		t.Errorf("a second report wrote %d events", n-eventsBefore-2)
	}
	if got := upstreamtest.Scalar[string](e, `SELECT revoked_at::text FROM api_keys WHERE key_id = $1`, liveID); got != revokedAt {
		t.Errorf("a second report moved revoked_at from %s to %s", revokedAt, got)
	}
	// The dashboard's revoke of a leaked key changes nothing and audits nothing.
	upstreamtest.WantStatus(t, owner.Do("DELETE", "/orgs/"+org+"/api-keys/"+liveID, ""), 204)
	if n := upstreamtest.Scalar[int](e, `SELECT count(*) FROM audit_events`); n != eventsBefore+2 {
		t.Errorf("revoking a leaked key wrote %d events", n-eventsBefore-2)
	}
}
