package httpapi_test

import (
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/keygate/keygate/upstream/internal/upstreamtest"
	"github.com/keygate/keygate/upstream/store"
)

// pageSecret finds the secret a webhooks page shows once, HTML-escaped: html/template
// writes base64's + as &#43;.
var pageSecret = regexp.MustCompile(`data-testid="webhook-secret">(whsec_[^<]+)</code>`)

// shownSecret is the secret body shows once, or "".
func shownSecret(body string) string {
	m := pageSecret.FindStringSubmatch(body)
	if m == nil {
		return ""
	}
	return html.UnescapeString(m[1])
}

func TestDashboardWebhooksPageAddsTestsRotatesAndDisables(t *testing.T) {
	e := newWebhookEnv(t)
	org := e.Org("pro")
	owner := e.Person(store.RoleOwner, org)
	base := "/dashboard/orgs/" + org + "/webhooks"

	r := form(owner).Do("POST", base, url.Values{"url": {"ftp://127.0.0.1/"}, "description": {"ops"}}.Encode())
	if r.Status != http.StatusBadRequest || !strings.Contains(r.Body, "url: must be an https URL") || !strings.Contains(r.Body, `value="ftp://127.0.0.1/"`) {
		t.Errorf("a bad URL: %d %s", r.Status, r.Body)
	}
	r = form(owner).Do("POST", base, url.Values{"url": {"http://127.0.0.1:9/hook"}, "description": {"ops"}}.Encode())
	secret := shownSecret(r.Body)
	if r.Status != http.StatusCreated || secret == "" {
		t.Fatalf("add: %d %s", r.Status, r.Body)
	}
	wh, err := e.Store.Webhooks(t.Context(), org)
	if err != nil || len(wh) != 1 || wh[0].Secret != secret {
		t.Fatalf("stored %v, %v; the page showed %s", wh, err, secret)
	}
	id := wh[0].ID
	page := owner.Do("GET", base, "")
	if strings.Contains(page.Body, pageSecret.FindStringSubmatch(r.Body)[1]) || !strings.Contains(page.Body, `data-webhook-id="`+id+`"`) {
		t.Errorf("the list shows the secret again, or not the row: %s", page.Body)
	}

	r = form(owner).Do("POST", base+"/"+id+"/test", "")
	if r.Status != http.StatusSeeOther || r.Header.Get("Location") != base+"/"+id {
		t.Errorf("test: %d %q", r.Status, r.Header.Get("Location"))
	}
	page = owner.Do("GET", base+"/"+id, "")
	if page.Status != 200 || strings.Count(page.Body, `data-testid="delivery-row"`) != 1 || !strings.Contains(page.Body, "webhook.test") {
		t.Errorf("deliveries: %d %s", page.Status, page.Body)
	}

	r = form(owner).Do("POST", base+"/"+id+"/rotate", "")
	if next := shownSecret(r.Body); r.Status != 200 || next == "" || next == secret {
		t.Errorf("rotate: %d %s", r.Status, r.Body)
	}
	r = form(owner).Do("POST", base+"/"+id+"/enabled", url.Values{"enabled": {"false"}}.Encode())
	if r.Status != http.StatusSeeOther || upstreamtest.Scalar[bool](e, `SELECT enabled FROM webhook_endpoints`) {
		t.Errorf("disable: %d, still enabled", r.Status)
	}
	if page := owner.Do("GET", base, ""); !strings.Contains(page.Body, `data-testid="webhook-status">disabled</td>`) {
		t.Errorf("the list does not say disabled: %s", page.Body)
	}
	audited := upstreamtest.Scalar[string](e, `SELECT string_agg(action, ',' ORDER BY id) FROM audit_events WHERE webhook_id = $1`, id)
	if audited != "webhook.created,webhook.secret_rotated,webhook.updated" {
		t.Errorf("audited %s", audited)
	}
}

func TestDashboardWebhooksPageIsForMembersWhoManageKeys(t *testing.T) {
	e := newWebhookEnv(t)
	org := e.Org("pro")
	for _, role := range []string{store.RoleEditor, store.RoleViewer} {
		r := e.Person(role, org).Do("GET", "/dashboard/orgs/"+org+"/webhooks", "")
		if r.Status != http.StatusForbidden {
			t.Errorf("%s: %d", role, r.Status)
		}
	}
	if r := e.Person(store.RoleAdmin, org).Do("GET", "/dashboard/orgs/"+org+"/webhooks", ""); r.Status != 200 {
		t.Errorf("Admin: %d", r.Status)
	}
}

func TestDashboardWebhooksPageEditsChoosesEventsAndDeletes(t *testing.T) {
	e := newWebhookEnv(t)
	org := e.Org("pro")
	owner := e.Person(store.RoleOwner, org)
	base := "/dashboard/orgs/" + org + "/webhooks"

	r := form(owner).Do("POST", base, url.Values{"url": {"http://127.0.0.1:9/hook"}, "events": {"key.revoked", "key.created"}}.Encode())
	if r.Status != http.StatusCreated {
		t.Fatalf("add: %d %s", r.Status, r.Body)
	}
	wh, err := e.Store.Webhooks(t.Context(), org)
	if err != nil || len(wh) != 1 || strings.Join(wh[0].Events, ",") != "key.created,key.revoked" {
		t.Fatalf("stored %+v, %v; want the events checked", wh, err)
	}
	id := wh[0].ID
	edit := base + "/" + id + "/edit"
	for _, tc := range []struct {
		name string
		form url.Values
		want string
	}{
		{"an unknown event", url.Values{"url": {"http://127.0.0.1:9/hook"}, "events": {"key.stolen"}}, "events: must hold only"},
		{"a bad URL", url.Values{"url": {"ftp://127.0.0.1/"}}, "url: must be an https URL"},
		{"a long description", url.Values{"url": {"http://127.0.0.1:9/hook"}, "description": {strings.Repeat("d", 501)}}, "description:"},
	} {
		r := form(owner).Do("POST", edit, tc.form.Encode())
		if r.Status != http.StatusBadRequest || !strings.Contains(html.UnescapeString(r.Body), tc.want) {
			t.Errorf("%s: %d, want 400 saying %q: %s", tc.name, r.Status, tc.want, r.Body)
		}
	}
	r = form(owner).Do("POST", edit, url.Values{"url": {"http://127.0.0.1:9/moved"}, "description": {"moved"}}.Encode())
	if r.Status != http.StatusSeeOther || r.Header.Get("Location") != base {
		t.Errorf("edit: %d %q %s", r.Status, r.Header.Get("Location"), r.Body)
	}
	got, err := e.Store.Webhook(t.Context(), org, id)
	if err != nil || got.URL != "http://127.0.0.1:9/moved" || got.Description != "moved" || len(got.Events) != 0 {
		t.Errorf("after the edit %+v, %v; want the new URL and description, and every event (none checked)", got, err)
	}
	page := owner.Do("GET", base, "")
	if !strings.Contains(page.Body, `data-testid="webhook-chosen">all</td>`) || !strings.Contains(page.Body, "URL (http or https)") {
		t.Errorf("the list: %s", page.Body)
	}

	r = form(owner).Do("POST", base+"/"+id+"/delete", "")
	if r.Status != http.StatusSeeOther || upstreamtest.Scalar[int](e, `SELECT count(*) FROM webhook_endpoints`) != 0 {
		t.Errorf("delete: %d, the endpoint is still there", r.Status)
	}
	upstreamtest.WantStatus(t, form(owner).Do("POST", base+"/"+id+"/delete", ""), http.StatusNotFound)
	audited := upstreamtest.Scalar[string](e, `SELECT string_agg(action, ',' ORDER BY id) FROM audit_events WHERE webhook_id = $1`, id)
	if audited != "webhook.created,webhook.updated,webhook.deleted" {
		t.Errorf("audited %s", audited)
	}
	for _, role := range []string{store.RoleEditor, store.RoleViewer} {
		upstreamtest.WantStatus(t, form(e.Person(role, org)).Do("POST", base+"/"+id+"/edit", url.Values{"url": {"http://127.0.0.1:9/x"}}.Encode()), http.StatusForbidden)
	}
}

func TestDashboardWebhooksFormSaysHTTPSWhereOnlyHTTPSIsAllowed(t *testing.T) {
	e := upstreamtest.NewEnv(t)
	org := e.Org("pro")
	page := e.Person(store.RoleOwner, org).Do("GET", "/dashboard/orgs/"+org+"/webhooks", "")
	if !strings.Contains(page.Body, "URL (https)") || strings.Contains(page.Body, "http or https") {
		t.Errorf("the form's label: %s", page.Body)
	}
}
