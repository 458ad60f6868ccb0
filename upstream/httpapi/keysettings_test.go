package httpapi_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/keygate/keygate/upstream/internal/upstreamtest"
	"github.com/keygate/keygate/upstream/store"
)

// badRequest is the body of a 400 with message.
func badRequest(message string) string {
	return `{"error":"invalid_request","message":` + upstreamtest.JSONBody(message) + `}`
}

// listEntry returns the list's entry of the key id, as its JSON text.
func listEntry(t *testing.T, c *upstreamtest.Client, org, id string) string {
	t.Helper()
	r := c.Do("GET", "/orgs/"+org+"/api-keys", "")
	upstreamtest.WantStatus(t, r, 200)
	var list struct {
		Data []map[string]any `json:"data"`
	}
	r.Decode(t, &list)
	for _, k := range list.Data {
		if k["id"] == id {
			return upstreamtest.JSONBody(k)
		}
	}
	t.Fatalf("key %s is not in the list %s", id, r.Body)
	return ""
}

// keysAndTrail is what a refused write must leave as it was: every key's row and the
// audit trail.
func keysAndTrail(e *upstreamtest.Env) string {
	return upstreamtest.Scalar[string](e, `SELECT coalesce(string_agg(
		key_id || coalesce(rate_limit::text, '-') || concat_ws('/', rate_limit_per_second, rate_limit_per_hour, rate_limit_per_day)
		|| allowed_cidrs::text || coalesce(revoked_at::text, '-'), ',' ORDER BY key_id), '')
		|| (SELECT count(*)::text FROM audit_events) FROM api_keys`)
}

func TestCreateKeyTakesItsOwnLimitAndNetworks(t *testing.T) {
	_, org, owner := upstreamtest.NewOrgEnv(t, "pro", store.RoleOwner)
	r := owner.Do("POST", "/orgs/"+org+"/api-keys",
		`{"name":"ci","role":"Viewer","rate_limit":60,"allowed_cidrs":["192.0.2.0/24","2001:DB8::/32","198.51.100.7"]}`)
	upstreamtest.WantStatus(t, r, 201)
	var created map[string]any
	r.Decode(t, &created)
	if got := upstreamtest.JSONBody([]any{created["rate_limit"], created["allowed_cidrs"]}); got != `[60,["192.0.2.0/24","2001:db8::/32","198.51.100.7/32"]]` {
		t.Errorf("created with rate_limit and allowed_cidrs %s", got)
	}
	id := created["id"].(string)
	want := `{"allowed_cidrs":["192.0.2.0/24","2001:db8::/32","198.51.100.7/32"],"created_at":` + upstreamtest.JSONBody(created["created_at"]) +
		`,"expires_at":null,"id":"` + id + `","last_used_at":null,"masked_key":"mon_live_` + id + `.********","name":"ci","rate_limit":60,"rate_limit_per_day":null,"rate_limit_per_hour":null,"rate_limit_per_second":null,"revoked_at":null,"role":"Viewer","scopes":null}`
	if got := listEntry(t, owner, org, id); got != want {
		t.Errorf("listed as %s\nwant %s", got, want)
	}

	// Null and [] are the plan's limit and anywhere.
	r = owner.Do("POST", "/orgs/"+org+"/api-keys", `{"name":"plain","role":"Viewer","rate_limit":null,"allowed_cidrs":[]}`)
	upstreamtest.WantStatus(t, r, 201)
	r.Decode(t, &created)
	if got := upstreamtest.JSONBody([]any{created["rate_limit"], created["allowed_cidrs"]}); got != `[null,[]]` {
		t.Errorf("created with null and [] answered %s", got)
	}
}

func TestCreateKeyRefusesBadSettingsAndCreatesNothing(t *testing.T) {
	e := upstreamtest.NewEnv(t)
	pro, enterprise := e.Org("pro"), e.Org("enterprise")
	owner := e.Person(store.RoleOwner, pro, enterprise)
	many := make([]string, 33)
	for i := range many {
		many[i] = fmt.Sprintf(`"10.%d.0.0/16"`, i)
	}
	for _, tc := range []struct{ name, org, members, message string }{
		{"a rate limit of 0", pro, `"rate_limit":0`, "rate_limit: must be from 1 to 600, the plan's api_rate_limit"},
		{"a negative rate limit", pro, `"rate_limit":-5`, "rate_limit: must be from 1 to 600, the plan's api_rate_limit"},
		{"a rate limit over the plan's", pro, `"rate_limit":601`, "rate_limit: must be from 1 to 600, the plan's api_rate_limit"},
		{"a rate limit of 0 on an unlimited plan", enterprise, `"rate_limit":0`, "rate_limit: must be a positive integer"},
		{"a fractional rate limit", pro, `"rate_limit":1.5`, "rate_limit: must be an integer"},
		{"a rate limit in exponent form", pro, `"rate_limit":1e2`, "rate_limit: must be an integer"},
		{"a rate limit as a string", pro, `"rate_limit":"60"`, "rate_limit: must be an integer, not a string"},
		{"a rate limit over 32 bits", enterprise, `"rate_limit":4294967296`, "rate_limit: must be an integer"},
		{"networks as a string", pro, `"allowed_cidrs":"10.0.0.0/8"`, "allowed_cidrs: must be an array of strings, not a string"},
		{"networks as null", pro, `"allowed_cidrs":null`, "allowed_cidrs: must be an array of strings, not null"},
		{"a network as a number", pro, `"allowed_cidrs":[10]`, "allowed_cidrs: must be an array of strings"},
		{"a malformed network", pro, `"allowed_cidrs":["10.0.0/8"]`, `allowed_cidrs: "10.0.0/8" is not an IPv4 or IPv6 CIDR such as 192.0.2.0/24`},
		{"bits after the prefix", pro, `"allowed_cidrs":["10.0.0.1/8"]`, "allowed_cidrs: 10.0.0.1/8 has bits set after its prefix length: write 10.0.0.0/8 for the network, or 10.0.0.1/32 for the one address"},
		{"33 networks", pro, `"allowed_cidrs":[` + strings.Join(many, ",") + `]`, "allowed_cidrs: must list at most 32 networks"},
		{"a network twice", pro, `"allowed_cidrs":["192.0.2.0/24","192.0.2.0/24"]`, "allowed_cidrs: lists 192.0.2.0/24 more than once"},
		{"a good limit and a bad network", pro, `"rate_limit":10,"allowed_cidrs":["x"]`, `allowed_cidrs: "x" is not an IPv4 or IPv6 CIDR such as 192.0.2.0/24`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := keysAndTrail(e)
			upstreamtest.Want(t, owner.Do("POST", "/orgs/"+tc.org+"/api-keys", `{"name":"k","role":"Admin",`+tc.members+`}`),
				400, badRequest(tc.message))
			if after := keysAndTrail(e); after != before {
				t.Errorf("the refused create changed keys or trail: %s, then %s", before, after)
			}
		})
	}
	// The bounds themselves are accepted.
	upstreamtest.WantStatus(t, owner.Do("POST", "/orgs/"+pro+"/api-keys", `{"name":"k","role":"Admin","rate_limit":600,"allowed_cidrs":[`+strings.Join(many[:32], ",")+`]}`), 201)
	upstreamtest.WantStatus(t, owner.Do("POST", "/orgs/"+enterprise+"/api-keys", `{"name":"k","role":"Admin","rate_limit":2147483647}`), 201)
}

func TestUpdateKeyChecksSessionMembershipPermissionBodyThenKeyInThatOrder(t *testing.T) {
	e := upstreamtest.NewEnv(t)
	pro, free, other := e.Org("pro"), e.Org("free"), e.Org("pro")
	owner := e.Person(store.RoleOwner, pro, free)
	editor := e.Person(store.RoleEditor, pro)
	viewer := e.Person(store.RoleViewer, pro)
	outsider := e.Person(store.RoleOwner, other)
	id, _ := newKey(t, owner, pro, `{"name":"ci","role":"Admin","rate_limit":50}`)
	foreignID, _ := newKey(t, outsider, other, `{"name":"theirs","role":"Admin"}`)
	revokedID, _ := newKey(t, owner, pro, `{"name":"gone","role":"Viewer"}`)
	upstreamtest.WantStatus(t, owner.Do("DELETE", "/orgs/"+pro+"/api-keys/"+revokedID, ""), 204)
	expiredID, _ := newKey(t, owner, pro, `{"name":"old","role":"Viewer"}`)
	e.Exec(`UPDATE api_keys SET expires_at = now() - interval '1 second' WHERE key_id = $1`, expiredID)
	e.Exec(`INSERT INTO api_keys (key_id, org_id, name, role, secret_hash) VALUES ('FreeFreeFreeFreeFree01', $1, 'f', 'Admin', decode(repeat('00', 32), 'hex'))`, free)

	path := func(org, id string) string { return "/orgs/" + org + "/api-keys/" + id }
	conflict := `{"error":"conflict","message":"the key is revoked or expired and cannot be changed"}`
	good := `{"rate_limit":20}`
	for _, tc := range []struct {
		name   string
		c      *upstreamtest.Client
		path   string
		body   string
		status int
		want   string
	}{
		{"no session", e.Anon(), path(pro, id), good, 401, bodyUnauthenticated},
		{"no session and a bad body", e.Anon(), path(pro, id), `{"rate_limit":0}`, 401, bodyUnauthenticated},
		{"not a member", outsider, path(pro, id), good, 404, bodyNotFound},
		{"not a member, with a bad body", outsider, path(pro, id), `{`, 404, bodyNotFound},
		{"a malformed org", owner, path("nope", id), good, 404, bodyNotFound},
		{"an Editor", editor, path(pro, id), good, 403, bodyForbidden},
		{"a Viewer with a bad body", viewer, path(pro, id), `{"rate_limit":0}`, 403, bodyForbidden},
		{"an empty body", owner, path(pro, id), "", 400, badRequest("body: must set at least one of rate_limit, rate_limit_per_second, rate_limit_per_hour, rate_limit_per_day, allowed_cidrs and scopes")},
		{"an empty object", owner, path(pro, id), `{}`, 400, badRequest("body: must set at least one of rate_limit, rate_limit_per_second, rate_limit_per_hour, rate_limit_per_day, allowed_cidrs and scopes")},
		{"not an object", owner, path(pro, id), `[]`, 400, badRequest("body: must be a JSON object")},
		{"bad JSON", owner, path(pro, id), `{"rate_limit":`, 400, badRequest("body: is not valid JSON")},
		{"an unknown field", owner, path(pro, id), `{"rate_limit":5,"name":"x"}`, 400, badRequest("name: unknown field")},
		{"a repeated field", owner, path(pro, id), `{"rate_limit":5,"rate_limit":6}`, 400, badRequest("rate_limit: appears more than once")},
		{"a rate limit of 0", owner, path(pro, id), `{"rate_limit":0}`, 400, badRequest("rate_limit: must be from 1 to 600, the plan's api_rate_limit")},
		{"a negative rate limit", owner, path(pro, id), `{"rate_limit":-1}`, 400, badRequest("rate_limit: must be from 1 to 600, the plan's api_rate_limit")},
		{"a rate limit over the plan's", owner, path(pro, id), `{"rate_limit":601}`, 400, badRequest("rate_limit: must be from 1 to 600, the plan's api_rate_limit")},
		{"a fractional rate limit", owner, path(pro, id), `{"rate_limit":2.5}`, 400, badRequest("rate_limit: must be an integer")},
		{"a rate limit as a boolean", owner, path(pro, id), `{"rate_limit":true}`, 400, badRequest("rate_limit: must be an integer, not a boolean")},
		{"a malformed network", owner, path(pro, id), `{"allowed_cidrs":["256.0.0.0/8"]}`, 400, badRequest(`allowed_cidrs: "256.0.0.0/8" is not an IPv4 or IPv6 CIDR such as 192.0.2.0/24`)},
		{"networks as an object", owner, path(pro, id), `{"allowed_cidrs":{}}`, 400, badRequest("allowed_cidrs: must be an array of strings, not an object")},
		{"an IPv4-mapped network", owner, path(pro, id), `{"allowed_cidrs":["::ffff:192.0.2.0/120"]}`, 400, badRequest("allowed_cidrs: ::ffff:192.0.2.0/120 is an IPv4-mapped IPv6 network: write it as IPv4")},
		{"a good limit and a bad network", owner, path(pro, id), `{"rate_limit":10,"allowed_cidrs":["10.0.0.1/8"]}`, 400,
			badRequest("allowed_cidrs: 10.0.0.1/8 has bits set after its prefix length: write 10.0.0.0/8 for the network, or 10.0.0.1/32 for the one address")},
		{"a bad body and an unknown key", owner, path(pro, "BBBBBBBBBBBBBBBBBBBBBB"), `{"rate_limit":0}`, 400, badRequest("rate_limit: must be from 1 to 600, the plan's api_rate_limit")},
		{"an unknown key", owner, path(pro, "BBBBBBBBBBBBBBBBBBBBBB"), good, 404, bodyNotFound},
		{"a malformed key id", owner, path(pro, "nope"), good, 404, bodyNotFound},
		{"another org's key", owner, path(pro, foreignID), good, 404, bodyNotFound},
		{"its own org's path for our key", outsider, path(other, id), good, 404, bodyNotFound},
		{"a revoked key", owner, path(pro, revokedID), good, 409, conflict},
		{"an expired key", owner, path(pro, expiredID), good, 409, conflict},
		{"a rate limit on a plan without API", owner, path(free, "FreeFreeFreeFreeFree01"), good, 400, badRequest("rate_limit: must be null: the plan has no API access")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := keysAndTrail(e)
			upstreamtest.Want(t, tc.c.Do("PATCH", tc.path, tc.body), tc.status, tc.want)
			if after := keysAndTrail(e); after != before {
				t.Errorf("the refused update changed keys or trail: %s, then %s", before, after)
			}
		})
	}
	// A plan without API access still lets its keys be narrowed to networks.
	upstreamtest.WantStatus(t, owner.Do("PATCH", path(free, "FreeFreeFreeFreeFree01"), `{"allowed_cidrs":["192.0.2.0/24"],"rate_limit":null}`), 200)
}

func TestUpdateKeyAnswersTheListedKeyAndAuditsWhatChanged(t *testing.T) {
	e := upstreamtest.NewEnv(t)
	org := e.Org("pro")
	owner := e.Person(store.RoleOwner, org)
	admin := e.Person(store.RoleAdmin, org)
	id, full := newKey(t, owner, org, `{"name":"ci","role":"Editor"}`)
	adminID := upstreamtest.Scalar[string](e, `SELECT m.user_id::text FROM memberships m WHERE m.org_id = $1 AND m.role = 'Admin'`, org)
	path := "/orgs/" + org + "/api-keys/" + id

	steps := []struct {
		body, rateLimit, cidrs, changes string
	}{
		{`{"rate_limit":25}`, `25`, `[]`, `{"rate_limit":{"from":null,"to":25}}`},
		{`{"allowed_cidrs":["2001:DB8:0::/48","192.0.2.9"]}`, `25`, `["2001:db8::/48","192.0.2.9/32"]`, `{"allowed_cidrs":{"from":[],"to":["2001:db8::/48","192.0.2.9/32"]}}`},
		{`{"rate_limit":25,"allowed_cidrs":["2001:db8::/48","192.0.2.9/32"]}`, `25`, `["2001:db8::/48","192.0.2.9/32"]`, ""},
		{`{"allowed_cidrs":[],"rate_limit":null}`, `null`, `[]`, `{"rate_limit":{"from":25,"to":null},"allowed_cidrs":{"from":["2001:db8::/48","192.0.2.9/32"],"to":[]}}`},
	}
	var wantChanges []string
	for _, st := range steps {
		r := admin.Do("PATCH", path, st.body)
		upstreamtest.WantStatus(t, r, 200)
		// The answer is the key as the list shows it, with the new settings.
		entry := listEntry(t, owner, org, id)
		var answered map[string]any
		r.Decode(t, &answered)
		if got := upstreamtest.JSONBody(answered); got != entry {
			t.Errorf("PATCH %s answered %s\nthe list has %s", st.body, got, entry)
		}
		if !strings.Contains(entry, `"rate_limit":`+st.rateLimit+`,`) || !strings.Contains(entry, `"allowed_cidrs":`+st.cidrs+`,`) {
			t.Errorf("after PATCH %s the key is %s; want rate_limit %s, allowed_cidrs %s", st.body, entry, st.rateLimit, st.cidrs)
		}
		if st.changes != "" {
			wantChanges = append([]string{st.changes}, wantChanges...)
		}
		var page struct {
			Data []struct {
				Action  string          `json:"action"`
				KeyID   string          `json:"key_id"`
				Actor   string          `json:"actor"`
				Changes json.RawMessage `json:"changes"`
			} `json:"data"`
		}
		owner.Do("GET", "/orgs/"+org+"/audit-events", "").Decode(t, &page)
		var got []string
		for _, ev := range page.Data {
			if ev.Action == "key.updated" {
				if ev.KeyID != id || ev.Actor != adminID {
					t.Errorf("key.updated of %s by %s, want %s by %s", ev.KeyID, ev.Actor, id, adminID)
				}
				got = append(got, string(ev.Changes))
			}
		}
		if strings.Join(got, "\n") != strings.Join(wantChanges, "\n") {
			t.Errorf("after PATCH %s the trail's changes are\n%s\nwant\n%s", st.body, strings.Join(got, "\n"), strings.Join(wantChanges, "\n"))
		}
	}
	// The audit answer names the changes; the other events have none.
	r := owner.Do("GET", "/orgs/"+org+"/audit-events?limit=1", "")
	if !strings.Contains(r.Body, `"action":"key.updated","key_id":"`+id+`","actor":"`+adminID+`","changes":{"rate_limit":{"from":25,"to":null},"allowed_cidrs":{"from":["2001:db8::/48","192.0.2.9/32"],"to":[]}},"at":"`) {
		t.Errorf("the newest event is %s", r.Body)
	}
	r = owner.Do("GET", "/orgs/"+org+"/audit-events", "")
	if strings.Count(r.Body, `"changes"`) != 3 {
		t.Errorf("want changes on the three key.updated events only: %s", r.Body)
	}
	if !verifies(t, e, full) {
		t.Error("the key stopped working after its updates")
	}
}

func TestRollKeepsTheKeysSettings(t *testing.T) {
	e, org, owner := upstreamtest.NewOrgEnv(t, "pro", store.RoleOwner)
	id, _ := newKey(t, owner, org, `{"name":"ci","role":"Editor","rate_limit":9,"allowed_cidrs":["192.0.2.0/24"]}`)
	r := owner.Do("POST", "/orgs/"+org+"/api-keys/"+id+"/roll", `{"grace_seconds":0}`)
	upstreamtest.WantStatus(t, r, 201)
	var rolled map[string]any
	r.Decode(t, &rolled)
	if got := upstreamtest.JSONBody([]any{rolled["rate_limit"], rolled["allowed_cidrs"]}); got != `[9,["192.0.2.0/24"]]` {
		t.Errorf("the rolled key has %s", got)
	}
	if n := upstreamtest.Scalar[int](e, `SELECT count(*) FROM api_keys WHERE rate_limit = 9 AND allowed_cidrs = '{192.0.2.0/24}'`); n != 2 {
		t.Errorf("%d keys with the settings, want the old and the new", n)
	}
}
