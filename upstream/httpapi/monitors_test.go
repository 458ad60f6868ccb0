package httpapi_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/keygate/keygate/upstream/internal/upstreamtest"
	"github.com/keygate/keygate/upstream/store"
)

// door is one of the two ways to the monitor routes, for one org and role.
type door struct {
	name string
	c    *upstreamtest.Client
	base string
}

// doors returns both doors to org's monitors, each with role. The dashboard's is a
// member of org, the /v1 door's a key of org.
func doors(e *upstreamtest.Env, org, role string) []door {
	e.T.Helper()
	return []door{
		{"dashboard", e.Person(role, org), "/orgs/" + org + "/monitors"},
		{"v1", e.Gateway(org, role), "/v1/monitors"},
	}
}

// create creates a monitor through d and returns it.
func (d door) create(t *testing.T, body string) store.Monitor {
	t.Helper()
	r := d.c.Do("POST", d.base, body)
	if r.Status != http.StatusCreated {
		t.Fatalf("%s: create: %d %s", d.name, r.Status, r.Body)
	}
	var m store.Monitor
	r.Decode(t, &m)
	return m
}

// monitorFields are the fields of a monitor as returned, and no others.
const monitorFields = "created_at,id,interval_seconds,locations,name,paused,target,type,updated_at"

func TestMonitorLifecycleOnBothDoors(t *testing.T) {
	e := upstreamtest.NewEnv(t)
	org := e.Org("pro")
	for _, d := range doors(e, org, store.RoleEditor) {
		t.Run(d.name, func(t *testing.T) {
			r := d.c.Do("POST", d.base, `{"name":"api","type":"http","target":"https://example.com/health",
				"config":{"method":"GET"},"assertions":[{"status":200}],"id":"ignored","created_at":"ignored"}`)
			upstreamtest.WantStatus(t, r, 201)
			var fields map[string]any
			r.Decode(t, &fields)
			if got := upstreamtest.SortedKeys(fields); got != monitorFields {
				t.Fatalf("create answered fields %s, want %s", got, monitorFields)
			}
			var m store.Monitor
			r.Decode(t, &m)
			if m.Name != "api" || m.Type != "http" || m.Target != "https://example.com/health" || m.IntervalSeconds != 300 ||
				strings.Join(m.Locations, ",") != "us-east" || m.Paused || m.ID == "ignored" || !m.CreatedAt.Equal(m.UpdatedAt) {
				t.Errorf("created %+v, want the body with its defaults", m)
			}
			if !strings.HasSuffix(fields["created_at"].(string), "Z") {
				t.Errorf("created_at %v is not in UTC", fields["created_at"])
			}

			got := d.c.Do("GET", d.base+"/"+m.ID, "")
			upstreamtest.Want(t, got, 200, strings.TrimSuffix(r.Body, "\n"))

			r = d.c.Do("PATCH", d.base+"/"+m.ID, `{"name":"api v2","interval_seconds":60,"locations":["eu-west","us-east"],"paused":true}`)
			upstreamtest.WantStatus(t, r, 200)
			var p store.Monitor
			r.Decode(t, &p)
			if p.Name != "api v2" || p.IntervalSeconds != 60 || strings.Join(p.Locations, ",") != "eu-west,us-east" || !p.Paused ||
				p.Target != m.Target || !p.CreatedAt.Equal(m.CreatedAt) || !p.UpdatedAt.After(m.UpdatedAt) {
				t.Errorf("patched %+v from %+v", p, m)
			}

			r = d.c.Do("GET", d.base, "")
			upstreamtest.WantStatus(t, r, 200)
			if !strings.Contains(r.Body, `"id":"`+m.ID+`"`) {
				t.Errorf("list %s lacks %s", r.Body, m.ID)
			}

			upstreamtest.Want(t, d.c.Do("DELETE", d.base+"/"+m.ID, ""), 204, "")
			upstreamtest.Want(t, d.c.Do("GET", d.base+"/"+m.ID, ""), 404, `{"error":"monitor not found"}`)
			upstreamtest.Want(t, d.c.Do("PATCH", d.base+"/"+m.ID, `{"name":"x"}`), 404, `{"error":"monitor not found"}`)
			upstreamtest.Want(t, d.c.Do("DELETE", d.base+"/"+m.ID, ""), 404, `{"error":"monitor not found"}`)
			if r := d.c.Do("GET", d.base, ""); strings.Contains(r.Body, m.ID) {
				t.Errorf("list %s shows the deleted monitor", r.Body)
			}
			if n := upstreamtest.Scalar[int](e, `SELECT count(*) FROM monitors WHERE id = $1 AND deleted_at IS NOT NULL`, m.ID); n != 1 {
				t.Error("delete is not soft: the row is gone or not marked")
			}
		})
	}
}

func TestWriteOnlyAndInternalFieldsAreNeverReturned(t *testing.T) {
	e := upstreamtest.NewEnv(t)
	org := e.Org("pro")
	for _, d := range doors(e, org, store.RoleAdmin) {
		t.Run(d.name, func(t *testing.T) {
			m := d.create(t, `{"name":"n","type":"tcp","target":"db.example.com:5432","config":{"secret":"CONFIG-3"},"assertions":["ASSERT-3"]}`)
			e.Exec(`UPDATE monitors SET paused_reason = 'REASON-3' WHERE id = $1`, m.ID)
			for _, r := range []upstreamtest.Response{
				d.c.Do("GET", d.base+"/"+m.ID, ""),
				d.c.Do("GET", d.base, ""),
				d.c.Do("PATCH", d.base+"/"+m.ID, `{"config":{"secret":"CONFIG-4"},"assertions":["ASSERT-4"]}`),
			} {
				for _, leak := range []string{"config", "assertions", "config_version", "paused_reason", "org_id", "deleted_at", "CONFIG-", "ASSERT-", "REASON-", org} {
					if strings.Contains(r.Body, leak) {
						t.Errorf("response %s contains %q", r.Body, leak)
					}
				}
			}
			var page struct{ Data []map[string]any }
			d.c.Do("GET", d.base, "").Decode(t, &page)
			for _, item := range page.Data {
				if got := upstreamtest.SortedKeys(item); got != monitorFields {
					t.Errorf("list item fields %s, want %s", got, monitorFields)
				}
			}
		})
	}
}

func TestConfigVersionGrowsWhenConfigOrAssertionsChange(t *testing.T) {
	e := upstreamtest.NewEnv(t)
	org := e.Org("pro")
	d := doors(e, org, store.RoleEditor)[1]
	m := d.create(t, `{"name":"n","type":"http","target":"http://example.com","config":{"a":1,"b":[true,null]}}`)
	version := func() int {
		return upstreamtest.Scalar[int](e, `SELECT config_version FROM monitors WHERE id = $1`, m.ID)
	}
	for _, tc := range []struct {
		name  string
		patch string
		want  int
	}{
		{"created", "", 1},
		{"name only", `{"name":"n2"}`, 1},
		{"config with the same value, keys reordered", `{"config":{"b":[true,null],"a":1}}`, 1},
		{"assertions with the stored default", `{"assertions":[]}`, 1},
		{"config changed", `{"config":{"a":2}}`, 2},
		{"assertions changed", `{"assertions":[{"status":200}]}`, 3},
		{"both changed", `{"config":{},"assertions":[]}`, 4},
		{"paused", `{"paused":true}`, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.patch != "" {
				upstreamtest.WantStatus(t, d.c.Do("PATCH", d.base+"/"+m.ID, tc.patch), 200)
			}
			if v := version(); v != tc.want {
				t.Errorf("config_version = %d, want %d", v, tc.want)
			}
		})
	}
	if cfg := upstreamtest.Scalar[string](e, `SELECT config::text || assertions::text FROM monitors WHERE id = $1`, m.ID); cfg != "{}[]" {
		t.Errorf("stored config and assertions = %s, want {}[]", cfg)
	}
}

func TestConfigAndAssertionsAreStoredAsSent(t *testing.T) {
	e := upstreamtest.NewEnv(t)
	org := e.Org("pro")
	d := doors(e, org, store.RoleEditor)[0]
	m := d.create(t, `{"name":"n","type":"http","target":"http://example.com",
		"config":{"headers":{"X-A":"<b>&é"},"n":12345678901234567890,"f":1.5e3,"bad":"\ud800"},"assertions":[{"path":"$.ok","eq":true}]}`)
	got := upstreamtest.Scalar[string](e, `SELECT jsonb_build_array(config, assertions)::text FROM monitors WHERE id = $1`, m.ID)
	want := `[{"f": 1.5e3, "n": 12345678901234567890, "bad": "` + "\uFFFD" + `", "headers": {"X-A": "<b>&é"}}, [{"eq": true, "path": "$.ok"}]]`
	// jsonb normalises 1.5e3 to 1500.
	want = strings.Replace(want, "1.5e3", "1500", 1)
	if got != want {
		t.Errorf("stored %s\nwant   %s", got, want)
	}
}

func TestMonitorsAreConfinedToTheirOrg(t *testing.T) {
	e := upstreamtest.NewEnv(t)
	mine, theirs := e.Org("pro"), e.Org("pro")
	foreign := doors(e, theirs, store.RoleEditor)[0].create(t, `{"name":"theirs","type":"http","target":"https://their.example"}`)
	deleted := doors(e, mine, store.RoleEditor)[1].create(t, `{"name":"gone","type":"http","target":"https://gone.example"}`)
	e.Exec(`UPDATE monitors SET deleted_at = now() WHERE id = $1`, deleted.ID)
	notFound := `{"error":"monitor not found"}`

	for _, d := range doors(e, mine, store.RoleAdmin) {
		own := d.create(t, `{"name":"mine","type":"http","target":"https://my.example"}`)
		for _, tc := range []struct{ name, id string }{
			{"foreign", foreign.ID},
			{"deleted", deleted.ID},
			{"missing", "5b3c1f1e-0000-4000-8000-000000000000"},
			{"malformed", "not-a-uuid"},
			{"uuid without hyphens", strings.ReplaceAll(own.ID, "-", "")},
			{"sql", "1'%20OR%20'1'='1"},
		} {
			t.Run(d.name+" "+tc.name, func(t *testing.T) {
				upstreamtest.Want(t, d.c.Do("GET", d.base+"/"+tc.id, ""), 404, notFound)
				upstreamtest.Want(t, d.c.Do("PATCH", d.base+"/"+tc.id, `{"name":"hijacked"}`), 404, notFound)
				upstreamtest.Want(t, d.c.Do("DELETE", d.base+"/"+tc.id, ""), 404, notFound)
			})
		}
		r := d.c.Do("GET", d.base+"?limit=200", "")
		if strings.Contains(r.Body, foreign.ID) || strings.Contains(r.Body, "theirs") || strings.Contains(r.Body, deleted.ID) {
			t.Errorf("%s: list %s shows a foreign or deleted monitor", d.name, r.Body)
		}
	}
	row := upstreamtest.Scalar[string](e, `SELECT name || ' ' || (deleted_at IS NULL)::text FROM monitors WHERE id = $1`, foreign.ID)
	if row != "theirs true" {
		t.Errorf("the foreign monitor is now %q", row)
	}
}

func TestDashboardMonitorDoorChecksSessionMembershipAndRole(t *testing.T) {
	e := upstreamtest.NewEnv(t)
	org, other := e.Org("pro"), e.Org("pro")
	m := doors(e, org, store.RoleEditor)[1].create(t, `{"name":"n","type":"http","target":"http://192.0.2.1"}`)
	viewer := e.Person(store.RoleViewer, org)
	outsider := e.Person(store.RoleOwner, other)
	base := "/orgs/" + org + "/monitors"
	body := `{"name":"x","type":"http","target":"https://example.com"}`
	for _, tc := range []struct {
		name         string
		c            *upstreamtest.Client
		method, path string
		status       int
		want         string
	}{
		{"no session lists", e.Anon(), "GET", base, 401, bodyUnauthenticated},
		{"no session creates", e.Anon(), "POST", base, 401, bodyUnauthenticated},
		{"outsider reads", outsider, "GET", base + "/" + m.ID, 404, bodyNotFound},
		{"outsider creates", outsider, "POST", base, 404, bodyNotFound},
		{"malformed org", viewer, "GET", "/orgs/x/monitors", 404, bodyNotFound},
		{"viewer creates", viewer, "POST", base, 403, bodyForbidden},
		{"viewer patches", viewer, "PATCH", base + "/" + m.ID, 403, bodyForbidden},
		{"viewer deletes", viewer, "DELETE", base + "/" + m.ID, 403, bodyForbidden},
		{"viewer patches a missing monitor", viewer, "PATCH", base + "/nope", 403, bodyForbidden},
		{"viewer reads", viewer, "GET", base + "/" + m.ID, 200, ""},
		{"viewer lists", viewer, "GET", base, 200, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.c.Do(tc.method, tc.path, body)
			if tc.want == "" {
				upstreamtest.WantStatus(t, r, tc.status)
			} else {
				upstreamtest.Want(t, r, tc.status, tc.want)
			}
		})
	}
}

func TestMonitorListPaginatesByCreationWithAnOpaqueCursor(t *testing.T) {
	e := upstreamtest.NewEnv(t)
	org, other := e.Org("enterprise"), e.Org("enterprise")
	// Seven monitors. Three share one created_at (one statement), for the tie-break on
	// id. A deleted one and a foreign one must never be listed.
	e.Exec(`INSERT INTO monitors (org_id, name, type, target, created_at)
SELECT $1, 'm' || i, 'http', 'https://example.com', timestamptz '2030-01-01 00:00:00Z' + (i / 3) * interval '1 second'
FROM generate_series(0, 6) i`, org)
	e.Exec(`INSERT INTO monitors (org_id, name, type, target, deleted_at) VALUES ($1, 'deleted', 'http', 'https://example.com', now())`, org)
	e.Exec(`INSERT INTO monitors (org_id, name, type, target) VALUES ($1, 'foreign', 'http', 'https://example.com')`, other)
	var wantOrder []string
	rows, err := e.Pool.Query(t.Context(), `SELECT id::text FROM monitors WHERE org_id = $1 AND deleted_at IS NULL ORDER BY created_at, id`, org)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		_ = rows.Scan(&id)
		wantOrder = append(wantOrder, id)
	}

	for _, d := range doors(e, org, store.RoleViewer) {
		t.Run(d.name, func(t *testing.T) {
			var got []string
			cursor, pages := "", 0
			for {
				path := d.base + "?limit=3"
				if cursor != "" {
					path += "&cursor=" + cursor
				}
				r := d.c.Do("GET", path, "")
				upstreamtest.WantStatus(t, r, 200)
				var page struct {
					Data       []store.Monitor `json:"data"`
					NextCursor *string         `json:"next_cursor"`
				}
				r.Decode(t, &page)
				pages++
				for _, m := range page.Data {
					got = append(got, m.ID)
				}
				if page.NextCursor == nil {
					if !strings.HasSuffix(r.Body, `"next_cursor":null}`+"\n") {
						t.Errorf("last page %s lacks next_cursor null", r.Body)
					}
					break
				}
				cursor = *page.NextCursor
				if pages > 5 {
					t.Fatal("pagination does not end")
				}
			}
			if strings.Join(got, ",") != strings.Join(wantOrder, ",") || pages != 3 {
				t.Errorf("paged %d pages of %v, want 3 pages of %v", pages, got, wantOrder)
			}

			var all struct{ Data []store.Monitor }
			d.c.Do("GET", d.base, "").Decode(t, &all)
			if len(all.Data) != 7 {
				t.Errorf("default page has %d monitors, want all 7", len(all.Data))
			}
			// A page ending exactly at the last monitor has no next cursor.
			r := d.c.Do("GET", d.base+"?limit=1&cursor="+cursorAfter(t, d, 6), "")
			upstreamtest.WantStatus(t, r, 200)
			if !strings.Contains(r.Body, `"id":"`+wantOrder[6]+`"`) || !strings.HasSuffix(r.Body, `],"next_cursor":null}`+"\n") {
				t.Errorf("last page = %s, want the 7th monitor and no next cursor", r.Body)
			}
		})
	}
}

// cursorAfter returns the cursor that follows the first n monitors of d's list.
func cursorAfter(t *testing.T, d door, n int) string {
	t.Helper()
	var page struct {
		NextCursor string `json:"next_cursor"`
	}
	d.c.Do("GET", fmt.Sprintf("%s?limit=%d", d.base, n), "").Decode(t, &page)
	return page.NextCursor
}

func TestMonitorListRefusesBadLimitsAndCursors(t *testing.T) {
	e := upstreamtest.NewEnv(t)
	org := e.Org("pro")
	limitMsg := `{"error":"invalid_request","message":"limit: must be an integer from 1 to 200"}`
	cursorMsg := `{"error":"invalid_request","message":"cursor: is not a cursor this API returned"}`
	for _, d := range doors(e, org, store.RoleViewer) {
		for _, tc := range []struct{ query, want string }{
			{"limit=0", limitMsg},
			{"limit=201", limitMsg},
			{"limit=-1", limitMsg},
			{"limit=ten", limitMsg},
			{"limit=1.5", limitMsg},
			{"cursor=x", cursorMsg},
			{"cursor=" + (store.Cursor{CreatedAt: time.Now(), ID: "x"}).Encode(), cursorMsg},
			{"cursor=eyJpZCI6MX0", cursorMsg},
		} {
			t.Run(d.name+" "+tc.query, func(t *testing.T) {
				upstreamtest.Want(t, d.c.Do("GET", d.base+"?"+tc.query, ""), 400, tc.want)
			})
		}
		upstreamtest.Want(t, d.c.Do("GET", d.base+"?limit=&cursor=", ""), 200, `{"data":[],"next_cursor":null}`)
		upstreamtest.Want(t, d.c.Do("GET", d.base+"?limit=200", ""), 200, `{"data":[],"next_cursor":null}`)
	}
}

func TestPatchThatChangesTypeRevalidatesTheTarget(t *testing.T) {
	e := upstreamtest.NewEnv(t)
	org := e.Org("enterprise")
	for _, d := range doors(e, org, store.RoleEditor) {
		t.Run(d.name, func(t *testing.T) {
			m := d.create(t, `{"name":"n","type":"http","target":"https://example.com"}`)
			for _, tc := range []struct{ patch, want string }{
				{`{"type":"tcp"}`, "target: must be host:port with a port from 1 to 65535 for type tcp"},
				{`{"type":"dns"}`, "target: must be a hostname for type dns"},
				{`{"target":"example.com"}`, "target: must be an absolute http or https URL with a host for type http"},
				{`{"type":"icmp","target":"https://example.com"}`, "target: must be a hostname or an IP address for type icmp"},
			} {
				upstreamtest.Want(t, d.c.Do("PATCH", d.base+"/"+m.ID, tc.patch), 400, `{"error":"invalid_request","message":`+upstreamtest.JSONBody(tc.want)+`}`)
			}
			r := d.c.Do("PATCH", d.base+"/"+m.ID, `{"type":"tcp","target":"example.com:443"}`)
			upstreamtest.WantStatus(t, r, 200)
			var p store.Monitor
			r.Decode(t, &p)
			if p.Type != "tcp" || p.Target != "example.com:443" {
				t.Errorf("patched %+v", p)
			}
			// An empty PATCH changes nothing, not even updated_at.
			r = d.c.Do("PATCH", d.base+"/"+m.ID, `{}`)
			var same store.Monitor
			r.Decode(t, &same)
			if !same.UpdatedAt.Equal(p.UpdatedAt) {
				t.Errorf("empty PATCH moved updated_at from %v to %v", p.UpdatedAt, same.UpdatedAt)
			}
		})
	}
}

func TestMonitorBodyOverOneMebibyteIs413(t *testing.T) {
	e := upstreamtest.NewEnv(t)
	org := e.Org("pro")
	for _, d := range doors(e, org, store.RoleEditor) {
		m := d.create(t, `{"name":"n","type":"http","target":"https://example.com"}`)
		big := `{"name":"n","type":"http","target":"https://example.com","config":{"pad":"` + strings.Repeat("x", 1<<20) + `"}}`
		upstreamtest.Want(t, d.c.Do("POST", d.base, big), 413, `{"error":"request_too_large"}`)
		upstreamtest.Want(t, d.c.Do("PATCH", d.base+"/"+m.ID, big), 413, `{"error":"request_too_large"}`)
		// Just under the limit is accepted.
		fits := `{"config":{"pad":"` + strings.Repeat("x", 1<<20-len(`{"config":{"pad":""}}`)) + `"}}`
		upstreamtest.WantStatus(t, d.c.Do("PATCH", d.base+"/"+m.ID, fits), 200)
	}
}

func TestMonitorWriteBodyIsValidatedStrictly(t *testing.T) {
	e := upstreamtest.NewEnv(t)
	org := e.Org("enterprise")
	valid := map[string]any{"name": "n", "type": "http", "target": "https://example.com"}
	with := func(kv ...any) string {
		m := map[string]any{}
		for k, v := range valid {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			if kv[i+1] == nil {
				delete(m, kv[i].(string))
				continue
			}
			m[kv[i].(string)] = kv[i+1]
		}
		return upstreamtest.JSONBody(m)
	}
	raw := func(s string) json.RawMessage { return json.RawMessage(s) }
	deep := strings.Repeat("[", 70) + strings.Repeat("]", 70)

	for _, tc := range []struct {
		name, body, message string
	}{
		{"empty body", ``, "body: must be a JSON object"},
		{"not JSON", `{name:"n"}`, "body: is not valid JSON"},
		{"array", `[]`, "body: must be a JSON object"},
		{"null", `null`, "body: must be a JSON object"},
		{"trailing data", with() + `x`, "body: must hold a single JSON object and nothing after it"},
		{"two objects", with() + `{}`, "body: must hold a single JSON object and nothing after it"},
		{"truncated", `{"name":"n"`, "body: is not valid JSON"},
		{"unknown field", with("color", "red"), "color: unknown field"},
		{"org_id is not writable", with("org_id", "00000000-0000-0000-0000-000000000000"), "org_id: unknown field"},
		{"config_version is not writable", with("config_version", 9), "config_version: unknown field"},
		{"repeated field", `{"name":"a","name":"b","type":"http","target":"https://example.com"}`, "name: appears more than once"},
		{"missing name", with("name", nil), "name: required"},
		{"missing type", with("type", nil), "type: required"},
		{"missing target", with("target", nil), "target: required"},
		{"null name", with("name", raw("null")), "name: must be a string, not null"},
		{"numeric name", with("name", 5), "name: must be a string, not a number"},
		{"empty name", with("name", ""), "name: must be 1 to 200 characters long"},
		{"name of 201 characters", with("name", strings.Repeat("ü", 201)), "name: must be 1 to 200 characters long"},
		{"name with a newline", with("name", "a\nb"), "name: must not contain control characters"},
		{"unknown type", with("type", "ftp"), "type: must be one of http, tcp, dns, icmp"},
		{"type in upper case", with("type", "HTTP"), "type: must be one of http, tcp, dns, icmp"},
		{"null type", with("type", raw("null")), "type: must be a string, not null"},
		{"empty target", with("target", ""), "target: must be 1 to 2048 characters long"},
		{"target too long", with("target", "https://example.com/"+strings.Repeat("a", 2030)), "target: must be 1 to 2048 characters long"},
		{"http target without scheme", with("target", "example.com"), "target: must be an absolute http or https URL with a host for type http"},
		{"http target ftp", with("target", "ftp://example.com"), "target: must be an absolute http or https URL with a host for type http"},
		{"http target without host", with("target", "https:///path"), "target: must be an absolute http or https URL with a host for type http"},
		{"http target with a bad port", with("target", "https://example.com:70000/"), "target: must be an absolute http or https URL with a host for type http"},
		{"http target with a space", with("target", "https://example.com/a b"), "target: must not contain white space"},
		{"http target with a bad host", with("target", "https://exa_mple.com/"), "target: must be an absolute http or https URL with a host for type http"},
		{"tcp target without port", with("type", "tcp", "target", "example.com"), "target: must be host:port with a port from 1 to 65535 for type tcp"},
		{"tcp target port 0", with("type", "tcp", "target", "example.com:0"), "target: must be host:port with a port from 1 to 65535 for type tcp"},
		{"tcp target port 65536", with("type", "tcp", "target", "example.com:65536"), "target: must be host:port with a port from 1 to 65535 for type tcp"},
		{"tcp target a URL", with("type", "tcp", "target", "https://example.com:443"), "target: must be host:port with a port from 1 to 65535 for type tcp"},
		{"tcp target IPv6 without brackets", with("type", "tcp", "target", "2001:db8::1:443"), "target: must be host:port with a port from 1 to 65535 for type tcp"},
		{"dns target an IP", with("type", "dns", "target", "192.0.2.1"), "target: must be a hostname for type dns"},
		{"dns target a URL", with("type", "dns", "target", "https://example.com"), "target: must be a hostname for type dns"},
		{"dns target label too long", with("type", "dns", "target", strings.Repeat("a", 64)+".com"), "target: must be a hostname for type dns"},
		{"dns target with a leading hyphen", with("type", "dns", "target", "-a.example.com"), "target: must be a hostname for type dns"},
		{"icmp target with a port", with("type", "icmp", "target", "example.com:80"), "target: must be a hostname or an IP address for type icmp"},
		{"interval a string", with("interval_seconds", "60"), "interval_seconds: must be an integer, not a string"},
		{"interval a fraction", with("interval_seconds", 60.5), "interval_seconds: must be an integer"},
		{"interval an exponent", with("interval_seconds", raw("6e1")), "interval_seconds: must be an integer"},
		{"interval null", with("interval_seconds", raw("null")), "interval_seconds: must be an integer, not null"},
		{"interval below 10", with("interval_seconds", 9), "interval_seconds: must be from 10 to 86400"},
		{"interval above a day", with("interval_seconds", 86401), "interval_seconds: must be from 10 to 86400"},
		{"interval beyond int32", with("interval_seconds", raw("99999999999")), "interval_seconds: must be an integer"},
		{"locations empty", with("locations", []string{}), "locations: must not be empty"},
		{"locations a string", with("locations", "us-east"), "locations: must be an array of strings, not a string"},
		{"locations null", with("locations", raw("null")), "locations: must be an array of strings, not null"},
		{"locations with a number", with("locations", []any{"us-east", 1}), "locations: must be an array of strings"},
		{"unknown location", with("locations", []string{"mars"}), `locations: unknown location "mars"; known: us-east, us-west, eu-west, eu-central, ap-southeast`},
		{"repeated location", with("locations", []string{"us-east", "us-east"}), "locations: lists us-east more than once"},
		{"paused a string", with("paused", "true"), "paused: must be a boolean, not a string"},
		{"paused null", with("paused", raw("null")), "paused: must be a boolean, not null"},
		{"config an array", with("config", []int{}), "config: must be an object, not an array"},
		{"config null", with("config", raw("null")), "config: must be an object, not null"},
		{"config a string", with("config", "{}"), "config: must be an object, not a string"},
		{"config with NUL", with("config", raw(`{"a":"x\u0000y"}`)), "config: must not contain the character U+0000"},
		{"config with a NUL key", with("config", raw(`{"\u0000":1}`)), "config: must not contain the character U+0000"},
		{"config with a huge number", with("config", raw(`{"a":1e400}`)), "config: holds a number out of range"},
		{"config with a tiny number", with("config", raw(`{"a":1e-400}`)), "config: holds a number out of range"},
		{"config nested too deep", with("config", raw(`{"a":`+deep+`}`)), "config: is nested more than 64 levels deep"},
		{"assertions an object", with("assertions", map[string]any{}), "assertions: must be an array, not an object"},
		{"assertions null", with("assertions", raw("null")), "assertions: must be an array, not null"},
		{"assertions with NUL", with("assertions", raw(`["\u0000"]`)), "assertions: must not contain the character U+0000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, d := range doors(e, org, store.RoleEditor)[1:] {
				upstreamtest.Want(t, d.c.Do("POST", d.base, tc.body), 400, `{"error":"invalid_request","message":`+upstreamtest.JSONBody(tc.message)+`}`)
			}
		})
	}
	if n := upstreamtest.Scalar[int](e, `SELECT count(*) FROM monitors`); n != 0 {
		t.Fatalf("invalid bodies created %d monitors", n)
	}

	for _, tc := range []struct{ name, body string }{
		{"http with port and query", with("target", "http://example.com:8080/health?x=1#frag")},
		{"http IPv6", with("target", "http://[2001:db8::1]/")},
		{"http localhost", with("target", "http://localhost")},
		{"tcp IPv4", with("type", "tcp", "target", "192.0.2.1:22")},
		{"tcp IPv6", with("type", "tcp", "target", "[2001:db8::1]:22")},
		{"dns with a final dot", with("type", "dns", "target", "example.com.")},
		{"icmp IPv6", with("type", "icmp", "target", "2001:db8::1")},
		{"icmp hostname", with("type", "icmp", "target", "xn--bcher-kva.example")},
		{"interval bounds", with("interval_seconds", 10)},
		{"every location", with("locations", []string{"ap-southeast", "eu-central", "eu-west", "us-west", "us-east"})},
		{"read-only fields ignored", with("id", "x", "created_at", 5, "updated_at", raw("null"))},
		{"full body", with("interval_seconds", 86400, "paused", true, "config", map[string]any{"a": []any{1, "b", nil}}, "assertions", []any{map[string]any{}})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, d := range doors(e, org, store.RoleEditor)[1:] {
				upstreamtest.WantStatus(t, d.c.Do("POST", d.base, tc.body), 201)
			}
		})
	}
}

func TestPatchBodyIsValidatedStrictly(t *testing.T) {
	e := upstreamtest.NewEnv(t)
	org := e.Org("enterprise")
	d := doors(e, org, store.RoleEditor)[1]
	m := d.create(t, `{"name":"n","type":"http","target":"https://example.com"}`)
	for _, tc := range []struct{ body, message string }{
		{`{"name":null}`, "name: must be a string, not null"},
		{`{"name":""}`, "name: must be 1 to 200 characters long"},
		{`{"interval_seconds":5}`, "interval_seconds: must be from 10 to 86400"},
		{`{"locations":[]}`, "locations: must not be empty"},
		{`{"paused":1}`, "paused: must be a boolean, not a number"},
		{`{"config":[]}`, "config: must be an object, not an array"},
		{`{"owner":"me"}`, "owner: unknown field"},
		{`[]`, "body: must be a JSON object"},
	} {
		upstreamtest.Want(t, d.c.Do("PATCH", d.base+"/"+m.ID, tc.body), 400, `{"error":"invalid_request","message":`+upstreamtest.JSONBody(tc.message)+`}`)
	}
	var got store.Monitor
	d.c.Do("GET", d.base+"/"+m.ID, "").Decode(t, &got)
	if got.Name != "n" || got.IntervalSeconds != 300 {
		t.Errorf("refused patches changed the monitor: %+v", got)
	}
}
