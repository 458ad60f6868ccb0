package limiter_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/keygate/keygate/internal/testkit/testenv"
	"github.com/keygate/keygate/limiter"
)

func TestBudgetCountsGivenUpOnAreNeverWrittenLater(t *testing.T) {
	// While Redis hangs every count times out at its deadline; when Redis comes back,
	// the script must refuse the commands held meanwhile at every stage: the callers
	// have already treated them as not counted.
	const timeout = 300 * time.Millisecond
	rdb, direct, proxy := slowRedis(t, timeout)
	clock := newClock(at(base, 20*time.Second))
	bothModes(t, rdb, timeout, func(t *testing.T, l *limiter.Redis, prefix string) {
		in := instances{a: l, b: l, rdb: direct, prefix: prefix}
		b := limiter.Budgets{Key: "k", KeyLimit: 100, Org: "org-20", OrgLimit: 100, MonthLimit: 100}
		if got := spendWithin(in, 5, b, timeout); got.allowed != 5 {
			t.Fatalf("before the hang: %+v", got)
		}
		proxy.Hang()
		start := time.Now()
		got := spendWithin(in, 20, b, timeout)
		waited := time.Since(start)
		proxy.Resume()
		if got.failed != 20 || waited < timeout || waited > 3*timeout {
			t.Errorf("%d of 20 counts failed, after %v, while Redis hung; want 20 after %v", got.failed, waited, timeout)
		}
		time.Sleep(500 * time.Millisecond) // the held commands arrive and run
		in.checkCounters(t, map[string]int64{
			keyCounter(prefix, "org-20", "k", base):     5,
			orgCounter(prefix, "org-20", base):          5,
			monthCounter(prefix, "org-20", clock.now()): 5,
		})
		r, err := l.Allow(context.Background(), b)
		if err != nil || r.Key.Remaining != 94 || r.Org.Remaining != 94 || r.Month.Used != 6 {
			t.Errorf("after the hang: %+v, %v; want the sixth count everywhere", r, err)
		}
	}, limiter.WithClock(clock.now))
}

func TestLateBudgetCountsAreRefusedAloneInTheirCall(t *testing.T) {
	// Counts of one org in one round, some of whose deadlines have passed by the time
	// Redis runs the script: those are ErrLate and not counted at any stage, the
	// others are counted and numbered as if alone.
	const timeout = 2 * time.Second
	rdb, direct, proxy := slowRedis(t, timeout)
	clock := newClock(at(base, 30*time.Second))
	prefix := uniquePrefix(t)
	l := limiter.NewRedis(rdb, limiter.WithPrefix(prefix), limiter.WithPipelining(timeout), limiter.WithClock(clock.now))
	b := limiter.Budgets{Key: "k", KeyLimit: 100, Org: "org-21", OrgLimit: 100, MonthLimit: 100}
	if _, err := l.Allow(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	proxy.Hang() // the first count waits in flight; the others gather behind it
	first := make(chan error, 1)
	go func() {
		_, err := l.Allow(context.Background(), b)
		first <- err
	}()
	testenv.Eventually(t, 10*time.Second, "the first count in flight", func() bool { return proxy.Held() > 0 })
	type answer struct {
		r   limiter.Result
		err error
	}
	answers := make(chan answer, 40)
	for i := range 40 {
		go func() {
			ctx := context.Background()
			if i%2 == 1 { // half give up before Redis sees their count
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, 300*time.Millisecond)
				defer cancel()
			}
			r, err := l.Allow(ctx, b)
			answers <- answer{r, err}
		}()
	}
	time.Sleep(600 * time.Millisecond)
	proxy.Resume()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	var key, org, used []int
	failed := 0
	for range 40 {
		a := <-answers
		if a.err != nil {
			failed++
			if !errors.Is(a.err, limiter.ErrLate) && !errors.Is(a.err, context.DeadlineExceeded) {
				t.Errorf("a late count failed with %v", a.err)
			}
			continue
		}
		key, org, used = append(key, a.r.Key.Remaining), append(org, a.r.Org.Remaining), append(used, int(a.r.Month.Used))
	}
	sort.Ints(key)
	sort.Ints(org)
	sort.Ints(used)
	if failed != 20 || fmt.Sprint(key) != fmt.Sprint(seq(78, 97)) || fmt.Sprint(org) != fmt.Sprint(key) || fmt.Sprint(used) != fmt.Sprint(seq(3, 22)) {
		t.Errorf("%d failed; remaining %v and %v, used %v; want 20 failed and the 20 others numbered 3..22", failed, key, org, used)
	}
	in := instances{rdb: direct, prefix: prefix}
	in.checkCounters(t, map[string]int64{
		keyCounter(prefix, "org-21", "k", base):     22,
		orgCounter(prefix, "org-21", base):          22,
		monthCounter(prefix, "org-21", clock.now()): 22,
	})
}

// spendWithin runs n concurrent Allow calls of b on in.a, each under its own
// timeout, and counts their outcomes, failures included.
func spendWithin(in instances, n int, b limiter.Budgets, timeout time.Duration) tally {
	type answer struct {
		r   limiter.Result
		err error
	}
	answers := make(chan answer, n)
	for range n {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			r, err := in.a.Allow(ctx, b)
			answers <- answer{r, err}
		}()
	}
	tl := tally{refused: map[limiter.Stage]int{}}
	for range n {
		switch a := <-answers; {
		case a.err != nil:
			tl.failed++
		case a.r.Allowed:
			tl.allowed++
		default:
			tl.refused[a.r.RefusedAt]++
		}
	}
	return tl
}

func TestBudgetCountsSurviveAScriptFlush(t *testing.T) {
	// After a SCRIPT FLUSH (or a failover) EVALSHA fails with NOSCRIPT: every count
	// must still happen, once.
	clock := newClock(at(base, 20*time.Second))
	forEachRedisMode(t, func(t *testing.T, in instances) {
		ctx := context.Background()
		flush := func() {
			var err error
			if cc, ok := in.rdb.(*redis.ClusterClient); ok {
				err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return c.ScriptFlush(ctx).Err() })
			} else {
				err = in.rdb.ScriptFlush(ctx).Err()
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		var budgets []limiter.Budgets
		for o := range 4 { // several orgs: a pipelined round of several script calls
			budgets = append(budgets, limiter.Budgets{Key: "k", KeyLimit: 100, Org: fmt.Sprint("org-22-", o), OrgLimit: 100, MonthLimit: 100})
		}
		for round := 1; round <= 3; round++ {
			flush()
			if got := spend(t, in, 5, budgets...); got.allowed != 20 || got.failed != 0 {
				t.Fatalf("after SCRIPT FLUSH %d: allowed %d, failed %d; want 20 and 0", round, got.allowed, got.failed)
			}
			for _, b := range budgets {
				in.checkCounters(t, map[string]int64{
					keyCounter(in.prefix, b.Org, "k", base):     int64(5 * round),
					orgCounter(in.prefix, b.Org, base):          int64(5 * round),
					monthCounter(in.prefix, b.Org, clock.now()): int64(5 * round),
				})
			}
		}
	}, limiter.WithClock(clock.now))
}

func TestAnOrgsCountsOfSeveralKeysShareAScriptCallAndEachGetsItsOwnNumber(t *testing.T) {
	// Redis is slow, so that while a round is in flight the others gather into one:
	// the counts of one org in a round, of any of its keys, go as one script call,
	// and each must still get the answer of its own place in the order: per key, per
	// org and per month, every number is taken once.
	const timeout = 2 * time.Second
	rdb, _, proxy := slowRedis(t, timeout)
	clock := newClock(at(base, 20*time.Second))
	l := limiter.NewRedis(rdb, limiter.WithClock(clock.now), limiter.WithPrefix(uniquePrefix(t)),
		limiter.WithPipelining(timeout))
	if _, err := allowKey(l, context.Background(), "warm", 1); err != nil { // the clock reading
		t.Fatal(err)
	}
	proxy.SetDelay(20 * time.Millisecond)
	defer proxy.SetDelay(0)
	// Org X: four keys, 30 requests each, nothing refused. Org Y: two keys of 10 a
	// minute, 30 requests each.
	var budgets []limiter.Budgets
	for k := range 4 {
		budgets = append(budgets, limiter.Budgets{Key: fmt.Sprint("x", k), KeyLimit: 1000, Org: "org-X", OrgLimit: 1000, MonthLimit: 1e6})
	}
	for k := range 2 {
		budgets = append(budgets, limiter.Budgets{Key: fmt.Sprint("y", k), KeyLimit: 10, Org: "org-Y", OrgLimit: 1000, MonthLimit: 1e6})
	}
	before := limiter.ScriptCalls(l)
	var mu sync.Mutex
	keys := map[string][]limiter.Window{}
	orgs := map[string][]int{} // the org's remaining, of those that reached it
	used := map[string][]int{}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for _, b := range budgets {
		for range 30 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				r, err := l.Allow(context.Background(), b)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				defer mu.Unlock()
				keys[b.Key] = append(keys[b.Key], r.Key)
				if r.RefusedAt != limiter.StageKey {
					orgs[b.Org] = append(orgs[b.Org], r.Org.Remaining)
					used[b.Org] = append(used[b.Org], int(r.Month.Used))
				}
			}()
		}
	}
	close(start)
	wg.Wait()
	calls := limiter.ScriptCalls(l) - before
	for _, b := range budgets {
		checkNumbered(t, b.Key, keys[b.Key], 30, b.KeyLimit, 40)
	}
	for org, n := range map[string]int{"org-X": 120, "org-Y": 20} {
		sort.Sort(sort.Reverse(sort.IntSlice(orgs[org])))
		sort.Ints(used[org])
		if fmt.Sprint(orgs[org]) != fmt.Sprint(down(999, n)) || fmt.Sprint(used[org]) != fmt.Sprint(seq(1, n)) {
			t.Errorf("%s: remaining %v, used %v; want each of 999 down to %d, and 1..%d, once", org, orgs[org], used[org], 1000-n, n)
		}
	}
	// Each round holds each org once at most, so calls made < counts means counts of
	// one org (and of several of its keys) shared a call.
	if calls >= 180 || calls < 2 {
		t.Errorf("180 counts made %d script calls; want fewer, at least one per org", calls)
	}
	t.Logf("180 counts of 2 orgs and 6 keys in %d script calls", calls)
}

// down is hi, hi-1, … n numbers in all.
func down(hi, n int) []int {
	var s []int
	for i := range n {
		s = append(s, hi-i)
	}
	return s
}

func TestABudgetCountReachingRedisInTheLastMillisecondsOfItsTimeoutIsRefused(t *testing.T) {
	// As for Allow: deadlines go to Redis 2 ms early, so a count reaching it in the
	// last 2 ms before its deadline is not counted at any stage, and its caller gets
	// an error (ErrLate if the answer still reaches it in time), never a result. Redis hangs
	// while the count is sent and resumes 0.7 ms before the caller's deadline, 20
	// times.
	const timeout = 20 * time.Millisecond
	rdb, direct, proxy := slowRedis(t, timeout)
	clock := newClock(at(base, 20*time.Second))
	bothModes(t, rdb, timeout, func(t *testing.T, l *limiter.Redis, prefix string) {
		if _, err := allowKey(l, context.Background(), "warm", 10); err != nil { // reads Redis's clock
			t.Fatal(err)
		}
		in := instances{rdb: direct, prefix: prefix}
		for i := range 20 {
			org := fmt.Sprint("org-23-", i)
			proxy.Hang()
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			deadline, _ := ctx.Deadline()
			done := make(chan limiter.Result, 1)
			go func() {
				r, err := l.Allow(ctx, limiter.Budgets{Key: "k", KeyLimit: 10, Org: org, OrgLimit: 10, MonthLimit: 10})
				if err != nil {
					r = limiter.Result{}
				}
				done <- r
			}()
			time.Sleep(time.Until(deadline.Add(-700 * time.Microsecond)))
			proxy.Resume()
			r := <-done
			cancel()
			time.Sleep(5 * time.Millisecond) // the held command runs
			if r != (limiter.Result{}) {
				t.Errorf("attempt %d: %+v; want an error (ErrLate, or a timeout), nothing being counted", i, r)
			}
			for _, k := range in.keys(t) {
				if strings.Contains(k, org+"}") {
					t.Errorf("attempt %d: counter %s written, in the last 2 ms of its timeout", i, k)
				}
			}
		}
	}, limiter.WithClock(clock.now))
}

func TestALimitChangedMidRoundKeepsOneCount(t *testing.T) {
	// A key's own limit or its org's plan changes while counts of the old and the new
	// limits share a round: each count is judged by its own limits, and all of them
	// share the counters, each number taken once.
	const timeout = 2 * time.Second
	rdb, direct, proxy := slowRedis(t, timeout)
	clock := newClock(at(base, 20*time.Second))
	for _, tc := range []struct {
		name     string
		old, new limiter.Budgets
	}{
		{"the key's limit", limiter.Budgets{Key: "k", KeyLimit: 5, Org: "o", OrgLimit: 1000, MonthLimit: 1e6},
			limiter.Budgets{Key: "k", KeyLimit: 1000, Org: "o", OrgLimit: 1000, MonthLimit: 1e6}},
		{"the org's limits", limiter.Budgets{Key: "k", KeyLimit: 1000, Org: "o", OrgLimit: 5, MonthLimit: 1e6},
			limiter.Budgets{Key: "k", KeyLimit: 1000, Org: "o", OrgLimit: 1000, MonthLimit: 2e6}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prefix := uniquePrefix(t)
			l := limiter.NewRedis(rdb, limiter.WithClock(clock.now), limiter.WithPrefix(prefix),
				limiter.WithPipelining(timeout))
			if _, err := allowKey(l, context.Background(), "warm", 1); err != nil {
				t.Fatal(err)
			}
			proxy.SetDelay(20 * time.Millisecond)
			defer proxy.SetDelay(0)
			before := limiter.ScriptCalls(l)
			got := spend(t, instances{a: l, b: l}, 20, tc.old, tc.new)
			if calls := limiter.ScriptCalls(l) - before; calls >= 40 {
				t.Errorf("40 counts made %d script calls; want rounds of several", calls)
			}
			var key, org, used []int // the numbers taken, where the limits show them
			for _, r := range got.results {
				if r.Key.Limit == 1000 {
					key = append(key, 1000-r.Key.Remaining)
				} else if r.Key.Allowed {
					key = append(key, 5-r.Key.Remaining)
				}
				if r.RefusedAt != limiter.StageKey && (r.Org.Limit == 1000 || r.Org.Allowed) {
					org = append(org, r.Org.Limit-r.Org.Remaining)
				}
				if r.Allowed {
					used = append(used, int(r.Month.Used))
				}
			}
			for name, numbers := range map[string][]int{"key": key, "org": org, "month": used} {
				sort.Ints(numbers)
				for i, n := range numbers {
					if i > 0 && n == numbers[i-1] {
						t.Errorf("%s numbers %v: %d taken twice", name, numbers, n)
					}
				}
			}
			// The old limit allows 5 of its 20 (the first 5 numbers, whichever counts
			// took them), the new one all of its 20.
			if got.allowed < 20 || got.allowed > 25 || got.failed != 0 || len(used) != got.allowed || used[len(used)-1] != got.allowed {
				t.Errorf("allowed %d, refused %v, month used %v", got.allowed, got.refused, used)
			}
			// Redis's counters agree with the answers.
			instances{rdb: direct}.checkCounters(t, map[string]int64{
				keyCounter(prefix, "o", "k", base):     40,
				orgCounter(prefix, "o", base):          int64(40 - got.refused[limiter.StageKey]),
				monthCounter(prefix, "o", clock.now()): int64(got.allowed),
			})
		})
	}
}
