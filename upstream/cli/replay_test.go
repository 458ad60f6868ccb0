package cli

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/upstream/internal/upstreamtest"
	"github.com/keygate/keygate/upstream/store"
)

// pgTool returns the path of PostgreSQL's program name (pg_dump, pg_restore): on the
// PATH, or in the server's own bin directory, where scripts/stack.sh finds it.
func pgTool(t *testing.T, name string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.Sort(dirs)
	for _, d := range slices.Backward(dirs) {
		if p := filepath.Join(d, name); fileExists(p) {
			return p
		}
	}
	t.Fatalf("no %s: install PostgreSQL (scripts/stack.sh does)", name)
	return ""
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// pgRun runs a PostgreSQL program and fails the test with its output on failure.
func pgRun(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(pgTool(t, name), args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
}

// restored makes a database from the custom-format dump file, as an operator
// restores one: pg_restore into an empty database.
func restored(t *testing.T, file string) string {
	t.Helper()
	target := upstreamtest.EmptyDatabase(t)
	pgRun(t, "pg_restore", "--no-owner", "--exit-on-error", "--dbname", target, file)
	return target
}

// replayed is the output of key replay-revocations.
type replayed struct {
	Events                               int
	DryRun                               bool `json:"dry_run"`
	Revoked, Expired, Unchanged, Unknown []string
}

// replay runs key replay-revocations against the database target with args.
func replay(t *testing.T, target string, stdin string, args ...string) replayed {
	t.Helper()
	code, stdout, stderr := run(t, map[string]string{"DATABASE_URL": target}, stdin, append([]string{"key", "replay-revocations"}, args...)...)
	if code != exitOK {
		t.Fatalf("key replay-revocations %v: exit %d, %s", args, code, stderr)
	}
	var r replayed
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		t.Fatalf("output %q: %v", stdout, err)
	}
	return r
}

// TestAReplayAfterARestoreEndsTheKeysEndedSinceTheBackup: a database is dumped, then
// keys are revoked, found leaked and rolled. Restored from the dump, it takes those
// keys again. The replay, from the live database or from the audit trail's export,
// refuses them again, and leaves alone the key that lived on; a second replay changes
// nothing.
func TestAReplayAfterARestoreEndsTheKeysEndedSinceTheBackup(t *testing.T) {
	ctx := context.Background()
	e, org, owner := upstreamtest.NewOrgEnv(t, "pro", "Owner")
	keys := map[string]string{} // name → full key
	ids := map[string]string{}
	for _, name := range []string{"kept", "revoked", "leaked", "rolled"} {
		r, full, err := e.Keys.Create(ctx, keystore.NewKey{OrgID: org, Name: name, Role: keystore.RoleAdmin})
		if err != nil {
			t.Fatal(err)
		}
		keys[name], ids[name] = full, r.ID
	}

	since := time.Now().Add(-time.Second) // the backup's time, a little early: replaying more is harmless
	backup := filepath.Join(t.TempDir(), "keygate.dump")
	pgRun(t, "pg_dump", "--format=custom", "--file", backup, e.DBURL)

	// The owner revokes one and rolls one (an hour's grace) through the API; a leak
	// report names the third.
	upstreamtest.WantStatus(t, owner.Do("DELETE", "/orgs/"+org+"/api-keys/"+ids["revoked"], ""), 204)
	upstreamtest.WantStatus(t, owner.Do("POST", "/orgs/"+org+"/api-keys/"+ids["rolled"]+"/roll", `{"grace_seconds":3600}`), 201)
	if _, err := e.Keys.RevokeLeaked(ctx, []keystore.LeakReport{{Token: keys["leaked"], URL: "https://paste.example/1"}}); err != nil {
		t.Fatal(err)
	}
	// The audit trail's export, as the API gives it, taken from the live system.
	page := owner.Do("GET", "/orgs/"+org+"/audit-events?limit=100", "")
	upstreamtest.WantStatus(t, page, 200)
	export := filepath.Join(t.TempDir(), "audit.json")
	if err := os.WriteFile(export, []byte(page.Body), 0o600); err != nil {
		t.Fatal(err)
	}

	verifies := func(target string) map[string]bool {
		t.Helper()
		pool := upstreamtest.NewPool(t, target, store.DefaultDatabaseTimeout)
		ks := keystore.New(pool, e.Config.KeyFormat)
		out := map[string]bool{}
		for name, full := range keys {
			_, ok, err := ks.Verify(ctx, full)
			if err != nil {
				t.Fatal(err)
			}
			out[name] = ok
		}
		return out
	}
	// expiry returns when the rolled key expires in the database at url.
	expiry := func(url string) time.Time {
		t.Helper()
		recs, err := keystore.New(upstreamtest.NewPool(t, url, store.DefaultDatabaseTimeout), e.Config.KeyFormat).List(ctx, org)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			if r.ID == ids["rolled"] && r.ExpiresAt != nil {
				return *r.ExpiresAt
			}
		}
		return time.Time{}
	}
	allLive := map[string]bool{"kept": true, "revoked": true, "leaked": true, "rolled": true}
	// From the database, the rolled key keeps the hour of grace its roll gave it; from
	// the export, which does not say, it ends at the roll.
	ended := map[string]bool{"kept": true, "revoked": false, "leaked": false, "rolled": false}
	endedKeepingGrace := map[string]bool{"kept": true, "revoked": false, "leaked": false, "rolled": true}
	want := func(what string, got, want map[string]bool) {
		t.Helper()
		for name := range want {
			if got[name] != want[name] {
				t.Errorf("%s: key %s verifies %v, want %v", what, name, got[name], want[name])
			}
		}
	}
	sorted := func(names ...string) []string {
		var out []string
		for _, n := range names {
			out = append(out, ids[n])
		}
		slices.Sort(out)
		return out
	}
	wantReport := func(what string, got replayed, revoked, expired, unchanged []string) {
		t.Helper()
		for _, l := range [][]string{got.Revoked, got.Expired, got.Unchanged} {
			slices.Sort(l)
		}
		if got.Events != 3 || !slices.Equal(got.Revoked, revoked) || !slices.Equal(got.Expired, expired) ||
			!slices.Equal(got.Unchanged, unchanged) || len(got.Unknown) != 0 {
			t.Errorf("%s: %+v, want 3 events, revoked %v, expired %v, unchanged %v", what, got, revoked, expired, unchanged)
		}
	}

	t.Run("from the live database", func(t *testing.T) {
		target := restored(t, backup)
		want("restored", verifies(target), allLive) // the restore brings them back
		wantReport("the replay", replay(t, target, "", "--from-database", e.DBURL, "--since", since.Format(time.RFC3339Nano)),
			sorted("revoked", "leaked"), sorted("rolled"), nil)
		want("replayed", verifies(target), endedKeepingGrace)
		if got, live := expiry(target), expiry(e.DBURL); !got.Equal(live) || live.IsZero() {
			t.Errorf("the rolled key expires at %v after the replay, want %v as on the live database", got, live)
		}
		wantReport("a second replay", replay(t, target, "", "--from-database", e.DBURL, "--since", since.Format(time.RFC3339Nano)),
			nil, nil, sorted("revoked", "leaked", "rolled"))
		// The trail of the restored database holds the ends again.
		pool := upstreamtest.NewPool(t, target, store.DefaultDatabaseTimeout)
		events, err := keystore.New(pool, e.Config.KeyFormat).Events(ctx, org, 0, 100)
		if err != nil {
			t.Fatal(err)
		}
		var actions []string
		for _, ev := range events {
			if keystore.Ends(ev.Action) {
				actions = append(actions, ev.Action+" "+ev.KeyID)
			}
		}
		if len(actions) != 3 {
			t.Errorf("the restored trail holds %q, want the three ends once each", actions)
		}
	})

	t.Run("from the export of the audit trail, on standard input", func(t *testing.T) {
		target := restored(t, backup)
		body, err := os.ReadFile(export)
		if err != nil {
			t.Fatal(err)
		}
		dry := replay(t, target, string(body), "--from", "-", "--dry-run")
		if !dry.DryRun {
			t.Errorf("--dry-run output %+v says no dry_run", dry)
		}
		wantReport("the dry run", dry, sorted("revoked", "leaked"), sorted("rolled"), nil)
		want("after a dry run", verifies(target), allLive)
		wantReport("the replay", replay(t, target, "", "--from", export), sorted("revoked", "leaked"), sorted("rolled"), nil)
		want("replayed", verifies(target), ended)
	})
}

func TestReplayRevocationsRefusesABadCommandLine(t *testing.T) {
	dir := t.TempDir()
	notJSON := filepath.Join(dir, "audit.txt")
	if err := os.WriteFile(notJSON, []byte("key.revoked abc\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	noTime := filepath.Join(dir, "audit.json")
	if err := os.WriteFile(noTime, []byte(`{"action":"key.revoked","key_id":"AAAAAAAAAAAAAAAAAAAAAA"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"DATABASE_URL": "postgres://nobody@127.0.0.1:1/none"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "upstream key replay-revocations: usage: give one of --from and --from-database (see --help)\n"},
		{[]string{"--from", "x", "--from-database", "postgres://h/db"}, "upstream key replay-revocations: usage: give one of --from and --from-database (see --help)\n"},
		{[]string{"--from", notJSON, "--since", "yesterday"}, "upstream key replay-revocations: usage: --since \"yesterday\" is not an RFC 3339 time such as 2026-11-28T03:00:00Z\n"},
		{[]string{"--from", notJSON}, "upstream key replay-revocations: usage: --from: not JSON at byte 0: invalid character 'k' looking for beginning of value\n"},
		{[]string{"--from", noTime}, "upstream key replay-revocations: usage: --from: a key.revoked event without a key_id and a time: map[action:key.revoked key_id:AAAAAAAAAAAAAAAAAAAAAA]\n"},
		{[]string{"--from-database", "postgres://a b"}, "upstream key replay-revocations: usage: --from-database is not a valid postgres URL\n"},
	} {
		code, stdout, stderr := run(t, env, "", append([]string{"key", "replay-revocations"}, tc.args...)...)
		if code != exitUsage || stdout != "" || stderr != tc.want {
			t.Errorf("%v: exit %d, %q %q; want 2 and %q", tc.args, code, stdout, stderr, tc.want)
		}
	}
}
