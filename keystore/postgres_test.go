package keystore_test

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keygate/keygate/internal/testkit/testenv"
	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/keystore/keystoretest"
	"github.com/keygate/keygate/schema/schematest"
)

// newStore returns a Store on a fresh database, and an org on plan.
func newStore(t testing.TB, plan string) (*keystore.Store, *pgxpool.Pool, string) {
	t.Helper()
	pool, _ := schematest.NewPool(t)
	s := keystore.New(pool, keystoretest.Format(t, "mon"))
	return s, pool, newOrg(t, pool, plan)
}

func newOrg(t testing.TB, pool *pgxpool.Pool, plan string) string {
	t.Helper()
	var id string
	if err := pool.QueryRow(context.Background(),
		`INSERT INTO orgs (name, plan) VALUES ('acme', $1) RETURNING id::text`, plan).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// holdLocks begins a transaction on pool that runs sql, so that the locks sql takes
// are held until the test rolls the transaction back, or ends.
func holdLocks(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	if _, err := tx.Exec(ctx, sql, args...); err != nil {
		t.Fatal(err)
	}
	return tx
}

// waitForALockWait waits until a statement on pool's database waits on a lock: a
// statement the test started has reached a lock that holdLocks holds.
func waitForALockWait(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, "a statement waiting on the held lock", func() bool {
		var n int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
}

func create(t *testing.T, s *keystore.Store, nk keystore.NewKey) (keystore.Record, string) {
	t.Helper()
	rec, full, err := s.Create(context.Background(), nk)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	return rec, full
}

// verifier is what Store and Batcher both do.
type verifier interface {
	Verify(ctx context.Context, presented string) (keystore.Key, bool, error)
}

// verifiers returns s itself and a Batcher over s.
func verifiers(s *keystore.Store) map[string]verifier {
	return map[string]verifier{
		"store":   s,
		"batcher": keystore.NewBatcher(s, keystore.BatcherOptions{Lanes: 2}),
	}
}

func wantRefused(t *testing.T, s verifier, presented string) {
	t.Helper()
	k, ok, err := s.Verify(context.Background(), presented)
	if err != nil || ok {
		t.Errorf("Verify(%q) = %+v, %v, %v; want refused without error", presented, k, ok, err)
	}
}

func TestVerifyOutcomes(t *testing.T) {
	for _, name := range []string{"store", "batcher"} {
		t.Run(name, func(t *testing.T) { testVerifyOutcomes(t, name) })
	}
}

func testVerifyOutcomes(t *testing.T, kind string) {
	ctx := context.Background()
	store, pool, org := newStore(t, "pro")
	s := verifiers(store)[kind]

	rec, full := create(t, store, keystore.NewKey{OrgID: org, Name: "ci", Role: keystore.RoleEditor})
	k, ok, err := s.Verify(ctx, full)
	if err != nil || !ok {
		t.Fatalf("Verify(valid) = %v, %v", ok, err)
	}
	if want := (keystore.Key{ID: rec.ID, OrgID: org, Role: keystore.RoleEditor, RateLimit: 600, OrgRateLimit: -1, MonthlyQuota: -1}); !sameKey(k, want) {
		t.Errorf("Verify(valid) = %+v, want %+v", k, want)
	}

	keyID, secret, _ := keystoretest.Format(t, "mon").Parse(full)
	t.Run("unknown key id", func(t *testing.T) {
		wantRefused(t, s, "mon_live_"+strings.Repeat("Q", 22)+"."+secret)
	})
	t.Run("wrong secret", func(t *testing.T) {
		_, _, other, _ := keystoretest.Format(t, "mon").Generate()
		wantRefused(t, s, "mon_live_"+keyID+"."+other)
	})
	t.Run("case-flipped secret", func(t *testing.T) {
		flipped := []byte(secret)
		for i, c := range flipped {
			if c >= 'a' && c <= 'z' {
				flipped[i] = c - 'a' + 'A'
				break
			}
		}
		wantRefused(t, s, "mon_live_"+keyID+"."+string(flipped))
	})
	t.Run("case-flipped key id", func(t *testing.T) {
		wantRefused(t, s, "mon_live_"+strings.ToLower(keyID)+"."+secret)
	})
	t.Run("malformed", func(t *testing.T) {
		wantRefused(t, s, full+"x")
		wantRefused(t, s, "Bearer "+full)
	})
	t.Run("other prefix", func(t *testing.T) {
		other := verifiers(keystore.New(pool, keystoretest.Format(t, "abc")))[kind]
		if _, ok, err := other.Verify(ctx, full); ok || err != nil {
			t.Errorf("a store for prefix abc accepted a mon key: %v, %v", ok, err)
		}
	})
	t.Run("revoked", func(t *testing.T) {
		rec, full := create(t, store, keystore.NewKey{OrgID: org, Name: "r", Role: keystore.RoleAdmin})
		if _, ok, _ := s.Verify(ctx, full); !ok {
			t.Fatal("fresh key refused")
		}
		if found, err := store.Revoke(ctx, org, rec.ID, "test"); !found || err != nil {
			t.Fatalf("Revoke = %v, %v", found, err)
		}
		wantRefused(t, s, full)
	})
	t.Run("expired", func(t *testing.T) {
		soon := time.Now().Add(time.Second)
		rec, full := create(t, store, keystore.NewKey{OrgID: org, Name: "e", Role: keystore.RoleViewer, ExpiresAt: &soon})
		if _, ok, _ := s.Verify(ctx, full); !ok {
			t.Fatal("key refused before its expiry")
		}
		// Move the expiry into the past rather than sleeping.
		if _, err := pool.Exec(ctx, `UPDATE api_keys SET expires_at = now() - interval '1 ms' WHERE key_id = $1`, rec.ID); err != nil {
			t.Fatal(err)
		}
		wantRefused(t, s, full)
	})
	t.Run("plan change applies on the next lookup", func(t *testing.T) {
		if _, err := pool.Exec(ctx, `UPDATE orgs SET plan = 'free' WHERE id = $1`, org); err != nil {
			t.Fatal(err)
		}
		k, ok, err := s.Verify(ctx, full)
		if err != nil || !ok || k.RateLimit != 0 {
			t.Errorf("Verify after moving to free = %+v, %v, %v; want rate limit 0", k, ok, err)
		}
	})
}

func TestVerifyTellsADeadDatabaseFromABadKey(t *testing.T) {
	s, _, org := newStore(t, "pro")
	_, full := create(t, s, keystore.NewKey{OrgID: org, Name: "k", Role: keystore.RoleAdmin})

	for name, ds := range verifiers(keystore.New(schematest.UnreachablePool(t), keystoretest.Format(t, "mon"))) {
		if _, ok, err := ds.Verify(context.Background(), full); ok || err == nil {
			t.Errorf("%s: Verify against a dead database = %v, %v; want an error", name, ok, err)
		}
		// A malformed key needs no database and is a plain refusal.
		if _, ok, err := ds.Verify(context.Background(), "garbage"); ok || err != nil {
			t.Errorf("%s: Verify(garbage) against a dead database = %v, %v; want refused without error", name, ok, err)
		}
	}
}

func TestVerifyTimesOutOnAStuckDatabase(t *testing.T) {
	ctx := context.Background()
	s, pool, org := newStore(t, "pro")
	_, full := create(t, s, keystore.NewKey{OrgID: org, Name: "k", Role: keystore.RoleAdmin})

	// Hold a lock that the lookup must wait for.
	holdLocks(t, pool, `LOCK TABLE api_keys IN ACCESS EXCLUSIVE MODE`)
	for name, v := range verifiers(s) {
		tctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		start := time.Now()
		_, ok, err := v.Verify(tctx, full)
		cancel()
		if ok || err == nil {
			t.Errorf("%s: Verify on a locked table = %v, %v; want an error", name, ok, err)
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Errorf("%s: Verify took %v past its 300ms deadline", name, d)
		}
	}
}

func TestCreateListRevoke(t *testing.T) {
	ctx := context.Background()
	s, pool, org := newStore(t, "pro")
	other := newOrg(t, pool, "pro")

	exp := time.Now().Add(24 * time.Hour).Truncate(time.Microsecond)
	a, fullA := create(t, s, keystore.NewKey{OrgID: org, Name: "first", Role: keystore.RoleAdmin, ExpiresAt: &exp})
	b, _ := create(t, s, keystore.NewKey{OrgID: org, Name: "second", Role: keystore.RoleViewer})
	foreign, fullForeign := create(t, s, keystore.NewKey{OrgID: other, Name: "theirs", Role: keystore.RoleAdmin})

	if !strings.HasPrefix(fullA, "mon_live_"+a.ID+".") {
		t.Errorf("full key %q does not carry its id %q", fullA, a.ID)
	}
	if a.ExpiresAt == nil || !a.ExpiresAt.Equal(exp) {
		t.Errorf("ExpiresAt = %v, want %v", a.ExpiresAt, exp)
	}

	// Only the digest is stored.
	var stored []byte
	if err := pool.QueryRow(ctx, `SELECT secret_hash FROM api_keys WHERE key_id = $1`, a.ID).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	_, secretA, _ := keystoretest.Format(t, "mon").Parse(fullA)
	if sum := keystore.HashSecret(secretA); string(stored) != string(sum[:]) {
		t.Errorf("stored %x, want SHA-256 of the secret", stored)
	}

	list, err := s.List(ctx, org)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].ID != a.ID || list[1].ID != b.ID {
		t.Fatalf("List = %+v, want keys %s and %s in order", list, a.ID, b.ID)
	}
	if list[1].Name != "second" || list[1].Role != keystore.RoleViewer || list[1].ExpiresAt != nil || list[1].RevokedAt != nil {
		t.Errorf("List entry = %+v", list[1])
	}

	// Revoking another org's key is "not found" and leaves it working.
	if found, err := s.Revoke(ctx, org, foreign.ID, "test"); found || err != nil {
		t.Errorf("Revoke(foreign) = %v, %v; want not found", found, err)
	}
	if _, ok, _ := s.Verify(ctx, fullForeign); !ok {
		t.Error("the foreign key stopped working after a refused revoke")
	}
	if found, err := s.Revoke(ctx, org, "not-a-key-id", "test"); found || err != nil {
		t.Errorf("Revoke(malformed id) = %v, %v; want not found", found, err)
	}

	// Revoking twice succeeds and keeps the first time.
	if found, err := s.Revoke(ctx, org, b.ID, "test"); !found || err != nil {
		t.Fatalf("Revoke = %v, %v", found, err)
	}
	list, _ = s.List(ctx, org)
	first := list[1].RevokedAt
	if first == nil {
		t.Fatal("revoked key lists no revoked_at")
	}
	if found, err := s.Revoke(ctx, org, b.ID, "test"); !found || err != nil {
		t.Fatalf("second Revoke = %v, %v", found, err)
	}
	list, _ = s.List(ctx, org)
	if !list[1].RevokedAt.Equal(*first) {
		t.Errorf("second revoke moved revoked_at from %v to %v", first, list[1].RevokedAt)
	}
}

func TestCreateRefusesWhatTheDatabaseForbids(t *testing.T) {
	s, _, org := newStore(t, "pro")
	for _, nk := range []keystore.NewKey{
		{OrgID: org, Name: "x", Role: "Owner"},
		{OrgID: org, Name: "", Role: keystore.RoleAdmin},
		{OrgID: org, Name: strings.Repeat("n", 101), Role: keystore.RoleAdmin},
		{OrgID: "00000000-0000-0000-0000-000000000000", Name: "x", Role: keystore.RoleAdmin},
	} {
		if _, _, err := s.Create(context.Background(), nk); err == nil {
			t.Errorf("Create(%+v) succeeded", nk)
		}
	}
}

// TestVerifySurvivesConnectionsKilledUnderIt is a PostgreSQL restart as the pool sees it:
// every idle connection is dead. The next lookup must still answer, not fail.
func TestVerifySurvivesConnectionsKilledUnderIt(t *testing.T) {
	ctx := context.Background()
	s, pool, org := newStore(t, "pro")
	_, full := create(t, s, keystore.NewKey{OrgID: org, Name: "k", Role: keystore.RoleAdmin})
	for name, v := range verifiers(s) {
		if _, ok, err := v.Verify(ctx, full); !ok || err != nil {
			t.Fatalf("%s: before = %v, %v", name, ok, err)
		}
		admin, err := pgxpool.New(ctx, schematest.URL(t))
		if err != nil {
			t.Fatal(err)
		}
		var killed int
		err = admin.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
WHERE datname = $1 AND pid <> pg_backend_pid()`, pool.Config().ConnConfig.Database).Scan(&killed)
		admin.Close()
		if err != nil || killed == 0 {
			t.Fatalf("terminating the pool's connections: %d, %v", killed, err)
		}
		if _, ok, err := v.Verify(ctx, full); !ok || err != nil {
			t.Errorf("%s: Verify after its connections were killed = %v, %v; want ok", name, ok, err)
		}
	}
}

// TestLookupFindsExactlyTheLiveKeysOfEveryBatchSize looks up batches of every shape the
// store sends (one id, IN lists of 2 to 64 parameters with the last id repeated, ANY
// beyond), each mixing live, revoked, expired and unknown key ids and live ids
// presented with a wrong secret, after enough lookups of each that PostgreSQL has
// moved every statement to its generic plan. A live id whose digest the lookup does not
// present is not found: the database filters it out as it does a revoked key.
func TestLookupFindsExactlyTheLiveKeysOfEveryBatchSize(t *testing.T) {
	ctx := context.Background()
	store, pool, org := newStore(t, "pro")
	var ids, live []string
	var sums [][]byte
	for i := range 100 {
		rec, full := create(t, store, keystore.NewKey{OrgID: org, Name: "k", Role: keystore.RoleViewer})
		ids = append(ids, rec.ID)
		_, secret, _ := strings.Cut(full, ".")
		sum := keystore.HashSecret(secret)
		sums = append(sums, sum[:])
		switch i % 5 {
		case 1:
			if _, err := store.Revoke(ctx, org, rec.ID, "test"); err != nil {
				t.Fatal(err)
			}
		case 2:
			if _, err := pool.Exec(ctx, `UPDATE api_keys SET expires_at = now() - interval '1 ms' WHERE key_id = $1`, rec.ID); err != nil {
				t.Fatal(err)
			}
		case 3:
			ids[i] = strings.Repeat("Q", 20) + strconv.Itoa(10+i) // unknown
		case 4:
			wrong := keystore.HashSecret(secret + "x") // a live id, a wrong secret
			sums[i] = wrong[:]
		default:
			live = append(live, rec.ID)
		}
	}
	for _, n := range []int{1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 31, 33, 63, 64, 65, 80, 100} {
		// Ending with an unknown id and a live id with a wrong secret, which padding repeats.
		batch, batchSums := ids[len(ids)-n:], sums[len(sums)-n:]
		var want []string
		for _, id := range batch {
			if slices.Contains(live, id) {
				want = append(want, id)
			}
		}
		slices.Sort(want)
		for range 8 { // PostgreSQL plans the first five executions on their own
			got, err := store.Lookup(ctx, batch, batchSums)
			if err != nil || !slices.Equal(got, want) {
				t.Fatalf("Lookup(%d ids) = %v, %v; want %v", n, got, err, want)
			}
		}
	}
}

// batchCounter is a pgx tracer that counts the batches a connection sends.
type batchCounter struct{ batches int }

func (c *batchCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (c *batchCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *batchCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.batches++
	return ctx
}
func (c *batchCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (c *batchCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

func TestPrepareLookupsPreparesEveryLookupOnTheConnection(t *testing.T) {
	// Every shape of lookup (one id, IN lists of 2 to 64, ANY) is prepared at once, in
	// one batch, so that no lookup on a new connection pays a round trip to prepare; in
	// the exec modes that prepare nothing (PgBouncer's), nothing is sent. The server's
	// view counts distinct statements: through PgBouncer in transaction pooling a
	// server connection is shared, and may hold what another client prepared.
	_, pool, _ := newStore(t, "pro")
	ctx := context.Background()
	for _, tc := range []struct {
		mode     pgx.QueryExecMode
		batches  int
		prepared int // distinct lookups the server holds prepared afterwards; -1: not asked
	}{
		{pgx.QueryExecModeCacheStatement, 1, 8},
		{pgx.QueryExecModeExec, 0, -1},
	} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			cfg := pool.Config().ConnConfig.Copy()
			cfg.DefaultQueryExecMode = tc.mode
			counter := &batchCounter{}
			cfg.Tracer = counter
			conn, err := pgx.ConnectConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			if err := keystore.PrepareLookups(ctx, conn); err != nil {
				t.Fatalf("PrepareLookups: %v", err)
			}
			if counter.batches != tc.batches {
				t.Errorf("PrepareLookups sent %d batches, want %d", counter.batches, tc.batches)
			}
			if tc.prepared < 0 {
				return
			}
			var n int
			if err := conn.QueryRow(ctx, "SELECT count(DISTINCT statement) FROM pg_prepared_statements WHERE statement LIKE 'SELECT k.key_id%'").Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != tc.prepared {
				t.Errorf("%d lookups prepared, want %d", n, tc.prepared)
			}
		})
	}
}
