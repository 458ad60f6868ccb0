package keystore_test

import (
	"context"
	"fmt"
	"net/netip"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keygate/keygate/internal/testkit/testenv"
	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/keystore/keystoretest"
	"github.com/keygate/keygate/schema/schematest"
)

// These tests need the stack's standbys: scripts/stack.sh up-standbys. The standby
// of DATABASE_STANDBY_SLOW_URL replays every commit seconds late.

// standbyPool returns a pool on the standby of the environment variable env, in the
// test database of primary, closed when the test ends. The database reaches the
// standby when the standby replays its creation; until then the pool's queries fail.
// The fast standby is waited for until it has replayed the creation, and whatever the
// other packages wrote before it.
func standbyPool(t testing.TB, primary *pgxpool.Pool, env string) *pgxpool.Pool {
	t.Helper()
	if env == "DATABASE_STANDBY_FAST_URL" {
		testenv.WaitForReplay(t, testenv.Getenv(t, "DATABASE_URL"), testenv.GetenvOrSkip(t, env), 2*time.Minute)
	}
	u, err := url.Parse(testenv.GetenvOrSkip(t, env))
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + primary.Config().ConnConfig.Database
	cfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		t.Fatal(err)
	}
	return schematest.OpenPool(t, cfg)
}

// counted is a Reader with its lookups counted by the server that answered them, and
// the number of its standbys taking lookups.
type counted struct {
	*keystore.Reader
	standby, primary atomic.Int64
	in               atomic.Int32
	waits            atomic.Int64 // lookups that waited for a standby's replay
}

func newReader(t *testing.T, s *keystore.Store, pool *pgxpool.Pool, standbys []*pgxpool.Pool, opts keystore.ReaderOptions) *counted {
	t.Helper()
	c := &counted{}
	opts.OnLookup = func(_ context.Context, standby bool) {
		if standby {
			c.standby.Add(1)
		} else {
			c.primary.Add(1)
		}
	}
	opts.OnReplayWait = func(time.Duration) { c.waits.Add(1) }
	opts.OnStandby = func(_ int, in bool) {
		if in {
			c.in.Add(1)
		} else {
			c.in.Add(-1)
		}
	}
	c.Reader = keystore.NewReader(keystore.NewBatcher(s, opts.Batcher), pool, standbys, opts)
	t.Cleanup(c.Close)
	return c
}

// waitForAStandby verifies full, which must be live, until a standby answers it.
func waitForAStandby(t *testing.T, r *counted, full string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for before := r.standby.Load(); r.standby.Load() == before; {
		if time.Now().After(deadline) {
			t.Fatalf("no standby answered within 30s (%d lookups on the primary)", r.primary.Load())
		}
		if _, ok, err := r.Verify(context.Background(), full); !ok || err != nil {
			t.Fatalf("Verify of a live key = %v, %v", ok, err)
		}
		time.Sleep(5 * time.Millisecond) // until the probe lets the standby in
	}
}

// waitForStandbysIn waits until all n standbys of r take lookups.
func waitForStandbysIn(t *testing.T, r *counted, n int) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, "every standby taking lookups", func() bool {
		return r.in.Load() == int32(n)
	})
}

// writeLoad inserts rows into a table of pool's database until the test ends, one
// every 2ms, as the other tests and the gateways' own writes do on a busy primary. The
// primary's position moves all the time: a fresh reading of it is nearly always a
// little past what a standby has replayed.
func writeLoad(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	if _, err := pool.Exec(ctx, `CREATE TABLE write_load (n int)`); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if _, err := pool.Exec(ctx, `INSERT INTO write_load VALUES (1)`); err != nil && ctx.Err() == nil {
				t.Errorf("write load: %v", err)
				return
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

// TestReaderRefusesAKeyRevokedBeforeTheLookupOnEveryStandby revokes keys one after
// another and looks each up at once: a lagging standby must not answer with the key
// it still has. The slow standby has every key long before it is revoked, and still
// has it for seconds after.
func TestReaderRefusesAKeyRevokedBeforeTheLookupOnEveryStandby(t *testing.T) {
	for _, tc := range []struct {
		name string
		envs []string
	}{
		{"fast standby", []string{"DATABASE_STANDBY_FAST_URL"}},
		{"slow standby", []string{"DATABASE_STANDBY_SLOW_URL"}},
		{"both", []string{"DATABASE_STANDBY_FAST_URL", "DATABASE_STANDBY_SLOW_URL"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			s, pool, org := newStore(t, "pro")
			var standbys []*pgxpool.Pool
			for _, env := range tc.envs {
				standbys = append(standbys, standbyPool(t, pool, env))
			}
			// A lag of a minute keeps the slow standby in: the fence alone must
			// keep its stale rows out. Each lookup waits for it at most half the
			// Timeout, short of its delay, before the primary answers.
			r := newReader(t, s, pool, standbys, keystore.ReaderOptions{
				MaxLag: time.Minute, Batcher: keystore.BatcherOptions{Timeout: time.Second}})
			var keys []keystore.Record
			var fulls []string
			for range 5 {
				rec, full := create(t, s, keystore.NewKey{OrgID: org, Name: "k", Role: keystore.RoleAdmin})
				keys, fulls = append(keys, rec), append(fulls, full)
			}
			waitForStandbysIn(t, r, len(standbys))
			if tc.name == "fast standby" {
				waitForAStandby(t, r, fulls[len(fulls)-1])
			}
			for i := range keys {
				if found, err := s.Revoke(ctx, org, keys[i].ID, "test"); !found || err != nil {
					t.Fatalf("Revoke = %v, %v", found, err)
				}
				for range 3 {
					if _, ok, err := r.Verify(ctx, fulls[i]); ok || err != nil {
						t.Fatalf("key %d after its revocation: Verify = %v, %v; want refused", i, ok, err)
					}
				}
			}
			t.Logf("lookups: %d on standbys, %d on the primary", r.standby.Load(), r.primary.Load())
		})
	}
}

// TestReaderRefusesEveryLookupStartedAfterARevokeUnderLoad is the Batcher's freshness
// test through standbys: lookups of a key run from many goroutines while it is
// revoked, and every one that started after Revoke returned must be refused.
func TestReaderRefusesEveryLookupStartedAfterARevokeUnderLoad(t *testing.T) {
	ctx := context.Background()
	s, pool, org := newStore(t, "pro")
	r := newReader(t, s, pool, []*pgxpool.Pool{
		standbyPool(t, pool, "DATABASE_STANDBY_FAST_URL"),
		standbyPool(t, pool, "DATABASE_STANDBY_SLOW_URL"),
	}, keystore.ReaderOptions{MaxLag: time.Minute, Batcher: keystore.BatcherOptions{Lanes: 2}})
	victim, full := create(t, s, keystore.NewKey{OrgID: org, Name: "victim", Role: keystore.RoleAdmin})
	waitForAStandby(t, r, full)

	var (
		revoked    atomic.Int64 // unix nanoseconds when Revoke returned; 0 before
		wrong, all atomic.Int64
		stop       atomic.Bool
		wg         sync.WaitGroup
	)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				start := time.Now().UnixNano()
				_, ok, err := r.Verify(ctx, full)
				if err != nil {
					t.Errorf("Verify: %v", err)
					return
				}
				if after := revoked.Load(); after != 0 && start > after {
					all.Add(1)
					if ok {
						wrong.Add(1)
					}
				}
			}
		}()
	}
	time.Sleep(300 * time.Millisecond) // load before the revoke
	if found, err := s.Revoke(ctx, org, victim.ID, "test"); !found || err != nil {
		t.Fatalf("Revoke = %v, %v", found, err)
	}
	revoked.Store(time.Now().UnixNano())
	time.Sleep(500 * time.Millisecond) // load after it
	stop.Store(true)
	wg.Wait()
	if all.Load() == 0 {
		t.Fatal("no lookup started after the revoke")
	}
	if wrong.Load() != 0 {
		t.Errorf("%d of %d lookups started after the revoke accepted the key", wrong.Load(), all.Load())
	}
	t.Logf("lookups: %d on standbys, %d on the primary; %d after the revoke", r.standby.Load(), r.primary.Load(), all.Load())
}

// TestReaderSendsMostLookupsToTheStandbys: while the test writes nothing, a standby
// that keeps up answers most lookups, the primary only the fence's small query, at
// most one a batch. The page header of an idle primary's insert position must not
// keep them on the primary.
func TestReaderSendsMostLookupsToTheStandbys(t *testing.T) {
	ctx := context.Background()
	s, pool, org := newStore(t, "pro")
	r := newReader(t, s, pool, []*pgxpool.Pool{standbyPool(t, pool, "DATABASE_STANDBY_FAST_URL")}, keystore.ReaderOptions{})
	_, full := create(t, s, keystore.NewKey{OrgID: org, Name: "k", Role: keystore.RoleAdmin})
	waitForAStandby(t, r, full)
	r.standby.Store(0)
	r.primary.Store(0)
	began, readings, queries := time.Now(), r.FenceReadings(), r.StandbyQueries()
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				if _, ok, err := r.Verify(ctx, full); !ok || err != nil {
					t.Errorf("Verify = %v, %v", ok, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	// Other writers of the server (other tests' databases, the server's own
	// background records) move the primary's position too, and send a few lookups
	// to the primary while the standby replays them.
	if st, pr := r.standby.Load(), r.primary.Load(); st+pr != 800 || st < 2*pr {
		t.Errorf("lookups: %d on the standby, %d on the primary; want 800, at least two in three on the standby", st, pr)
	}
	// A reading goes out only with a batch, or for the probe (every 250 ms here).
	readings, queries = r.FenceReadings()-readings, r.StandbyQueries()-queries
	if probes := uint64(time.Since(began)/(250*time.Millisecond)) + 2; readings > queries+probes {
		t.Errorf("%d readings of the primary for %d batches on the standby; want at most one a batch (and %d for the probe)", readings, queries, probes)
	}
}

// TestReaderWaitsForAStandbyToReplayAWritingPrimary: while the primary writes all the
// time, a fresh reading of its position is nearly always past the standby's replay at
// the lookup. The lookups wait the few milliseconds the standby takes to replay it,
// and the standby still answers most of them; the probe keeps it in throughout.
func TestReaderWaitsForAStandbyToReplayAWritingPrimary(t *testing.T) {
	ctx := context.Background()
	s, pool, org := newStore(t, "pro")
	r := newReader(t, s, pool, []*pgxpool.Pool{standbyPool(t, pool, "DATABASE_STANDBY_FAST_URL")}, keystore.ReaderOptions{})
	victim, full := create(t, s, keystore.NewKey{OrgID: org, Name: "k", Role: keystore.RoleAdmin})
	writeLoad(t, pool)
	waitForAStandby(t, r, full)
	r.standby.Store(0)
	r.primary.Store(0)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				if _, ok, err := r.Verify(ctx, full); !ok || err != nil {
					t.Errorf("Verify = %v, %v", ok, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if st, pr := r.standby.Load(), r.primary.Load(); st+pr != 200 || st < 2*pr {
		t.Errorf("lookups under write load: %d on the standby, %d on the primary; want 200, at least two in three on the standby", st, pr)
	}
	if r.waits.Load() == 0 {
		t.Errorf("no lookup waited for the standby's replay: the write load did not move the primary's position")
	}
	if n := r.in.Load(); n != 1 {
		t.Errorf("standbys in after the load: %d, want 1", n)
	}
	// The wait never lets the standby answer before it has replayed the revoke.
	if found, err := s.Revoke(ctx, org, victim.ID, "test"); !found || err != nil {
		t.Fatalf("Revoke = %v, %v", found, err)
	}
	before := r.standby.Load()
	for range 20 {
		if _, ok, err := r.Verify(ctx, full); ok || err != nil {
			t.Fatalf("after the revoke: Verify = %v, %v; want refused", ok, err)
		}
	}
	if r.standby.Load() == before {
		t.Errorf("no refusal after the revoke came from the standby")
	}
}

// TestReaderChecksTheClientAddressOnTheStandby: a key with allowed networks, asked
// from outside them, is refused by the standby's lookup as by the primary's; asked from
// inside, the standby answers it.
func TestReaderChecksTheClientAddressOnTheStandby(t *testing.T) {
	ctx := context.Background()
	s, pool, org := newStore(t, "pro")
	r := newReader(t, s, pool, []*pgxpool.Pool{standbyPool(t, pool, "DATABASE_STANDBY_FAST_URL")}, keystore.ReaderOptions{})
	_, full := create(t, s, keystore.NewKey{OrgID: org, Name: "k", Role: keystore.RoleAdmin,
		AllowedCIDRs: []netip.Prefix{netip.MustParsePrefix("10.9.0.0/16")}})
	waitForAStandby(t, r, full)
	id, secret, _ := keystoretest.Format(t, "mon").Parse(full)
	before := r.standby.Load()
	if _, ok, err := r.VerifyParsed(ctx, id, secret, netip.MustParseAddr("203.0.113.1")); ok || err != nil {
		t.Errorf("from outside the key's networks: VerifyParsed = %v, %v; want refused", ok, err)
	}
	if _, ok, err := r.VerifyParsed(ctx, id, secret, netip.MustParseAddr("10.9.1.1")); !ok || err != nil {
		t.Errorf("from inside the key's networks: VerifyParsed = %v, %v; want accepted", ok, err)
	}
	if got := r.standby.Load() - before; got != 2 {
		t.Errorf("%d of the 2 lookups answered by the standby, want both", got)
	}
}

// TestReaderAnswersFromThePrimaryWithoutAStandby: a standby that cannot be reached
// costs no lookup an error; the primary answers them all.
func TestReaderAnswersFromThePrimaryWithoutAStandby(t *testing.T) {
	ctx := context.Background()
	s, pool, org := newStore(t, "pro")
	r := newReader(t, s, pool, []*pgxpool.Pool{schematest.UnreachablePool(t)}, keystore.ReaderOptions{})
	_, full := create(t, s, keystore.NewKey{OrgID: org, Name: "k", Role: keystore.RoleAdmin})
	for range 20 {
		if _, ok, err := r.Verify(ctx, full); !ok || err != nil {
			t.Fatalf("Verify = %v, %v", ok, err)
		}
	}
	if st, pr := r.standby.Load(), r.primary.Load(); st != 0 || pr != 20 {
		t.Errorf("lookups: %d on the standby, %d on the primary; want 0 and 20", st, pr)
	}
}

// TestReaderIsBrokenWhenThePrimaryIsDown: without the primary a lookup cannot be
// fenced, so a standby's answer cannot be trusted. The lookup fails: an error, never
// a refusal or an acceptance.
func TestReaderIsBrokenWhenThePrimaryIsDown(t *testing.T) {
	ctx := context.Background()
	s, pool, org := newStore(t, "pro")
	_, full := create(t, s, keystore.NewKey{OrgID: org, Name: "k", Role: keystore.RoleAdmin})
	// A pool of the Reader's own, closed below as a dead primary.
	primary, err := pgxpool.New(ctx, pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer primary.Close()
	r := newReader(t, keystore.New(primary, keystoretest.Format(t, "mon")), primary,
		[]*pgxpool.Pool{standbyPool(t, pool, "DATABASE_STANDBY_FAST_URL")}, keystore.ReaderOptions{})
	waitForAStandby(t, r, full)
	primary.Close()
	if _, ok, err := r.Verify(ctx, full); ok || err == nil {
		t.Errorf("Verify with the primary down = %v, %v; want an error", ok, err)
	}
}

// TestReaderAnswersWithinTheTimeoutWhileAStandbyHangs: a lookup bounded by the
// Timeout, as a request is, still gets its answer from the primary while its standby
// hangs: the standby's tries take at most half of it. Once resumed, the standby
// answers again.
func TestReaderAnswersWithinTheTimeoutWhileAStandbyHangs(t *testing.T) {
	s, pool, org := newStore(t, "pro")
	standby := standbyPool(t, pool, "DATABASE_STANDBY_FAST_URL")
	cfg := standby.Config()
	proxy := schematest.Proxied(t, cfg)
	const timeout = time.Second
	r := newReader(t, s, pool, []*pgxpool.Pool{schematest.OpenPool(t, cfg)},
		keystore.ReaderOptions{Batcher: keystore.BatcherOptions{Timeout: timeout}})
	_, full := create(t, s, keystore.NewKey{OrgID: org, Name: "k", Role: keystore.RoleAdmin})
	waitForAStandby(t, r, full)

	proxy.Hang()
	for i := range 5 {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		_, ok, err := r.Verify(ctx, full)
		cancel()
		if !ok || err != nil {
			t.Fatalf("lookup %d with the standby hung: Verify = %v, %v; want the primary's answer", i, ok, err)
		}
	}
	proxy.Resume()
	waitForAStandby(t, r, full)
}

// A gateway looks keys up on its standbys, with the primary answering what they
// cannot. A key revoked on the primary before Verify is called is refused, whichever
// server answers. (Compiled, not run: it needs a primary and a standby.)
func ExampleNewReader() {
	ctx := context.Background()
	primary, err := pgxpool.New(ctx, "postgres://keygate@primary:5432/keygate")
	if err != nil {
		panic(err)
	}
	defer primary.Close()
	standby, err := pgxpool.New(ctx, "postgres://keygate@standby1:5432/keygate")
	if err != nil {
		panic(err)
	}
	defer standby.Close()

	format, _ := keystore.NewFormat("mon")
	opts := keystore.BatcherOptions{Timeout: 2 * time.Second}
	r := keystore.NewReader(keystore.NewBatcher(keystore.New(primary, format), opts), primary,
		[]*pgxpool.Pool{standby}, keystore.ReaderOptions{Batcher: opts, MaxLag: time.Second})
	defer r.Close()

	key, ok, err := r.Verify(ctx, "mon_live_…")
	switch {
	case err != nil:
		fmt.Println("503: the primary could not fence the lookup, or answer it")
	case !ok:
		fmt.Println("401")
	default:
		fmt.Println("key", key.ID, "of", key.OrgID)
	}
}
