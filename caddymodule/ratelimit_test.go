package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/keygate/keygate/caddymodule/conns"
	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/limiter"
)

func TestRateLimitHeaders(t *testing.T) {
	hdr := http.Header{}
	setRateLimit(hdr, limiter.Result{Allowed: true, Key: limiter.Window{Allowed: true, Limit: 600, Remaining: 17, ResetAfter: 42}})
	if got := hdr.Get("RateLimit-Policy"); got != `"default";q=600;w=60` {
		t.Errorf("RateLimit-Policy %q", got)
	}
	if got := hdr.Get("RateLimit"); got != `"default";r=17;t=42` {
		t.Errorf("RateLimit %q", got)
	}
	rec := httptest.NewRecorder()
	h := &Handler{}
	h.answer(rec, httptest.NewRequest(http.MethodGet, "/v1/me", nil), keystore.OutcomeRateLimited, nil,
		rateLimited(rec.Header(), &limiter.Result{RefusedAt: limiter.StageKey, Key: limiter.Window{Limit: 600, ResetAfter: 9}}, 1, nil))
	if rec.Code != 429 || rec.Body.String() != `{"error":"rate_limited","retryAfter":9,"budget":"key","window":"minute"}` || rec.Header().Get("Retry-After") != "9" {
		t.Errorf("429 = %d %q %s", rec.Code, rec.Header(), rec.Body)
	}
}

func TestRateLimitHeadersWithoutACountRemoveAnyUpstreamSet(t *testing.T) {
	hdr := http.Header{"Ratelimit": {`"default";r=999;t=1`}, "Ratelimit-Policy": {`"default";q=999;w=60`}, "X-Other": {"kept"}}
	setRateLimit(hdr, limiter.Result{})
	if len(hdr) != 1 || hdr.Get("X-Other") != "kept" {
		t.Errorf("without a count: %q; want only X-Other", hdr)
	}
	setRateLimit(hdr, limiter.Result{Allowed: true, Key: limiter.Window{Allowed: true, Limit: 3, Remaining: -1, ResetAfter: 5}})
	if hdr.Get("Ratelimit") != `"default";r=0;t=5` || hdr.Get("Ratelimit-Policy") != `"default";q=3;w=60` {
		t.Errorf("with a count: %q", hdr)
	}
}

// TestRateLimitHeadersListEachMinuteBudget: the key's minute first, as "default", then
// the organisation's, as "org"; an unlimited key's count shows the org's alone.
func TestRateLimitHeadersListEachMinuteBudget(t *testing.T) {
	for _, tc := range []struct {
		name          string
		res           limiter.Result
		policy, limit string
		retryAfter    int
	}{
		{"both", limiter.Result{Allowed: true,
			Key: limiter.Window{Allowed: true, Limit: 20, Remaining: 19, ResetAfter: 42},
			Org: limiter.Window{Allowed: true, Limit: 100, Remaining: 57, ResetAfter: 42}},
			`"default";q=20;w=60, "org";q=100;w=60`, `"default";r=19;t=42, "org";r=57;t=42`, 0},
		{"refused by the org", limiter.Result{RefusedAt: limiter.StageOrg,
			Key: limiter.Window{Allowed: true, Limit: 20, Remaining: 3, ResetAfter: 8},
			Org: limiter.Window{Limit: 100, Remaining: -4, ResetAfter: 8}},
			`"default";q=20;w=60, "org";q=100;w=60`, `"default";r=3;t=8, "org";r=0;t=8`, 8},
		{"an unlimited key", limiter.Result{Allowed: true,
			Org: limiter.Window{Allowed: true, Limit: 100, Remaining: 99, ResetAfter: 30}},
			`"org";q=100;w=60`, `"org";r=99;t=30`, 0},
		{"a month alone", limiter.Result{Allowed: true,
			Key:   limiter.Window{Allowed: true, Limit: 20, Remaining: 10, ResetAfter: 5},
			Month: limiter.Quota{Limit: 1000, Used: 7, Remaining: 993, ResetAfter: 86400}},
			`"default";q=20;w=60`, `"default";r=10;t=5`, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			count := tc.res
			hdr := http.Header{}
			setRateLimit(hdr, count)
			if got := hdr.Get("RateLimit-Policy"); got != tc.policy {
				t.Errorf("RateLimit-Policy %q, want %q", got, tc.policy)
			}
			if got := hdr.Get("RateLimit"); got != tc.limit {
				t.Errorf("RateLimit %q, want %q", got, tc.limit)
			}
			if count.RetryAfter() != tc.retryAfter {
				t.Errorf("RetryAfter() %d, want %d", count.RetryAfter(), tc.retryAfter)
			}
		})
	}
}

// seedFailing is a Redis that answers, for an organisation whose month's count the
// usage record cannot give; calls counts its calls.
type seedFailing struct{ calls *int }

func (s seedFailing) Allow(context.Context, limiter.Budgets) (limiter.Result, error) {
	*s.calls++
	return limiter.Result{}, fmt.Errorf("counting in redis: seeding the month of org o: %w: %w", limiter.ErrMonthSeed, context.DeadlineExceeded)
}

// TestAMonthThatCannotBeSeededDoesNotOpenRedissBreaker: PostgreSQL failing to give a
// month's count is not Redis failing, so Redis's breaker stays closed for every key.
func TestAMonthThatCannotBeSeededDoesNotOpenRedissBreaker(t *testing.T) {
	calls := 0
	c := redisCounts(seedFailing{&calls}, conns.NewBreaker(nil, nil), nil, nil)
	b := limiter.Budgets{Key: "k", KeyLimit: 10, Org: "o", OrgLimit: 100}
	for range 3 * conns.BreakerThreshold {
		if _, err := c.allow(context.Background(), b); !errors.Is(err, limiter.ErrMonthSeed) {
			t.Fatalf("allow: %v, want the seed's error", err)
		}
	}
	if calls != 3*conns.BreakerThreshold {
		t.Errorf("Redis was asked %d times of %d: its breaker opened", calls, 3*conns.BreakerThreshold)
	}
	f := redisCounts(failingLimiter{}, conns.NewBreaker(nil, nil), nil, nil)
	for range conns.BreakerThreshold {
		_, _ = f.allow(context.Background(), b)
	}
	if _, err := f.allow(context.Background(), b); !errors.Is(err, conns.ErrBreakerOpen) {
		t.Errorf("after %d failures of Redis itself: %v, want the breaker open", conns.BreakerThreshold, err)
	}
}
