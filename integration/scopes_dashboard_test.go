package integration

import (
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
)

// scopeBox is the selector of the checkbox of scope within the group group.
func scopeBox(group chromedp.CSS, scope string) chromedp.CSS {
	return group + chromedp.CSS(` input[name="scopes"][value="`+scope+`"]`)
}

// wantScopes checks the keys page's scopes cell of the row: the scopes separated by
// spaces, or "all".
func wantScopes(tb *tab, row chromedp.CSS, want string) {
	tb.t.Helper()
	if got := strings.Join(strings.Fields(get(tb, "the key's scopes", chromedp.Text(row+tid("key-scopes")))), " "); got != want {
		tb.t.Errorf("the key's scopes show %q, want %q", got, want)
	}
}

// TestDashboardScopesInABrowser creates a scoped key in the dashboard's form in
// headless Chromium, through the gateway: the keys page shows its scopes, its settings
// form has them checked and changes them, and a roll keeps them. The key works on
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
	owner.do("widen the key", chromedp.Click(scopeBox(edit, "monitors:write")),
		clickThrough(row+tid("save-settings"), tid("create-key-name")))
	wantScopes(owner, row, "monitors:read monitors:write")

	// A roll keeps the scopes.
	owner.do("roll", chromedp.SetValue(row+tid("roll-grace"), "0"), chromedp.Click(row+tid("roll")), chromedp.WaitVisible(tid("new-key")))
	rolled := get(owner, "read the rolled key", chromedp.Text(tid("new-key")))
	s.neverLog(rolled)
	rolledRow := chromedp.CSS(`tr[data-key-id="` + strings.TrimPrefix(strings.SplitN(rolled, ".", 2)[0], "mon_live_") + `"] `)
	wantScopes(owner, rolledRow, "monitors:read monitors:write")

	// No box checked is everything the role allows.
	owner.do("open the rolled key's settings", chromedp.Click(rolledRow+tid("edit-settings")), chromedp.WaitVisible(rolledRow+tid("save-settings")))
	redit := rolledRow + tid("edit-scopes")
	owner.do("unscope the key",
		chromedp.Click(scopeBox(redit, "monitors:read")),
		chromedp.Click(scopeBox(redit, "monitors:write")),
		clickThrough(rolledRow+tid("save-settings"), tid("create-key-name")))
	wantScopes(owner, rolledRow, "all")
	if got := bearer(t, base, "/v1/me", rolled); got != 200 {
		t.Fatalf("/v1/me with the rolled key: %d", got)
	}
}
