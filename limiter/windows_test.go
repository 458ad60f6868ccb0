package limiter_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keygate/keygate/limiter"
)

// The Redis keys of a key's windows beside its minute (see Redis), with and without
// organisation budgets, in the window of span s holding t.
func windowCounter(prefix, org, key string, s limiter.Span, t time.Time) string {
	tag := map[limiter.Span]string{limiter.Second: "s", limiter.Hour: "h", limiter.Day: "d"}[s]
	index := strconv.FormatInt(t.Unix()/int64(s.Seconds()), 10)
	if org == "" {
		return prefix + "{" + key + "}:" + tag + ":" + index
	}
	return prefix + "{o:" + org + "}:k:" + key + ":" + tag + ":" + index
}

// TestEachWindowOfAKeyPassesExactlyItsNumber: 16 concurrent requests through two
// instances, against a key's second, hour or day of 5 beside a minute of 1,000: each
// window lets exactly 5 through, refuses the others at the key naming itself, and a
// refused request counts in no window but the one it found full.
func TestEachWindowOfAKeyPassesExactlyItsNumber(t *testing.T) {
	clock := newClock(at(base, 12*time.Second+300*time.Millisecond))
	for _, span := range []limiter.Span{limiter.Second, limiter.Hour, limiter.Day} {
		for _, org := range []string{"", "org-w"} {
			t.Run(fmt.Sprintf("%s, org %q", span, org), func(t *testing.T) {
				forEachMode(t, func(t *testing.T, in instances) {
					key := fmt.Sprint("win-", time.Now().UnixNano())
					b := limiter.Budgets{Key: key, KeyLimit: 1000, Org: org}
					if org != "" {
						b.OrgLimit, b.MonthLimit = 10000, 1<<40
					}
					switch span {
					case limiter.Second:
						b.KeyPerSecond = 5
					case limiter.Hour:
						b.KeyPerHour = 5
					case limiter.Day:
						b.KeyPerDay = 5
					}
					got := spend(t, in, 16, b)
					if got.allowed != 5 || got.refused[limiter.StageKey] != 11 {
						t.Fatalf("allowed %d, refused %v; want 5 and 11 at the key", got.allowed, got.refused)
					}
					var left []int
					for _, r := range got.results {
						if r.Allowed {
							left = append(left, r.KeyWindow(span).Remaining)
						} else if r.RefusedIn != span || r.RetryAfter() != r.KeyWindow(span).ResetAfter || r.NeverFits {
							t.Errorf("refused %+v; want refused in the %s, retry after its end", r, span)
						}
					}
					if slices.Sort(left); !slices.Equal(left, []int{0, 1, 2, 3, 4}) {
						t.Errorf("the 5 that passed had %v left in the %s, want 0…4 once each", left, span)
					}
					minute := keyCounter(in.prefix, org, key, base)
					if org == "" {
						minute = in.prefix + "{" + key + "}:" + strconv.FormatInt(base, 10)
					}
					// The window counts all 16: the 11 it refused found it full. The
					// minute counts only the 5 that passed. (A second's counter may be
					// gone by now on a busy machine: it lives two seconds.)
					want := map[string]int64{minute: 5}
					if span != limiter.Second {
						want[windowCounter(in.prefix, org, key, span, clock.now())] = 16
					}
					in.checkCounters(t, want)
				}, limiter.WithClock(clock.now))
			})
		}
	}
}

// TestARequestRefusedByOneWindowSpendsNothingInTheOthers: a key with a second of 2, a
// minute of 5 and a day of 8, request by request across the windows' edges: what
// one window refuses counts in no other that still had room, and the window a
// refusal names is the one a retry waits for.
func TestARequestRefusedByOneWindowSpendsNothingInTheOthers(t *testing.T) {
	day := time.Date(2031, 5, 20, 23, 58, 10, 0, time.UTC)
	clock := newClock(day)
	forEachMode(t, func(t *testing.T, in instances) {
		clock.set(day)
		key := fmt.Sprint("spend-", time.Now().UnixNano())
		b := limiter.Budgets{Key: key, KeyLimit: 5, KeyPerSecond: 2, KeyPerDay: 8}
		for i, step := range []struct {
			at        time.Duration // after day
			allowed   bool
			refusedIn limiter.Span
			retry     int
			left      [3]int // the second's, the minute's, the day's
		}{
			{0, true, 0, 0, [3]int{1, 4, 7}},
			{100 * time.Millisecond, true, 0, 0, [3]int{0, 3, 6}},
			// The second is full: refused, the minute and the day untouched.
			{200 * time.Millisecond, false, limiter.Second, 1, [3]int{0, 3, 6}},
			{time.Second, true, 0, 0, [3]int{1, 2, 5}},
			{2 * time.Second, true, 0, 0, [3]int{1, 1, 4}},
			{3 * time.Second, true, 0, 0, [3]int{1, 0, 3}},
			// The minute is full, the second is not: refused by the minute.
			{3*time.Second + 500*time.Millisecond, false, limiter.Minute, 47, [3]int{1, 0, 3}},
			// A fresh minute (23:59), then the day runs out.
			{60 * time.Second, true, 0, 0, [3]int{1, 4, 2}},
			{61 * time.Second, true, 0, 0, [3]int{1, 3, 1}},
			{61*time.Second + 100*time.Millisecond, true, 0, 0, [3]int{0, 2, 0}},
			// Both the second and the day full: the day, which a retry waits for.
			{61*time.Second + 200*time.Millisecond, false, limiter.Day, 49, [3]int{0, 2, 0}},
			// The day alone full: the second's room stays unspent.
			{62 * time.Second, false, limiter.Day, 48, [3]int{2, 2, 0}},
			// A new day (00:00 UTC): everything fresh.
			{110 * time.Second, true, 0, 0, [3]int{1, 4, 7}},
		} {
			clock.set(day.Add(step.at))
			r, err := in.a.Allow(context.Background(), b)
			if err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
			left := [3]int{r.Second.Remaining, r.Key.Remaining, r.Day.Remaining}
			if r.Allowed != step.allowed || left != step.left || !r.Allowed && (r.RefusedAt != limiter.StageKey ||
				r.RefusedIn != step.refusedIn || r.RetryAfter() != step.retry) {
				t.Errorf("step %d at +%v: %+v, retry after %d; want allowed %v (else refused in the %s, retry after %d), left %v",
					i, step.at, r, r.RetryAfter(), step.allowed, step.refusedIn, step.retry, step.left)
			}
		}
	}, limiter.WithClock(clock.now))
}

// TestACostAboveAWindowsWholeLimitNeverFits: a request costing more than a window's
// whole limit is refused by that window before any other, and no wait lets it
// through: RetryAfter is 0. It counts nowhere.
func TestACostAboveAWindowsWholeLimitNeverFits(t *testing.T) {
	clock := newClock(at(base, 5*time.Second))
	forEachMode(t, func(t *testing.T, in instances) {
		key := fmt.Sprint("never-", time.Now().UnixNano())
		b := limiter.Budgets{Key: key, KeyLimit: 100, KeyPerSecond: 5, KeyPerDay: 40, Cost: 6}
		r, err := in.a.Allow(context.Background(), b)
		if err != nil || r.Allowed || r.RefusedIn != limiter.Second || !r.NeverFits || r.RetryAfter() != 0 {
			t.Errorf("cost 6 against a second of 5: %+v, %v; want refused in the second, never fits, no retry", r, err)
		}
		b.Cost = 5
		if r, err := in.a.Allow(context.Background(), b); err != nil || !r.Allowed || r.Second.Remaining != 0 || r.Day.Remaining != 35 {
			t.Errorf("cost 5 after it: %+v, %v; want allowed, nothing left of the second, 35 of the day", r, err)
		}
		// The org's minute: 4 units, a cost of 5 never fits there either.
		b = limiter.Budgets{Key: key + "o", KeyLimit: 100, Org: key, OrgLimit: 4, Cost: 5}
		if r, err := in.a.Allow(context.Background(), b); err != nil || r.RefusedAt != limiter.StageOrg || !r.NeverFits || r.RetryAfter() != 0 {
			t.Errorf("cost 5 against an org's minute of 4: %+v, %v; want refused at the org, never fits", r, err)
		}
	}, limiter.WithClock(clock.now))
}

// TestTheWindowsResetAtTheirUTCEdges: each window's ResetAfter is the whole seconds to
// its end, aligned to UTC: the second's next second, the hour's next hour, the day's
// next midnight UTC. Redis's counters live the rest of their window and one more.
func TestTheWindowsResetAtTheirUTCEdges(t *testing.T) {
	now := time.Date(2031, 7, 4, 21, 40, 15, 250e6, time.UTC)
	clock := newClock(now)
	forEachMode(t, func(t *testing.T, in instances) {
		key := fmt.Sprint("edges-", time.Now().UnixNano())
		r, err := in.a.Allow(context.Background(), limiter.Budgets{Key: key, KeyPerSecond: 9, KeyPerHour: 9, KeyPerDay: 9})
		want := limiter.Result{Allowed: true, Second: res(true, 9, 8, 1), Hour: res(true, 9, 8, 19*60+45), Day: res(true, 9, 8, 2*3600+19*60+45)}
		if err != nil || r != want {
			t.Errorf("%+v, %v; want %+v", r, err, want)
		}
		if in.rdb == nil {
			return
		}
		// The second's counter lives 1.75 s: on a busy machine it may be gone by now.
		if keys := in.keys(t); len(keys) < 2 || len(keys) > 3 || slices.Contains(keys, in.prefix+"{"+key+"}:"+strconv.FormatInt(now.Unix()/60, 10)) {
			t.Errorf("counters %v; want the hour's and the day's (and the second's), no minute", keys)
		}
		for s, want := range map[limiter.Span]time.Duration{
			limiter.Hour: 19*time.Minute + 44750*time.Millisecond + time.Hour,
			limiter.Day:  2*time.Hour + 19*time.Minute + 44750*time.Millisecond + 24*time.Hour,
		} {
			got, err := in.rdb.PTTL(context.Background(), windowCounter(in.prefix, "", key, s, now)).Result()
			if err != nil || got > want || got < want-2*time.Second {
				t.Errorf("the %s's counter: TTL %v, %v; want %v (less the test's time)", s, got, err, want)
			}
		}
	}, limiter.WithClock(clock.now))
}

// TestCountsOfOneKeyInTwoSecondsOfOneRoundKeepEachSecondExact: counts of one key
// whose clocks straddle a second's edge, gathered in pipelined rounds, hold each
// second to its limit (the 3 that pass in each see 2, 1 and 0 left) and the minute to
// the sum of what passed.
func TestCountsOfOneKeyInTwoSecondsOfOneRoundKeepEachSecondExact(t *testing.T) {
	start := at(base, 40*time.Second)
	var n atomic.Int64
	// Every other count reads the next second.
	clock := func() time.Time { return start.Add(time.Duration(n.Add(1)%2) * time.Second) }
	// Local counts into the newest window its clock has shown: Redis alone.
	forEachRedisMode(t, func(t *testing.T, in instances) {
		key := fmt.Sprint("straddle-", time.Now().UnixNano())
		got := spend(t, in, 40, limiter.Budgets{Key: key, KeyLimit: 1000, KeyPerSecond: 3})
		if got.allowed != 6 || got.refused[limiter.StageKey] != 34 {
			t.Errorf("allowed %d, refused %v; want 3 in each of two seconds", got.allowed, got.refused)
		}
		var left []int
		for _, r := range got.results {
			if r.Allowed {
				left = append(left, r.Second.Remaining)
			}
		}
		if slices.Sort(left); !slices.Equal(left, []int{0, 0, 1, 1, 2, 2}) {
			t.Errorf("the 6 that passed had %v left in their second, want 0, 1 and 2 twice each", left)
		}
		in.checkCounters(t, map[string]int64{in.prefix + "{" + key + "}:" + strconv.FormatInt(base, 10): 6})
	}, limiter.WithClock(clock), limiter.WithLinger(5*time.Millisecond))
}

// TestACostOnABurstLetsThroughOnlyWhatFitsWhole: requests of cost 3 against a
// second of 5, concurrently from two instances: one passes, and the others spend
// nothing of the minute.
func TestACostOnABurstLetsThroughOnlyWhatFitsWhole(t *testing.T) {
	clock := newClock(at(base, 50*time.Second))
	forEachMode(t, func(t *testing.T, in instances) {
		key := fmt.Sprint("burst-", time.Now().UnixNano())
		var wg sync.WaitGroup
		var allowed atomic.Int64
		for i := range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				l := in.a
				if i%2 == 1 {
					l = in.b
				}
				r, err := l.Allow(context.Background(), limiter.Budgets{Key: key, KeyLimit: 60, KeyPerSecond: 5, Cost: 3})
				if err != nil {
					t.Error(err)
					return
				}
				if r.Allowed {
					allowed.Add(1)
				}
			}()
		}
		wg.Wait()
		if allowed.Load() != 1 {
			t.Errorf("%d of 3 requests of cost 3 allowed on a second of 5, want 1", allowed.Load())
		}
		// The two refused counted nowhere: the minute holds the one that passed.
		in.checkCounters(t, map[string]int64{in.prefix + "{" + key + "}:" + strconv.FormatInt(base, 10): 3})
	}, limiter.WithClock(clock.now))
}
