package limiter_test

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/keygate/keygate/limiter"
)

// The last release's scripts, verbatim: testdata/last-release-key.lua counted a key
// without organisation budgets, testdata/last-release-budgets.lua a key with them.
// Operators upgrade one gateway at a time, so for a while gateways of both releases
// count on one Redis: they must share each budget exactly.
func lastReleaseScript(t *testing.T, name string) *redis.Script {
	t.Helper()
	src, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return redis.NewScript(string(src))
}

// TestTheLastReleaseAndThisOneShareAKeysMinute: counts of a key without org budgets,
// alternating between the last release's script and this release's Allow, number
// one window: the limit lets through exactly limit of them, whoever counts.
func TestTheLastReleaseAndThisOneShareAKeysMinute(t *testing.T) {
	rdb := redisClient(t)
	prefix := uniquePrefix(t)
	now := time.Date(2030, 1, 2, 3, 4, 15, 0, time.UTC)
	l := limiter.NewRedis(rdb, limiter.WithPrefix(prefix), limiter.WithClock(func() time.Time { return now }))
	old := lastReleaseScript(t, "last-release-key.lua")
	counter := prefix + "{k}:" + strconv.FormatInt(now.Unix()/60, 10)
	ctx := context.Background()
	const limit = 6
	allowed := 0
	for i := 1; i <= 10; i++ {
		if i%2 == 1 {
			v, err := old.Run(ctx, rdb, []string{counter}, 60000, 0).Int64Slice()
			if err != nil {
				t.Fatal(err)
			}
			if v[0] != int64(i) {
				t.Fatalf("request %d: the last release counted %d", i, v[0])
			}
			if v[0] <= limit {
				allowed++
			}
			continue
		}
		r, err := l.Allow(ctx, limiter.Budgets{Key: "k", KeyLimit: limit})
		if err != nil {
			t.Fatal(err)
		}
		if want := limit - i; r.Key.Remaining != max(want, 0) || r.Allowed != (i <= limit) {
			t.Fatalf("request %d: this release's %+v, want %d left", i, r.Key, max(want, 0))
		}
		if r.Allowed {
			allowed++
		}
	}
	if allowed != limit {
		t.Errorf("%d of 10 allowed, want %d", allowed, limit)
	}
}

// TestTheLastReleaseAndThisOneShareAnOrgsBudgets: the same for a key with an org
// ceiling and a monthly quota, whose counters are the organisation's.
func TestTheLastReleaseAndThisOneShareAnOrgsBudgets(t *testing.T) {
	rdb := redisClient(t)
	prefix := uniquePrefix(t)
	now := time.Date(2030, 1, 2, 3, 4, 15, 0, time.UTC)
	w := now.Unix() / 60
	l := limiter.NewRedis(rdb, limiter.WithPrefix(prefix), limiter.WithClock(func() time.Time { return now }))
	old := lastReleaseScript(t, "last-release-budgets.lua")
	keys := []string{
		orgCounter(prefix, "o", w), monthCounter(prefix, "o", now),
		keyCounter(prefix, "o", "k", w),
	}
	// The month starts at zero (seed 0) in both releases' first count.
	shareOrgBudgets(t, rdb, l, old, keys, limiter.Budgets{Key: "k", Org: "o"})
}

// shareOrgBudgets sends ten requests of key k of org o through the last release's
// script (old, on keys: the org's minute, its month and the key's minute) and l in
// turn, with a key limit of 100, an org ceiling of 7 and a month of 1,000 set on b. It
// requires one exact budget: each side counts the other's requests, exactly the org's
// 7 pass, and the month holds them.
func shareOrgBudgets(t *testing.T, rdb *redis.Client, l *limiter.Redis, old *redis.Script, keys []string, b limiter.Budgets) {
	t.Helper()
	ctx := context.Background()
	const keyLimit, orgLimit, monthLimit = 100, 7, 1000
	b.KeyLimit, b.OrgLimit, b.MonthLimit = keyLimit, orgLimit, monthLimit
	allowed := 0
	for i := 1; i <= 10; i++ {
		if i%2 == 1 {
			v, err := old.Run(ctx, rdb, keys, 120000, 86400000, 0, orgLimit, monthLimit, keyLimit, 3, 0).Int64Slice()
			if err != nil {
				t.Fatal(err)
			}
			// {status, now, org, month, key}: the counts before this request.
			if v[0] != 0 || v[4] != int64(i-1) {
				t.Fatalf("request %d: the last release answered %v", i, v)
			}
			if v[2] < orgLimit {
				allowed++
			}
			continue
		}
		r, err := l.Allow(ctx, b)
		if err != nil {
			t.Fatal(err)
		}
		if r.Key.Remaining != keyLimit-i || r.Allowed != (allowed < orgLimit) {
			t.Fatalf("request %d: this release's %+v, with %d allowed before it", i, r, allowed)
		}
		if r.Allowed {
			allowed++
		}
	}
	if allowed != orgLimit {
		t.Errorf("%d of 10 allowed, want the org's %d", allowed, orgLimit)
	}
	if used, err := rdb.Get(ctx, keys[1]).Int64(); err != nil || used != orgLimit {
		t.Errorf("the month holds %d (%v), want the %d allowed", used, err, orgLimit)
	}
}

// TestTheLastReleaseIgnoresAKeysOtherWindowsAndSharesItsMinute: while gateways roll,
// the last release counts a key's minute (and an org's budgets) as before, on the
// same counters, and knows nothing of the key's second, hour and day. This release
// counts those too: the minute and the org's minute stay exact between both, and the
// other windows hold only this release's counts.
func TestTheLastReleaseIgnoresAKeysOtherWindowsAndSharesItsMinute(t *testing.T) {
	rdb := redisClient(t)
	prefix := uniquePrefix(t)
	now := time.Date(2030, 1, 2, 3, 4, 15, 0, time.UTC)
	w := now.Unix() / 60
	l := limiter.NewRedis(rdb, limiter.WithPrefix(prefix), limiter.WithClock(func() time.Time { return now }))
	ctx := context.Background()
	t.Run("a key's own minute", func(t *testing.T) {
		old := lastReleaseScript(t, "last-release-key.lua")
		counter := prefix + "{k}:" + strconv.FormatInt(w, 10)
		const limit = 6
		allowed, ours := 0, 0
		for i := 1; i <= 10; i++ {
			if i%2 == 1 {
				v, err := old.Run(ctx, rdb, []string{counter}, 60000, 0).Int64Slice()
				if err != nil {
					t.Fatal(err)
				}
				if v[0] <= limit {
					allowed++
				}
				continue
			}
			r, err := l.Allow(ctx, limiter.Budgets{Key: "k", KeyLimit: limit, KeyPerSecond: 100, KeyPerDay: 100})
			if err != nil {
				t.Fatal(err)
			}
			if r.Allowed != (allowed < limit) || r.Allowed && r.Day.Remaining != 100-ours-1 {
				t.Fatalf("request %d: this release's %+v, with %d allowed before it", i, r, allowed)
			}
			if r.Allowed {
				allowed++
				ours++
			}
		}
		if allowed != limit {
			t.Errorf("%d of 10 allowed, want %d", allowed, limit)
		}
		day := windowCounter(prefix, "", "k", limiter.Day, now)
		if n, err := rdb.Get(ctx, day).Int64(); err != nil || n != int64(ours) {
			t.Errorf("the day holds %d (%v), want this release's %d that passed", n, err, ours)
		}
	})
	t.Run("an org's budgets", func(t *testing.T) {
		old := lastReleaseScript(t, "last-release-budgets.lua")
		keys := []string{orgCounter(prefix, "o", w), monthCounter(prefix, "o", now), keyCounter(prefix, "o", "k", w)}
		shareOrgBudgets(t, rdb, l, old, keys, limiter.Budgets{Key: "k", KeyPerSecond: 50, KeyPerHour: 50, Org: "o"})
		// This release's five all passed the key's windows; the hour counts them.
		if n, err := rdb.Get(ctx, windowCounter(prefix, "o", "k", limiter.Hour, now)).Int64(); err != nil || n != 5 {
			t.Errorf("the hour holds %d (%v), want this release's 5", n, err)
		}
	})
}
