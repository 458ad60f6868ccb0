package httpapi_test

import (
	"context"
	"encoding/json"
	"html"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/upstream/internal/upstreamtest"
	"github.com/keygate/keygate/upstream/store"
)

// keysScopesAndTrail is what a refused write of scopes must leave as it was: every
// key's scopes and the audit trail.
func keysScopesAndTrail(e *upstreamtest.Env) string {
	return upstreamtest.Scalar[string](e, `SELECT coalesce(string_agg(key_id || coalesce(scopes::text, '-'), ',' ORDER BY key_id), '')
		|| (SELECT count(*)::text FROM audit_events) FROM api_keys`)
}

// keyScopes returns the scopes the gateway's lookup finds for full, "null" for none.
func keyScopes(t *testing.T, e *upstreamtest.Env, full string) string {
	t.Helper()
	k, ok, err := e.Keys.Verify(context.Background(), full)
	if err != nil || !ok {
		t.Fatalf("Verify = %v, %v", ok, err)
	}
	return upstreamtest.JSONBody(k.Scopes)
}

func TestCreateKeyTakesScopesAndTheListShowsThem(t *testing.T) {
	e, org, owner := upstreamtest.NewOrgEnv(t, "pro", store.RoleOwner)
	r := owner.Do("POST", "/orgs/"+org+"/api-keys", `{"name":"provisioning","role":"Editor","scopes":["monitors:write","monitors:read"]}`)
	upstreamtest.WantStatus(t, r, 201)
	var created map[string]any
	r.Decode(t, &created)
	// The scopes come back in the vocabulary's order, whatever order they were sent in.
	if got := upstreamtest.JSONBody(created["scopes"]); got != `["monitors:read","monitors:write"]` {
		t.Errorf("created with scopes %s", got)
	}
	id, full := created["id"].(string), created["key"].(string)
	if got := listEntry(t, owner, org, id); !strings.Contains(got, `"scopes":["monitors:read","monitors:write"]`) {
		t.Errorf("listed as %s", got)
	}
	if got := keyScopes(t, e, full); got != `["monitors:read","monitors:write"]` {
		t.Errorf("the gateway's lookup finds scopes %s", got)
	}

	// Absent and null are everything the role allows: null in every answer.
	for _, body := range []string{`{"name":"plain","role":"Viewer"}`, `{"name":"plain","role":"Viewer","scopes":null}`} {
		r = owner.Do("POST", "/orgs/"+org+"/api-keys", body)
		upstreamtest.WantStatus(t, r, 201)
		created = nil
		r.Decode(t, &created)
		if v, ok := created["scopes"]; !ok || v != nil {
			t.Errorf("%s: created with scopes %v (present %v), want null", body, v, ok)
		}
		if got := listEntry(t, owner, org, created["id"].(string)); !strings.Contains(got, `"scopes":null`) {
			t.Errorf("%s: listed as %s", body, got)
		}
		if got := keyScopes(t, e, created["key"].(string)); got != "null" {
			t.Errorf("%s: the gateway's lookup finds scopes %s", body, got)
		}
	}
}

// TestBadScopesAreRefusedAtEveryDoor: the same bad scopes get the same 400 from the
// create and the PATCH, and change nothing.
func TestBadScopesAreRefusedAtEveryDoor(t *testing.T) {
	e, org, owner := upstreamtest.NewOrgEnv(t, "pro", store.RoleOwner)
	id, _ := newKey(t, owner, org, `{"name":"kept","role":"Admin","scopes":["monitors:read"]}`)
	const unknown = `scopes: "monitors:admin" is not a scope: use monitors:read, monitors:write or monitors:delete`
	for _, tc := range []struct{ name, members, message string }{
		{"empty", `"scopes":[]`, "scopes: must list at least one scope, or be null for everything the role allows"},
		{"unknown", `"scopes":["monitors:read","monitors:admin"]`, unknown},
		{"another case", `"scopes":["MONITORS:READ"]`, `scopes: "MONITORS:READ" is not a scope: a scope matches [a-z][a-z0-9_.:-]*`},
		{"twice", `"scopes":["monitors:write","monitors:write"]`, "scopes: lists monitors:write more than once"},
		{"a string", `"scopes":"monitors:read"`, "scopes: must be an array of strings or null, not a string"},
		{"an object", `"scopes":{}`, "scopes: must be an array of strings or null, not an object"},
		{"a number in the list", `"scopes":[1]`, "scopes: must be an array of strings or null"},
		{"a null in the list", `"scopes":[null]`, "scopes: must be an array of strings or null"},
		{"a good limit and bad scopes", `"rate_limit":10,"scopes":["monitors:admin"]`, unknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := keysScopesAndTrail(e)
			upstreamtest.Want(t, owner.Do("POST", "/orgs/"+org+"/api-keys", `{"name":"k","role":"Admin",`+tc.members+`}`), 400, badRequest(tc.message))
			upstreamtest.Want(t, owner.Do("PATCH", "/orgs/"+org+"/api-keys/"+id, `{`+tc.members+`}`), 400, badRequest(tc.message))
			if after := keysScopesAndTrail(e); after != before {
				t.Errorf("a refused write changed keys or trail: %s, then %s", before, after)
			}
		})
	}
}

// TestTheVocabularyIsTheOperators: a scope the operator adds is offered by the
// dashboard and accepted by both doors at once, in the vocabulary's order; one the
// operator deletes is neither.
func TestTheVocabularyIsTheOperators(t *testing.T) {
	e, org, owner := upstreamtest.NewOrgEnv(t, "pro", store.RoleOwner)
	st := store.New(e.Pool)
	if _, err := st.PutScope(t.Context(), keystore.Scope{Name: "reports:read", Description: "Read reports"}); err != nil {
		t.Fatal(err)
	}
	page := owner.Do("GET", "/dashboard/orgs/"+org, "").Body
	if want := `<label title="Read reports"><input name="scopes" type="checkbox" value="reports:read"> reports:read</label>`; !strings.Contains(page, want) {
		t.Errorf("the keys page lacks %s", want)
	}
	id, _ := newKey(t, owner, org, `{"name":"r","role":"Viewer","scopes":["reports:read","monitors:read"]}`)
	if got := listEntry(t, owner, org, id); !strings.Contains(got, `"scopes":["monitors:read","reports:read"]`) {
		t.Errorf("listed as %s", got)
	}
	upstreamtest.WantStatus(t, owner.Do("PATCH", "/orgs/"+org+"/api-keys/"+id, `{"scopes":["monitors:read"]}`), 200)
	if _, err := st.DeleteScope(t.Context(), "reports:read"); err != nil {
		t.Fatal(err)
	}
	const gone = `scopes: "reports:read" is not a scope: use monitors:read, monitors:write or monitors:delete`
	upstreamtest.Want(t, owner.Do("PATCH", "/orgs/"+org+"/api-keys/"+id, `{"scopes":["reports:read"]}`), 400, badRequest(gone))
	upstreamtest.Want(t, owner.Do("POST", "/orgs/"+org+"/api-keys", `{"name":"k","role":"Admin","scopes":["reports:read"]}`), 400, badRequest(gone))
	if page := owner.Do("GET", "/dashboard/orgs/"+org, "").Body; strings.Contains(page, "reports:read") {
		t.Error("the keys page still offers a deleted scope")
	}
}

// TestUpdateKeyChangesTheScopesFromTheNextRequestAndAuditsThem: each PATCH of scopes
// answers the key as listed, is what the gateway's next lookup finds, and is audited
// with its before and after; the same scopes again audit nothing.
func TestUpdateKeyChangesTheScopesFromTheNextRequestAndAuditsThem(t *testing.T) {
	e, org, owner := upstreamtest.NewOrgEnv(t, "pro", store.RoleOwner)
	id, full := newKey(t, owner, org, `{"name":"ci","role":"Editor"}`)
	path := "/orgs/" + org + "/api-keys/" + id
	var wantChanges []string
	for _, st := range []struct{ body, scopes, changes string }{
		{`{"scopes":["monitors:read"]}`, `["monitors:read"]`, `{"scopes":{"from":null,"to":["monitors:read"]}}`},
		{`{"scopes":["monitors:read"]}`, `["monitors:read"]`, ""},
		{`{"scopes":["monitors:delete","monitors:write","monitors:read"]}`, `["monitors:read","monitors:write","monitors:delete"]`,
			`{"scopes":{"from":["monitors:read"],"to":["monitors:read","monitors:write","monitors:delete"]}}`},
		{`{"rate_limit":5,"scopes":["monitors:write"]}`, `["monitors:write"]`,
			`{"rate_limit":{"from":null,"to":5},"scopes":{"from":["monitors:read","monitors:write","monitors:delete"],"to":["monitors:write"]}}`},
		{`{"allowed_cidrs":["192.0.2.0/24"]}`, `["monitors:write"]`, `{"allowed_cidrs":{"from":[],"to":["192.0.2.0/24"]}}`},
		{`{"scopes":null}`, `null`, `{"scopes":{"from":["monitors:write"],"to":null}}`},
	} {
		r := owner.Do("PATCH", path, st.body)
		upstreamtest.WantStatus(t, r, 200)
		entry := listEntry(t, owner, org, id)
		var answered map[string]any
		r.Decode(t, &answered)
		if got := upstreamtest.JSONBody(answered); got != entry {
			t.Errorf("PATCH %s answered %s\nthe list has %s", st.body, got, entry)
		}
		if !strings.Contains(entry, `"scopes":`+st.scopes) {
			t.Errorf("after PATCH %s the key is %s; want scopes %s", st.body, entry, st.scopes)
		}
		if got := keyScopes(t, e, full); got != st.scopes {
			t.Errorf("after PATCH %s the gateway's lookup finds scopes %s, want %s", st.body, got, st.scopes)
		}
		if st.changes != "" {
			wantChanges = append([]string{st.changes}, wantChanges...)
		}
		var page struct {
			Data []struct {
				Action  string          `json:"action"`
				Changes json.RawMessage `json:"changes"`
			} `json:"data"`
		}
		owner.Do("GET", "/orgs/"+org+"/audit-events", "").Decode(t, &page)
		var got []string
		for _, ev := range page.Data {
			if ev.Action == "key.updated" {
				got = append(got, string(ev.Changes))
			}
		}
		if !slices.Equal(got, wantChanges) {
			t.Errorf("after PATCH %s the trail's changes are\n%s\nwant\n%s", st.body, strings.Join(got, "\n"), strings.Join(wantChanges, "\n"))
		}
	}
}

func TestRollKeepsTheKeysScopes(t *testing.T) {
	e, org, owner := upstreamtest.NewOrgEnv(t, "pro", store.RoleOwner)
	id, _ := newKey(t, owner, org, `{"name":"ci","role":"Editor","scopes":["monitors:read"]}`)
	r := owner.Do("POST", "/orgs/"+org+"/api-keys/"+id+"/roll", `{"grace_seconds":0}`)
	upstreamtest.WantStatus(t, r, 201)
	var rolled struct {
		ID     string
		Key    string
		Scopes []string
	}
	r.Decode(t, &rolled)
	if !slices.Equal(rolled.Scopes, []string{"monitors:read"}) {
		t.Errorf("the rolled key has scopes %q", rolled.Scopes)
	}
	if got := keyScopes(t, e, rolled.Key); got != `["monitors:read"]` {
		t.Errorf("the gateway's lookup finds the rolled key's scopes %s", got)
	}
}

func TestDashboardCreatesAndEditsAKeysScopes(t *testing.T) {
	e, org, owner := upstreamtest.NewOrgEnv(t, "pro", store.RoleOwner)
	page := owner.Do("GET", "/dashboard/orgs/"+org, "").Body
	for _, field := range []string{
		`<fieldset class="scopes" data-testid="create-key-scopes">`,
		`<label title="List and read monitors"><input name="scopes" type="checkbox" value="monitors:read"> monitors:read</label>`,
		`<label title="Create and change monitors"><input name="scopes" type="checkbox" value="monitors:write"> monitors:write</label>`,
		`<label title="Delete monitors"><input name="scopes" type="checkbox" value="monitors:delete"> monitors:delete</label>`,
	} {
		if !strings.Contains(page, field) {
			t.Errorf("the keys page lacks %s", field)
		}
	}

	r := form(owner).Do("POST", "/dashboard/orgs/"+org+"/keys", url.Values{"name": {"ci"}, "role": {"Editor"},
		"scopes": {"monitors:write", "monitors:read"}}.Encode())
	if r.Status != http.StatusCreated {
		t.Fatalf("create: %d %s", r.Status, r.Body)
	}
	full := fullKeyPattern.FindString(r.Body)
	id := strings.TrimPrefix(full[:strings.IndexByte(full, '.')], "mon_live_")
	if got := listEntry(t, owner, org, id); !strings.Contains(got, `"scopes":["monitors:read","monitors:write"]`) {
		t.Errorf("the form created %s", got)
	}
	if got := scopesCell(t, r.Body, id); got != `<span class="muted">scopes:</span> <code>monitors:read</code> <code>monitors:write</code>` {
		t.Errorf("the row shows scopes %q", got)
	}
	edit := settingsForm(t, r.Body, id)
	for _, want := range []string{`value="monitors:read" checked>`, `value="monitors:write" checked>`, `value="monitors:delete">`} {
		if !strings.Contains(edit, want) {
			t.Errorf("the settings form lacks %s:\n%s", want, edit)
		}
	}

	// The settings form sets the scopes with the other settings; none checked is
	// everything the role allows.
	settings := "/dashboard/orgs/" + org + "/keys/" + id + "/settings"
	r = form(owner).Do("POST", settings, url.Values{"rate_limit": {""}, "allowed_cidrs": {""}, "scopes": {"monitors:delete"}}.Encode())
	if r.Status != http.StatusSeeOther {
		t.Fatalf("settings form: %d %s", r.Status, r.Body)
	}
	if got := keyScopes(t, e, full); got != `["monitors:delete"]` {
		t.Errorf("after the settings form the lookup finds %s", got)
	}
	r = form(owner).Do("POST", settings, url.Values{"rate_limit": {""}, "allowed_cidrs": {""}}.Encode())
	if r.Status != http.StatusSeeOther {
		t.Fatalf("settings form: %d %s", r.Status, r.Body)
	}
	if got := keyScopes(t, e, full); got != "null" {
		t.Errorf("after unchecking every scope the lookup finds %s", got)
	}
	page = owner.Do("GET", "/dashboard/orgs/"+org, "").Body
	if got := scopesCell(t, page, id); got != `<span class="muted">scopes:</span> all` {
		t.Errorf("an unscoped key's row shows %q", got)
	}
	audit := owner.Do("GET", "/dashboard/orgs/"+org+"/audit", "").Body
	for _, words := range []string{
		"scopes: monitors:read, monitors:write → monitors:delete",
		"scopes: monitors:delete → all the role allows",
	} {
		if !strings.Contains(audit, `data-testid="audit-changes">`+words+`<`) {
			t.Errorf("the audit page does not say %q:\n%s", words, audit)
		}
	}

	// A bad scope is refused with the JSON API's message, the boxes as they were sent.
	for _, door := range []string{"/dashboard/orgs/" + org + "/keys", settings} {
		before := keysScopesAndTrail(e)
		r = form(owner).Do("POST", door, url.Values{"name": {"n"}, "role": {"Admin"}, "scopes": {"monitors:read", "monitors:admin"}}.Encode())
		words := `Please check the form: scopes: "monitors:admin" is not a scope: use monitors:read, monitors:write or monitors:delete.`
		if r.Status != http.StatusBadRequest || !strings.Contains(r.Body, html.EscapeString(words)) {
			t.Errorf("%s: %d, want 400 with %q: %s", door, r.Status, words, r.Body)
		}
		if after := keysScopesAndTrail(e); after != before {
			t.Errorf("%s: a refused form changed keys or trail: %s, then %s", door, before, after)
		}
		if door == settings {
			if edit := settingsForm(t, r.Body, id); !strings.Contains(edit, `value="monitors:read" checked>`) {
				t.Errorf("the settings form is not sent back as it was:\n%s", edit)
			}
		} else if !strings.Contains(r.Body, `<input name="scopes" type="checkbox" value="monitors:read" checked> monitors:read</label>`) {
			t.Errorf("the create form is not sent back as it was:\n%s", r.Body)
		}
	}
}

// keyRow returns the keys page's row of the key id.
func keyRow(t *testing.T, page, id string) string {
	t.Helper()
	_, row, ok := strings.Cut(page, `data-key-id="`+id+`"`)
	if !ok {
		t.Fatalf("no row of %s on the page:\n%s", id, page)
	}
	row, _, _ = strings.Cut(row, "</tr>")
	return row
}

// scopesCell returns the markup of the scopes of the key id, in its row's first cell.
func scopesCell(t *testing.T, page, id string) string {
	t.Helper()
	_, rest, ok := strings.Cut(keyRow(t, page, id), `data-testid="key-scopes">`)
	if !ok {
		t.Fatalf("no key-scopes in the row of %s", id)
	}
	v, _, _ := strings.Cut(rest, "</span></td>")
	return v
}

// settingsForm returns the scopes of the settings form of the key id.
func settingsForm(t *testing.T, page, id string) string {
	t.Helper()
	_, rest, ok := strings.Cut(keyRow(t, page, id), `data-testid="edit-scopes">`)
	if !ok {
		t.Fatalf("no edit-scopes in the row of %s", id)
	}
	v, _, _ := strings.Cut(rest, "</fieldset>")
	return v
}
