package integration

// PostgreSQL failing over under the gateways and the upstream: a primary of the test's
// own with a synchronous standby (scripts/stack.sh up-failover, through pgpair), both
// named in database_url and DATABASE_URL with target_session_attrs=read-write, the
// standby in database_read_urls too. The shared servers are not touched.

import (
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/keygate/keygate/internal/testkit/pgpair"
	"github.com/keygate/keygate/internal/testkit/testenv"
)

// failoverTimeout is the upstream's --database-timeout in these tests: the bound on a
// revocation that waits for a standby that does not confirm.
const failoverTimeout = 2 * time.Second

// newFailoverStack is newStack on a pair of the test's own: the test's database is
// made on its primary, and the gateways, the upstream and the operator CLI reach it
// through the URL of both servers. The gateways flush usage every second.
func newFailoverStack(t *testing.T) (*Stack, *pgpair.Pair) {
	t.Helper()
	pair := pgpair.Start(t)
	t.Setenv("DATABASE_URL", pair.PrimaryURL) // schematest makes the database there
	s := newStackWith(t, stackOptions{
		databaseVia: func(direct string) string {
			d, err := url.Parse(direct)
			if err != nil {
				t.Fatal(err)
			}
			for env, base := range map[string]string{"KEYGATE_TEST_FAILOVER_STANDBY": pair.StandbyURL, "": pair.FailoverURL} {
				u, err := url.Parse(base)
				if err != nil {
					t.Fatal(err)
				}
				u.Path = d.Path
				if env == "" {
					direct = u.String()
				} else {
					t.Setenv(env, u.String())
				}
			}
			return direct
		},
		gwOptions:    "usage_flush_interval 1s\ndatabase_read_urls {env.KEYGATE_TEST_FAILOVER_STANDBY}",
		upstreamArgs: []string{"--database-timeout", failoverTimeout.String()},
	})
	return s, pair
}

// TestAStandbyThatStopsConfirmingHoldsUpRevocationsOnly: the synchronous standby
// stopped, so that no commit that waits for it returns. A login answers within 3 s,
// keys are made and used, and their usage is written. A revocation is not
// acknowledged: it answers 503 at the upstream's database timeout, and so does the
// same revocation sent again, though it finds the key revoked on the primary (pgx
// cancelled the first one's wait, and PostgreSQL then commits on the primary alone).
// Once the standby is back, the revocation is acknowledged and the key refused.
func TestAStandbyThatStopsConfirmingHoldsUpRevocationsOnly(t *testing.T) {
	s, pair := newFailoverStack(t)
	org := s.newOrg("enterprise")
	start := time.Now()
	pair.StopStandby()
	restarted := false
	defer func() {
		if !restarted {
			pair.StartStandby()
		}
	}()

	var owner *Client
	timed(t, 3*time.Second, func() Resp { owner = s.loginOwner(org); return Resp{} })
	liveID, live := owner.createKey(org.ID, "live", "Admin", nil)
	doomedID, doomed := owner.createKey(org.ID, "doomed", "Admin", nil)
	for range 5 {
		if r := s.api(live, 0).do("GET", "/v1/monitors", nil); r.Status != http.StatusOK {
			t.Fatalf("GET /v1/monitors with the standby stopped: %d %s", r.Status, r.Body)
		}
	}
	if r := s.api(doomed, 0).do("GET", "/v1/me", nil); r.Status != http.StatusOK {
		t.Fatalf("GET /v1/me with a key made while the standby is stopped: %d %s", r.Status, r.Body)
	}

	revoke := func() Resp { return owner.do("DELETE", "/orgs/"+org.ID+"/api-keys/"+doomedID, nil, nil) }
	for range 2 {
		wantError(t, timed(t, failoverTimeout+5*time.Second, revoke), http.StatusServiceUnavailable, serviceUnavailable)
	}
	testenv.Eventually(t, 30*time.Second, "the live key's usage written with the standby stopped", func() bool {
		return owner.usageTotals(org.ID, start)[liveID+" proxied 200"] == 5
	})

	pair.StartStandby()
	restarted = true
	testenv.Eventually(t, 30*time.Second, "the revocation acknowledged once the standby is back", func() bool {
		return revoke().Status == http.StatusNoContent
	})
	wantError(t, s.api(doomed, 1).do("GET", "/v1/me", nil), http.StatusUnauthorized, unauthenticated)
}

// TestAFailoverKeepsEveryAcknowledgedRevocation: a key revoked, the primary crashed at
// once (pg_ctl stop -m immediate) and the standby promoted (pg_ctl promote). While no
// primary answers, lookups answer 503, never 200. Once promoted, the gateways answer
// within 10 s; then 40 requests in a row through both gateways, to the gateway and to
// the upstream, are all answered 200. A third gateway, without standbys and asked
// nothing while the primary was down, still holds every connection the crash left;
// 40 requests at once through it are all answered 200 too. The revoked key is
// refused, a key made after the failover works, and its every request is in the
// usage record. The promoted server answers no lookup as a standby.
func TestAFailoverKeepsEveryAcknowledgedRevocation(t *testing.T) {
	s, pair := newFailoverStack(t)
	quiet := s.withGateway("usage_flush_interval 1s\nlookup_lanes 4")
	org, owner := s.newOwner("enterprise")
	_, live := owner.createKey(org.ID, "live", "Admin", nil)
	revokedID, revoked := owner.createKey(org.ID, "revoked", "Admin", nil)
	for _, key := range []string{live, revoked} {
		for g := range s.gateways {
			if r := s.api(key, g).do("GET", "/v1/me", nil); r.Status != http.StatusOK {
				t.Fatalf("GET /v1/me before the failover, gateway %d: %d %s", g, r.Status, r.Body)
			}
		}
	}
	if r := owner.do("DELETE", "/orgs/"+org.ID+"/api-keys/"+revokedID, nil, nil); r.Status != http.StatusNoContent {
		t.Fatalf("revoke: %d %s", r.Status, r.Body)
	}

	pair.KillPrimary()
	for g := range quiet {
		for range 3 {
			r := timed(t, 10*time.Second, func() Resp { return s.api(live, g).do("GET", "/v1/me", nil) })
			wantError(t, r, http.StatusServiceUnavailable, serviceUnavailable)
		}
	}
	pair.Promote()
	promoted := time.Now()
	onStandby := make([]float64, quiet)
	for g := range quiet {
		testenv.Eventually(t, 30*time.Second, "the gateway answering after the promotion", func() bool {
			return s.api(live, g).do("GET", "/v1/me", nil).Status == http.StatusOK
		})
		d := time.Since(promoted)
		if d > 10*time.Second {
			t.Errorf("gateway %d answered %v after the promotion, more than 10s", g, d)
		}
		t.Logf("gateway %d answered %v after the promotion", g, d.Round(time.Millisecond))
		onStandby[g] = s.gatewayMetric(g, lookupsOnStandbys)
	}

	for i := range 40 {
		path := []string{"/v1/me", "/v1/monitors"}[i%2]
		if r := s.api(live, i%quiet).do("GET", path, nil); r.Status != http.StatusOK {
			t.Errorf("request %d of 40 after the failover, GET %s: %d %s", i, path, r.Status, r.Body)
		}
	}
	var burst []call
	for i := range 40 {
		burst = append(burst, call{live, quiet, "GET", []string{"/v1/me", "/v1/monitors"}[i%2], nil})
	}
	if n := statuses(s.burst(burst)); n[http.StatusOK] != len(burst) {
		t.Errorf("40 requests at once through the quiet gateway after the failover: answers by status %v, want 200 only", n)
	}
	for g := range s.gateways {
		wantError(t, s.api(revoked, g).do("GET", "/v1/me", nil), http.StatusUnauthorized, unauthenticated)
	}

	after := time.Now()
	owner = s.loginOwner(org)
	newID, made := owner.createKey(org.ID, "made after", "Admin", nil)
	for i := range 6 {
		if r := s.api(made, i%len(s.gateways)).do("GET", "/v1/me", nil); r.Status != http.StatusOK {
			t.Fatalf("a key made after the failover, request %d: %d %s", i, r.Status, r.Body)
		}
	}
	testenv.Eventually(t, 30*time.Second, "the new key's requests in the usage record", func() bool {
		return owner.usageTotals(org.ID, after)[newID+" me 200"] == 6
	})
	for g := range quiet {
		if got := s.gatewayMetric(g, lookupsOnStandbys) - onStandby[g]; got != 0 {
			t.Errorf("gateway %d: %v lookups answered by a standby after the promotion; the only one is the primary now", g, got)
		}
	}
}
