package integration

import (
	"net/http"
	"strings"
	"testing"
)

const monitorNotFound = `{"error":"monitor not found"}`

func newMonitor(name string) map[string]any {
	return map[string]any{
		"name": name, "type": "http", "target": "https://example.com/health",
		"interval_seconds": 60, "locations": []string{"us-east"},
		"config":     map[string]any{"headers": map[string]any{"X-Probe-Token": "probe-secret"}, "nested": []any{map[string]any{"config": 1}}},
		"assertions": []any{map[string]any{"type": "status", "equals": 200}},
	}
}

// wantNoHiddenFields fails if any never-returned field name appears in a body.
func wantNoHiddenFields(t *testing.T, r Resp) {
	t.Helper()
	for _, f := range []string{"config", "assertions", "config_version", "paused_reason", "org_id", "deleted_at"} {
		if strings.Contains(string(r.Body), `"`+f+`"`) {
			t.Errorf("response shows %q: %s", f, r.Body)
		}
	}
	if strings.Contains(string(r.Body), "probe-secret") {
		t.Errorf("response shows the monitor's config: %s", r.Body)
	}
}

func TestRolesOnV1(t *testing.T) {
	s := newStack(t)
	org, owner := s.newOwner("pro")
	_, admin := owner.createKey(org.ID, "admin", "Admin", nil)
	_, editor := owner.createKey(org.ID, "editor", "Editor", nil)
	_, viewer := owner.createKey(org.ID, "viewer", "Viewer", nil)

	var ids []string
	for _, key := range []string{admin, editor} {
		r := s.api(key, 0).do("POST", "/v1/monitors", newMonitor("by key"))
		if r.Status != http.StatusCreated {
			t.Fatalf("create with a writer key: %d %s", r.Status, r.Body)
		}
		ids = append(ids, r.JSON(t)["id"].(string))
	}
	v := s.api(viewer, 1)
	if r := v.do("GET", "/v1/monitors", nil); r.Status != 200 {
		t.Errorf("Viewer list: %d %s", r.Status, r.Body)
	}
	if r := v.do("GET", "/v1/monitors/"+ids[0], nil); r.Status != 200 {
		t.Errorf("Viewer read: %d %s", r.Status, r.Body)
	}
	if r := v.do("GET", "/v1/me", nil); r.Status != 200 || !jsonEqual(r.Body, []byte(proMe(org.ID, "Viewer"))) {
		t.Errorf("Viewer /v1/me: %d %s", r.Status, r.Body)
	}
	for _, rq := range []struct{ method, path string }{
		{"POST", "/v1/monitors"}, {"PATCH", "/v1/monitors/" + ids[0]}, {"PUT", "/v1/monitors/" + ids[0]},
		{"DELETE", "/v1/monitors/" + ids[0]}, {"POST", "/v1/me"},
	} {
		wantError(t, v.do(rq.method, rq.path, map[string]any{"name": "x"}), 403, `{"error":"forbidden","reason":"role","required_role":"Editor"}`)
	}
	// The refused writes changed nothing.
	if r := v.do("GET", "/v1/monitors/"+ids[0], nil); r.Status != 200 || r.JSON(t)["name"] != "by key" {
		t.Errorf("after refused writes: %d %s", r.Status, r.Body)
	}
	// Admin and Editor may patch and delete.
	if r := s.api(editor, 0).do("PATCH", "/v1/monitors/"+ids[0], map[string]any{"name": "renamed"}); r.Status != 200 {
		t.Errorf("Editor patch: %d %s", r.Status, r.Body)
	}
	if r := s.api(admin, 0).do("DELETE", "/v1/monitors/"+ids[1], nil); r.Status != http.StatusNoContent {
		t.Errorf("Admin delete: %d %s", r.Status, r.Body)
	}
}

func TestMonitorsThroughV1NeverShowHiddenFieldsAndStayInTheirOrg(t *testing.T) {
	s := newStack(t)
	org, key := s.newKey("pro", "Admin")
	a := s.api(key, 0)

	created := a.do("POST", "/v1/monitors", newMonitor("homepage"))
	if created.Status != http.StatusCreated {
		t.Fatalf("create: %d %s", created.Status, created.Body)
	}
	wantNoHiddenFields(t, created)
	m := created.JSON(t)
	id := m["id"].(string)
	for _, f := range []string{"id", "name", "type", "target", "interval_seconds", "locations", "paused", "created_at", "updated_at"} {
		if _, ok := m[f]; !ok {
			t.Errorf("created monitor lacks %q: %s", f, created.Body)
		}
	}

	for _, r := range []Resp{
		a.do("GET", "/v1/monitors/"+id, nil),
		a.do("GET", "/v1/monitors", nil),
		a.do("PATCH", "/v1/monitors/"+id, map[string]any{"config": map[string]any{"v": 2}, "paused": true}),
	} {
		if r.Status != 200 {
			t.Errorf("%d %s", r.Status, r.Body)
		}
		wantNoHiddenFields(t, r)
	}
	list := a.do("GET", "/v1/monitors?limit=1", nil).JSON(t)
	if data := list["data"].([]any); len(data) != 1 || data[0].(map[string]any)["id"] != id {
		t.Errorf("list %v", list)
	}

	// Another org sees none of it.
	other, otherKey := s.newKey("pro", "Admin")
	b := s.api(otherKey, 1)
	wantError(t, b.do("GET", "/v1/monitors/"+id, nil), 404, monitorNotFound)
	wantError(t, b.do("PATCH", "/v1/monitors/"+id, map[string]any{"name": "pwned"}), 404, monitorNotFound)
	wantError(t, b.do("DELETE", "/v1/monitors/"+id, nil), 404, monitorNotFound)
	if l := b.do("GET", "/v1/monitors", nil).JSON(t); len(l["data"].([]any)) != 0 {
		t.Errorf("another org's list shows %v", l)
	}
	// Forged identity headers through the gateway change nothing: still the other org.
	forged := s.raw("GET", s.URL(0)+"/v1/monitors/"+id, nil, http.Header{
		"Authorization":      {"Bearer " + otherKey},
		"X-Gateway-Org-Id":   {org.ID},
		"X-Gateway-Key-Role": {"Admin"},
		"X-Gateway-Secret":   {gatewaySecret},
	})
	wantError(t, forged, 404, monitorNotFound)
	if me := s.raw("GET", s.URL(0)+"/v1/me", nil, http.Header{"Authorization": {"Bearer " + otherKey}, "X-Gateway-Org-Id": {org.ID}}); !strings.Contains(string(me.Body), other.ID) {
		t.Errorf("/v1/me with a forged org header: %s", me.Body)
	}

	// Straight to the upstream: without the gateway's secret, nothing.
	direct := "http://" + s.upAddr + "/v1/monitors/" + id
	for name, h := range map[string]http.Header{
		"no secret":    {"X-Gateway-Org-Id": {org.ID}, "X-Gateway-Key-Id": {"AAAAAAAAAAAAAAAAAAAAAA"}, "X-Gateway-Key-Role": {"Admin"}},
		"wrong secret": {"X-Gateway-Org-Id": {org.ID}, "X-Gateway-Key-Id": {"AAAAAAAAAAAAAAAAAAAAAA"}, "X-Gateway-Key-Role": {"Admin"}, "X-Gateway-Secret": {"guess"}},
		"a real key":   {"Authorization": {"Bearer " + key}},
	} {
		t.Run("direct "+name, func(t *testing.T) {
			wantError(t, s.raw("GET", direct, nil, h), 401, unauthenticated)
			wantError(t, s.raw("DELETE", direct, nil, h), 401, unauthenticated)
		})
	}
	// With the secret the upstream trusts the headers: the secret is what protects it.
	trusted := s.raw("GET", direct, nil, http.Header{"X-Gateway-Org-Id": {org.ID}, "X-Gateway-Key-Id": {"AAAAAAAAAAAAAAAAAAAAAA"},
		"X-Gateway-Key-Role": {"Viewer"}, "X-Gateway-Secret": {gatewaySecret}})
	if trusted.Status != 200 {
		t.Errorf("direct with the right secret: %d %s", trusted.Status, trusted.Body)
	}

	// Delete, then the monitor is gone for everyone and in every way.
	if r := a.do("DELETE", "/v1/monitors/"+id, nil); r.Status != http.StatusNoContent {
		t.Fatalf("delete: %d %s", r.Status, r.Body)
	}
	wantError(t, a.do("GET", "/v1/monitors/"+id, nil), 404, monitorNotFound)
	wantError(t, a.do("DELETE", "/v1/monitors/"+id, nil), 404, monitorNotFound)
	wantError(t, a.do("GET", "/v1/monitors/not-a-uuid", nil), 404, monitorNotFound)
	if l := a.do("GET", "/v1/monitors", nil).JSON(t); len(l["data"].([]any)) != 0 {
		t.Errorf("list after delete %v", l)
	}
}

// TestPlanGatesInOrderWithIdenticalBodiesOnBothDoors sends each gated write to /v1 and to
// the dashboard and requires the same status and body from both.
func TestPlanGatesInOrderWithIdenticalBodiesOnBothDoors(t *testing.T) {
	s := newStack(t)
	s.cli("", "plan", "put", "--name", "small", "--api-rate-limit", "1000", "--max-monitors", "2",
		"--min-interval", "120", "--locations", "us-east,eu-west", "--check-types", "http,tcp")
	org, owner := s.newOwner("small")
	_, key := owner.createKey(org.ID, "k", "Editor", nil)
	a := s.api(key, 0)

	body := func(kv ...any) map[string]any {
		m := map[string]any{"name": "m", "type": "http", "target": "https://example.com", "interval_seconds": 300, "locations": []string{"us-east"}}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
	both := func(name string, b map[string]any, status int, want string) {
		t.Helper()
		t.Run(name, func(t *testing.T) {
			v1 := a.do("POST", "/v1/monitors", b)
			dash := owner.do("POST", "/orgs/"+org.ID+"/monitors", b, nil)
			if want == "" { // any invalid_request, the same on both doors
				if v1.JSON(t)["error"] != "invalid_request" {
					t.Errorf("/v1: %d %s, want invalid_request", v1.Status, v1.Body)
				}
				want = string(v1.Body)
			}
			wantError(t, v1, status, want)
			wantError(t, dash, status, want)
		})
	}
	minInterval := `{"error":"quota_exceeded","metric":"min_interval_seconds","upgrade":true}`
	both("interval below the plan's minimum", body("interval_seconds", 60), 402, minInterval)
	both("a location the plan lacks", body("locations", []string{"us-east", "ap-southeast", "us-west"}), 403,
		`{"error":"feature_gated","feature":"location:ap-southeast","upgrade":true}`)
	both("a check type the plan lacks", body("type", "dns", "target", "example.com"), 403,
		`{"error":"feature_gated","feature":"check_type:dns","upgrade":true}`)
	// Order: interval before locations before type.
	both("interval and location both bad", body("interval_seconds", 30, "locations", []string{"us-west"}), 402, minInterval)
	both("location and type both bad", body("locations", []string{"us-west"}, "type", "icmp", "target", "example.com"), 403,
		`{"error":"feature_gated","feature":"location:us-west","upgrade":true}`)
	// Validation comes before the gates.
	both("invalid body", body("interval_seconds", 5), 400, "")

	// Fill the quota, one monitor through each door.
	if r := a.do("POST", "/v1/monitors", body()); r.Status != 201 {
		t.Fatalf("first create: %d %s", r.Status, r.Body)
	}
	if r := owner.do("POST", "/orgs/"+org.ID+"/monitors", body(), nil); r.Status != 201 {
		t.Fatalf("second create: %d %s", r.Status, r.Body)
	}
	quota := `{"error":"quota_exceeded","metric":"monitors","upgrade":true}`
	both("over the monitor count", body(), 402, quota)
	// Count comes first of all gates.
	both("over the count with every other gate failing too", body("interval_seconds", 10, "locations", []string{"us-west"}, "type", "icmp", "target", "example.com"), 402, quota)

	// PATCH is gated like POST (but for the count).
	list := a.do("GET", "/v1/monitors", nil).JSON(t)
	id := list["data"].([]any)[0].(map[string]any)["id"].(string)
	wantError(t, a.do("PATCH", "/v1/monitors/"+id, map[string]any{"interval_seconds": 60}), 402, minInterval)
	wantError(t, owner.do("PATCH", "/orgs/"+org.ID+"/monitors/"+id, map[string]any{"interval_seconds": 60}, nil), 402, minInterval)
	wantError(t, a.do("PATCH", "/v1/monitors/"+id, map[string]any{"type": "icmp", "target": "example.com"}), 403,
		`{"error":"feature_gated","feature":"check_type:icmp","upgrade":true}`)
}
