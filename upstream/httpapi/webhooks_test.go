package httpapi_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/keygate/keygate/upstream/httpapi"
	"github.com/keygate/keygate/upstream/internal/upstreamtest"
	"github.com/keygate/keygate/upstream/store"
	"github.com/keygate/keygate/upstream/webhook"
)

// newWebhookEnv is a server that accepts http and loopback webhook URLs, so that no
// test here resolves a name on the network.
func newWebhookEnv(t *testing.T) *upstreamtest.Env {
	return upstreamtest.NewEnv(t, func(c *httpapi.Config) {
		c.Webhooks = webhook.Policy{AllowHTTP: true, AllowPrivate: true}
	})
}

func TestWebhookRoutesCheckSessionMembershipAndPermission(t *testing.T) {
	e := newWebhookEnv(t)
	org, other := e.Org("pro"), e.Org("pro")
	owner := e.Person(store.RoleOwner, org)
	r := owner.Do("POST", "/orgs/"+org+"/webhooks", `{"url":"http://127.0.0.1:9/hook"}`)
	upstreamtest.WantStatus(t, r, 201)
	var ep struct{ ID string }
	r.Decode(t, &ep)
	base := "/orgs/" + org + "/webhooks"
	routes := [][2]string{
		{"POST", base}, {"GET", base}, {"GET", base + "/" + ep.ID}, {"PATCH", base + "/" + ep.ID},
		{"DELETE", base + "/" + ep.ID}, {"POST", base + "/" + ep.ID + "/test"},
		{"POST", base + "/" + ep.ID + "/rotate-secret"}, {"GET", base + "/" + ep.ID + "/deliveries"},
		{"POST", base + "/" + ep.ID + "/deliveries/1/retry"},
	}
	for _, tc := range []struct {
		name   string
		c      *upstreamtest.Client
		status int
		body   string
	}{
		{"no session", e.Anon(), 401, bodyUnauthenticated},
		{"an outsider", e.Person(store.RoleOwner, other), 404, bodyNotFound},
		{"an Editor", e.Person(store.RoleEditor, org), 403, bodyForbidden},
		{"a Viewer", e.Person(store.RoleViewer, org), 403, bodyForbidden},
	} {
		for _, rt := range routes {
			t.Run(tc.name+" "+rt[0]+" "+rt[1], func(t *testing.T) {
				upstreamtest.Want(t, tc.c.Do(rt[0], rt[1], `{"url":"http://127.0.0.1:9/x"}`), tc.status, tc.body)
			})
		}
	}
	admin := e.Person(store.RoleAdmin, org)
	upstreamtest.WantStatus(t, admin.Do("GET", base, ""), 200)
}

func TestWebhookBodiesAreChecked(t *testing.T) {
	e := newWebhookEnv(t)
	org := e.Org("pro")
	owner := e.Person(store.RoleOwner, org)
	bad := func(msg string) string {
		return `{"error":"invalid_request","message":` + upstreamtest.JSONBody(msg) + `}`
	}
	types := "key.created, key.revoked, key.rolled, key.leaked, key.expiring, key.expired, quota.threshold"
	for _, tc := range []struct{ name, body, want string }{
		{"no body", ``, bad("body: must be a JSON object")},
		{"no url", `{"events":[]}`, bad("url: required")},
		{"a number url", `{"url":1}`, bad("url: must be a string, not a number")},
		{"an unknown event", `{"url":"http://127.0.0.1:9/","events":["key.stolen"]}`, bad("events: must hold only " + types)},
		{"events not an array", `{"url":"http://127.0.0.1:9/","events":"key.created"}`, bad("events: must be an array of event types")},
		{"events null", `{"url":"http://127.0.0.1:9/","events":null}`, bad("events: must be an array of event types")},
		{"enabled on create", `{"url":"http://127.0.0.1:9/","enabled":false}`, bad("enabled: unknown field")},
		{"an unknown field", `{"url":"http://127.0.0.1:9/","secret":"whsec_x"}`, bad("secret: unknown field")},
		{"a long description", `{"url":"http://127.0.0.1:9/","description":"` + strings.Repeat("d", 501) + `"}`, bad("description: must be 0 to 500 characters long")},
		{"a ws URL", `{"url":"ws://127.0.0.1:9/"}`, bad("url: must be an https URL")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			upstreamtest.Want(t, owner.Do("POST", "/orgs/"+org+"/webhooks", tc.body), 400, tc.want)
		})
	}
}

func TestWebhookLifecycleIsAuditedAndTheSecretShownOnlyOnCreationAndRotation(t *testing.T) {
	e := newWebhookEnv(t)
	org := e.Org("pro")
	owner := e.Person(store.RoleOwner, org)
	base := "/orgs/" + org + "/webhooks"
	r := owner.Do("POST", base, `{"url":"http://127.0.0.1:9/hook","events":["key.revoked","key.created","key.revoked"],"description":"ops"}`)
	upstreamtest.WantStatus(t, r, 201)
	var created map[string]any
	r.Decode(t, &created)
	id, secret := created["id"].(string), created["secret"].(string)
	if got := upstreamtest.SortedKeys(created); got != "created_at,description,disabled_reason,enabled,events,id,masked_secret,secret,updated_at,url" {
		t.Errorf("created members %s", got)
	}
	if !strings.HasPrefix(secret, "whsec_") || len(secret) != len("whsec_")+44 {
		t.Errorf("secret %q", secret)
	}
	if fmt.Sprint(created["events"]) != "[key.created key.revoked]" || created["masked_secret"] != secret[:10]+"********" {
		t.Errorf("created %v", created)
	}

	for _, path := range []string{base, base + "/" + id} {
		r := owner.Do("GET", path, "")
		upstreamtest.WantStatus(t, r, 200)
		if strings.Contains(r.Body, secret) || strings.Contains(r.Body, `"secret"`) {
			t.Errorf("GET %s shows the secret: %s", path, r.Body)
		}
	}
	r = owner.Do("PATCH", base+"/"+id, `{"enabled":false,"description":"paused"}`)
	upstreamtest.WantStatus(t, r, 200)
	if !strings.Contains(r.Body, `"enabled":false,"disabled_reason":"user"`) || strings.Contains(r.Body, secret) {
		t.Errorf("PATCH answered %s", r.Body)
	}
	upstreamtest.Want(t, owner.Do("PATCH", base+"/"+id, `{}`), 400,
		`{"error":"invalid_request","message":"body: must set url, events, description or enabled"}`)
	r = owner.Do("POST", base+"/"+id+"/rotate-secret", "")
	upstreamtest.WantStatus(t, r, 200)
	var rotated struct{ Secret string }
	r.Decode(t, &rotated)
	if rotated.Secret == secret || !strings.HasPrefix(rotated.Secret, "whsec_") {
		t.Errorf("rotated secret %q", rotated.Secret)
	}
	upstreamtest.WantStatus(t, owner.Do("DELETE", base+"/"+id, ""), 204)
	upstreamtest.Want(t, owner.Do("DELETE", base+"/"+id, ""), 404, `{"error":"webhook not found"}`)
	upstreamtest.Want(t, owner.Do("GET", base+"/not-a-uuid", ""), 404, `{"error":"webhook not found"}`)

	r = owner.Do("GET", "/orgs/"+org+"/audit-events", "")
	upstreamtest.WantStatus(t, r, 200)
	var page struct {
		Data []map[string]any `json:"data"`
	}
	r.Decode(t, &page)
	var actions []string
	for _, ev := range page.Data {
		actions = append(actions, ev["action"].(string))
		if ev["webhook_id"] != id || ev["key_id"] != nil {
			t.Errorf("audit event %v", ev)
		}
	}
	if got := strings.Join(actions, ","); got != "webhook.deleted,webhook.secret_rotated,webhook.updated,webhook.created" {
		t.Errorf("audit actions %s", got)
	}
}

func TestAnOrgHasAtMostTenWebhooksEvenUnderConcurrentCreations(t *testing.T) {
	e := newWebhookEnv(t)
	org := e.Org("pro")
	owner := e.Person(store.RoleOwner, org)
	var wg sync.WaitGroup
	statuses := make([]int, 14)
	for i := range statuses {
		wg.Go(func() {
			statuses[i] = owner.Do("POST", "/orgs/"+org+"/webhooks", `{"url":"http://127.0.0.1:9/hook"}`).Status
		})
	}
	wg.Wait()
	created := 0
	for _, s := range statuses {
		if s == 201 {
			created++
		} else if s != 409 {
			t.Errorf("status %d", s)
		}
	}
	if created != store.MaxWebhookEndpoints {
		t.Errorf("%d created, want %d", created, store.MaxWebhookEndpoints)
	}
	upstreamtest.Want(t, owner.Do("POST", "/orgs/"+org+"/webhooks", `{"url":"http://127.0.0.1:9/hook"}`), 409,
		`{"error":"conflict","message":"an organisation has at most 10 webhook endpoints"}`)
}
