package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/keygate/keygate/internal/testkit/pgpair"
	"github.com/keygate/keygate/upstream/internal/upstreamtest"
	"github.com/keygate/keygate/upstream/store"
)

// TestOnlyPlanChangesThatTakeAPIAccessAwayWaitForTheSynchronousStandby: a primary
// whose synchronous standby has stopped confirming. A plan left without API access,
// and an organisation moved to one, take every key of theirs off the API: those
// writes are still waiting for the standby when their context ends, a second on.
// The upstream's other writes, a login's among them, commit at once.
func TestOnlyPlanChangesThatTakeAPIAccessAwayWaitForTheSynchronousStandby(t *testing.T) {
	pair := pgpair.Start(t)
	t.Setenv("DATABASE_URL", pair.PrimaryURL) // the test's database is made on the pair
	e := upstreamtest.NewEnv(t)
	s := e.Store
	plan := func(name string, apiRateLimit int) store.Plan {
		return store.Plan{Name: name, APIRateLimit: apiRateLimit, MaxMonitors: 5, MinIntervalSeconds: 60,
			Locations: []string{"us-east"}, CheckTypes: []string{"http"}, OrgRateLimit: -1, APIRequestsPerMonth: -1,
			APIRateLimitPerSecond: -1, APIRateLimitPerHour: -1, APIRateLimitPerDay: -1}
	}
	for _, p := range []store.Plan{plan("closing", 100), plan("lowering", 100)} {
		if _, err := s.PutPlan(context.Background(), p); err != nil {
			t.Fatal(err)
		}
	}
	toFree, toPro := e.Org("pro"), e.Org("free")
	email, _ := e.User()
	userID, _, err := s.PasswordHash(context.Background(), email)
	if err != nil {
		t.Fatal(err)
	}
	pair.StopStandby()
	t.Cleanup(pair.StartStandby) // before the database is dropped: that waits for the standby too

	for _, w := range []struct {
		name   string
		synced bool
		write  func(context.Context) error
	}{
		{"a plan put without API access", true, func(ctx context.Context) error {
			_, err := s.PutPlan(ctx, plan("gated", 0))
			return err
		}},
		{"a plan changed to no API access", true, func(ctx context.Context) error {
			_, err := s.UpdatePlan(ctx, "closing", func(p *store.Plan) error { p.APIRateLimit = 0; return nil })
			return err
		}},
		{"an organisation moved to a plan without API access", true, func(ctx context.Context) error {
			_, err := s.SetOrgPlan(ctx, toFree, "free")
			return err
		}},
		{"a plan put with API access", false, func(ctx context.Context) error {
			_, err := s.PutPlan(ctx, plan("open", 10))
			return err
		}},
		{"a plan's rate limit lowered", false, func(ctx context.Context) error {
			_, err := s.UpdatePlan(ctx, "lowering", func(p *store.Plan) error { p.APIRateLimit = 50; return nil })
			return err
		}},
		{"an organisation moved to a plan with API access", false, func(ctx context.Context) error {
			_, err := s.SetOrgPlan(ctx, toPro, "pro")
			return err
		}},
		{"an organisation created", false, func(ctx context.Context) error {
			_, err := s.CreateOrg(ctx, "new org", "pro")
			return err
		}},
		{"a login reserved", false, func(ctx context.Context) error {
			_, _, err := s.ReserveLogin(ctx, store.DefaultLoginThrottle, "203.0.113.9", store.EmailKey(email), time.Now())
			return err
		}},
		{"a session created", false, func(ctx context.Context) error {
			_, err := s.CreateSession(ctx, userID, time.Hour)
			return err
		}},
	} {
		t.Run(w.name, func(t *testing.T) {
			timeout := 10 * time.Second
			if w.synced {
				timeout = time.Second
			}
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			start := time.Now()
			err := w.write(ctx)
			switch {
			case !w.synced && err != nil:
				t.Errorf("%v after %v; want it committed without the standby", err, time.Since(start))
			case w.synced && (err == nil || ctx.Err() == nil):
				t.Errorf("%v after %v; want it waiting for the standby until its context ends", err, time.Since(start))
			}
		})
	}
}
