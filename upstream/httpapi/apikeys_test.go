package httpapi_test

import (
	"context"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/upstream/httpapi"
	"github.com/keygate/keygate/upstream/internal/upstreamtest"
	"github.com/keygate/keygate/upstream/store"
)

// The bodies of the key routes' refusals (openapi/dashboard.yaml).
const (
	bodyUnauthenticated = `{"error":"unauthenticated"}`
	bodyNotFound        = `{"error":"not found"}`
	bodyForbidden       = `{"error":"forbidden"}`
	bodyAPIGated        = `{"error":"feature_gated","feature":"api","upgrade":true}`
)

func TestKeyRoutesCheckSessionMembershipPermissionPlanAndBodyInThatOrder(t *testing.T) {
	e := upstreamtest.NewEnv(t)
	pro, free, other := e.Org("pro"), e.Org("free"), e.Org("pro")
	owner := e.Person(store.RoleOwner, pro, free)
	admin := e.Person(store.RoleAdmin, pro)
	editor := e.Person(store.RoleEditor, pro, free)
	viewer := e.Person(store.RoleViewer, pro)
	outsider := e.Person(store.RoleOwner, other)
	badBody := `{"name":"","role":"Owner"}`
	goodBody := `{"name":"ci","role":"Viewer"}`
	keyID := "AAAAAAAAAAAAAAAAAAAAAA"

	type route struct{ method, suffix, body string }
	create := route{"POST", "/api-keys", badBody}
	list := route{"GET", "/api-keys", ""}
	revoke := route{"DELETE", "/api-keys/" + keyID, ""}

	for _, tc := range []struct {
		name   string
		c      *upstreamtest.Client
		org    string
		routes []route
		status int
		body   string
	}{
		{"no session", e.Anon(), pro, []route{create, list, revoke}, 401, bodyUnauthenticated},
		{"no session and a malformed org", e.Anon(), "nope", []route{create, list, revoke}, 401, bodyUnauthenticated},
		{"an unknown session", e.Anon().With("Cookie", "session=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"), pro, []route{create, list, revoke}, 401, bodyUnauthenticated},
		{"a malformed session", e.Anon().With("Cookie", "session=x"), pro, []route{create, list, revoke}, 401, bodyUnauthenticated},
		{"not a member", outsider, pro, []route{create, list, revoke}, 404, bodyNotFound},
		{"a malformed org id", owner, "not-a-uuid", []route{create, list, revoke}, 404, bodyNotFound},
		{"an unknown org id", owner, "00000000-0000-0000-0000-000000000000", []route{create, list, revoke}, 404, bodyNotFound},
		{"an Editor", editor, pro, []route{create, list, revoke}, 403, bodyForbidden},
		{"a Viewer", viewer, pro, []route{create, list, revoke}, 403, bodyForbidden},
		{"an Editor on a plan without API", editor, free, []route{create}, 403, bodyForbidden},
		{"an Owner on a plan without API", owner, free, []route{create}, 403, bodyAPIGated},
		{"an Owner with a bad body", owner, pro, []route{create}, 400, `{"error":"invalid_request","message":"name: must be 1 to 100 characters long"}`},
		{"an Admin with a bad body", admin, pro, []route{create}, 400, `{"error":"invalid_request","message":"name: must be 1 to 100 characters long"}`},
		{"an Owner revoking an unknown key", owner, pro, []route{revoke}, 404, bodyNotFound},
		{"an Owner listing on a plan without API", owner, free, []route{list}, 200, `{"data":[]}`},
		{"an Admin listing", admin, pro, []route{list}, 200, `{"data":[]}`},
	} {
		for _, rt := range tc.routes {
			t.Run(tc.name+" "+rt.method, func(t *testing.T) {
				upstreamtest.Want(t, tc.c.Do(rt.method, "/orgs/"+tc.org+rt.suffix, rt.body), tc.status, tc.body)
			})
		}
	}
	// With a good body, the same Owner on the free plan is still refused by the plan.
	upstreamtest.Want(t, owner.Do("POST", "/orgs/"+free+"/api-keys", goodBody), 403, bodyAPIGated)
	if n := upstreamtest.Scalar[int](e, `SELECT count(*) FROM api_keys`); n != 0 {
		t.Errorf("api keys = %d, want none created", n)
	}
}

func TestCreateKeyValidatesItsBody(t *testing.T) {
	_, org, owner := upstreamtest.NewOrgEnv(t, "pro", store.RoleOwner)
	past := time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)
	for _, tc := range []struct{ name, body, message string }{
		{"not JSON", `{`, "body: is not valid JSON"},
		{"not an object", `"ci"`, "body: must be a JSON object"},
		{"two objects", `{"name":"ci","role":"Admin"}{}`, "body: must hold a single JSON object and nothing after it"},
		{"no name", `{"role":"Admin"}`, "name: required"},
		{"no role", `{"name":"ci"}`, "role: required"},
		{"empty name", `{"name":"","role":"Admin"}`, "name: must be 1 to 100 characters long"},
		{"name of 101 characters", `{"name":"` + strings.Repeat("é", 101) + `","role":"Admin"}`, "name: must be 1 to 100 characters long"},
		{"name with a control character", `{"name":"a\u0000b","role":"Admin"}`, "name: must not contain control characters"},
		{"null name", `{"name":null,"role":"Admin"}`, "name: must be a string, not null"},
		{"role Owner", `{"name":"ci","role":"Owner"}`, "role: must be one of Admin, Editor, Viewer"},
		{"role in lower case", `{"name":"ci","role":"admin"}`, "role: must be one of Admin, Editor, Viewer"},
		{"expiry in the past", `{"name":"ci","role":"Admin","expires_at":"` + past + `"}`, "expires_at: must be in the future"},
		{"expiry not RFC 3339", `{"name":"ci","role":"Admin","expires_at":"tomorrow"}`, "expires_at: must be an RFC 3339 timestamp"},
		{"expiry a number", `{"name":"ci","role":"Admin","expires_at":1700000000}`, "expires_at: must be a string, not a number"},
		{"unknown field", `{"name":"ci","role":"Admin","permissions":["x"]}`, "permissions: unknown field"},
		{"repeated field", `{"name":"ci","role":"Admin","name":"cd"}`, "name: appears more than once"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			upstreamtest.Want(t, owner.Do("POST", "/orgs/"+org+"/api-keys", tc.body), 400,
				`{"error":"invalid_request","message":`+upstreamtest.JSONBody(tc.message)+`}`)
		})
	}
	r := owner.Do("POST", "/orgs/"+org+"/api-keys", `{"name":"`+strings.Repeat("é", 100)+`","role":"Admin","expires_at":null}`)
	upstreamtest.WantStatus(t, r, 201)
}

func TestCreatedKeyAppearsOnceAndIsListedMasked(t *testing.T) {
	e, org, owner := upstreamtest.NewOrgEnv(t, "pro", store.RoleOwner)
	expires := time.Now().Add(24 * time.Hour).UTC().Truncate(time.Second)

	r := owner.Do("POST", "/orgs/"+org+"/api-keys",
		upstreamtest.JSONBody(map[string]string{"name": "ci", "role": "Editor", "expires_at": expires.Format(time.RFC3339)}))
	upstreamtest.WantStatus(t, r, http.StatusCreated)
	var created map[string]any
	r.Decode(t, &created)
	if got := upstreamtest.SortedKeys(created); got != "allowed_cidrs,created_at,expires_at,id,key,name,rate_limit,rate_limit_per_day,rate_limit_per_hour,rate_limit_per_second,role,scopes" {
		t.Fatalf("create answered fields %s", got)
	}
	id, full := created["id"].(string), created["key"].(string)
	if !regexp.MustCompile(`^mon_live_` + id + `\.[A-Za-z0-9_-]{43}[0-9A-Za-z]{6}$`).MatchString(full) {
		t.Errorf("key %q is not mon_live_<id>.<secret>", full)
	}
	if created["name"] != "ci" || created["role"] != "Editor" || created["expires_at"] != expires.Format(time.RFC3339) {
		t.Errorf("created = %v", created)
	}
	if _, err := time.Parse(time.RFC3339, created["created_at"].(string)); err != nil || !strings.HasSuffix(created["created_at"].(string), "Z") {
		t.Errorf("created_at %v is not RFC 3339 in UTC", created["created_at"])
	}
	if r.Header.Get("Cache-Control") != "no-store" {
		t.Errorf("Cache-Control = %q, want no-store", r.Header.Get("Cache-Control"))
	}

	// The key works with the gateway's keystore, bound to the org and role chosen.
	k, ok, err := e.Keys.Verify(context.Background(), full)
	if err != nil || !ok || k.OrgID != org || k.Role != keystore.RoleEditor {
		t.Errorf("Verify = %+v, %v, %v", k, ok, err)
	}

	secret := full[strings.IndexByte(full, '.')+1:]
	r = owner.Do("GET", "/orgs/"+org+"/api-keys", "")
	upstreamtest.Want(t, r, 200, `{"data":[{"id":"`+id+`","name":"ci","role":"Editor","created_at":`+upstreamtest.JSONBody(created["created_at"])+
		`,"expires_at":"`+expires.Format(time.RFC3339)+`","revoked_at":null,"last_used_at":null,"masked_key":"mon_live_`+id+`.********","rate_limit":null,"rate_limit_per_second":null,"rate_limit_per_hour":null,"rate_limit_per_day":null,"allowed_cidrs":[],"scopes":null}]}`)
	if strings.Contains(r.Body, secret) {
		t.Error("the list shows the secret")
	}
}

func TestKeyPrefixIsConfigurable(t *testing.T) {
	e := upstreamtest.NewEnv(t, func(c *httpapi.Config) { c.KeyFormat, _ = keystore.NewFormat("acme") })
	org := e.Org("pro")
	owner := e.Person(store.RoleAdmin, org)
	var created struct{ ID, Key string }
	r := owner.Do("POST", "/orgs/"+org+"/api-keys", `{"name":"ci","role":"Admin"}`)
	r.Decode(t, &created)
	if !strings.HasPrefix(created.Key, "acme_live_"+created.ID+".") {
		t.Errorf("key %q does not use the prefix acme", created.Key)
	}
	upstreamtest.WantStatus(t, owner.Do("GET", "/orgs/"+org+"/api-keys", ""), 200)
}

func TestRevokeKeyIsIdempotentAndConfinedToTheOrg(t *testing.T) {
	e := upstreamtest.NewEnv(t)
	org, other := e.Org("pro"), e.Org("pro")
	owner := e.Person(store.RoleOwner, org)
	otherOwner := e.Person(store.RoleOwner, other)
	newKey := func(c *upstreamtest.Client, org string) (string, string) {
		var k struct{ ID, Key string }
		c.Do("POST", "/orgs/"+org+"/api-keys", `{"name":"k","role":"Admin"}`).Decode(t, &k)
		return k.ID, k.Key
	}
	id, full := newKey(owner, org)
	foreignID, foreignFull := newKey(otherOwner, other)

	upstreamtest.Want(t, owner.Do("DELETE", "/orgs/"+org+"/api-keys/"+foreignID, ""), 404, bodyNotFound)
	upstreamtest.Want(t, owner.Do("DELETE", "/orgs/"+org+"/api-keys/nope", ""), 404, bodyNotFound)
	upstreamtest.Want(t, owner.Do("DELETE", "/orgs/"+org+"/api-keys/BBBBBBBBBBBBBBBBBBBBBB", ""), 404, bodyNotFound)
	// The foreign org's Owner cannot revoke through their own org's path either.
	upstreamtest.Want(t, otherOwner.Do("DELETE", "/orgs/"+other+"/api-keys/"+id, ""), 404, bodyNotFound)

	upstreamtest.Want(t, owner.Do("DELETE", "/orgs/"+org+"/api-keys/"+id, ""), 204, "")
	upstreamtest.Want(t, owner.Do("DELETE", "/orgs/"+org+"/api-keys/"+id, ""), 204, "")

	ctx := context.Background()
	if _, ok, err := e.Keys.Verify(ctx, full); ok || err != nil {
		t.Errorf("revoked key verifies: %v, %v", ok, err)
	}
	if _, ok, err := e.Keys.Verify(ctx, foreignFull); !ok || err != nil {
		t.Errorf("the foreign key was touched: %v, %v", ok, err)
	}
	var list struct {
		Data []struct {
			ID        string  `json:"id"`
			RevokedAt *string `json:"revoked_at"`
		} `json:"data"`
	}
	owner.Do("GET", "/orgs/"+org+"/api-keys", "").Decode(t, &list)
	if len(list.Data) != 1 || list.Data[0].ID != id || list.Data[0].RevokedAt == nil {
		t.Errorf("list = %+v, want only the org's key, revoked", list.Data)
	}
}
