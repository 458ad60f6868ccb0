package keystore_test

import (
	"context"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keygate/keygate/internal/pgfailover"
	"github.com/keygate/keygate/internal/testkit/pgpair"
	"github.com/keygate/keygate/internal/testkit/testenv"
	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/keystore/keystoretest"
	"github.com/keygate/keygate/schema/schematest"
)

// TestOnlyWritesThatTakeAccessAwayWaitForTheSynchronousStandby: a primary whose
// synchronous standby has stopped confirming. Each write that takes access away is
// still waiting for the standby when its context ends, a second on: acknowledged, it
// would have survived a failover to the standby, even one that finds nothing left to
// change. Every other write commits at once.
func TestOnlyWritesThatTakeAccessAwayWaitForTheSynchronousStandby(t *testing.T) {
	pair := pgpair.Start(t)
	t.Setenv("DATABASE_URL", pair.PrimaryURL) // the test's database is made on the pair
	s, pool, org := newStore(t, "pro")
	actor := newUser(t, pool)
	net10 := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	net10a := []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}
	// Each write has a key of its own: a write still waiting holds its key's row.
	key := func(cidrs []netip.Prefix, scopes []string) (keystore.Record, string) {
		return create(t, s, keystore.NewKey{OrgID: org, Name: "k", Role: keystore.RoleAdmin, AllowedCIDRs: cidrs, Scopes: scopes})
	}
	update := func(cidrs []netip.Prefix, scopes []string, u keystore.Update) func(context.Context) error {
		rec, _ := key(cidrs, scopes)
		return func(ctx context.Context) error {
			_, err := s.Update(ctx, org, rec.ID, u, actor)
			return err
		}
	}
	revoke, revokeFull := key(nil, nil)
	rolled, _ := key(nil, nil)
	_, leaked := key(nil, nil)
	used, _ := key(nil, nil)
	replayed, _ := key(nil, nil)
	replay := func(dryRun bool) func(context.Context) error {
		return func(ctx context.Context) error {
			_, err := s.Replay(ctx, []keystore.Event{{OrgID: org, Action: keystore.ActionRevoked, KeyID: replayed.ID, At: time.Now()}}, dryRun)
			return err
		}
	}
	lastUsed := keystore.NewLastUsed(pool, keystore.LastUsedOptions{})
	usage := keystore.NewUsage(pool, keystore.UsageOptions{})
	limit := 10
	writes := []struct {
		name   string
		synced bool
		write  func(context.Context) error
	}{
		{"revoke a key", true, func(ctx context.Context) error {
			_, err := s.Revoke(ctx, org, revoke.ID, actor)
			return err
		}},
		{"report a key leaked", true, func(ctx context.Context) error {
			_, err := s.RevokeLeaked(ctx, []keystore.LeakReport{{Token: leaked, URL: "https://example.com/paste"}})
			return err
		}},
		{"roll a key", true, func(ctx context.Context) error {
			_, _, err := s.Roll(ctx, org, rolled.ID, time.Hour, actor)
			return err
		}},
		{"replay a revocation after a restore", true, replay(false)},
		{"narrow a key's networks", true, update(net10, nil, keystore.Update{SetAllowedCIDRs: true, AllowedCIDRs: net10a})},
		{"give a key networks", true, update(nil, nil, keystore.Update{SetAllowedCIDRs: true, AllowedCIDRs: net10})},
		{"narrow a key's scopes", true, update(nil, []string{keystore.ScopeMonitorsRead, keystore.ScopeMonitorsWrite},
			keystore.Update{SetScopes: true, Scopes: []string{keystore.ScopeMonitorsRead}})},
		{"give a key scopes", true, update(nil, nil, keystore.Update{SetScopes: true, Scopes: []string{keystore.ScopeMonitorsRead}})},
		{"replay a revocation as a dry run", false, replay(true)},
		{"create a key", false, func(ctx context.Context) error {
			_, _, err := s.Create(ctx, keystore.NewKey{OrgID: org, Name: "new", Role: keystore.RoleViewer})
			return err
		}},
		{"widen a key's networks", false, update(net10a, nil, keystore.Update{SetAllowedCIDRs: true, AllowedCIDRs: net10})},
		{"take a key's networks away", false, update(net10, nil, keystore.Update{SetAllowedCIDRs: true, AllowedCIDRs: nil})},
		{"widen a key's scopes", false, update(nil, []string{keystore.ScopeMonitorsRead},
			keystore.Update{SetScopes: true, Scopes: []string{keystore.ScopeMonitorsRead, keystore.ScopeMonitorsWrite}})},
		{"lower a key's rate limit", false, update(nil, nil, keystore.Update{SetRateLimit: true, RateLimit: &limit})},
		{"note a key's last use", false, func(ctx context.Context) error {
			lastUsed.Record(used.ID)
			return lastUsed.Flush(ctx)
		}},
		{"record usage", false, func(ctx context.Context) error {
			usage.Record(org, used.ID, time.Now(), keystore.OutcomeMe, 200, 1)
			return usage.Flush(ctx)
		}},
	}
	pair.StopStandby()
	t.Cleanup(pair.StartStandby) // before the database is dropped: that waits for the standby too
	for _, w := range writes {
		t.Run(w.name, func(t *testing.T) {
			if !w.synced {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				start := time.Now()
				if err := w.write(ctx); err != nil {
					t.Errorf("%v after %v; want it committed without the standby", err, time.Since(start))
				}
				return
			}
			wantWaiting(t, w.write)
		})
	}

	// pgx cancels the query it gives up on, and PostgreSQL then commits the
	// revocation on the primary alone. Revoking the key again changes nothing, and is
	// still not acknowledged before the standby has the first revocation.
	testenv.Eventually(t, 30*time.Second, "the cancelled revocation committed on the primary alone", func() bool {
		_, ok, err := s.Verify(context.Background(), revokeFull)
		return err == nil && !ok
	})
	wantWaiting(t, func(ctx context.Context) error {
		_, err := s.Revoke(ctx, org, revoke.ID, actor)
		return err
	})
}

// wantWaiting runs a write that must wait for the synchronous standby, and fails the
// test unless it is still waiting when its context ends, a second on.
func wantWaiting(t *testing.T, write func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	if err := write(ctx); err == nil || ctx.Err() == nil {
		t.Errorf("%v after %v; want it waiting for the standby until its context ends", err, time.Since(start))
	}
}

// TestAfterAFailoverNoLookupFailsOnceOneIsAnswered: a Reader whose primary is
// reached through a URL of both servers, with a floor of open connections, and whose
// standby is the synchronous one. The primary crashes and the standby is promoted.
// Once the promoted server takes connections, no lookup fails: under concurrent
// lookups the pool hands out none of the connections the crash left in it. A key revoked before the crash is
// refused. The promoted server answers no lookup as a standby, which it no longer is.
func TestAfterAFailoverNoLookupFailsOnADeadConnection(t *testing.T) {
	ctx := context.Background()
	pair := pgpair.Start(t)
	t.Setenv("DATABASE_URL", pair.PrimaryURL)
	s, pool, org := newStore(t, "pro")
	const floor = 8
	both := poolOn(t, pair.FailoverURL, pool, floor)
	standby := poolOn(t, pair.StandbyURL, pool, 0)
	r := newReader(t, keystore.New(both, keystoretest.Format(t, "mon")), both, []*pgxpool.Pool{standby},
		keystore.ReaderOptions{Batcher: keystore.BatcherOptions{Timeout: 2 * time.Second, Lanes: 4}})
	_, live := create(t, s, keystore.NewKey{OrgID: org, Name: "live", Role: keystore.RoleAdmin})
	revoked, gone := create(t, s, keystore.NewKey{OrgID: org, Name: "revoked", Role: keystore.RoleAdmin})
	waitForAStandby(t, r, live)
	if found, err := s.Revoke(ctx, org, revoked.ID, "test"); !found || err != nil {
		t.Fatalf("Revoke = %v, %v", found, err)
	}
	testenv.Eventually(t, 30*time.Second, "the floor of connections open", func() bool {
		return both.Stat().TotalConns() >= floor
	})

	pair.KillPrimary()
	pair.Promote()
	// No lookup meanwhile, as behind a breaker that is open: the crash's connections
	// are all still in the pool when the lookups come.
	testenv.Eventually(t, 30*time.Second, "the promoted server taking writes through the URL of both", func() bool {
		conn, err := pgx.Connect(ctx, pair.FailoverURL)
		if err == nil {
			conn.Close(ctx)
		}
		return err == nil
	})
	onStandby := r.standby.Load()
	var (
		wg     sync.WaitGroup
		failed atomic.Int64
	)
	for range floor {
		wg.Go(func() {
			for range 5 {
				if _, ok, err := r.Verify(ctx, live); !ok || err != nil {
					failed.Add(1)
					t.Logf("a lookup after the promotion: %v, %v", ok, err)
				}
			}
		})
	}
	wg.Wait()
	if n := failed.Load(); n != 0 {
		t.Errorf("%d of %d lookups after the promotion failed, want none", n, floor*5)
	}
	if _, ok, err := r.Verify(ctx, gone); ok || err != nil {
		t.Errorf("the key revoked before the crash: Verify = %v, %v; want refused", ok, err)
	}
	if got := r.standby.Load() - onStandby; got != 0 {
		t.Errorf("%d lookups answered by the promoted server as a standby, want none", got)
	}
}

// poolOn opens a pool on the database of like at the servers of url, keeping floor
// connections open, that follows a failover as the gateway's pools do.
func poolOn(t *testing.T, url string, like *pgxpool.Pool, floor int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Database = like.Config().ConnConfig.Database
	cfg.MinConns, cfg.MaxConns = floor, max(floor, 4)
	cfg.HealthCheckPeriod = 100 * time.Millisecond
	pgfailover.Follow(cfg)
	return schematest.OpenPool(t, cfg)
}

// TestAStandbyThatFollowsThePromotedPrimaryServesLookupsAgain: a second standby,
// asynchronous, takes a Reader's lookups. The primary crashes, the synchronous
// standby is promoted, and the second is pointed at it, as a failover tool does. It
// follows the new timeline and takes lookups again, fenced on the new primary: a key
// revoked there is refused on the next lookup.
func TestAStandbyThatFollowsThePromotedPrimaryServesLookupsAgain(t *testing.T) {
	ctx := context.Background()
	pair := pgpair.Start(t)
	second := pair.AddStandby(2)
	t.Setenv("DATABASE_URL", pair.PrimaryURL)
	s, pool, org := newStore(t, "pro")
	both := poolOn(t, pair.FailoverURL, pool, 0)
	r := newReader(t, keystore.New(both, keystoretest.Format(t, "mon")), both, []*pgxpool.Pool{poolOn(t, second, pool, 0)},
		keystore.ReaderOptions{Batcher: keystore.BatcherOptions{Timeout: 2 * time.Second}})
	_, live := create(t, s, keystore.NewKey{OrgID: org, Name: "live", Role: keystore.RoleAdmin})
	waitForAStandby(t, r, live)
	// Both standbys have all the primary wrote, so that the second can follow the
	// first: a standby ahead of the one promoted could not.
	for _, standby := range []string{pair.StandbyURL, second} {
		testenv.WaitForReplay(t, pair.PrimaryURL, standby, time.Minute)
	}

	pair.KillPrimary()
	pair.Promote()
	pair.Follow(2)
	s = keystore.New(both, keystoretest.Format(t, "mon")) // the store of the new primary
	doomed, full := create(t, s, keystore.NewKey{OrgID: org, Name: "doomed", Role: keystore.RoleAdmin})
	waitForAStandby(t, r, full)
	if found, err := s.Revoke(ctx, org, doomed.ID, "test"); !found || err != nil {
		t.Fatalf("Revoke on the new primary = %v, %v", found, err)
	}
	for range 3 {
		if _, ok, err := r.Verify(ctx, full); ok || err != nil {
			t.Fatalf("a key revoked on the new primary: Verify = %v, %v; want refused", ok, err)
		}
	}
}
