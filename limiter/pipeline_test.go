package limiter_test

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/keygate/keygate/internal/testkit/testenv"
	"github.com/keygate/keygate/limiter"
)

// countAll runs calls[key] concurrent Allow calls of every key against limits[key],
// all at once. It returns each key's results.
func countAll(t *testing.T, l limiter.Limiter, calls, limits map[string]int) map[string][]limiter.Window {
	t.Helper()
	var mu sync.Mutex
	got := map[string][]limiter.Window{}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for key, n := range calls {
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				r, err := allowKey(l, context.Background(), key, limits[key])
				if err != nil {
					t.Errorf("Allow(%s): %v", key, err)
					return
				}
				mu.Lock()
				got[key] = append(got[key], r)
				mu.Unlock()
			}()
		}
	}
	close(start)
	wg.Wait()
	return got
}

// checkNumbered checks the n results of one key, counted from a fresh window. They
// must be those of the numbers 1..n counted one by one. The first limit are allowed,
// with remaining limit-1 … 0, each once. The rest are refused with remaining 0. All
// have resetAfter.
func checkNumbered(t *testing.T, key string, results []limiter.Window, n, limit, resetAfter int) {
	t.Helper()
	if len(results) != n {
		t.Fatalf("%s: %d results, want %d", key, len(results), n)
	}
	var remaining []int
	refused := 0
	for _, r := range results {
		if r.Limit != limit || r.ResetAfter != resetAfter {
			t.Errorf("%s: result %+v, want limit %d and resetAfter %d", key, r, limit, resetAfter)
		}
		if r.Allowed {
			remaining = append(remaining, r.Remaining)
		} else if refused++; r.Remaining != 0 {
			t.Errorf("%s: refused with remaining %d", key, r.Remaining)
		}
	}
	allowed := min(n, limit)
	if len(remaining) != allowed || refused != n-allowed {
		t.Fatalf("%s: allowed %d, refused %d; want %d and %d", key, len(remaining), refused, allowed, n-allowed)
	}
	sort.Sort(sort.Reverse(sort.IntSlice(remaining)))
	for i, rem := range remaining {
		if want := limit - 1 - i; rem != want {
			t.Fatalf("%s: remaining of the allowed %v; want each of %d down to %d once", key, remaining, limit-1, limit-allowed)
		}
	}
}

func TestPipelinedCountsOfOneKeyShareACallAndEachGetsItsOwnNumber(t *testing.T) {
	// Redis is slow, so the counts made while a round is in flight gather into one.
	// The counts of one key in a round go as one script call, and on one Redis server
	// so do those of many keys. Each must still get the answer of its own number.
	const timeout = 2 * time.Second
	rdb, _, proxy := slowRedis(t, timeout)
	clock := newClock(at(base, 20*time.Second))
	for _, tc := range []struct {
		name   string
		calls  map[string]int
		limits map[string]int
	}{
		{"one key over its limit", map[string]int{"k": 200}, map[string]int{"k": 50}},
		{"one key, every number seen", map[string]int{"k": 150}, map[string]int{"k": 1 << 30}},
		{"mixed keys", map[string]int{"a": 60, "b": 40, "c": 1, "d": 30},
			map[string]int{"a": 10, "b": 40, "c": 1, "d": 100}},
		{"more keys than a round scans for", manyKeys(12, 15), manyKeys(12, 7)},
		{"many keys, one count each", manyKeys(60, 1), manyKeys(60, 1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := limiter.NewRedis(rdb, limiter.WithClock(clock.now), limiter.WithPrefix(uniquePrefix(t)),
				limiter.WithPipelining(timeout))
			if _, err := allowKey(l, context.Background(), "warm", 1); err != nil { // the clock reading
				t.Fatal(err)
			}
			proxy.SetDelay(20 * time.Millisecond)
			defer proxy.SetDelay(0)
			before := limiter.ScriptCalls(l)
			got := countAll(t, l, tc.calls, tc.limits)
			total := 0
			for key, n := range tc.calls {
				checkNumbered(t, key, got[key], n, tc.limits[key], 40)
				total += n
			}
			// A round is one script call on one server, whatever its keys. So there
			// are fewer calls than counts, or than keys when each key counts once.
			if calls := limiter.ScriptCalls(l) - before; calls >= uint64(total) || calls == 0 {
				t.Errorf("%d counts of %d keys made %d script calls; want fewer than the counts", total, len(tc.calls), calls)
			}
		})
	}
}

func TestPipelinedCountsLateForRedisAreRefusedAloneInTheirCall(t *testing.T) {
	// Counts of one key in one round, some of whose deadlines have passed when Redis
	// runs the script. Those are ErrLate and not counted. The others are counted and
	// numbered as if alone.
	const timeout = 2 * time.Second
	rdb, _, proxy := slowRedis(t, timeout)
	// One window throughout, however long the test takes: its counts must add up.
	mid := time.Now().Truncate(time.Minute).Add(30 * time.Second)
	l := limiter.NewRedis(rdb, limiter.WithPrefix(uniquePrefix(t)), limiter.WithPipelining(timeout),
		limiter.WithClock(func() time.Time { return mid }))
	if _, err := allowKey(l, context.Background(), "warm", 1); err != nil {
		t.Fatal(err)
	}
	proxy.Hang() // the first count waits in flight; the others gather behind it
	first := make(chan error, 1)
	go func() {
		_, err := allowKey(l, context.Background(), "k", 100)
		first <- err
	}()
	testenv.Eventually(t, 10*time.Second, "the first count in flight", func() bool { return proxy.Held() > 0 })
	type answer struct {
		r   limiter.Window
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
			r, err := allowKey(l, ctx, "k", 100)
			answers <- answer{r, err}
		}()
	}
	time.Sleep(600 * time.Millisecond)
	proxy.Resume()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	var remaining []int
	failed := 0
	for range 40 {
		a := <-answers
		if a.err != nil {
			failed++
			continue
		}
		remaining = append(remaining, a.r.Remaining)
	}
	sort.Ints(remaining)
	if failed != 20 || fmt.Sprint(remaining) != fmt.Sprint(seq(79, 98)) {
		t.Errorf("%d failed, remaining %v; want 20 failed and the 20 others numbered 2..21", failed, remaining)
	}
	r, err := allowKey(l, context.Background(), "k", 100)
	if err != nil || r.Remaining != 78 {
		t.Errorf("the next count = %+v, %v; want number 22 (remaining 78): the late ones uncounted", r, err)
	}
}

// seq is lo, lo+1, … hi.
func seq(lo, hi int) []int {
	var s []int
	for i := lo; i <= hi; i++ {
		s = append(s, i)
	}
	return s
}

// manyKeys is keys k0 … k(n-1), each mapped to v.
func manyKeys(n, v int) map[string]int {
	m := map[string]int{}
	for i := range n {
		m[fmt.Sprint("k", i)] = v
	}
	return m
}

func TestWithLingerBusyCallersShareRoundsAndStayExact(t *testing.T) {
	// 16 callers count back to back on one key: each sends its next count as soon as
	// it has its answer. With a linger, a round waits until they pause, that is until
	// all of them wait. So the counts share a few script calls. Each number is still
	// counted once.
	const timeout = 2 * time.Second
	rdb, _, _ := slowRedis(t, timeout)
	const callers, each, limit = 16, 10, 100
	for _, linger := range []time.Duration{0, 200 * time.Millisecond} {
		clock := newClock(at(base, 20*time.Second))
		l := limiter.NewRedis(rdb, limiter.WithClock(clock.now), limiter.WithPrefix(uniquePrefix(t)),
			limiter.WithPipelining(timeout), limiter.WithLinger(linger))
		run := func(key string) []limiter.Window {
			var mu sync.Mutex
			var results []limiter.Window
			var wg sync.WaitGroup
			for range callers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range each {
						r, err := allowKey(l, context.Background(), key, limit)
						if err != nil {
							t.Errorf("Allow: %v", err)
							return
						}
						mu.Lock()
						results = append(results, r)
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			return results
		}
		run("warm") // the rate the linger goes by
		before := limiter.ScriptCalls(l)
		checkNumbered(t, "k", run("k"), callers*each, limit, 40)
		calls := limiter.ScriptCalls(l) - before
		t.Logf("linger %v: %d counts in %d script calls", linger, callers*each, calls)
		// Ten rounds of all 16 at best. Without a linger, about twice as many here.
		if linger > 0 && calls > each+3 {
			t.Errorf("linger %v: %d counts made %d script calls; want the rounds to wait for all callers (at most %d calls)", linger, callers*each, calls, each+3)
		}
	}
}
