package httpapi_test

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keygate/keygate/upstream/httpapi"
	"github.com/keygate/keygate/upstream/internal/upstreamtest"
	"github.com/keygate/keygate/upstream/store"
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
	e := upstreamtest.NewEnv(t)
	org, other := e.Org("pro"), e.Org("pro")
	owner := e.Person(store.RoleOwner, org)
	admin := e.Person(store.RoleAdmin, org)
	otherOwner := e.Person(store.RoleOwner, other)
	start := time.Now().Add(-time.Second)

	id, _ := newKey(t, owner, org, `{"name":"ci","role":"Admin"}`)
	ownerID := upstreamtest.Scalar[string](e, `SELECT created_by::text FROM api_keys WHERE key_id = $1`, id)
	r := admin.Do("POST", "/orgs/"+org+"/api-keys/"+id+"/roll", `{"grace_seconds":30}`)
	upstreamtest.WantStatus(t, r, 201)
	var rolled struct{ ID string }
	r.Decode(t, &rolled)
	adminID := upstreamtest.Scalar[string](e, `SELECT created_by::text FROM api_keys WHERE key_id = $1`, rolled.ID)
	upstreamtest.WantStatus(t, owner.Do("DELETE", "/orgs/"+org+"/api-keys/"+rolled.ID, ""), 204)
	// Revoking again changes nothing and is not audited again.
	upstreamtest.WantStatus(t, admin.Do("DELETE", "/orgs/"+org+"/api-keys/"+rolled.ID, ""), 204)
	// Another org's trail is its own.
	newKey(t, otherOwner, other, `{"name":"theirs","role":"Viewer"}`)

	r = admin.Do("GET", "/orgs/"+org+"/audit-events", "")
	upstreamtest.WantStatus(t, r, 200)
	var page eventPage
	r.Decode(t, &page)
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
	r = owner.Do("GET", "/orgs/"+org+"/audit-events?limit=1", "")
	var raw struct {
		Data []map[string]any `json:"data"`
	}
	r.Decode(t, &raw)
	if got := upstreamtest.SortedKeys(raw.Data[0]); got != "action,actor,at,id,key_id" {
		t.Errorf("a key.revoked event has fields %s", got)
	}
}

func TestAuditEventsAreForOwnersAndAdminsOfTheOrg(t *testing.T) {
	e := upstreamtest.NewEnv(t)
	org, other := e.Org("pro"), e.Org("free")
	owner := e.Person(store.RoleOwner, org, other)
	editor := e.Person(store.RoleEditor, org)
	viewer := e.Person(store.RoleViewer, org)
	outsider := e.Person(store.RoleOwner, other)
	path := "/orgs/" + org + "/audit-events"
	upstreamtest.Want(t, e.Anon().Do("GET", path, ""), 401, bodyUnauthenticated)
	upstreamtest.Want(t, outsider.Do("GET", path, ""), 404, bodyNotFound)
	upstreamtest.Want(t, owner.Do("GET", "/orgs/nope/audit-events", ""), 404, bodyNotFound)
	upstreamtest.Want(t, editor.Do("GET", path, ""), 403, bodyForbidden)
	upstreamtest.Want(t, viewer.Do("GET", path, ""), 403, bodyForbidden)
	upstreamtest.Want(t, owner.Do("GET", path, ""), 200, `{"data":[],"next_cursor":null}`)
	// A plan without API access still shows its trail.
	upstreamtest.Want(t, owner.Do("GET", "/orgs/"+other+"/audit-events", ""), 200, `{"data":[],"next_cursor":null}`)
	upstreamtest.Want(t, owner.Do("POST", path, ""), 405, `{"error":"method not allowed"}`)
}

func TestAuditEventsArePaginatedByCursor(t *testing.T) {
	_, org, owner := upstreamtest.NewOrgEnv(t, "pro", store.RoleOwner)
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
		r := owner.Do("GET", path, "")
		upstreamtest.WantStatus(t, r, 200)
		var page eventPage
		r.Decode(t, &page)
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
		upstreamtest.Want(t, owner.Do("GET", "/orgs/"+org+"/audit-events?"+q, ""), 400, bad("limit", "must be an integer from 1 to 200"))
	}
	for _, c := range []string{"x", "!!", httpapi.EncodeEventCursor(1) + "=", "ZTA", "ZS0x", "ZTAx", "MTI"} {
		upstreamtest.Want(t, owner.Do("GET", "/orgs/"+org+"/audit-events?cursor="+c, ""), 400, bad("cursor", "is not a cursor this API returned"))
	}
	upstreamtest.WantStatus(t, owner.Do("GET", "/orgs/"+org+"/audit-events?limit=200&cursor=", ""), 200)
}

// TestTheAuditPageNamesPeopleAndKeys reads the dashboard's trail: each event names
// its key by name and masked id, and the person who acted by email, where the JSON
// API gives ids.
func TestTheAuditPageNamesPeopleAndKeys(t *testing.T) {
	e := upstreamtest.NewEnv(t)
	org := e.Org("pro")
	ownerEmail, _, owner := e.Account(store.RoleOwner, org)
	adminEmail, _, admin := e.Account(store.RoleAdmin, org)
	id, _ := newKey(t, owner, org, `{"name":"ci deploys","role":"Admin"}`)
	r := admin.Do("POST", "/orgs/"+org+"/api-keys/"+id+"/roll", `{"grace_seconds":30}`)
	upstreamtest.WantStatus(t, r, 201)
	var rolled struct{ ID string }
	r.Decode(t, &rolled)
	upstreamtest.WantStatus(t, owner.Do("DELETE", "/orgs/"+org+"/api-keys/"+rolled.ID, ""), 204)

	r = owner.Do("GET", "/dashboard/orgs/"+org+"/audit", "")
	upstreamtest.WantStatus(t, r, 200)
	rows := regexp.MustCompile(`(?s)<tr data-testid="audit-row">.*?</tr>`).FindAllString(r.Body, -1)
	if len(rows) != 3 {
		t.Fatalf("%d audit rows, want 3:\n%s", len(rows), r.Body)
	}
	key := func(testid, keyID string) string {
		return `<span data-testid="` + testid + `" data-key-id="` + keyID + `">ci deploys <code class="muted">` + e.Config.KeyFormat.Mask(keyID) + `</code></span>`
	}
	for i, want := range []struct{ action, key, actor string }{
		{"key.revoked", key("audit-key", rolled.ID), ownerEmail},
		{"key.rolled", key("audit-key", id) + " → " + key("audit-new-key", rolled.ID), adminEmail},
		{"key.created", key("audit-key", id), ownerEmail},
	} {
		for _, part := range []string{
			`<td data-label="Event">` + want.action + `</td>`,
			`<td data-label="Key or webhook">` + want.key,
			`<td data-label="By" data-testid="audit-actor">` + want.actor + `</td>`,
		} {
			if !strings.Contains(rows[i], part) {
				t.Errorf("row %d lacks %s:\n%s", i, part, rows[i])
			}
		}
	}
	// The ids stay out of sight; the JSON API has them.
	for _, email := range []string{ownerEmail, adminEmail} {
		userID := upstreamtest.Scalar[string](e, `SELECT id::text FROM users WHERE email = $1`, email)
		if strings.Contains(r.Body, userID) {
			t.Errorf("the page shows the user id %s", userID)
		}
	}
}

// TestTheAuditPageNamesWebhooks reads webhook events on the dashboard's trail: each
// names its endpoint where the JSON API has its webhook_id, by URL with a link to its
// deliveries, or by id once deleted; the dispatcher's disabling names the dispatcher.
func TestTheAuditPageNamesWebhooks(t *testing.T) {
	e := newWebhookEnv(t)
	org := e.Org("pro")
	ownerEmail, _, owner := e.Account(store.RoleOwner, org)
	ids := map[string]string{}
	for _, name := range []string{"kept", "gone"} {
		r := owner.Do("POST", "/orgs/"+org+"/webhooks", `{"url":"http://127.0.0.1:9/`+name+`"}`)
		upstreamtest.WantStatus(t, r, 201)
		var ep struct{ ID string }
		r.Decode(t, &ep)
		ids[name] = ep.ID
	}
	upstreamtest.WantStatus(t, owner.Do("DELETE", "/orgs/"+org+"/webhooks/"+ids["gone"], ""), 204)
	// The dispatcher disables an endpoint only after days of failures: its audit row
	// is written as the dispatcher writes it.
	e.Exec(`INSERT INTO audit_events (org_id, action, webhook_id, actor) VALUES ($1, $2, $3, $4)`,
		org, store.ActionWebhookDisabled, ids["kept"], store.ActorDispatcher)

	var page struct{ Data []map[string]any }
	owner.Do("GET", "/orgs/"+org+"/audit-events", "").Decode(t, &page)
	r := owner.Do("GET", "/dashboard/orgs/"+org+"/audit", "")
	upstreamtest.WantStatus(t, r, 200)
	rows := regexp.MustCompile(`(?s)<tr data-testid="audit-row">.*?</tr>`).FindAllString(r.Body, -1)
	if len(rows) != 4 || len(page.Data) != 4 {
		t.Fatalf("%d audit rows and %d events, want 4:\n%s", len(rows), len(page.Data), r.Body)
	}
	listed := func(id, url string) string {
		return `<td data-label="Key or webhook"><span data-testid="audit-webhook" data-webhook-id="` + id + `">webhook <a href="/dashboard/orgs/` +
			org + `/webhooks/` + id + `"><code>` + url + `</code></a></span></td>`
	}
	gone := `<td data-label="Key or webhook"><span data-testid="audit-webhook" data-webhook-id="` + ids["gone"] +
		`">a webhook no longer listed <code class="muted">` + ids["gone"] + `</code></span></td>`
	for i, want := range []struct{ action, webhook, actor string }{
		{"webhook.disabled", listed(ids["kept"], "http://127.0.0.1:9/kept"), "the webhook dispatcher"},
		{"webhook.deleted", gone, ownerEmail},
		{"webhook.created", gone, ownerEmail},
		{"webhook.created", listed(ids["kept"], "http://127.0.0.1:9/kept"), ownerEmail},
	} {
		if page.Data[i]["action"] != want.action || !strings.Contains(want.webhook, `data-webhook-id="`+fmt.Sprint(page.Data[i]["webhook_id"])+`"`) {
			t.Errorf("event %d is %v, the page's row %s", i, page.Data[i], want.webhook)
		}
		for _, part := range []string{
			`<td data-label="Event">` + want.action + `</td>`,
			want.webhook,
			`<td data-label="By" data-testid="audit-actor">` + want.actor + `</td>`,
		} {
			if !strings.Contains(rows[i], part) {
				t.Errorf("row %d lacks %s:\n%s", i, part, rows[i])
			}
		}
		if strings.Contains(rows[i], `data-testid="audit-key"`) {
			t.Errorf("row %d names a key:\n%s", i, rows[i])
		}
	}
}

// TestAnOperatorsPlanChangeIsInTheOrgsTrail: org set-plan's move is an event of the
// organisation's trail, by the operator, with the plans before and after, in the JSON
// API and on the audit page.
func TestAnOperatorsPlanChangeIsInTheOrgsTrail(t *testing.T) {
	e, org, owner := upstreamtest.NewOrgEnv(t, "pro", store.RoleOwner)
	if _, err := store.New(e.Pool).SetOrgPlan(t.Context(), org, "enterprise"); err != nil {
		t.Fatal(err)
	}
	r := owner.Do("GET", "/orgs/"+org+"/audit-events", "")
	upstreamtest.WantStatus(t, r, 200)
	if want := `"action":"org.plan_changed","actor":"operator","changes":{"plan":{"from":"pro","to":"enterprise"}},"at":`; !strings.Contains(r.Body, want) {
		t.Errorf("the trail %s lacks %s", r.Body, want)
	}
	page := owner.Do("GET", "/dashboard/orgs/"+org+"/audit", "").Body
	for _, want := range []string{`data-testid="audit-changes">plan: pro → enterprise<`, `data-testid="audit-actor">an operator<`} {
		if !strings.Contains(page, want) {
			t.Errorf("the audit page lacks %s:\n%s", want, page)
		}
	}
}
