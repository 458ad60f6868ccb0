package integration

// The gateway's half of the usage record: what bin/caddy counts, and that a graceful
// stop and PostgreSQL going away lose none of it. Read back as a person reads it,
// through GET /orgs/{orgId}/usage.

import (
	"context"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keygate/keygate/internal/testkit/testenv"
)

// usageTotals reads org's usage by minute from from up to now through the owner's
// session, and sums it over the minutes: "key_id outcome status" → count.
func (c *Client) usageTotals(orgID string, from time.Time) map[string]int64 {
	c.s.t.Helper()
	to := time.Now().UTC().Truncate(time.Minute).Add(time.Minute)
	q := url.Values{"granularity": {"minute"}, "from": {from.UTC().Truncate(time.Minute).Format(time.RFC3339)}, "to": {to.Format(time.RFC3339)}}
	out := map[string]int64{}
	for _, u := range c.usage(orgID, q) {
		out[u.name()] += u.Count
	}
	return out
}

// wantTotals compares usageTotals with want, line by line.
func wantTotals(t *testing.T, what string, got, want map[string]int64) {
	t.Helper()
	if maps.Equal(got, want) {
		return
	}
	lines := func(m map[string]int64) string {
		var l []string
		for _, k := range slices.Sorted(maps.Keys(m)) {
			l = append(l, k+" "+strconv.FormatInt(m[k], 10))
		}
		return strings.Join(l, "\n")
	}
	t.Errorf("%s: the usage record holds\n%s\nwant\n%s", what, lines(got), lines(want))
}

// TestUsageOfTwoGatewaysAddsUpAndAGracefulStopLosesNothing sends a mix of answers
// through two gateways whose only flush is the one of a graceful stop, stops them with
// SIGTERM, and reads every request back, per key, outcome and status.
func TestUsageOfTwoGatewaysAddsUpAndAGracefulStopLosesNothing(t *testing.T) {
	s := newStack(t)
	a, b := s.withGateway("usage_flush_interval 1h"), s.withGateway("usage_flush_interval 1h")
	start := time.Now()

	pro, owner := s.newOwner("pro")
	adminID, admin := owner.createKey(pro.ID, "admin", "Admin", nil)
	viewerID, viewer := owner.createKey(pro.ID, "viewer", "Viewer", nil)
	s.cli("", "plan", "put", "--name", "two", "--api-rate-limit", "2", "--max-monitors", "10",
		"--min-interval", "60", "--locations", "us-east", "--check-types", "http")
	small, smallOwner := s.newOwner("two")
	smallID, smallKey := smallOwner.createKey(small.ID, "small", "Viewer", nil)
	gated, gatedOwner := s.newOwner("pro")
	gatedID, gatedKey := gatedOwner.createKey(gated.ID, "gated", "Admin", nil)
	s.cli("", "org", "set-plan", "--org", gated.ID, "--plan", "free")

	waitForWindowRoom(20) // the small key's three requests in one rate-limit window
	missing := "/v1/monitors/00000000-0000-4000-8000-000000000000"
	s.sendSteps([]step{
		{call{admin, a, "GET", "/v1/me", nil}, 200},
		{call{admin, b, "GET", "/v1/me", nil}, 200},
		{call{admin, b, "GET", "/v1/me", nil}, 200},
		{call{admin, a, "POST", "/v1/monitors", newMonitor("usage")}, 201},
		{call{admin, a, "GET", "/v1/monitors", nil}, 200},
		{call{admin, b, "GET", "/v1/monitors", nil}, 200},
		{call{admin, a, "GET", missing, nil}, 404},
		{call{admin, b, "GET", missing, nil}, 404},
		{call{viewer, a, "GET", "/v1/monitors", nil}, 200},
		{call{viewer, a, "POST", "/v1/monitors", newMonitor("no")}, 403},
		{call{viewer, b, "DELETE", missing, nil}, 403},
		{call{smallKey, a, "GET", "/v1/me", nil}, 200},
		{call{smallKey, b, "GET", "/v1/me", nil}, 200},
		{call{smallKey, a, "GET", "/v1/me", nil}, 429},
		{call{smallKey, b, "GET", "/v1/monitors", nil}, 429},
		{call{gatedKey, a, "GET", "/v1/me", nil}, 403},
		{call{gatedKey, b, "GET", "/v1/monitors", nil}, 403},
		{call{"mon_live_nope", a, "GET", "/v1/me", nil}, 401},            // no key: no one's
		{call{admin[:len(admin)-1] + "x", b, "GET", "/v1/me", nil}, 401}, // a wrong secret: no one's
	})

	for _, i := range []int{a, b} {
		s.gateways[i].proc.stop() // SIGTERM
	}
	wantTotals(t, "the pro org", owner.usageTotals(pro.ID, start), map[string]int64{
		adminID + " me 200":         3,
		adminID + " proxied 201":    1,
		adminID + " proxied 200":    2,
		adminID + " proxied 404":    2,
		viewerID + " proxied 200":   1,
		viewerID + " forbidden 403": 2,
	})
	wantTotals(t, "the org on two requests a minute", smallOwner.usageTotals(small.ID, start), map[string]int64{
		smallID + " me 200":           2,
		smallID + " rate_limited 429": 2,
	})
	wantTotals(t, "the org without API access", gatedOwner.usageTotals(gated.ID, start), map[string]int64{
		gatedID + " feature_gated 403": 2,
	})
}

// TestUsageIsHeldWhilePostgresIsAwayAndWrittenWhenItIsBack counts requests while
// PostgreSQL refuses the usage writes, then stops PostgreSQL altogether, and brings it
// back: every request counted is written, none twice, none dropped.
func TestUsageIsHeldWhilePostgresIsAwayAndWrittenWhenItIsBack(t *testing.T) {
	s := newStack(t)
	g := s.withGateway("usage_flush_interval 1s")
	start := time.Now()
	pro, owner := s.newOwner("pro")
	keyID, key := owner.createKey(pro.ID, "k", "Admin", nil)
	api := s.api(key, g)
	errorsBefore := s.gatewayMetric(g, "keygate_usage_flush_errors_total")

	// PostgreSQL refuses the writes while it answers the key lookups.
	ctx := context.Background()
	if _, err := s.dbConn().Exec(ctx, `ALTER TABLE usage_minutes ADD CONSTRAINT refused CHECK (false) NOT VALID`); err != nil {
		t.Fatal(err)
	}
	me, monitors := 0, 0
	for range 5 {
		if r := api.do("GET", "/v1/me", nil); r.Status != 200 {
			t.Fatalf("GET /v1/me: %d %s", r.Status, r.Body)
		}
		me++
	}
	for range 3 {
		if r := api.do("GET", "/v1/monitors", nil); r.Status != 200 {
			t.Fatalf("GET /v1/monitors: %d %s", r.Status, r.Body)
		}
		monitors++
	}
	testenv.Eventually(t, 10*time.Second, "a refused flush", func() bool {
		return s.gatewayMetric(g, "keygate_usage_flush_errors_total") > errorsBefore
	})

	// Then PostgreSQL is gone for a few flushes.
	s.stackCmd("stop-pg")
	restarted := false
	defer func() {
		if !restarted {
			s.stackCmd("start-pg")
		}
	}()
	errorsDown := s.gatewayMetric(g, "keygate_usage_flush_errors_total")
	testenv.Eventually(t, 10*time.Second, "failed flushes while PostgreSQL is down", func() bool {
		return s.gatewayMetric(g, "keygate_usage_flush_errors_total") >= errorsDown+2
	})
	s.stackCmd("start-pg")
	restarted = true

	// Back: the requests that get through count too, the writes still refused.
	testenv.Eventually(t, 15*time.Second, "the gateway answering again", func() bool {
		r := api.do("GET", "/v1/me", nil)
		if r.Status == 200 {
			me++
		}
		return r.Status == 200
	})
	if _, err := s.dbConn().Exec(ctx, `ALTER TABLE usage_minutes DROP CONSTRAINT refused`); err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{keyID + " me 200": int64(me), keyID + " proxied 200": int64(monitors)}
	waitForUsage(t, owner, pro.ID, start, want) // once PostgreSQL takes the writes
	// Two more ticks of usage_flush_interval 1s: nothing written twice. A flush with
	// nothing to write leaves no trace to wait on.
	time.Sleep(2 * time.Second)
	wantTotals(t, "two flushes later", owner.usageTotals(pro.ID, start), want)
	if n := s.gatewayMetric(g, "keygate_usage_dropped_total"); n != 0 {
		t.Errorf("keygate_usage_dropped_total = %v, want 0 within the buffer", n)
	}
}
