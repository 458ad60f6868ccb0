package limiter_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/keygate/keygate/internal/testkit/testenv"
	"github.com/keygate/keygate/limiter"
)

// instances are two limiters counting in one place, as two gateway instances would
// (two Redis clients), and a client to read that place's counters (nil for Local).
type instances struct {
	a, b   limiter.Limiter
	rdb    redis.UniversalClient
	prefix string
}

// budgetModes are the ways Allow counts: in process, and in a single Redis and
// a Redis Cluster, each plain and pipelined. Local is one instance: a and b are the
// same limiter. The Cluster modes skip without REDIS_CLUSTER_URL (scripts/stack.sh
// up-cluster; `make test` sets it).
var budgetModes = []struct {
	name      string
	cluster   bool
	pipelined bool
	local     bool
}{
	{name: "local", local: true},
	{name: "redis"},
	{name: "redis pipelined", pipelined: true},
	{name: "cluster", cluster: true},
	{name: "cluster pipelined", cluster: true, pipelined: true},
}

// forEachMode runs f as a subtest per budget mode, with two instances under a prefix of
// their own, built with opts.
func forEachMode(t *testing.T, f func(t *testing.T, in instances), opts ...limiter.Option) {
	forModes(t, true, f, opts...)
}

// forEachRedisMode is forEachMode without Local.
func forEachRedisMode(t *testing.T, f func(t *testing.T, in instances), opts ...limiter.Option) {
	forModes(t, false, f, opts...)
}

func forModes(t *testing.T, local bool, f func(t *testing.T, in instances), opts ...limiter.Option) {
	for _, mode := range budgetModes {
		if mode.local && !local {
			continue
		}
		t.Run(mode.name, func(t *testing.T) {
			if mode.local {
				l := limiter.NewLocal(opts...)
				f(t, instances{a: l, b: l})
				return
			}
			prefix := uniquePrefix(t)
			o := append([]limiter.Option{limiter.WithPrefix(prefix)}, opts...)
			if mode.pipelined {
				o = append(o, limiter.WithPipelining(2*time.Second))
			}
			var a, b redis.UniversalClient
			if mode.cluster {
				a, b = clusterClient(t), clusterClient(t)
			} else {
				a, b = redisClient(t), redisClient(t)
			}
			f(t, instances{a: limiter.NewRedis(a, o...), b: limiter.NewRedis(b, o...), rdb: a, prefix: prefix})
		})
	}
}

// clusterClient returns a client of the Redis Cluster named by REDIS_CLUSTER_URL,
// skipping the test without one.
func clusterClient(t *testing.T) *redis.ClusterClient {
	t.Helper()
	opts, err := redis.ParseClusterURL(testenv.GetenvOrSkip(t, "REDIS_CLUSTER_URL"))
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClusterClient(opts)
	t.Cleanup(func() { c.Close() })
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("pinging the cluster: %v", err)
	}
	return c
}

// The Redis keys Allow documents, in window w of minute-clock time and month
// yyyymm.
func keyCounter(prefix, org, key string, w int64) string {
	return prefix + "{o:" + org + "}:k:" + key + ":" + strconv.FormatInt(w, 10)
}
func orgCounter(prefix, org string, w int64) string {
	return prefix + "{o:" + org + "}:o:" + strconv.FormatInt(w, 10)
}
func monthCounter(prefix, org string, t time.Time) string {
	return prefix + "{o:" + org + "}:M:" + t.UTC().Format("200601")
}

// counter reads a counter of in's Redis, 0 if missing; -1 for Local, which has none to
// read.
func (in instances) counter(t *testing.T, key string) int64 {
	t.Helper()
	if in.rdb == nil {
		return -1
	}
	n, err := in.rdb.Get(context.Background(), key).Int64()
	if errors.Is(err, redis.Nil) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// checkCounters checks in's counters against want (key to count); nothing for Local.
func (in instances) checkCounters(t *testing.T, want map[string]int64) {
	t.Helper()
	if in.rdb == nil {
		return
	}
	for key, n := range want {
		if got := in.counter(t, key); got != n {
			t.Errorf("counter %s = %d, want %d", key, got, n)
		}
	}
}

// keys returns the Redis keys under in's prefix, from every master of a Cluster.
func (in instances) keys(t *testing.T) []string {
	t.Helper()
	ctx := context.Background()
	cc, ok := in.rdb.(*redis.ClusterClient)
	if !ok {
		keys, err := in.rdb.Keys(ctx, in.prefix+"*").Result()
		if err != nil {
			t.Fatal(err)
		}
		return keys
	}
	var mu sync.Mutex
	var all []string
	err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		keys, err := c.Keys(ctx, in.prefix+"*").Result()
		mu.Lock()
		all = append(all, keys...)
		mu.Unlock()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return all
}

// forget deletes every counter under in's prefix, as FLUSHALL would; this Redis is
// shared with other packages' tests, which a FLUSHALL would disturb.
func (in instances) forget(t *testing.T) {
	t.Helper()
	for _, k := range in.keys(t) {
		if err := in.rdb.Del(context.Background(), k).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// tally is what a burst of Allow calls came to.
type tally struct {
	allowed, failed int
	refused         map[limiter.Stage]int
	results         []limiter.Result
}

// spend runs n concurrent Allow calls of each Budgets, alternating between the
// two instances, and counts their outcomes.
func spend(t *testing.T, in instances, n int, budgets ...limiter.Budgets) tally {
	t.Helper()
	var mu sync.Mutex
	tl := tally{refused: map[limiter.Stage]int{}}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		for _, b := range budgets {
			l := in.a
			if i%2 == 1 {
				l = in.b
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				r, err := l.Allow(context.Background(), b)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err != nil:
					t.Errorf("Allow(%+v): %v", b, err)
					tl.failed++
				case r.Allowed:
					tl.allowed++
				default:
					tl.refused[r.RefusedAt]++
				}
				tl.results = append(tl.results, r)
			}()
		}
	}
	close(start)
	wg.Wait()
	return tl
}

func TestAKeysOwnLimitPassesExactlyItsNumber(t *testing.T) {
	clock := newClock(at(base, 10*time.Second))
	forEachMode(t, func(t *testing.T, in instances) {
		b := limiter.Budgets{Key: "key-A", KeyLimit: 25, Org: "org-1", OrgLimit: 1000, MonthLimit: 1 << 40}
		got := spend(t, in, 120, b)
		if got.allowed != 25 || got.refused[limiter.StageKey] != 95 {
			t.Errorf("allowed %d, refused %v; want 25 allowed and 95 refused at key", got.allowed, got.refused)
		}
		// The key's minute counts all; the org's and the month only what the key let through.
		in.checkCounters(t, map[string]int64{
			keyCounter(in.prefix, "org-1", "key-A", base): 120,
			orgCounter(in.prefix, "org-1", base):          25,
			monthCounter(in.prefix, "org-1", clock.now()): 25,
		})
	}, limiter.WithClock(clock.now))
}

func TestAnOrgCeilingPassesExactlyItsNumberAcrossKeysAndInstances(t *testing.T) {
	clock := newClock(at(base, 10*time.Second))
	forEachMode(t, func(t *testing.T, in instances) {
		var budgets []limiter.Budgets
		for k := range 6 {
			budgets = append(budgets, limiter.Budgets{Key: fmt.Sprint("key-", k), KeyLimit: 1000, Org: "org-2", OrgLimit: 40, MonthLimit: 1 << 40})
		}
		got := spend(t, in, 30, budgets...)
		if got.allowed != 40 || got.refused[limiter.StageOrg] != 140 || len(got.refused) != 1 {
			t.Errorf("allowed %d, refused %v; want 40 allowed and 140 refused at org", got.allowed, got.refused)
		}
		want := map[string]int64{
			orgCounter(in.prefix, "org-2", base):          180,
			monthCounter(in.prefix, "org-2", clock.now()): 40,
		}
		for k := range 6 {
			want[keyCounter(in.prefix, "org-2", fmt.Sprint("key-", k), base)] = 30
		}
		in.checkCounters(t, want)
	}, limiter.WithClock(clock.now))
}

func TestAMonthlyQuotaPassesExactlyItsNumberThenRefusesWithoutCounting(t *testing.T) {
	clock := newClock(at(base, 10*time.Second))
	forEachMode(t, func(t *testing.T, in instances) {
		var budgets []limiter.Budgets
		for k := range 3 {
			budgets = append(budgets, limiter.Budgets{Key: fmt.Sprint("key-", k), KeyLimit: 1000, Org: "org-3", OrgLimit: 1000, MonthLimit: 30})
		}
		got := spend(t, in, 40, budgets...)
		if got.allowed != 30 || got.refused[limiter.StageMonth] != 90 || len(got.refused) != 1 {
			t.Errorf("allowed %d, refused %v; want 30 allowed and 90 refused at month", got.allowed, got.refused)
		}
		var used []int
		for _, r := range got.results {
			if r.Allowed {
				used = append(used, int(r.Month.Used))
			} else if r.Month.Used != 30 || r.Month.Remaining != 0 {
				t.Errorf("refused at month with %+v, want used 30 and remaining 0", r.Month)
			}
		}
		sort.Ints(used)
		if fmt.Sprint(used) != fmt.Sprint(seq(1, 30)) {
			t.Errorf("the allowed saw used %v, want each of 1..30 once", used)
		}
		// Later requests, on either instance, are refused at month and not counted.
		for _, l := range []limiter.Limiter{in.a, in.b} {
			r, err := l.Allow(context.Background(), budgets[0])
			if err != nil || r.Allowed || r.RefusedAt != limiter.StageMonth || r.RetryAfter() != 0 || r.Month.Used != 30 {
				t.Errorf("a request past the quota: %+v, %v; want refused at month, used 30", r, err)
			}
		}
		in.checkCounters(t, map[string]int64{
			monthCounter(in.prefix, "org-3", clock.now()): 30,
			orgCounter(in.prefix, "org-3", base):          122,
		})
	}, limiter.WithClock(clock.now))
}

func TestARefusalAtOneStageIsNotCountedAtALaterOne(t *testing.T) {
	clock := newClock(at(base, 15*time.Second))
	forEachMode(t, func(t *testing.T, in instances) {
		clock.set(at(base, 15*time.Second))
		a := limiter.Budgets{Key: "A", KeyLimit: 2, Org: "org-4", OrgLimit: 3, MonthLimit: 4}
		b := limiter.Budgets{Key: "B", KeyLimit: 10, Org: "org-4", OrgLimit: 3, MonthLimit: 4}
		for i, step := range []struct {
			b         limiter.Budgets
			next      bool // in the next minute
			refusedAt limiter.Stage
			key, org  limiter.Window
			used      int64
			counters  [4]int64 // A's minute, B's minute, the org's minute, the month
		}{
			{a, false, limiter.StageNone, res(true, 2, 1, 45), res(true, 3, 2, 45), 1, [4]int64{1, 0, 1, 1}},
			{a, false, limiter.StageNone, res(true, 2, 0, 45), res(true, 3, 1, 45), 2, [4]int64{2, 0, 2, 2}},
			// Over the key's limit: neither the org's minute nor the month counts it.
			{a, false, limiter.StageKey, res(false, 2, 0, 45), res(false, 3, 1, 45), 2, [4]int64{3, 0, 2, 2}},
			{b, false, limiter.StageNone, res(true, 10, 9, 45), res(true, 3, 0, 45), 3, [4]int64{3, 1, 3, 3}},
			// Over the org's limit: the month does not count it.
			{b, false, limiter.StageOrg, res(true, 10, 8, 45), res(false, 3, 0, 45), 3, [4]int64{3, 2, 4, 3}},
			{b, true, limiter.StageNone, res(true, 10, 9, 60), res(true, 3, 2, 60), 4, [4]int64{0, 1, 1, 4}},
			// Over the month: counted by the minutes, not by the month.
			{b, true, limiter.StageMonth, res(true, 10, 8, 60), res(true, 3, 1, 60), 4, [4]int64{0, 2, 2, 4}},
		} {
			w := base
			if step.next {
				w = base + 1
				clock.set(minute(w))
			}
			r, err := in.a.Allow(context.Background(), step.b)
			if err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
			want := limiter.Result{
				Allowed: step.refusedAt == limiter.StageNone, RefusedAt: step.refusedAt, Key: step.key, Org: step.org,
				Month: limiter.Quota{Limit: 4, Used: step.used, Remaining: 4 - step.used, ResetAfter: monthLeft(clock.now())},
			}
			if r != want {
				t.Errorf("step %d:\n got %+v\nwant %+v", i, r, want)
			}
			in.checkCounters(t, map[string]int64{
				keyCounter(in.prefix, "org-4", "A", w):        step.counters[0],
				keyCounter(in.prefix, "org-4", "B", w):        step.counters[1],
				orgCounter(in.prefix, "org-4", w):             step.counters[2],
				monthCounter(in.prefix, "org-4", clock.now()): step.counters[3],
			})
		}
	}, limiter.WithClock(clock.now))
}

// res is a Result.
func res(allowed bool, limit, remaining, resetAfter int) limiter.Window {
	return limiter.Window{Allowed: allowed, Limit: limit, Remaining: remaining, ResetAfter: resetAfter}
}

// monthLeft is the whole seconds left in t's UTC month, rounded up.
func monthLeft(t time.Time) int {
	u := t.UTC()
	end := time.Date(u.Year(), u.Month()+1, 1, 0, 0, 0, 0, time.UTC)
	return int((end.Sub(u) + time.Second - 1) / time.Second)
}

func TestBudgetsWithoutAnOrgBudgetAreAllowOnTheSameCounter(t *testing.T) {
	// A plan without org budgets counts as it always has: the key's counter of Allow,
	// shared with Allow's counts, and no other.
	clock := newClock(at(base, 20*time.Second))
	forEachMode(t, func(t *testing.T, in instances) {
		ctx := context.Background()
		allowKey(in.a, ctx, "k", 5)
		allowKey(in.b, ctx, "k", 5)
		for _, b := range []limiter.Budgets{
			{Key: "k", KeyLimit: 5},
			{Key: "k", KeyLimit: 5, Org: "org-5"}, // an org without budgets
			{Key: "k", KeyLimit: 5, Org: "org-5", OrgLimit: -1, MonthLimit: -1},
		} {
			if _, err := in.b.Allow(ctx, b); err != nil {
				t.Fatal(err)
			}
			allowKey(in.a, ctx, "k", 5)
		}
		r, err := in.a.Allow(ctx, limiter.Budgets{Key: "k", KeyLimit: 5})
		want := limiter.Result{RefusedAt: limiter.StageKey, Key: res(false, 5, 0, 40)}
		if err != nil || r != want {
			t.Errorf("the ninth count: %+v, %v; want %+v", r, err, want)
		}
		if in.rdb == nil {
			return
		}
		keys := in.keys(t)
		if want := in.prefix + "{k}:" + strconv.FormatInt(base, 10); len(keys) != 1 || keys[0] != want {
			t.Errorf("counters %v, want only Allow's %s", keys, want)
		}
	}, limiter.WithClock(clock.now))
}

func TestBudgetsBadInputCountsNothing(t *testing.T) {
	forEachMode(t, func(t *testing.T, in instances) {
		for _, tc := range []struct {
			b    limiter.Budgets
			want error
		}{
			{limiter.Budgets{Key: "k", Org: "o"}, limiter.ErrBadLimit},
			{limiter.Budgets{Key: "k", KeyLimit: -1, Org: "o", OrgLimit: -1, MonthLimit: -1}, limiter.ErrBadLimit},
			{limiter.Budgets{Key: "k", KeyLimit: 5, OrgLimit: 5}, limiter.ErrNoOrg},
			{limiter.Budgets{Key: "k", KeyLimit: 5, MonthLimit: 5}, limiter.ErrNoOrg},
		} {
			if _, err := in.a.Allow(context.Background(), tc.b); err != tc.want {
				t.Errorf("Allow(%+v) = %v, want %v", tc.b, err, tc.want)
			}
		}
		if in.rdb == nil {
			return
		}
		if keys := in.keys(t); len(keys) != 0 {
			t.Errorf("counters %v written for bad budgets", keys)
		}
	})
}

func TestAKeyWithoutALimitOfItsOwnCountsAgainstItsOrg(t *testing.T) {
	// An unlimited key on a plan with an org ceiling: only the org's budgets apply.
	clock := newClock(at(base, 20*time.Second))
	forEachMode(t, func(t *testing.T, in instances) {
		b := limiter.Budgets{Key: "k", KeyLimit: -1, Org: "org-6", OrgLimit: 10}
		got := spend(t, in, 30, b)
		if got.allowed != 10 || got.refused[limiter.StageOrg] != 20 {
			t.Errorf("allowed %d, refused %v; want 10 and 20 at org", got.allowed, got.refused)
		}
		for _, r := range got.results {
			if r.Key != (limiter.Window{}) || r.Month != (limiter.Quota{}) {
				t.Errorf("budgets that do not apply reported: %+v", r)
			}
		}
		in.checkCounters(t, map[string]int64{
			keyCounter(in.prefix, "org-6", "k", base):     0,
			orgCounter(in.prefix, "org-6", base):          30,
			monthCounter(in.prefix, "org-6", clock.now()): 0,
		})
	}, limiter.WithClock(clock.now))
}

// record is the usage record months are seeded from (as the gateway's reads
// PostgreSQL's): each org's count of each month, and the seed calls it answered.
type record struct {
	mu      sync.Mutex
	used    map[string]int64 // org and month start (RFC 3339) to used
	calls   []string         // org and month start of each call
	err     error            // the answer of every call, while set
	block   chan struct{}    // while not nil, calls wait for it to close
	ctxErrs []error          // each call's context's error once it had its answer
}

func (rec *record) seed(ctx context.Context, org string, month time.Time) (int64, error) {
	id := org + " " + month.Format(time.RFC3339)
	rec.mu.Lock()
	rec.calls = append(rec.calls, id)
	block, err, used := rec.block, rec.err, rec.used[id]
	rec.mu.Unlock()
	if block != nil {
		<-block
	}
	rec.mu.Lock()
	rec.ctxErrs = append(rec.ctxErrs, ctx.Err())
	rec.mu.Unlock()
	return used, err
}

// set records used requests of org in the month starting at month.
func (rec *record) set(org string, month time.Time, used int64) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.used == nil {
		rec.used = map[string]int64{}
	}
	rec.used[org+" "+month.Format(time.RFC3339)] = used
}

// take returns the calls made since the last take.
func (rec *record) take() []string {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	calls := rec.calls
	rec.calls = nil
	return calls
}

// monthStart is the first instant of t's UTC month.
func monthStart(t time.Time) time.Time {
	u := t.UTC()
	return time.Date(u.Year(), u.Month(), 1, 0, 0, 0, 0, time.UTC)
}

func TestTheMonthSurvivesALossOfItsCountersThroughTheSeed(t *testing.T) {
	// Redis loses its data (a Local instance starts anew): the month is re-seeded from
	// the record, and a spent quota stays spent.
	rec := &record{}
	clock := newClock(at(base, 10*time.Second))
	opts := []limiter.Option{limiter.WithClock(clock.now), limiter.WithMonthSeed(rec.seed)}
	forEachMode(t, func(t *testing.T, in instances) {
		rec.take()
		rec.set("org-7", monthStart(clock.now()), 0)
		b := limiter.Budgets{Key: "k", KeyLimit: 1000, Org: "org-7", MonthLimit: 6}
		if got := spend(t, in, 10, b); got.allowed != 6 || got.refused[limiter.StageMonth] != 4 {
			t.Fatalf("allowed %d, refused %v; want 6 and 4 at month", got.allowed, got.refused)
		}
		// The month's first count found no counter: the record was asked, once per
		// instance at most, for this org's month.
		want := "org-7 " + monthStart(clock.now()).Format(time.RFC3339)
		if calls := rec.take(); len(calls) < 1 || len(calls) > 2 || calls[0] != want {
			t.Errorf("seed calls %q, want one or two of %q", calls, want)
		}
		rec.set("org-7", monthStart(clock.now()), 6) // what the record has received
		if in.rdb == nil {
			l := limiter.NewLocal(opts...)
			in.a, in.b = l, l
		} else {
			in.forget(t)
		}
		got := spend(t, in, 10, b)
		if got.allowed != 0 || got.refused[limiter.StageMonth] != 10 {
			t.Errorf("after the loss: allowed %d, refused %v; want all 10 refused at month", got.allowed, got.refused)
		}
		for _, r := range got.results {
			if r.Month.Used != 6 {
				t.Errorf("after the loss: %+v, want used 6", r.Month)
			}
		}
		if calls := rec.take(); len(calls) < 1 || len(calls) > 2 {
			t.Errorf("10 counts of two instances made seed calls %q; want one per instance at most", calls)
		}
		in.checkCounters(t, map[string]int64{monthCounter(in.prefix, "org-7", clock.now()): 6})
	}, opts...)
}

func TestWithoutASeedAMissingMonthStartsAtZero(t *testing.T) {
	clock := newClock(at(base, 10*time.Second))
	forEachMode(t, func(t *testing.T, in instances) {
		b := limiter.Budgets{Key: "k", KeyLimit: 1000, Org: "org-8", MonthLimit: 6}
		for round := range 2 {
			if got := spend(t, in, 10, b); got.allowed != 6 || got.refused[limiter.StageMonth] != 4 {
				t.Fatalf("round %d: allowed %d, refused %v; want 6 and 4 at month", round, got.allowed, got.refused)
			}
			if in.rdb == nil {
				l := limiter.NewLocal(limiter.WithClock(clock.now))
				in.a, in.b = l, l
			} else {
				in.forget(t)
			}
		}
	}, limiter.WithClock(clock.now))
}

func TestASeedIsSharedByItsCallersEachWaitingUntilItsOwnDeadline(t *testing.T) {
	rec := &record{}
	clock := newClock(at(base, 10*time.Second))
	forEachMode(t, func(t *testing.T, in instances) {
		rec.take()
		rec.mu.Lock()
		rec.block, rec.ctxErrs = make(chan struct{}), nil
		rec.mu.Unlock()
		b := limiter.Budgets{Key: "k", KeyLimit: 1000, Org: "org-9", OrgLimit: 1000, MonthLimit: 100}
		// The first caller starts the seed and gives up on it at its deadline.
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		start := time.Now()
		_, err := in.a.Allow(ctx, b)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > time.Second {
			t.Fatalf("a caller with a 100ms deadline: %v after %v; want the deadline's error at 100ms", err, time.Since(start))
		}
		// The others join the seed still in flight, which outlives its first caller.
		done := make(chan limiter.Result, 20)
		for range 20 {
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				r, err := in.a.Allow(ctx, b)
				if err != nil {
					t.Error(err)
				}
				done <- r
			}()
		}
		time.Sleep(100 * time.Millisecond)
		rec.mu.Lock()
		close(rec.block)
		rec.block = nil
		rec.mu.Unlock()
		var used []int
		for range 20 {
			used = append(used, int((<-done).Month.Used))
		}
		sort.Ints(used)
		if fmt.Sprint(used) != fmt.Sprint(seq(1, 20)) {
			t.Errorf("used %v, want 1..20: the caller that gave up must not count", used)
		}
		if calls := rec.take(); len(calls) != 1 {
			t.Errorf("seed calls %q, want one for all 21 callers", calls)
		}
		rec.mu.Lock()
		if len(rec.ctxErrs) != 1 || rec.ctxErrs[0] != nil {
			t.Errorf("the seed's context ended with %v; want it alive after its first caller left", rec.ctxErrs)
		}
		rec.mu.Unlock()
		in.checkCounters(t, map[string]int64{
			keyCounter(in.prefix, "org-9", "k", base): 20,
			orgCounter(in.prefix, "org-9", base):      20,
		})
	}, limiter.WithClock(clock.now), limiter.WithMonthSeed(rec.seed))
}

func TestASeedFailureIsAnErrorAndCountsNothing(t *testing.T) {
	rec := &record{}
	clock := newClock(at(base, 10*time.Second))
	forEachMode(t, func(t *testing.T, in instances) {
		rec.set("org-10", monthStart(clock.now()), 40)
		down := errors.New("postgres is down")
		rec.mu.Lock()
		rec.err = down
		rec.mu.Unlock()
		b := limiter.Budgets{Key: "k", KeyLimit: 1000, Org: "org-10", OrgLimit: 1000, MonthLimit: 100}
		if _, err := in.a.Allow(context.Background(), b); !errors.Is(err, down) || !errors.Is(err, limiter.ErrMonthSeed) {
			t.Errorf("Allow with a failing seed: %v, want it to wrap %v and ErrMonthSeed", err, down)
		}
		if in.rdb != nil {
			if keys := in.keys(t); len(keys) != 0 {
				t.Errorf("counters %v written while the month could not be seeded", keys)
			}
		}
		rec.mu.Lock()
		rec.err = nil
		rec.mu.Unlock()
		r, err := in.a.Allow(context.Background(), b)
		if err != nil || !r.Allowed || r.Month.Used != 41 || r.Org.Remaining != 999 || r.Key.Remaining != 999 {
			t.Errorf("once the seed answers: %+v, %v; want used 41, and the minutes' first count", r, err)
		}
	}, limiter.WithClock(clock.now), limiter.WithMonthSeed(rec.seed))
}

func TestBudgetsWindowAndMonthEdges(t *testing.T) {
	for _, tc := range []struct {
		name       string
		at         time.Time
		reset      int   // the minute's
		monthReset int   // the month's
		ttl        int64 // the minute counters', in milliseconds
	}{
		{"first instant of a month", time.Date(2031, 3, 1, 0, 0, 0, 0, time.UTC), 60, 31 * 86400, 120000},
		{"mid month, mid minute", time.Date(2031, 3, 15, 12, 30, 30, 1e6, time.UTC), 30, 16*86400 + 11*3600 + 29*60 + 30, 89999},
		{"last millisecond of a month", time.Date(2031, 3, 31, 23, 59, 59, 999e6, time.UTC), 1, 1, 60001},
		{"last nanosecond of a month", time.Date(2031, 3, 31, 23, 59, 59, 999999999, time.UTC), 1, 1, 60001},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := newClock(tc.at)
			forEachMode(t, func(t *testing.T, in instances) {
				b := limiter.Budgets{Key: "k", KeyLimit: 1, Org: "org-11", OrgLimit: 5, MonthLimit: 9}
				r, err := in.a.Allow(context.Background(), b)
				if err != nil || !r.Allowed || r.Key.ResetAfter != tc.reset || r.Org.ResetAfter != tc.reset || r.Month.ResetAfter != tc.monthReset {
					t.Errorf("%+v, %v; want allowed, resets %d, %d and %d", r, err, tc.reset, tc.reset, tc.monthReset)
				}
				// Refused by the key's minute: Retry-After is its window's end.
				if r, _ := in.b.Allow(context.Background(), b); r.RefusedAt != limiter.StageKey || r.RetryAfter() != tc.reset {
					t.Errorf("second request: %+v, retry after %d; want refused at key, retry after %d", r, r.RetryAfter(), tc.reset)
				}
				if in.rdb == nil {
					return
				}
				// Counters live for the rest of their window and one more, the month's
				// for the rest of the month and a day, all relative to Redis's clock.
				w := tc.at.Unix() / 60
				monthTTL := int64(tc.monthReset)*1000 + 24*3600*1000
				if tc.at.Nanosecond() != 0 {
					monthTTL = (time.Date(2031, 4, 1, 0, 0, 0, 0, time.UTC).Sub(tc.at) + 24*time.Hour + time.Millisecond - 1).Milliseconds()
				}
				for key, want := range map[string]int64{
					keyCounter(in.prefix, "org-11", "k", w):  tc.ttl,
					orgCounter(in.prefix, "org-11", w):       tc.ttl,
					monthCounter(in.prefix, "org-11", tc.at): monthTTL,
				} {
					got, err := in.rdb.PTTL(context.Background(), key).Result()
					if err != nil || got.Milliseconds() > want || got.Milliseconds() < want-2000 {
						t.Errorf("%s: TTL %v, %v; want %dms (less the test's time)", key, got, err, want)
					}
				}
			}, limiter.WithClock(clock.now))
		})
	}
}

func TestANewMonthStartsAFreshQuota(t *testing.T) {
	rec := &record{}
	end := time.Date(2031, 1, 31, 23, 59, 59, 500e6, time.UTC)
	clock := newClock(end)
	forEachMode(t, func(t *testing.T, in instances) {
		clock.set(end)
		rec.take()
		b := limiter.Budgets{Key: "k", KeyLimit: 1000, Org: "org-12", OrgLimit: 1000, MonthLimit: 3}
		if got := spend(t, in, 2, b, b); got.allowed != 3 || got.refused[limiter.StageMonth] != 1 {
			t.Fatalf("January: allowed %d, refused %v; want 3 and 1 at month", got.allowed, got.refused)
		}
		clock.set(time.Date(2031, 2, 1, 0, 0, 0, 0, time.UTC))
		r, err := in.a.Allow(context.Background(), b)
		want := limiter.Result{Allowed: true, Key: res(true, 1000, 999, 60), Org: res(true, 1000, 999, 60),
			Month: limiter.Quota{Limit: 3, Used: 1, Remaining: 2, ResetAfter: 28 * 86400}}
		if err != nil || r != want {
			t.Errorf("the first request of February: %+v, %v; want %+v", r, err, want)
		}
		calls := rec.take()
		if last := calls[len(calls)-1]; last != "org-12 2031-02-01T00:00:00Z" {
			t.Errorf("seed calls %q, the last for %q; want February's", calls, last)
		}
		in.checkCounters(t, map[string]int64{
			monthCounter(in.prefix, "org-12", end):         3,
			monthCounter(in.prefix, "org-12", clock.now()): 1,
		})
	}, limiter.WithClock(clock.now), limiter.WithMonthSeed(rec.seed))
}

func ExampleLocal_Allow_budgets() {
	l := limiter.NewLocal(limiter.WithClock(func() time.Time { return time.Date(2026, 11, 30, 23, 59, 45, 0, time.UTC) }))
	// Two keys of one org: each may make 3 requests a minute, the org 4 in all, and
	// 5 a month.
	for i, key := range []string{"key-A", "key-A", "key-A", "key-A", "key-B", "key-B", "key-B"} {
		r, _ := l.Allow(context.Background(), limiter.Budgets{Key: key, KeyLimit: 3, Org: "org-1", OrgLimit: 4, MonthLimit: 5})
		fmt.Printf("%d %s: allowed=%v refused-at=%q key-left=%d org-left=%d month-used=%d retry-after=%ds\n",
			i+1, key, r.Allowed, r.RefusedAt, r.Key.Remaining, r.Org.Remaining, r.Month.Used, r.RetryAfter())
	}
	// Output:
	// 1 key-A: allowed=true refused-at="" key-left=2 org-left=3 month-used=1 retry-after=0s
	// 2 key-A: allowed=true refused-at="" key-left=1 org-left=2 month-used=2 retry-after=0s
	// 3 key-A: allowed=true refused-at="" key-left=0 org-left=1 month-used=3 retry-after=0s
	// 4 key-A: allowed=false refused-at="key" key-left=0 org-left=1 month-used=3 retry-after=15s
	// 5 key-B: allowed=true refused-at="" key-left=2 org-left=0 month-used=4 retry-after=0s
	// 6 key-B: allowed=false refused-at="org" key-left=1 org-left=0 month-used=4 retry-after=15s
	// 7 key-B: allowed=false refused-at="org" key-left=0 org-left=0 month-used=4 retry-after=15s
}
