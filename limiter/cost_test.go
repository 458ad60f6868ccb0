package limiter_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/keygate/keygate/limiter"
)

// TestACostThatDoesNotFitIsRefusedWholeAndCountsNothing: a request weighs its cost at
// every budget. One whose cost does not fit in what a budget has left is refused
// there whole, and counts nowhere; a cheaper one may still use what is left.
func TestACostThatDoesNotFitIsRefusedWholeAndCountsNothing(t *testing.T) {
	clock := newClock(at(base, 15*time.Second))
	forEachMode(t, func(t *testing.T, in instances) {
		clock.set(at(base, 15*time.Second))
		org := fmt.Sprint("org-cost-", time.Now().UnixNano())
		key := limiter.Budgets{Key: "K", KeyLimit: 8, Org: org, OrgLimit: 100, MonthLimit: 1000}
		other := limiter.Budgets{Key: "O", KeyLimit: 100, Org: org, OrgLimit: 11, MonthLimit: 1000}
		for i, step := range []struct {
			b         limiter.Budgets
			cost      int
			refusedAt limiter.Stage
			keyLeft   int
			orgLeft   int
			used      int64
			counters  [4]int64 // K's minute, O's minute, the org's minute, the month
		}{
			{key, 5, limiter.StageNone, 3, 95, 5, [4]int64{5, 0, 5, 5}},
			// 5 with 3 left: refused whole; nothing counts, here or after.
			{key, 5, limiter.StageKey, 3, 95, 5, [4]int64{5, 0, 5, 5}},
			// A cheaper one still fits.
			{key, 3, limiter.StageNone, 0, 92, 8, [4]int64{8, 0, 8, 8}},
			// Nothing left: a refused request counts in the key's minute, as always.
			{key, 1, limiter.StageKey, 0, 92, 8, [4]int64{9, 0, 8, 8}},
			// The org's minute: 8 of 11 spent by K; O's 5 does not fit in its 3.
			{other, 5, limiter.StageOrg, 95, 3, 8, [4]int64{9, 5, 8, 8}},
			{other, 2, limiter.StageNone, 93, 1, 10, [4]int64{9, 7, 10, 10}},
			{other, 1, limiter.StageNone, 92, 0, 11, [4]int64{9, 8, 11, 11}},
		} {
			b := step.b
			b.Cost = step.cost
			r, err := in.a.Allow(context.Background(), b)
			if err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
			if r.RefusedAt != step.refusedAt || r.Allowed != (step.refusedAt == limiter.StageNone) ||
				r.Key.Remaining != step.keyLeft || r.Org.Remaining != step.orgLeft || r.Month.Used != step.used {
				t.Errorf("step %d (cost %d): %+v; want refused at %q, %d left of the key, %d of the org, %d used",
					i, step.cost, r, step.refusedAt, step.keyLeft, step.orgLeft, step.used)
			}
			in.checkCounters(t, map[string]int64{
				keyCounter(in.prefix, org, "K", base):     step.counters[0],
				keyCounter(in.prefix, org, "O", base):     step.counters[1],
				orgCounter(in.prefix, org, base):          step.counters[2],
				monthCounter(in.prefix, org, clock.now()): step.counters[3],
			})
		}
	}, limiter.WithClock(clock.now))
}

// TestCostsAreExactUnderConcurrency: requests of cost 5 against a key's minute of 12
// and an org's of 22, from two instances at once: exactly as many pass as fit whole,
// and what they counted adds up.
func TestCostsAreExactUnderConcurrency(t *testing.T) {
	clock := newClock(at(base, 20*time.Second))
	forEachMode(t, func(t *testing.T, in instances) {
		org := fmt.Sprint("org-costs-", time.Now().UnixNano())
		var mu sync.Mutex
		var wg sync.WaitGroup
		allowed := map[string]int{}
		for i := range 40 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				l := in.a
				if i%2 == 1 {
					l = in.b
				}
				key := fmt.Sprint("k", i%3)
				r, err := l.Allow(context.Background(), limiter.Budgets{Key: key, KeyLimit: 12, Org: org, OrgLimit: 22, MonthLimit: 1000, Cost: 5})
				if err != nil {
					t.Error(err)
					return
				}
				if r.Allowed {
					mu.Lock()
					allowed[key]++
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		total := 0
		for key, n := range allowed {
			if n > 2 {
				t.Errorf("key %s: %d requests of cost 5 allowed in a minute of 12", key, n)
			}
			total += n
		}
		if total != 4 {
			t.Errorf("%d requests of cost 5 allowed in an org minute of 22 (%v), want 4", total, allowed)
		}
		in.checkCounters(t, map[string]int64{monthCounter(in.prefix, org, clock.now()): 20})
	}, limiter.WithClock(clock.now))
}

// TestACostOnAKeysOwnMinute: the same for a key without organisation budgets, on its
// own counter.
func TestACostOnAKeysOwnMinute(t *testing.T) {
	clock := newClock(at(base, 30*time.Second))
	forEachMode(t, func(t *testing.T, in instances) {
		key := fmt.Sprint("own-", time.Now().UnixNano())
		for i, step := range []struct {
			cost    int
			allowed bool
			left    int
		}{{4, true, 2}, {4, false, 2}, {2, true, 0}, {1, false, 0}} {
			r, err := in.a.Allow(context.Background(), limiter.Budgets{Key: key, KeyLimit: 6, Cost: step.cost})
			if err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
			if r.Allowed != step.allowed || r.Key.Remaining != step.left {
				t.Errorf("step %d (cost %d): %+v; want allowed %v with %d left", i, step.cost, r.Key, step.allowed, step.left)
			}
		}
	}, limiter.WithClock(clock.now))
}
