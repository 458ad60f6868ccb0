package integration

import (
	"encoding/json"
	"net/http"
	"testing"
)

// TestAKeysOwnLimitAndNetworksThroughTheDashboardAPI sets a key's rate_limit and
// allowed_cidrs at creation and changes them with PATCH, through the gateway and a
// real stack; every exchange is checked against openapi/dashboard.yaml (doRequest).
func TestAKeysOwnLimitAndNetworksThroughTheDashboardAPI(t *testing.T) {
	s := newStack(t)
	org, owner := s.newOwner("pro")
	// The networks hold the loopback addresses, so that the key works from this test
	// whatever the gateway makes of them.
	r := owner.do("POST", "/orgs/"+org.ID+"/api-keys", map[string]any{
		"name": "narrow", "role": "Editor", "rate_limit": 50,
		"allowed_cidrs": []string{"127.0.0.0/8", "::1", "192.0.2.0/24"},
	}, nil)
	if r.Status != http.StatusCreated {
		t.Fatalf("create: %d %s", r.Status, r.Body)
	}
	created := r.JSON(t)
	id, key := created["id"].(string), created["key"].(string)
	s.neverLog(key)
	if got, _ := json.Marshal([]any{created["rate_limit"], created["allowed_cidrs"]}); string(got) != `[50,["127.0.0.0/8","::1/128","192.0.2.0/24"]]` {
		t.Errorf("created with %s", got)
	}
	if r := s.api(key, 0).do("GET", "/v1/me", nil); r.Status != http.StatusOK {
		t.Errorf("GET /v1/me with the narrowed key: %d %s", r.Status, r.Body)
	}

	path := "/orgs/" + org.ID + "/api-keys/" + id
	r = owner.do("PATCH", path, map[string]any{"rate_limit": nil, "allowed_cidrs": []string{"127.0.0.1", "::1/128"}}, nil)
	if r.Status != http.StatusOK {
		t.Fatalf("PATCH: %d %s", r.Status, r.Body)
	}
	entry := r.JSON(t)
	if got, _ := json.Marshal([]any{entry["id"], entry["rate_limit"], entry["allowed_cidrs"], entry["masked_key"]}); string(got) != `["`+id+`",null,["127.0.0.1/32","::1/128"],"mon_live_`+id+`.********"]` {
		t.Errorf("PATCH answered %s", r.Body)
	}
	list := owner.do("GET", "/orgs/"+org.ID+"/api-keys", nil, nil)
	if data := list.JSON(t)["data"].([]any); len(data) != 1 || !jsonEqual(mustJSON(t, data[0]), mustJSON(t, entry)) {
		t.Errorf("the list has %s, the PATCH answered %s", list.Body, r.Body)
	}
	if r := s.api(key, 1).do("GET", "/v1/me", nil); r.Status != http.StatusOK {
		t.Errorf("GET /v1/me after the PATCH: %d %s", r.Status, r.Body)
	}

	// The refusals, each with its documented body.
	other := s.newOrg("pro")
	foreignID, _ := s.loginOwner(other).createKey(other.ID, "theirs", "Admin", nil)
	revokedID, _ := owner.createKey(org.ID, "gone", "Viewer", nil)
	if r := owner.do("DELETE", "/orgs/"+org.ID+"/api-keys/"+revokedID, nil, nil); r.Status != http.StatusNoContent {
		t.Fatalf("revoke: %d %s", r.Status, r.Body)
	}
	editor := s.newMember(org, "Editor")
	for _, tc := range []struct {
		name   string
		c      *Client
		path   string
		body   any
		status int
		want   string
	}{
		{"a rate limit of 0", owner, path, map[string]any{"rate_limit": 0}, 400,
			`{"error":"invalid_request","message":"rate_limit: must be from 1 to 600, the plan's api_rate_limit"}`},
		{"a rate limit over the plan's", owner, path, map[string]any{"rate_limit": 601}, 400,
			`{"error":"invalid_request","message":"rate_limit: must be from 1 to 600, the plan's api_rate_limit"}`},
		{"a malformed network", owner, path, map[string]any{"allowed_cidrs": []string{"10.0.0.1/8"}}, 400,
			`{"error":"invalid_request","message":"allowed_cidrs: 10.0.0.1/8 has bits set after its prefix length: write 10.0.0.0/8 for the network, or 10.0.0.1/32 for the one address"}`},
		{"33 networks", owner, path, map[string]any{"allowed_cidrs": networks(33)}, 400,
			`{"error":"invalid_request","message":"allowed_cidrs: must list at most 32 networks"}`},
		{"an empty body", owner, path, map[string]any{}, 400,
			`{"error":"invalid_request","message":"body: must set at least one of rate_limit, rate_limit_per_second, rate_limit_per_hour, rate_limit_per_day, allowed_cidrs and scopes"}`},
		{"another org's key", owner, "/orgs/" + org.ID + "/api-keys/" + foreignID, map[string]any{"rate_limit": 5}, 404, `{"error":"not found"}`},
		{"a revoked key", owner, "/orgs/" + org.ID + "/api-keys/" + revokedID, map[string]any{"rate_limit": 5}, 409,
			`{"error":"conflict","message":"the key is revoked or expired and cannot be changed"}`},
		{"an Editor", editor, path, map[string]any{"rate_limit": 5}, 403, `{"error":"forbidden"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantError(t, tc.c.do("PATCH", tc.path, tc.body, nil), tc.status, tc.want)
		})
	}
	anon := &Client{s: s, http: &http.Client{}, base: s.URL(0)}
	wantError(t, anon.do("PATCH", path, map[string]any{"rate_limit": 5}, nil), 401, `{"error":"unauthenticated"}`)

	// The trail has the one update, with what changed.
	events := owner.do("GET", "/orgs/"+org.ID+"/audit-events", nil, nil).JSON(t)["data"].([]any)
	var updates []string
	for _, e := range events {
		if ev := e.(map[string]any); ev["action"] == "key.updated" {
			updates = append(updates, string(mustJSON(t, ev["changes"])))
		}
	}
	if len(updates) != 1 || !jsonEqual([]byte(updates[0]), []byte(`{"rate_limit":{"from":50,"to":null},"allowed_cidrs":{"from":["127.0.0.0/8","::1/128","192.0.2.0/24"],"to":["127.0.0.1/32","::1/128"]}}`)) {
		t.Errorf("key.updated events: %v", updates)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// newMember creates a user with role in o and logs them in.
func (s *Stack) newMember(o Org, role string) *Client {
	s.t.Helper()
	email, pw := "member-"+role+"-"+o.ID+"@example.com", "member password "+o.ID
	s.cli(pw+"\n", "user", "create", "--email", email, "--password-stdin")
	s.cli("", "member", "add", "--org", o.ID, "--email", email, "--role", role)
	s.neverLog(pw)
	return s.login(email, pw)
}
