package integration

import (
	"net/http"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
)

// scopeBox is the selector of the checkbox of scope within the group group.
func scopeBox(group chromedp.CSS, scope string) chromedp.CSS {
	return group + chromedp.CSS(` input[name="scopes"][value="`+scope+`"]`)
}

// wantScopes checks the scopes the keys page shows in the row: "scopes:", then the
// scopes separated by spaces, or "all".
func wantScopes(tb *tab, row chromedp.CSS, want string) {
	tb.t.Helper()
	want = "scopes: " + want
	if got := strings.Join(strings.Fields(get(tb, "the key's scopes", chromedp.Text(row+tid("key-scopes")))), " "); got != want {
		tb.t.Errorf("the key's scopes show %q, want %q", got, want)
	}
}

// TestDashboardScopesInABrowser creates a scoped key in the dashboard's form in
// headless Chromium, through the gateway: the keys page shows its scopes in a row as
// compact as any, its settings form has them checked and changes them, and a roll
// keeps them. The key works on
// /v1/me, which needs no scope.
func TestDashboardScopesInABrowser(t *testing.T) {
	s := newStack(t)
	base := s.URL(0)
	o := s.newOrg("pro")
	owner := newTab(t, browser(t), base)
	owner.logIn(o.Email, o.Password)
	owner.do("the keys page", chromedp.WaitVisible(tid("create-key-scopes")))
	create := tid("create-key-scopes")
	for _, scope := range []string{"monitors:read", "monitors:write", "monitors:delete"} {
		if checked := get(owner, "the box of "+scope, chromedp.JavascriptAttribute[bool](scopeBox(create, scope), "checked")); checked {
			t.Errorf("the create form checks %s before anyone did", scope)
		}
	}

	owner.do("create a key with a scope",
		chromedp.SendKeys(tid("create-key-name"), "ci"),
		chromedp.SetValue(tid("create-key-role"), "Editor"),
		chromedp.Click(scopeBox(create, "monitors:read")),
		chromedp.Click(tid("create-key-submit")),
		chromedp.WaitVisible(tid("new-key")),
	)
	key := get(owner, "read the new key", chromedp.Text(tid("new-key")))
	s.neverLog(key)
	if got := bearer(t, base, "/v1/me", key); got != 200 {
		t.Fatalf("/v1/me with the scoped key: %d", got)
	}
	id := strings.TrimPrefix(strings.SplitN(key, ".", 2)[0], "mon_live_")
	row := chromedp.CSS(`tr[data-key-id="` + id + `"] `)
	wantScopes(owner, row, "monitors:read")

	// The settings form has the key's scope checked; check another and save.
	owner.do("open the settings", chromedp.Click(row+tid("edit-settings")), chromedp.WaitVisible(row+tid("save-settings")))
	edit := row + tid("edit-scopes")
	for scope, want := range map[string]bool{"monitors:read": true, "monitors:write": false, "monitors:delete": false} {
		if got := get(owner, "the box of "+scope, chromedp.JavascriptAttribute[bool](scopeBox(edit, scope), "checked")); got != want {
			t.Errorf("the settings form's %s is checked %v, want %v", scope, got, want)
		}
	}
	owner.do("widen the key", chromedp.Click(scopeBox(edit, "monitors:write")), chromedp.Click(scopeBox(edit, "monitors:delete")),
		clickThrough(row+tid("save-settings"), tid("create-key-name")))
	wantScopes(owner, row, "monitors:read monitors:write monitors:delete")
	// Every scope shown, the row is as compact as any other.
	wantCompactRow(owner, id)

	// A roll keeps the scopes.
	owner.do("roll",
		chromedp.Click(row+tid("roll-open")),
		chromedp.WaitVisible(row+tid("roll-grace")),
		chromedp.SetValue(row+tid("roll-grace"), "0"),
		chromedp.Click(row+tid("roll")),
		chromedp.WaitVisible(tid("new-key")))
	rolled := get(owner, "read the rolled key", chromedp.Text(tid("new-key")))
	s.neverLog(rolled)
	rolledRow := chromedp.CSS(`tr[data-key-id="` + strings.TrimPrefix(strings.SplitN(rolled, ".", 2)[0], "mon_live_") + `"] `)
	wantScopes(owner, rolledRow, "monitors:read monitors:write monitors:delete")

	// No box checked is everything the role allows.
	owner.do("open the rolled key's settings", chromedp.Click(rolledRow+tid("edit-settings")), chromedp.WaitVisible(rolledRow+tid("save-settings")))
	redit := rolledRow + tid("edit-scopes")
	owner.do("unscope the key",
		chromedp.Click(scopeBox(redit, "monitors:read")),
		chromedp.Click(scopeBox(redit, "monitors:write")),
		chromedp.Click(scopeBox(redit, "monitors:delete")),
		clickThrough(rolledRow+tid("save-settings"), tid("create-key-name")))
	wantScopes(owner, rolledRow, "all")
	if got := bearer(t, base, "/v1/me", rolled); got != 200 {
		t.Fatalf("/v1/me with the rolled key: %d", got)
	}
}

// TestAKeysScopesThroughTheDashboardAPI sets a key's scopes at creation, changes them
// with PATCH and rolls the key, through the gateway and a real stack; every exchange
// is checked against openapi/dashboard.yaml (doRequest). The key works on /v1/me,
// which needs no scope, from the request after each change.
func TestAKeysScopesThroughTheDashboardAPI(t *testing.T) {
	s := newStack(t)
	org, owner := s.newOwner("pro")
	r := owner.do("POST", "/orgs/"+org.ID+"/api-keys", map[string]any{
		"name": "provisioning", "role": "Editor", "scopes": []string{"monitors:write", "monitors:read"},
	}, nil)
	if r.Status != http.StatusCreated {
		t.Fatalf("create: %d %s", r.Status, r.Body)
	}
	created := r.JSON(t)
	id, key := created["id"].(string), created["key"].(string)
	s.neverLog(key)
	if got := string(mustJSON(t, created["scopes"])); got != `["monitors:read","monitors:write"]` {
		t.Errorf("created with scopes %s", got)
	}
	if r := s.api(key, 0).do("GET", "/v1/me", nil); r.Status != http.StatusOK {
		t.Errorf("GET /v1/me with the scoped key: %d %s", r.Status, r.Body)
	}

	path := "/orgs/" + org.ID + "/api-keys/" + id
	for _, st := range []struct {
		body any
		want string
	}{
		{map[string]any{"scopes": []string{"monitors:read"}}, `["monitors:read"]`},
		{map[string]any{"scopes": nil}, `null`},
		{map[string]any{"scopes": []string{"monitors:delete", "monitors:read"}}, `["monitors:read","monitors:delete"]`},
	} {
		r = owner.do("PATCH", path, st.body, nil)
		if r.Status != http.StatusOK {
			t.Fatalf("PATCH %s: %d %s", mustJSON(t, st.body), r.Status, r.Body)
		}
		if got := string(mustJSON(t, r.JSON(t)["scopes"])); got != st.want {
			t.Errorf("PATCH %s answered scopes %s, want %s", mustJSON(t, st.body), got, st.want)
		}
		if r := s.api(key, 1).do("GET", "/v1/me", nil); r.Status != http.StatusOK {
			t.Errorf("GET /v1/me after PATCH %s: %d %s", mustJSON(t, st.body), r.Status, r.Body)
		}
	}
	list := owner.do("GET", "/orgs/"+org.ID+"/api-keys", nil, nil)
	if data := list.JSON(t)["data"].([]any); len(data) != 1 || string(mustJSON(t, data[0].(map[string]any)["scopes"])) != `["monitors:read","monitors:delete"]` {
		t.Errorf("the list has %s", list.Body)
	}
	for _, tc := range []struct {
		name string
		body any
		want string
	}{
		{"no scope", map[string]any{"scopes": []string{}},
			`{"error":"invalid_request","message":"scopes: must list at least one scope, or be null for everything the role allows"}`},
		{"an unknown scope", map[string]any{"scopes": []string{"monitors:admin"}},
			`{"error":"invalid_request","message":"scopes: \"monitors:admin\" is not a scope: use monitors:read, monitors:write or monitors:delete"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantError(t, owner.do("PATCH", path, tc.body, nil), 400, tc.want)
		})
	}

	r = owner.do("POST", path+"/roll", map[string]any{"grace_seconds": 0}, nil)
	if r.Status != http.StatusCreated {
		t.Fatalf("roll: %d %s", r.Status, r.Body)
	}
	if got := string(mustJSON(t, r.JSON(t)["scopes"])); got != `["monitors:read","monitors:delete"]` {
		t.Errorf("the rolled key has scopes %s", got)
	}
	events := owner.do("GET", "/orgs/"+org.ID+"/audit-events", nil, nil).JSON(t)["data"].([]any)
	var updates []string
	for _, e := range events {
		if ev := e.(map[string]any); ev["action"] == "key.updated" {
			updates = append(updates, string(mustJSON(t, ev["changes"])))
		}
	}
	if want := []string{
		`{"scopes":{"from":null,"to":["monitors:read","monitors:delete"]}}`,
		`{"scopes":{"from":["monitors:read"],"to":null}}`,
		`{"scopes":{"from":["monitors:read","monitors:write"],"to":["monitors:read"]}}`,
	}; strings.Join(updates, "\n") != strings.Join(want, "\n") {
		t.Errorf("key.updated events, newest first:\n%s\nwant\n%s", strings.Join(updates, "\n"), strings.Join(want, "\n"))
	}
}

// TestAKeysScopesApplyFromTheNextRequest changes a key's scopes through the dashboard
// API between requests to the gateway: each change decides the very next request,
// on both gateways, as the key's lookup reads the scopes with the key.
func TestAKeysScopesApplyFromTheNextRequest(t *testing.T) {
	s := newStack(t)
	org, owner := s.newOwner("pro")
	r := owner.do("POST", "/orgs/"+org.ID+"/api-keys", map[string]any{
		"name": "ci", "role": "Editor", "scopes": []string{"monitors:read"},
	}, nil)
	if r.Status != http.StatusCreated {
		t.Fatalf("create: %d %s", r.Status, r.Body)
	}
	created := r.JSON(t)
	id, key := created["id"].(string), created["key"].(string)
	s.neverLog(key)
	patch := func(scopes any) {
		t.Helper()
		if r := owner.do("PATCH", "/orgs/"+org.ID+"/api-keys/"+id, map[string]any{"scopes": scopes}, nil); r.Status != http.StatusOK {
			t.Fatalf("PATCH scopes %v: %d %s", scopes, r.Status, r.Body)
		}
	}
	const needsWrite = `{"error":"forbidden","reason":"scope","required_scope":"monitors:write"}`
	for gw := range 2 {
		a := s.api(key, gw)
		if r := a.do("GET", "/v1/monitors", nil); r.Status != http.StatusOK {
			t.Errorf("gateway %d: a read with monitors:read: %d %s", gw, r.Status, r.Body)
		}
		wantError(t, a.do("POST", "/v1/monitors", newMonitor("m")), http.StatusForbidden, needsWrite)
	}

	patch([]string{"monitors:read", "monitors:write"})
	for gw := range 2 {
		if r := s.api(key, gw).do("POST", "/v1/monitors", newMonitor("m")); r.Status != http.StatusCreated {
			t.Errorf("gateway %d: a write after monitors:write was added: %d %s", gw, r.Status, r.Body)
		}
	}

	patch([]string{"monitors:delete"})
	for gw := range 2 {
		wantError(t, s.api(key, gw).do("POST", "/v1/monitors", newMonitor("m")), http.StatusForbidden, needsWrite)
	}

	patch(nil)
	for gw := range 2 {
		if r := s.api(key, gw).do("POST", "/v1/monitors", newMonitor("m")); r.Status != http.StatusCreated {
			t.Errorf("gateway %d: a write after the scopes were removed: %d %s", gw, r.Status, r.Body)
		}
	}
}
