package httpapi

import (
	"fmt"
	"strconv"
	"testing"
	"time"
)

// event is an audit event as the list answers it.
type event struct {
	ID       string `json:"id"`
	Action   string `json:"action"`
	KeyID    string `json:"key_id"`
	Actor    string `json:"actor"`
	NewKeyID string `json:"new_key_id"`
	URL      string `json:"url"`
	At       string `json:"at"`
}

type eventPage struct {
	Data       []event `json:"data"`
	NextCursor *string `json:"next_cursor"`
}

func TestAuditEventsRecordCreateRollAndRevokeNewestFirst(t *testing.T) {
	e := newTestEnv(t)
	org, other := e.org("pro"), e.org("pro")
	owner := e.person(roleOwner, org)
	admin := e.person(roleAdmin, org)
	otherOwner := e.person(roleOwner, other)
	start := time.Now().Add(-time.Second)

	id, _ := newKey(t, owner, org, `{"name":"ci","role":"Admin"}`)
	ownerID := scalar[string](e, `SELECT created_by::text FROM api_keys WHERE key_id = $1`, id)
	r := admin.do("POST", "/orgs/"+org+"/api-keys/"+id+"/roll", `{"grace_seconds":30}`)
	wantStatus(t, r, 201)
	var rolled struct{ ID string }
	r.decode(t, &rolled)
	adminID := scalar[string](e, `SELECT created_by::text FROM api_keys WHERE key_id = $1`, rolled.ID)
	wantStatus(t, owner.do("DELETE", "/orgs/"+org+"/api-keys/"+rolled.ID, ""), 204)
	// Revoking again changes nothing and is not audited again.
	wantStatus(t, admin.do("DELETE", "/orgs/"+org+"/api-keys/"+rolled.ID, ""), 204)
	// Another org's trail is its own.
	newKey(t, otherOwner, other, `{"name":"theirs","role":"Viewer"}`)

	r = admin.do("GET", "/orgs/"+org+"/audit-events", "")
	wantStatus(t, r, 200)
	var page eventPage
	r.decode(t, &page)
	if page.NextCursor != nil {
		t.Errorf("next_cursor = %q, want null", *page.NextCursor)
	}
	wantEvents := []event{
		{Action: "key.revoked", KeyID: rolled.ID, Actor: ownerID},
		{Action: "key.rolled", KeyID: id, Actor: adminID, NewKeyID: rolled.ID},
		{Action: "key.created", KeyID: id, Actor: ownerID},
	}
	if len(page.Data) != len(wantEvents) {
		t.Fatalf("events = %+v, want %d", page.Data, len(wantEvents))
	}
	for i, got := range page.Data {
		at, err := time.Parse(time.RFC3339Nano, got.At)
		if err != nil || at.Before(start) || at.After(time.Now().Add(time.Second)) || got.At[len(got.At)-1] != 'Z' {
			t.Errorf("event %d at %q, want an RFC 3339 UTC time of this test", i, got.At)
		}
		w := wantEvents[i]
		w.ID, w.At = got.ID, got.At
		if got != w {
			t.Errorf("event %d = %+v, want %+v", i, got, w)
		}
		if i > 0 {
			prev, _ := strconv.Atoi(page.Data[i-1].ID)
			cur, _ := strconv.Atoi(got.ID)
			if cur >= prev {
				t.Errorf("event ids %s then %s are not newest first", page.Data[i-1].ID, got.ID)
			}
		}
	}
	// Fields that do not apply are absent, not null or empty.
	r = owner.do("GET", "/orgs/"+org+"/audit-events?limit=1", "")
	var raw struct {
		Data []map[string]any `json:"data"`
	}
	r.decode(t, &raw)
	if got := sortedKeys(raw.Data[0]); got != "action,actor,at,id,key_id" {
		t.Errorf("a key.revoked event has fields %s", got)
	}
}

func TestAuditEventsAreForOwnersAndAdminsOfTheOrg(t *testing.T) {
	e := newTestEnv(t)
	org, other := e.org("pro"), e.org("free")
	owner := e.person(roleOwner, org, other)
	editor := e.person(roleEditor, org)
	viewer := e.person(roleViewer, org)
	outsider := e.person(roleOwner, other)
	path := "/orgs/" + org + "/audit-events"
	want(t, e.anon().do("GET", path, ""), 401, bodyUnauthenticated)
	want(t, outsider.do("GET", path, ""), 404, bodyNotFound)
	want(t, owner.do("GET", "/orgs/nope/audit-events", ""), 404, bodyNotFound)
	want(t, editor.do("GET", path, ""), 403, bodyForbidden)
	want(t, viewer.do("GET", path, ""), 403, bodyForbidden)
	want(t, owner.do("GET", path, ""), 200, `{"data":[],"next_cursor":null}`)
	// A plan without API access still shows its trail.
	want(t, owner.do("GET", "/orgs/"+other+"/audit-events", ""), 200, `{"data":[],"next_cursor":null}`)
	want(t, owner.do("POST", path, ""), 405, `{"error":"method not allowed"}`)
}

func TestAuditEventsArePaginatedByCursor(t *testing.T) {
	e := newTestEnv(t)
	org := e.org("pro")
	owner := e.person(roleOwner, org)
	var created []string
	for i := 0; i < 5; i++ {
		id, _ := newKey(t, owner, org, fmt.Sprintf(`{"name":"k%d","role":"Viewer"}`, i))
		created = append(created, id)
	}
	var seen []string
	path := "/orgs/" + org + "/audit-events?limit=2"
	for pages := 0; ; pages++ {
		if pages > 3 {
			t.Fatal("the cursor does not end")
		}
		r := owner.do("GET", path, "")
		wantStatus(t, r, 200)
		var page eventPage
		r.decode(t, &page)
		for _, ev := range page.Data {
			seen = append(seen, ev.KeyID)
		}
		if page.NextCursor == nil {
			if len(page.Data) != 1 {
				t.Errorf("last page has %d events, want 1", len(page.Data))
			}
			break
		}
		if len(page.Data) != 2 {
			t.Errorf("page has %d events, want 2", len(page.Data))
		}
		path = "/orgs/" + org + "/audit-events?limit=2&cursor=" + *page.NextCursor
	}
	if fmt.Sprint(seen) != fmt.Sprint([]string{created[4], created[3], created[2], created[1], created[0]}) {
		t.Errorf("pages listed %v, want the creations newest first %v", seen, created)
	}

	bad := func(field, msg string) string {
		return `{"error":"invalid_request","message":"` + field + `: ` + msg + `"}`
	}
	for _, q := range []string{"limit=0", "limit=201", "limit=x", "limit=1.5"} {
		want(t, owner.do("GET", "/orgs/"+org+"/audit-events?"+q, ""), 400, bad("limit", "must be an integer from 1 to 200"))
	}
	for _, c := range []string{"x", "!!", encodeEventCursor(1) + "=", "ZTA", "ZS0x", "ZTAx", "MTI"} {
		want(t, owner.do("GET", "/orgs/"+org+"/audit-events?cursor="+c, ""), 400, bad("cursor", "is not a cursor this API returned"))
	}
	wantStatus(t, owner.do("GET", "/orgs/"+org+"/audit-events?limit=200&cursor=", ""), 200)
}
