package integration

import (
	"context"
	"encoding/base64"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"
)

const unauthenticated = `{"error":"api key unauthenticated"}`

func TestKeyLifeCycleAsAPersonDoesIt(t *testing.T) {
	s := newStack(t)
	org, owner := s.newOwner("pro")

	// Create: the full key, once.
	r := owner.do("POST", "/orgs/"+org.ID+"/api-keys", map[string]any{"name": "ci deploys", "role": "Editor"}, nil)
	if r.Status != http.StatusCreated {
		t.Fatalf("create key: %d %s", r.Status, r.Body)
	}
	created := r.JSON(t)
	key, _ := created["key"].(string)
	id, _ := created["id"].(string)
	s.neverLog(key)
	if !regexp.MustCompile(`^mon_live_` + regexp.QuoteMeta(id) + `\.[A-Za-z0-9_-]{43,}$`).MatchString(key) {
		t.Fatalf("created key %q does not have the form mon_live_<id>.<secret>", key)
	}
	for _, f := range []string{"id", "name", "role", "created_at", "expires_at", "key"} {
		if _, ok := created[f]; !ok {
			t.Errorf("create response lacks %q: %s", f, r.Body)
		}
	}
	if created["name"] != "ci deploys" || created["role"] != "Editor" || created["expires_at"] != nil {
		t.Errorf("create response %s", r.Body)
	}

	// Use it.
	me := s.api(key, 0).do("GET", "/v1/me", nil)
	if me.Status != http.StatusOK {
		t.Fatalf("GET /v1/me: %d %s", me.Status, me.Body)
	}
	if want := proMe(org.ID, "Editor"); !jsonEqual(me.Body, []byte(want)) {
		t.Errorf("GET /v1/me = %s, want %s", me.Body, want)
	}

	// List: masked, never the secret.
	_, secret, _ := strings.Cut(key, ".")
	list := owner.do("GET", "/orgs/"+org.ID+"/api-keys", nil, nil)
	if list.Status != http.StatusOK {
		t.Fatalf("list keys: %d %s", list.Status, list.Body)
	}
	if strings.Contains(string(list.Body), secret) || strings.Contains(string(list.Body), `"key"`) {
		t.Errorf("the key list shows the secret: %s", list.Body)
	}
	data, _ := list.JSON(t)["data"].([]any)
	if len(data) != 1 {
		t.Fatalf("list %s, want one key", list.Body)
	}
	entry := data[0].(map[string]any)
	if entry["masked_key"] != "mon_live_"+id+".********" || entry["id"] != id || entry["revoked_at"] != nil {
		t.Errorf("list entry %v", entry)
	}

	// Revoke: the next request is refused.
	if r := owner.do("DELETE", "/orgs/"+org.ID+"/api-keys/"+id, nil, nil); r.Status != http.StatusNoContent {
		t.Fatalf("revoke: %d %s", r.Status, r.Body)
	}
	for i := range 2 {
		wantError(t, s.api(key, i).do("GET", "/v1/me", nil), 401, unauthenticated)
	}
	list = owner.do("GET", "/orgs/"+org.ID+"/api-keys", nil, nil)
	if entry := list.JSON(t)["data"].([]any)[0].(map[string]any); entry["revoked_at"] == nil {
		t.Errorf("revoked key lists revoked_at null: %v", entry)
	}
	// Revoking again is fine; another org's id is not found.
	if r := owner.do("DELETE", "/orgs/"+org.ID+"/api-keys/"+id, nil, nil); r.Status != http.StatusNoContent {
		t.Errorf("second revoke: %d %s", r.Status, r.Body)
	}
	other := s.newOrg("pro")
	otherID, otherKey := s.loginOwner(other).createKey(other.ID, "theirs", "Admin", nil)
	wantError(t, owner.do("DELETE", "/orgs/"+org.ID+"/api-keys/"+otherID, nil, nil), 404, `{"error":"not found"}`)
	if r := s.api(otherKey, 0).do("GET", "/v1/me", nil); r.Status != 200 {
		t.Errorf("the other org's key stopped working: %d %s", r.Status, r.Body)
	}
}

func TestExpiryTakesEffectOnTheNextRequest(t *testing.T) {
	s := newStack(t)
	org, owner := s.newOwner("pro")
	exp := time.Now().Add(time.Hour).Truncate(time.Second)
	id, key := owner.createKey(org.ID, "short-lived", "Viewer", &exp)
	if r := s.api(key, 0).do("GET", "/v1/me", nil); r.Status != 200 {
		t.Fatalf("an hour before its expiry: %d %s", r.Status, r.Body)
	}
	// The clock seam: the expiry is moved to a second ago, not waited for, so a busy
	// machine that takes seconds between two requests cannot expire the key early.
	tag, err := s.dbConn().Exec(context.Background(),
		`UPDATE api_keys SET expires_at = now() - interval '1 second' WHERE key_id = $1`, id)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("moving the expiry into the past: %v, %d rows", err, tag.RowsAffected())
	}
	wantError(t, s.api(key, 0).do("GET", "/v1/me", nil), 401, unauthenticated)
	wantError(t, s.api(key, 1).do("GET", "/v1/monitors", nil), 401, unauthenticated)

	// An expiry in the past is refused at creation.
	past := time.Now().Add(-time.Minute)
	r := owner.do("POST", "/orgs/"+org.ID+"/api-keys", map[string]any{"name": "x", "role": "Viewer",
		"expires_at": past.UTC().Format(time.RFC3339)}, nil)
	if r.Status != 400 || r.JSON(t)["error"] != "invalid_request" {
		t.Errorf("a key expiring in the past: %d %s", r.Status, r.Body)
	}
}

// TestEveryCredentialShapeGetsTheSame401 sends every way of presenting a key wrongly
// and requires byte-identical answers: status, headers (but Date) and body.
func TestEveryCredentialShapeGetsTheSame401(t *testing.T) {
	s := newStack(t)
	org, owner := s.newOwner("pro")
	revokedID, revoked := owner.createKey(org.ID, "revoked", "Admin", nil)
	owner.do("DELETE", "/orgs/"+org.ID+"/api-keys/"+revokedID, nil, nil)
	_, key := owner.createKey(org.ID, "good", "Admin", nil)
	keyID, secret, _ := strings.Cut(strings.TrimPrefix(key, "mon_live_"), ".")
	session := owner.sessionCookie()

	h := func(kv ...string) http.Header {
		out := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			out.Add(kv[i], kv[i+1])
		}
		return out
	}
	flip := func(s string) string {
		b := []byte(s)
		for i, c := range b {
			if c >= 'a' && c <= 'z' {
				b[i] = c - 32
				return string(b)
			}
		}
		return s
	}
	cases := []struct {
		name   string
		path   string
		header http.Header
	}{
		{"no Authorization", "/v1/me", nil},
		{"empty Authorization", "/v1/me", h("Authorization", "")},
		{"scheme only", "/v1/me", h("Authorization", "Bearer")},
		{"scheme and space only", "/v1/me", h("Authorization", "Bearer ")},
		{"no scheme", "/v1/me", h("Authorization", key)},
		{"Basic with the key as user", "/v1/me", h("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(key+":")))},
		{"Basic with the key as password", "/v1/me", h("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("x:"+key)))},
		{"Token scheme", "/v1/me", h("Authorization", "Token "+key)},
		{"tab instead of space", "/v1/me", h("Authorization", "Bearer\t"+key)},
		{"no space", "/v1/me", h("Authorization", "Bearer"+key)},
		{"two Authorization headers", "/v1/me", h("Authorization", "Bearer "+key, "Authorization", "Bearer "+key)},
		{"key in api_key query", "/v1/me?api_key=" + key, nil},
		{"key in access_token query", "/v1/me?access_token=" + key, nil},
		{"key in a cookie", "/v1/me", h("Cookie", "api_key="+key)},
		{"dashboard session cookie", "/v1/me", h("Cookie", "session="+session)},
		{"X-API-Key header", "/v1/me", h("X-API-Key", key)},
		{"quoted key", "/v1/me", h("Authorization", `Bearer "`+key+`"`)},
		{"trailing garbage", "/v1/me", h("Authorization", "Bearer "+key+"x")},
		{"truncated secret", "/v1/me", h("Authorization", "Bearer "+key[:len(key)-1])},
		{"wrong prefix", "/v1/me", h("Authorization", "Bearer abc_live_"+keyID+"."+secret)},
		{"test instead of live", "/v1/me", h("Authorization", "Bearer mon_test_"+keyID+"."+secret)},
		{"upper-case prefix", "/v1/me", h("Authorization", "Bearer MON_live_"+keyID+"."+secret)},
		{"no dot", "/v1/me", h("Authorization", "Bearer mon_live_"+keyID+secret)},
		{"key id only", "/v1/me", h("Authorization", "Bearer mon_live_"+keyID)},
		{"case-flipped secret", "/v1/me", h("Authorization", "Bearer mon_live_"+keyID+"."+flip(secret))},
		{"case-flipped key id", "/v1/me", h("Authorization", "Bearer mon_live_"+strings.ToLower(keyID)+"."+secret)},
		{"unknown key id", "/v1/me", h("Authorization", "Bearer mon_live_"+strings.Repeat("Z", 22)+"."+secret)},
		{"revoked key", "/v1/me", h("Authorization", "Bearer "+revoked)},
		{"revoked key on another route", "/v1/monitors", h("Authorization", "Bearer "+revoked)},
		{"malformed on a write", "/v1/monitors", h("Authorization", "Bearer nope")},
	}
	var first *Resp
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			method := "GET"
			if tc.name == "malformed on a write" {
				method = "POST"
			}
			r := s.raw(method, s.URL(0)+tc.path, nil, tc.header)
			wantError(t, r, 401, unauthenticated)
			if r.Header.Get("WWW-Authenticate") != "Bearer" {
				t.Errorf("WWW-Authenticate %q, want Bearer", r.Header.Get("WWW-Authenticate"))
			}
			if first == nil {
				first = &r
				return
			}
			if d := headerDiff(first.Header, r.Header); d != "" {
				t.Errorf("headers differ from the first 401: %s", d)
			}
			if string(r.Body) != string(first.Body) {
				t.Errorf("body %q differs from the first 401's %q", r.Body, first.Body)
			}
		})
	}

	// The well-formed variants that must work, so the cases above fail for the right reason.
	// Whitespace around a header's value is not part of it (RFC 9110 §5.5), so a
	// trailing space is well-formed too.
	for _, auth := range []string{"Bearer " + key, "bearer " + key, "BEARER " + key, "Bearer   " + key, "Bearer " + key + " "} {
		if r := s.raw("GET", s.URL(0)+"/v1/me", nil, h("Authorization", auth)); r.Status != 200 {
			t.Errorf("Authorization %.10q…: %d %s, want 200", auth, r.Status, r.Body)
		}
	}
}

// headerDiff describes how two header sets differ, Date aside.
func headerDiff(a, b http.Header) string {
	var d []string
	for k := range a {
		if k != "Date" && strings.Join(a[k], ",") != strings.Join(b[k], ",") {
			d = append(d, k+": "+strings.Join(a[k], ",")+" vs "+strings.Join(b[k], ","))
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok && k != "Date" {
			d = append(d, k+" only in the second: "+strings.Join(b[k], ","))
		}
	}
	return strings.Join(d, "; ")
}

// sessionCookie returns the value of c's session cookie.
func (c *Client) sessionCookie() string {
	c.s.t.Helper()
	req, _ := http.NewRequest("GET", c.base+"/", nil)
	for _, ck := range c.http.Jar.Cookies(req.URL) {
		if ck.Name == "session" {
			return ck.Value
		}
	}
	c.s.t.Fatal("no session cookie")
	return ""
}
