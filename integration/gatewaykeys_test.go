package integration

// The gateway's half of the key lifecycle (docs/security.md, Keys): checksummed keys refused
// before any query, legacy_keys, and last_used_at written off the request path.

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keygate/keygate/internal/testkit/promtest"
	"github.com/keygate/keygate/internal/testkit/testenv"
	"github.com/keygate/keygate/keystore/keystoretest"
)

// withGateway starts one more gateway (index returned) with extra v1_gateway options.
func (s *Stack) withGateway(options string) int {
	s.t.Helper()
	s.gwOptions = options
	defer func() { s.gwOptions = "" }()
	s.startGateway("open")
	return len(s.gateways) - 1
}

// gatewayMetric reads one series from gateway i's admin /metrics.
func (s *Stack) gatewayMetric(i int, series string) float64 {
	s.t.Helper()
	return promtest.Scrape(s.t, "http://"+s.gateways[i].adminAt+"/metrics")[series]
}

// dbConn opens a connection of the test's own to the stack's database.
func (s *Stack) dbConn() *pgx.Conn {
	s.t.Helper()
	c, err := pgx.Connect(context.Background(), s.dbURL)
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// apiKeyScans returns how many scans of api_keys PostgreSQL has counted (sequential
// plus index), once every count made so far has reached the statistics.
//
// Why this counter: pg_stat_statements is not loaded on the test server, and every
// lookup scans api_keys at least once, whatever key it looks for (its plan starts
// with api_keys_pkey), while nothing else in these tests reads the table: so it counts
// the lookups that reached PostgreSQL, exactly. The counts reach the shared
// statistics late: a backend that flushed less than a second ago keeps its counts
// until it has been idle for 10 s (PostgreSQL 15's PGSTAT_MIN_INTERVAL and
// PGSTAT_IDLE_INTERVAL). So the count is read after 11 s of quiet, and again a second
// later to check that it has settled; each read is its own transaction, so it never
// sees a cached snapshot.
func (s *Stack) apiKeyScans(c *pgx.Conn) int64 {
	s.t.Helper()
	read := func() int64 {
		var n int64
		if err := c.QueryRow(context.Background(), `SELECT coalesce(seq_scan, 0) + coalesce(idx_scan, 0)
FROM pg_stat_user_tables WHERE relname = 'api_keys'`).Scan(&n); err != nil {
			s.t.Fatal(err)
		}
		return n
	}
	time.Sleep(11 * time.Second) // PostgreSQL's statistics flush: no event marks it
	prev := read()
	for range 10 {
		time.Sleep(time.Second) // the count unchanged a second later: settled
		n := read()
		if n == prev {
			return n
		}
		prev = n
	}
	s.t.Fatal("the scan count of api_keys did not settle")
	return 0
}

// wellFormedKey returns a checksummed key of the stack's prefix that no one created.
func wellFormedKey(t *testing.T) string {
	t.Helper()
	full, _, _, err := keystoretest.Format(t, "mon").Generate()
	if err != nil {
		t.Fatal(err)
	}
	return full
}

// badChecksum changes the last character of a key's checksum.
func badChecksum(key string) string {
	last := key[len(key)-1]
	if last == '0' {
		return key[:len(key)-1] + "1"
	}
	return key[:len(key)-1] + "0"
}

func want401(t *testing.T, r Resp) {
	t.Helper()
	wantError(t, r, http.StatusUnauthorized, unauthenticated)
	if got := r.Header.Get("WWW-Authenticate"); got != "Bearer" {
		t.Errorf("WWW-Authenticate %q, want Bearer", got)
	}
}

func TestBadChecksumCostsNoDatabaseQuery(t *testing.T) {
	// Most of its half minute is waiting for PostgreSQL's statistics: it waits beside
	// the other waiting tests (see the package doc). The scans it counts are those of
	// its own database.
	t.Parallel()
	s := newStack(t)
	o := s.newOrg("pro")
	_, key := s.loginOwner(o).createKey(o.ID, "ci", "Editor", nil)
	// A gateway of its own, writing no last_used_at: only lookups scan api_keys.
	gw := s.withGateway("last_used_interval off")
	if r := s.api(key, gw).do("GET", "/v1/me", nil); r.Status != http.StatusOK {
		t.Fatalf("the real key: %d %s", r.Status, r.Body)
	}
	conn := s.dbConn()
	const n = 40
	const lookups = "keygate_key_lookup_duration_seconds_count"

	scans0, lookups0 := s.apiKeyScans(conn), s.gatewayMetric(gw, lookups)
	for range n {
		want401(t, s.api(badChecksum(wellFormedKey(t)), gw).do("GET", "/v1/monitors", nil))
	}
	want401(t, s.api(badChecksum(key), gw).do("GET", "/v1/me", nil)) // a real key with a typo
	scans1, lookups1 := s.apiKeyScans(conn), s.gatewayMetric(gw, lookups)
	if scans1 != scans0 || lookups1 != lookups0 {
		t.Errorf("%d bad-checksum keys cost %d scans of api_keys and %v lookups, want none", n+1, scans1-scans0, lookups1-lookups0)
	}

	// The same number of well-formed unknown keys do query: the counter can move.
	for range n {
		want401(t, s.api(wellFormedKey(t), gw).do("GET", "/v1/monitors", nil))
	}
	scans2, lookups2 := s.apiKeyScans(conn), s.gatewayMetric(gw, lookups)
	t.Logf("scans of api_keys: %d for %d bad checksums, %d for %d well-formed unknown keys", scans1-scans0, n+1, scans2-scans1, n)
	if scans2-scans1 < n || lookups2-lookups1 != n {
		t.Errorf("%d well-formed unknown keys cost %d scans and %v lookups, want at least %d and exactly %d", n, scans2-scans1, lookups2-lookups1, n, n)
	}
}

// listedKey returns the dashboard's list entry of key id.
func listedKey(t *testing.T, c *Client, orgID, id string) map[string]any {
	t.Helper()
	r := c.do("GET", "/orgs/"+orgID+"/api-keys", nil, nil)
	if r.Status != http.StatusOK {
		t.Fatalf("listing keys: %d %s", r.Status, r.Body)
	}
	for _, e := range r.JSON(t)["data"].([]any) {
		if m := e.(map[string]any); m["id"] == id {
			return m
		}
	}
	t.Fatalf("key %s is not listed: %s", id, r.Body)
	return nil
}

// waitLastUsed polls the key list until the key shows a last_used_at, and returns it.
func waitLastUsed(t *testing.T, c *Client, orgID, id string, within time.Duration) time.Time {
	t.Helper()
	var at time.Time
	testenv.Eventually(t, within, "a last_used_at", func() bool {
		e := listedKey(t, c, orgID, id)
		v, present := e["last_used_at"]
		if present && v == nil {
			return false // not used yet, or not flushed yet
		}
		s, ok := v.(string)
		if !ok {
			t.Fatalf("last_used_at is %#v, want a time or null", v)
		}
		var err error
		if at, err = time.Parse(time.RFC3339Nano, s); err != nil {
			t.Fatalf("last_used_at %q is not RFC 3339: %v", s, err)
		}
		return true
	})
	return at
}

func TestLastUsedAppearsWithinTheFlushInterval(t *testing.T) {
	s := newStack(t)
	o, owner := s.newOwner("pro")
	id, key := owner.createKey(o.ID, "ci", "Editor", nil)
	other, _ := owner.createKey(o.ID, "unused", "Editor", nil)
	gw := s.withGateway("last_used_interval 1s")

	if v, present := listedKey(t, owner, o.ID, id)["last_used_at"]; !present || v != nil {
		t.Fatalf("a new key's last_used_at is %#v (present %v), want null", v, present)
	}
	before := time.Now()
	if r := s.api(key, gw).do("GET", "/v1/me", nil); r.Status != http.StatusOK {
		t.Fatalf("%d %s", r.Status, r.Body)
	}
	// One interval, plus the flush and the poll: 3 s is generous.
	at := waitLastUsed(t, owner, o.ID, id, 3*time.Second)
	if at.Before(before.Add(-5*time.Second)) || at.After(time.Now().Add(5*time.Second)) {
		t.Errorf("last_used_at %v, want about %v", at, before)
	}
	if v := listedKey(t, owner, o.ID, other)["last_used_at"]; v != nil {
		t.Errorf("the unused key's last_used_at is %v", v)
	}
}

func TestSlowLastUsedFlushNeverDelaysRequests(t *testing.T) {
	s := newStack(t)
	o, owner := s.newOwner("pro")
	id, key := owner.createKey(o.ID, "ci", "Editor", nil)
	gw := s.withGateway("last_used_interval 1s")
	ctx := context.Background()

	// The key's row locked: every flush's UPDATE waits on it (and times out), while
	// lookups, plain SELECTs, do not.
	tx, err := s.dbConn().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM api_keys WHERE key_id = $1 FOR UPDATE`, id); err != nil {
		t.Fatal(err)
	}
	const hold = 5 * time.Second
	var slowest time.Duration
	requests := 0
	for start := time.Now(); time.Since(start) < hold; requests++ {
		t0 := time.Now()
		r := s.api(key, gw).do("GET", "/v1/monitors", nil)
		took := time.Since(t0)
		if r.Status != http.StatusOK {
			t.Fatalf("request %d during the blocked flush: %d %s", requests, r.Status, r.Body)
		}
		slowest = max(slowest, took)
		time.Sleep(50 * time.Millisecond) // requests spread over the hold on purpose
	}
	if slowest >= time.Second {
		t.Errorf("the slowest of %d requests during a blocked flush took %v, want under 1s", requests, slowest)
	}
	if failed := s.gatewayMetric(gw, "keygate_last_used_flush_errors_total"); failed < 1 {
		t.Errorf("keygate_last_used_flush_errors_total = %v while the row was locked, want at least 1", failed)
	}
	if v := listedKey(t, owner, o.ID, id)["last_used_at"]; v != nil {
		t.Fatalf("last_used_at %v was written through the lock", v)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	// The failed flushes kept the id: the next one writes it.
	waitLastUsed(t, owner, o.ID, id, 5*time.Second)
	t.Logf("%d requests during a %v blocked flush, the slowest %v", requests, hold, slowest)
}

// insertLegacyKey stores a key in the format of before checksums: a 43-character
// secret without one, as older releases made.
func (s *Stack) insertLegacyKey(orgID string) string {
	s.t.Helper()
	var raw [32]byte
	rand.Read(raw[:])
	secret := base64.RawURLEncoding.EncodeToString(raw[:])
	id := strings.NewReplacer("-", "a", "_", "b").Replace(base64.RawURLEncoding.EncodeToString(raw[:16]))[:22]
	sum := sha256.Sum256([]byte(secret))
	if _, err := s.dbConn().Exec(context.Background(), `INSERT INTO api_keys (key_id, org_id, name, role, secret_hash)
VALUES ($1, $2, 'legacy', 'Editor', $3)`, id, orgID, sum[:]); err != nil {
		s.t.Fatal(err)
	}
	key := "mon_live_" + id + "." + secret
	s.neverLog(key)
	s.neverLog(secret)
	return key
}

func TestLegacyKeysAcceptOrReject(t *testing.T) {
	s := newStack(t)
	o := s.newOrg("pro")
	_, key := s.loginOwner(o).createKey(o.ID, "ci", "Editor", nil)
	legacy := s.insertLegacyKey(o.ID)
	reject := s.withGateway("legacy_keys reject")
	accept := s.withGateway("legacy_keys accept")
	const lookups = "keygate_key_lookup_duration_seconds_count"

	for name, gw := range map[string]int{"default": 0, "accept": accept} {
		if r := s.api(legacy, gw).do("GET", "/v1/me", nil); r.Status != http.StatusOK || !jsonEqual(r.Body, []byte(proMe(o.ID, "Editor"))) {
			t.Errorf("legacy key, %s: %d %s", name, r.Status, r.Body)
		}
	}
	before := s.gatewayMetric(reject, lookups)
	want401(t, s.api(legacy, reject).do("GET", "/v1/me", nil))
	if after := s.gatewayMetric(reject, lookups); after != before {
		t.Errorf("the refused legacy key cost %v lookups, want none", after-before)
	}
	if r := s.api(key, reject).do("GET", "/v1/me", nil); r.Status != http.StatusOK {
		t.Errorf("a checksummed key with legacy_keys reject: %d %s", r.Status, r.Body)
	}
}
