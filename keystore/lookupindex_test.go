package keystore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keygate/keygate/internal/testkit/testenv"
	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/keystore/keystoretest"
)

// planNode is a node of EXPLAIN (FORMAT JSON)'s plan, with what the lookup tests read.
type planNode struct {
	NodeType    string     `json:"Node Type"`
	Relation    string     `json:"Relation Name"`
	Index       string     `json:"Index Name"`
	HeapFetches *float64   `json:"Heap Fetches"`
	ActualRows  float64    `json:"Actual Rows"`
	Plans       []planNode `json:"Plans"`
}

// explain runs EXPLAIN (ANALYZE, FORMAT JSON) of sql with args on conn and returns
// its plan.
func explain(t *testing.T, conn *pgxpool.Conn, sql string, args ...any) planNode {
	t.Helper()
	var out []struct{ Plan planNode }
	var text []byte
	if err := conn.QueryRow(context.Background(), "EXPLAIN (ANALYZE, FORMAT JSON) "+sql, args...).Scan(&text); err != nil {
		t.Fatalf("EXPLAIN %s: %v", sql, err)
	}
	if err := json.Unmarshal(text, &out); err != nil || len(out) != 1 {
		t.Fatalf("EXPLAIN's JSON %s: %v", text, err)
	}
	return out[0].Plan
}

// scans returns the nodes of plan that read a table, each with its table.
func scans(plan planNode) (out []planNode) {
	if plan.Relation != "" {
		out = append(out, plan)
	}
	for _, p := range plan.Plans {
		out = append(out, scans(p)...)
	}
	return out
}

// wantOnlyIndexes fails unless every node of plan that reads api_keys or orgs reads
// their lookup index alone (an index-only scan that fetched no row of the table).
func wantOnlyIndexes(t *testing.T, what string, plan planNode) {
	t.Helper()
	index := map[string]string{"api_keys": "api_keys_lookup_idx", "orgs": "orgs_plan_idx"}
	for _, n := range scans(plan) {
		want, ok := index[n.Relation]
		if !ok {
			continue
		}
		if n.NodeType != "Index Only Scan" || n.Index != want || n.HeapFetches == nil || *n.HeapFetches != 0 {
			fetches := "none counted"
			if n.HeapFetches != nil {
				fetches = fmt.Sprint(*n.HeapFetches)
			}
			t.Errorf("%s reads %s by %s on %q, with heap fetches %s; want an Index Only Scan on %s with none",
				what, n.Relation, n.NodeType, n.Index, fetches, want)
		}
	}
}

// vacuum analyses api_keys and orgs, then vacuums them until every page of both is
// marked all-visible, as autovacuum would mark them. Vacuum marks a page only once
// the commits of its rows are flushed to the WAL (their hint bits), which the stack's
// synchronous_commit = off leaves to the WAL writer, within wal_writer_delay.
func vacuum(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `ANALYZE api_keys, orgs`); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "vacuum marking every page of api_keys and orgs all-visible", func() bool {
		var marked bool
		if _, err := pool.Exec(ctx, `VACUUM api_keys, orgs`); err != nil {
			t.Fatal(err)
		}
		err := pool.QueryRow(ctx, `SELECT bool_and(relallvisible = relpages) FROM pg_class
WHERE oid IN ('api_keys'::regclass, 'orgs'::regclass)`).Scan(&marked)
		if err != nil {
			t.Fatal(err)
		}
		return marked
	})
}

// TestLookupReadsOnlyIndexes: every lookup statement, one key or many, with its plan
// made for its arguments or made once for all, finds its keys in api_keys_lookup_idx
// and their plans through orgs_plan_idx, reading no row of either table once vacuum
// has marked their pages all-visible; and the gateways' last_used_at writes leave
// those pages as they were. So a lookup costs a descent of each index, however many
// keys the table holds (docs/scaling.md, What a lookup reads). The second look at a
// refused key reads the lookup index alone too.
func TestLookupReadsOnlyIndexes(t *testing.T) {
	ctx := context.Background()
	s, pool, org := newStore(t, "pro")
	orgs := []string{org, newOrg(t, pool, "pro"), newOrg(t, pool, "enterprise"), newOrg(t, pool, "pro"), newOrg(t, pool, "enterprise")}
	format := keystoretest.Format(t, "mon")
	later := time.Now().Add(time.Hour)
	var ids, fulls []string
	var sums [][]byte
	for i := range 65 {
		nk := keystore.NewKey{OrgID: orgs[i%len(orgs)], Name: "k", Role: keystore.RoleViewer}
		switch i % 4 { // every column the lookup reads, set on some key
		case 1:
			nk.AllowedCIDRs = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
		case 2:
			limit, second := 10, 2
			nk.Scopes, nk.RateLimit = []string{"monitors:read"}, &limit
			nk.WindowLimits[keystore.PerSecond] = &second
		case 3:
			nk.ExpiresAt = &later
		}
		_, full := create(t, s, nk)
		id, secret, _ := format.Parse(full)
		sum := keystore.HashSecret(secret)
		ids, fulls, sums = append(ids, id), append(fulls, full), append(sums, sum[:])
	}
	// Keys of other organisations, 40 times as many: the batch is a small part of the
	// table, as in a gateway's, not the whole of a few organisations' keys.
	// Each key id is made of its organisation's number and its own (not of the
	// organisation's random id, whose prefixes collide now and then).
	if _, err := pool.Exec(ctx, `WITH o AS (
	INSERT INTO orgs (name, plan) SELECT 'other', 'pro' FROM generate_series(1, 100) RETURNING id),
n AS (SELECT id, row_number() OVER () AS n FROM o)
INSERT INTO api_keys (key_id, org_id, name, role, secret_hash)
SELECT 'other' || lpad(n.n::text, 4, '0') || lpad(i::text, 17, '0'), n.id, 'other', 'Viewer', sha256(n.id::text::bytea)
FROM n, generate_series(1, 26) AS i`); err != nil {
		t.Fatal(err)
	}
	vacuum(t, pool)
	lu := keystore.NewLastUsed(pool, keystore.LastUsedOptions{})
	for _, id := range ids {
		lu.Record(id)
	}
	if err := lu.Flush(ctx); err != nil {
		t.Fatal(err)
	}

	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	// A table this small is cheaper to read whole: leave the planner only the indexes.
	// Whether it reads the rows behind them is what the test looks at.
	for _, set := range []string{"enable_seqscan = off", "enable_bitmapscan = off"} {
		if _, err := conn.Exec(ctx, "SET "+set); err != nil {
			t.Fatal(err)
		}
	}
	defer conn.Exec(ctx, "RESET ALL")
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		if _, err := conn.Exec(ctx, "SET plan_cache_mode = "+mode); err != nil {
			t.Fatal(err)
		}
		for _, n := range []int{1, 2, 3, 16, 33, 64, 65} {
			sql, args := keystore.LookupStatement(ids[:n], sums[:n])
			plan := explain(t, conn, sql, args...)
			if plan.ActualRows != float64(n) {
				t.Errorf("%s, %d keys: found %v keys", mode, n, plan.ActualRows)
			}
			wantOnlyIndexes(t, fmt.Sprintf("%s, a lookup of %d keys", mode, n), plan)
		}
		// The keys with networks (every fourth from the second), of one and of many.
		plan := explain(t, conn, keystore.DeniedStatements[0], ids[1], sums[1])
		wantOnlyIndexes(t, mode+", the second look at one key", plan)
		plan = explain(t, conn, keystore.DeniedStatements[1], []string{ids[1], ids[5]}, [][]byte{sums[1], sums[5]})
		if plan.ActualRows != 2 {
			t.Errorf("%s, the second look at two keys with networks found %v", mode, plan.ActualRows)
		}
		wantOnlyIndexes(t, mode+", the second look at two keys", plan)
	}

	// What changes after the vacuum reaches the next lookup, which reads the changed
	// row's page again: a revocation, an expiry, a move to a plan without API access.
	if found, err := s.Revoke(ctx, orgs[0], ids[0], "test"); !found || err != nil {
		t.Fatalf("Revoke = %v, %v", found, err)
	}
	wantRefused(t, s, fulls[0])
	if _, err := pool.Exec(ctx, `UPDATE api_keys SET expires_at = now() - interval '1 ms' WHERE key_id = $1`, ids[3]); err != nil {
		t.Fatal(err)
	}
	wantRefused(t, s, fulls[3])
	if _, err := pool.Exec(ctx, `UPDATE orgs SET plan = 'free' WHERE id = $1`, orgs[1]); err != nil {
		t.Fatal(err)
	}
	if k, ok, err := s.Verify(ctx, fulls[1]); err != nil || !ok || k.RateLimit != 0 {
		t.Errorf("Verify after the org moved to free = %+v, %v, %v; want its key with rate limit 0", k, ok, err)
	}
}

// TestLookupOfTheLastReleaseOnThisSchema: a gateway of the release before
// api_keys_lookup_idx, with its own lookup statement, finds a key this release made,
// and this release finds a key that release's upstream inserted.
func TestLookupOfTheLastReleaseOnThisSchema(t *testing.T) {
	ctx := context.Background()
	s, pool, org := newStore(t, "pro")
	format := keystoretest.Format(t, "mon")
	// The last release's statement of one key, as it was.
	const lastRelease = `SELECT k.key_id, k.org_id::text, k.role, k.secret_hash,
CASE WHEN k.rate_limit IS NULL OR p.api_rate_limit = 0 THEN p.api_rate_limit
	WHEN p.api_rate_limit < 0 THEN k.rate_limit
	ELSE least(k.rate_limit, p.api_rate_limit) END,
CASE WHEN p.api_rate_limit_per_second < 0 THEN coalesce(k.rate_limit_per_second, -1)
	ELSE least(k.rate_limit_per_second, p.api_rate_limit_per_second) END,
CASE WHEN p.api_rate_limit_per_hour < 0 THEN coalesce(k.rate_limit_per_hour, -1)
	ELSE least(k.rate_limit_per_hour, p.api_rate_limit_per_hour) END,
CASE WHEN p.api_rate_limit_per_day < 0 THEN coalesce(k.rate_limit_per_day, -1)
	ELSE least(k.rate_limit_per_day, p.api_rate_limit_per_day) END,
p.org_rate_limit, p.api_requests_per_month,
CASE WHEN cardinality(k.allowed_cidrs) > 0 THEN k.allowed_cidrs END,
array_to_string(k.scopes, ' ')
FROM api_keys k
JOIN orgs o ON o.id = k.org_id
JOIN plans p ON p.name = o.plan
WHERE k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > now()) AND k.key_id = $1` +
		` AND CASE WHEN k.secret_hash = $2 AND (cardinality(k.allowed_cidrs) = 0 OR $3::inet <<= ANY(k.allowed_cidrs) OR $3::inet IS NULL) THEN true END`
	rec, full := create(t, s, keystore.NewKey{OrgID: org, Name: "this release's", Role: keystore.RoleEditor})
	_, secret, _ := format.Parse(full)
	sum := keystore.HashSecret(secret)
	var found string
	if err := pool.QueryRow(ctx, lastRelease, rec.ID, sum[:], nil).Scan(&found, new(string), new(string), new([]byte),
		new(int), new(int), new(int), new(int), new(int), new(int64), new([]netip.Prefix), new(*string)); err != nil || found != rec.ID {
		t.Errorf("the last release's lookup of this release's key found %q, %v", found, err)
	}

	// The last release's upstream inserts a key with its own statement.
	full, id, secret, err := format.Generate()
	if err != nil {
		t.Fatal(err)
	}
	sum = keystore.HashSecret(secret)
	if _, err := pool.Exec(ctx, `INSERT INTO api_keys (key_id, org_id, name, role, secret_hash, created_by, expires_at, rate_limit, allowed_cidrs, scopes)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
ON CONFLICT (key_id) DO NOTHING`, id, org, "the last release's", "Viewer", sum[:], nil, nil, nil, []netip.Prefix{}, nil); err != nil {
		t.Fatal(err)
	}
	if k, ok, err := s.Verify(ctx, full); err != nil || !ok || k.ID != id {
		t.Errorf("Verify of the last release's key = %+v, %v, %v", k, ok, err)
	}
}
