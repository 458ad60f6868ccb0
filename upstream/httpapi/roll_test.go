package httpapi_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keygate/keygate/upstream/internal/upstreamtest"
	"github.com/keygate/keygate/upstream/store"
)

// newKey creates a key of name and role in org through the route. It returns the key's
// id and full text.
func newKey(t *testing.T, c *upstreamtest.Client, org, body string) (id, full string) {
	t.Helper()
	r := c.Do("POST", "/orgs/"+org+"/api-keys", body)
	upstreamtest.WantStatus(t, r, 201)
	var k struct{ ID, Key string }
	r.Decode(t, &k)
	return k.ID, k.Key
}

// verifies reports whether full is a live key to the gateway's keystore.
func verifies(t *testing.T, e *upstreamtest.Env, full string) bool {
	t.Helper()
	_, ok, err := e.Keys.Verify(context.Background(), full)
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	return ok
}

func TestRollChecksSessionMembershipPermissionPlanBodyAndKeyInThatOrder(t *testing.T) {
	e := upstreamtest.NewEnv(t)
	pro, free, other := e.Org("pro"), e.Org("free"), e.Org("pro")
	owner := e.Person(store.RoleOwner, pro, free)
	editor := e.Person(store.RoleEditor, pro)
	viewer := e.Person(store.RoleViewer, pro)
	outsider := e.Person(store.RoleOwner, other)
	id, full := newKey(t, owner, pro, `{"name":"ci","role":"Admin"}`)
	foreignID, _ := newKey(t, outsider, other, `{"name":"theirs","role":"Admin"}`)
	e.Exec(`INSERT INTO api_keys (key_id, org_id, name, role, secret_hash) VALUES ('FreeFreeFreeFreeFree01', $1, 'f', 'Admin', decode(repeat('00', 32), 'hex'))`, free)
	revokedID, _ := newKey(t, owner, pro, `{"name":"gone","role":"Viewer"}`)
	upstreamtest.WantStatus(t, owner.Do("DELETE", "/orgs/"+pro+"/api-keys/"+revokedID, ""), 204)
	expiredID, _ := newKey(t, owner, pro, `{"name":"old","role":"Viewer"}`)
	e.Exec(`UPDATE api_keys SET expires_at = now() - interval '1 second' WHERE key_id = $1`, expiredID)
	keysBefore := upstreamtest.Scalar[int](e, `SELECT count(*) FROM api_keys`)
	eventsBefore := upstreamtest.Scalar[int](e, `SELECT count(*) FROM audit_events`)

	roll := func(org, id string) string { return "/orgs/" + org + "/api-keys/" + id + "/roll" }
	bad := func(msg string) string {
		return `{"error":"invalid_request","message":` + upstreamtest.JSONBody(msg) + `}`
	}
	conflict := `{"error":"conflict","message":"the key is revoked or expired and cannot be rolled"}`
	for _, tc := range []struct {
		name   string
		c      *upstreamtest.Client
		path   string
		body   string
		status int
		want   string
	}{
		{"no session", e.Anon(), roll(pro, id), `{}`, 401, bodyUnauthenticated},
		{"not a member", outsider, roll(pro, id), `{}`, 404, bodyNotFound},
		{"a malformed org", owner, roll("nope", id), `{}`, 404, bodyNotFound},
		{"an Editor", editor, roll(pro, id), `{}`, 403, bodyForbidden},
		{"a Viewer", viewer, roll(pro, id), `{}`, 403, bodyForbidden},
		{"a plan without API", owner, roll(free, "FreeFreeFreeFreeFree01"), `{}`, 403, bodyAPIGated},
		{"a plan without API and a bad body", owner, roll(free, "FreeFreeFreeFreeFree01"), `{"grace_seconds":-1}`, 403, bodyAPIGated},
		{"a negative grace", owner, roll(pro, id), `{"grace_seconds":-1}`, 400, bad("grace_seconds: must be an integer from 0 to 86400")},
		{"a grace over a day", owner, roll(pro, id), `{"grace_seconds":86401}`, 400, bad("grace_seconds: must be an integer from 0 to 86400")},
		{"a fractional grace", owner, roll(pro, id), `{"grace_seconds":1.5}`, 400, bad("grace_seconds: must be an integer")},
		{"a grace as a string", owner, roll(pro, id), `{"grace_seconds":"60"}`, 400, bad("grace_seconds: must be an integer, not a string")},
		{"a null grace", owner, roll(pro, id), `{"grace_seconds":null}`, 400, bad("grace_seconds: must be an integer, not null")},
		{"an unknown field", owner, roll(pro, id), `{"grace":60}`, 400, bad("grace: unknown field")},
		{"not an object", owner, roll(pro, id), `[60]`, 400, bad("body: must be a JSON object")},
		{"bad JSON", owner, roll(pro, id), `{"grace_seconds":`, 400, bad("body: is not valid JSON")},
		{"a bad body and an unknown key", owner, roll(pro, "BBBBBBBBBBBBBBBBBBBBBB"), `{"grace_seconds":-1}`, 400, bad("grace_seconds: must be an integer from 0 to 86400")},
		{"an unknown key", owner, roll(pro, "BBBBBBBBBBBBBBBBBBBBBB"), `{}`, 404, bodyNotFound},
		{"a malformed key id", owner, roll(pro, "nope"), `{}`, 404, bodyNotFound},
		{"another org's key", owner, roll(pro, foreignID), `{}`, 404, bodyNotFound},
		{"a revoked key", owner, roll(pro, revokedID), `{}`, 409, conflict},
		{"an expired key", owner, roll(pro, expiredID), `{"grace_seconds":60}`, 409, conflict},
	} {
		t.Run(tc.name, func(t *testing.T) {
			upstreamtest.Want(t, tc.c.Do("POST", tc.path, tc.body), tc.status, tc.want)
		})
	}
	if n := upstreamtest.Scalar[int](e, `SELECT count(*) FROM api_keys`); n != keysBefore {
		t.Errorf("refused rolls changed the key count from %d to %d", keysBefore, n)
	}
	if n := upstreamtest.Scalar[int](e, `SELECT count(*) FROM audit_events`); n != eventsBefore {
		t.Errorf("refused rolls wrote %d audit events", n-eventsBefore)
	}
	if n := upstreamtest.Scalar[int](e, `SELECT count(*) FROM api_keys WHERE expires_at IS NOT NULL AND key_id IN ($1, $2)`, id, foreignID); n != 0 || !verifies(t, e, full) {
		t.Errorf("refused rolls touched a live key")
	}
}

func TestRollWithoutGraceReplacesTheKeyAtOnce(t *testing.T) {
	e, org, admin := upstreamtest.NewOrgEnv(t, "pro", store.RoleAdmin)
	oldID, oldFull := newKey(t, admin, org, `{"name":"deploy","role":"Editor"}`)

	// An empty body is a grace of 0.
	r := admin.Do("POST", "/orgs/"+org+"/api-keys/"+oldID+"/roll", "")
	upstreamtest.WantStatus(t, r, 201)
	var created map[string]any
	r.Decode(t, &created)
	if got := upstreamtest.SortedKeys(created); got != "allowed_cidrs,created_at,expires_at,id,key,name,rate_limit,rate_limit_per_day,rate_limit_per_hour,rate_limit_per_second,role,scopes" {
		t.Fatalf("roll answered fields %s", got)
	}
	newID, newFull := created["id"].(string), created["key"].(string)
	if newID == oldID || !strings.HasPrefix(newFull, "mon_live_"+newID+".") {
		t.Errorf("new key %q (id %q) is not a fresh key", newFull, newID)
	}
	if created["name"] != "deploy" || created["role"] != "Editor" || created["expires_at"] != nil {
		t.Errorf("rolled = %v, want the old key's name and role, no expiry", created)
	}
	if verifies(t, e, oldFull) {
		t.Error("the old key still works after a roll without grace")
	}
	if !verifies(t, e, newFull) {
		t.Error("the new key does not work")
	}
	// Rolling the old key again: it has expired.
	upstreamtest.Want(t, admin.Do("POST", "/orgs/"+org+"/api-keys/"+oldID+"/roll", `{"grace_seconds":0}`), 409,
		`{"error":"conflict","message":"the key is revoked or expired and cannot be rolled"}`)
	if got := upstreamtest.Scalar[string](e, `SELECT created_by::text FROM api_keys WHERE key_id = $1`, newID); got == "" {
		t.Error("the new key has no creator")
	}
}

func TestRollWithGraceKeepsTheOldKeyUntilItEndsAndNeverExtendsIt(t *testing.T) {
	e, org, owner := upstreamtest.NewOrgEnv(t, "pro", store.RoleOwner)
	oldID, oldFull := newKey(t, owner, org, `{"name":"ci","role":"Viewer"}`)
	expiresIn := func(id string) float64 {
		return upstreamtest.Scalar[float64](e, `SELECT extract(epoch FROM expires_at - now())::float8 FROM api_keys WHERE key_id = $1`, id)
	}

	r := owner.Do("POST", "/orgs/"+org+"/api-keys/"+oldID+"/roll", `{"grace_seconds":3600}`)
	upstreamtest.WantStatus(t, r, 201)
	var first struct{ ID, Key string }
	r.Decode(t, &first)
	if !verifies(t, e, oldFull) || !verifies(t, e, first.Key) {
		t.Fatal("during the grace both keys must work")
	}
	if d := expiresIn(oldID); d < 3590 || d > 3600 {
		t.Errorf("old key expires in %.0fs, want about 3600s", d)
	}
	// A key in its grace can be rolled again, but its expiry only ever comes closer.
	upstreamtest.WantStatus(t, owner.Do("POST", "/orgs/"+org+"/api-keys/"+oldID+"/roll", `{"grace_seconds":86400}`), 201)
	if d := expiresIn(oldID); d < 3590 || d > 3600 {
		t.Errorf("a longer grace moved the expiry to %.0fs from now", d)
	}
	upstreamtest.WantStatus(t, owner.Do("POST", "/orgs/"+org+"/api-keys/"+oldID+"/roll", `{"grace_seconds":60}`), 201)
	if d := expiresIn(oldID); d < 50 || d > 60 {
		t.Errorf("a shorter grace left the expiry %.0fs from now, want about 60s", d)
	}

	// A key with an expiry passes it to its successor. A grace beyond it does not
	// extend the old key.
	exp := time.Now().Add(10 * time.Minute).UTC().Truncate(time.Second).Format(time.RFC3339)
	limitedID, _ := newKey(t, owner, org, `{"name":"temp","role":"Admin","expires_at":"`+exp+`"}`)
	r = owner.Do("POST", "/orgs/"+org+"/api-keys/"+limitedID+"/roll", `{"grace_seconds":86400}`)
	upstreamtest.WantStatus(t, r, 201)
	var rolled struct {
		ExpiresAt string `json:"expires_at"`
	}
	r.Decode(t, &rolled)
	if rolled.ExpiresAt != exp {
		t.Errorf("new key expires_at = %q, want the old key's %q", rolled.ExpiresAt, exp)
	}
	if got := upstreamtest.Scalar[time.Time](e, `SELECT expires_at FROM api_keys WHERE key_id = $1`, limitedID); got.UTC().Format(time.RFC3339) != exp {
		t.Errorf("old key expires_at moved to %v, want %s", got, exp)
	}
}

func TestConcurrentRollsOfOneKeyWithoutGraceLetOneThrough(t *testing.T) {
	e, org, owner := upstreamtest.NewOrgEnv(t, "pro", store.RoleOwner)
	for round := 0; round < 5; round++ {
		id, _ := newKey(t, owner, org, `{"name":"race","role":"Admin"}`)
		statuses := make([]int, 4)
		var wg sync.WaitGroup
		for i := range statuses {
			wg.Add(1)
			go func() {
				defer wg.Done()
				statuses[i] = owner.Do("POST", "/orgs/"+org+"/api-keys/"+id+"/roll", `{"grace_seconds":0}`).Status
			}()
		}
		wg.Wait()
		created, conflicts := 0, 0
		for _, s := range statuses {
			switch s {
			case 201:
				created++
			case 409:
				conflicts++
			}
		}
		if created != 1 || conflicts != len(statuses)-1 {
			t.Errorf("round %d: statuses %v, want one 201 and the rest 409", round, statuses)
		}
		if n := upstreamtest.Scalar[int](e, `SELECT count(*) FROM audit_events WHERE action = 'key.rolled' AND key_id = $1`, id); n != 1 {
			t.Errorf("round %d: %d key.rolled events, want 1", round, n)
		}
	}
}
