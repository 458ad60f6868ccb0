package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keygate/keygate/internal/testkit/testenv"
)

// The key lifecycle of docs/security.md (Keys) through the built binaries: roll with and without
// grace, the audit trail, leak reports.

// leakToken is the --leak-report-token of the stacks that serve leak reports.
const leakToken = "integration-leak-report-token-0123456789"

// serveLeakReports restarts the upstream with LEAK_REPORT_TOKEN set, which mounts
// POST /security/leaked-keys.
func (s *Stack) serveLeakReports() {
	s.t.Helper()
	s.neverLog(leakToken)
	s.stopUpstream()
	env := append(slices.Clone(s.cliEnv), "LEAK_REPORT_TOKEN="+leakToken)
	s.upstream = s.start("upstream (leak reports)", env, filepath.Join(s.bin, "upstream"), "serve", "--addr", s.upAddr)
	waitListening(s.t, s.upAddr, s.upstream)
}

// roll rolls key id of org with grace seconds and returns the new key's id and key.
func (c *Client) roll(orgID, id string, grace int) (newID, key string) {
	c.s.t.Helper()
	r := c.do("POST", "/orgs/"+orgID+"/api-keys/"+id+"/roll", map[string]any{"grace_seconds": grace}, nil)
	if r.Status != http.StatusCreated {
		c.s.t.Fatalf("rolling key %s: %d %s", id, r.Status, r.Body)
	}
	v := r.JSON(c.s.t)
	newID, _ = v["id"].(string)
	key, _ = v["key"].(string)
	c.s.neverLog(key)
	if _, secret, ok := strings.Cut(key, "."); ok {
		c.s.neverLog(secret)
	}
	return newID, key
}

// wantMe asserts that key, of a pro org, answers GET /v1/me with its org and role.
func wantMe(t *testing.T, s *Stack, key, orgID, role string) {
	t.Helper()
	r := s.api(key, 0).do("GET", "/v1/me", nil)
	if want := proMe(orgID, role); r.Status != http.StatusOK || !jsonEqual(r.Body, []byte(want)) {
		t.Errorf("GET /v1/me = %d %s, want 200 %s", r.Status, r.Body, want)
	}
}

func TestRollWithoutGraceRefusesTheOldKeyOnTheNextRequest(t *testing.T) {
	s := newStack(t)
	org, owner := s.newOwner("pro")
	oldID, oldKey := owner.createKey(org.ID, "deploys", "Editor", nil)
	wantMe(t, s, oldKey, org.ID, "Editor")

	_, newKey := owner.roll(org.ID, oldID, 0)
	for i := range s.gateways {
		wantError(t, s.api(oldKey, i).do("GET", "/v1/me", nil), 401, unauthenticated)
	}
	wantMe(t, s, newKey, org.ID, "Editor")
	wantError(t, owner.do("POST", "/orgs/"+org.ID+"/api-keys/"+oldID+"/roll", map[string]any{"grace_seconds": 0}, nil),
		409, `{"error":"conflict","message":"the key is revoked or expired and cannot be rolled"}`)
}

func TestRollWithGraceKeepsTheOldKeyUntilTheGraceEnds(t *testing.T) {
	s := newStack(t)
	org, owner := s.newOwner("pro")
	oldID, oldKey := owner.createKey(org.ID, "ci", "Viewer", nil)

	const grace = 2 * time.Second
	sent := time.Now()
	_, newKey := owner.roll(org.ID, oldID, int(grace/time.Second))
	rolled := time.Now()
	wantMe(t, s, newKey, org.ID, "Viewer")

	// The old key works until the grace ends and is refused from then on: no 401 before
	// sent+grace, a 401 by rolled+grace (and a little slack for the request itself).
	var worked int
	testenv.Eventually(t, grace+30*time.Second, "the old key refused", func() bool {
		start := time.Now()
		r := s.api(oldKey, 0).do("GET", "/v1/me", nil)
		done := time.Now()
		if r.Status == http.StatusUnauthorized {
			wantError(t, r, 401, unauthenticated)
			if done.Before(sent.Add(grace)) {
				t.Errorf("the old key was refused %v after the roll was sent, within its grace of %v", done.Sub(sent), grace)
			}
			return true
		}
		if r.Status != http.StatusOK {
			t.Fatalf("old key during its grace: %d %s", r.Status, r.Body)
		}
		if start.After(rolled.Add(grace + time.Second)) {
			t.Fatalf("the old key still works %v after the roll, past its grace of %v", start.Sub(rolled), grace)
		}
		worked++
		return false
	})
	if worked == 0 {
		t.Error("the old key never worked during its grace")
	}
	wantError(t, s.api(oldKey, 1).do("GET", "/v1/me", nil), 401, unauthenticated)
	wantMe(t, s, newKey, org.ID, "Viewer")
}

func TestAuditTrailAndLeakReports(t *testing.T) {
	s := newStack(t)
	s.serveLeakReports()
	org, owner := s.newOwner("pro")
	ownerID, _ := s.cli("", "member", "add", "--org", org.ID, "--email", org.Email, "--role", "Owner")["user_id"].(string)
	report := func(token string, pairs ...string) Resp {
		var items []map[string]string
		for i := 0; i+1 < len(pairs); i += 2 {
			items = append(items, map[string]string{"token": pairs[i], "url": pairs[i+1]})
		}
		return s.raw("POST", s.URL(0)+"/security/leaked-keys", items, http.Header{"Authorization": {"Bearer " + token}})
	}

	aID, _ := owner.createKey(org.ID, "a", "Admin", nil)
	leakedID, leaked := owner.createKey(org.ID, "leaked", "Editor", nil)
	_, kept := owner.createKey(org.ID, "kept", "Editor", nil)
	bID, _ := owner.roll(org.ID, aID, 0)
	if r := owner.do("DELETE", "/orgs/"+org.ID+"/api-keys/"+bID, nil, nil); r.Status != http.StatusNoContent {
		t.Fatalf("revoke: %d %s", r.Status, r.Body)
	}
	wantMe(t, s, leaked, org.ID, "Editor")

	// A leak report revokes the live key: its next request is refused.
	wantError(t, report("wrong-"+leakToken, leaked, "https://example.com/x"), 401, `{"error":"unauthenticated"}`)
	wantMe(t, s, leaked, org.ID, "Editor")
	r := report(leakToken, leaked, "https://github.com/acme/app/blob/main/.env", "mon_live_nothing.here", "https://example.com/n")
	if want := `{"data":[{"url":"https://github.com/acme/app/blob/main/.env","outcome":"revoked"},{"url":"https://example.com/n","outcome":"unknown"}]}`; r.Status != 200 || !jsonEqual(r.Body, []byte(want)) {
		t.Fatalf("leak report = %d %s, want 200 %s", r.Status, r.Body, want)
	}
	for i := range s.gateways {
		wantError(t, s.api(leaked, i).do("GET", "/v1/me", nil), 401, unauthenticated)
	}
	wantMe(t, s, kept, org.ID, "Editor")
	// Reporting it again changes nothing.
	r = report(leakToken, leaked, "https://example.com/again")
	if want := `{"data":[{"url":"https://example.com/again","outcome":"already_revoked"}]}`; r.Status != 200 || !jsonEqual(r.Body, []byte(want)) {
		t.Errorf("second leak report = %d %s, want 200 %s", r.Status, r.Body, want)
	}

	// The trail, newest first, with who did what.
	r = owner.do("GET", "/orgs/"+org.ID+"/audit-events", nil, nil)
	if r.Status != http.StatusOK {
		t.Fatalf("audit events: %d %s", r.Status, r.Body)
	}
	var page struct {
		Data []struct {
			Action, Actor string
			KeyID         string `json:"key_id"`
			NewKeyID      string `json:"new_key_id"`
			URL           string `json:"url"`
		} `json:"data"`
		NextCursor *string `json:"next_cursor"`
	}
	if err := json.Unmarshal(r.Body, &page); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range page.Data {
		got = append(got, strings.Join([]string{e.Action, e.KeyID, e.Actor, e.NewKeyID, e.URL}, " "))
	}
	want := []string{
		fmt.Sprintf("key.leaked %s leak-report  https://github.com/acme/app/blob/main/.env", leakedID),
		fmt.Sprintf("key.revoked %s %s  ", bID, ownerID),
		fmt.Sprintf("key.rolled %s %s %s ", aID, ownerID, bID),
		"", // the creation of kept, checked below
		fmt.Sprintf("key.created %s %s  ", leakedID, ownerID),
		fmt.Sprintf("key.created %s %s  ", aID, ownerID),
	}
	if len(got) != len(want) || page.NextCursor != nil {
		t.Fatalf("audit events:\n%s\nwant %d and no next page", strings.Join(got, "\n"), len(want))
	}
	for i := range want {
		if want[i] == "" {
			if !strings.HasPrefix(got[i], "key.created ") || !strings.HasSuffix(got[i], " "+ownerID+"  ") {
				t.Errorf("event %d = %q, want the creation of kept", i, got[i])
			}
			continue
		}
		if got[i] != want[i] {
			t.Errorf("event %d = %q, want %q", i, got[i], want[i])
		}
	}
	if _, secret, _ := strings.Cut(leaked, "."); strings.Contains(string(r.Body), secret) {
		t.Error("the audit trail shows a secret")
	}
}
