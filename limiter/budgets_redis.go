package limiter

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/keygate/keygate/internal/gather"
)

// AllowBudgets counts one request against b's budgets; see BudgetLimiter. It is one
// round trip, one script call (budgetScript), whatever b holds. A Budgets with neither
// org budget is Allow, on the same counter.
//
// The counters of an org's budgets share the Cluster hash slot of the org's id, its
// keys' minute counters included:
//
//	<prefix>{o:<org>}:k:<key>:<window>   the key's minute
//	<prefix>{o:<org>}:o:<window>         the org's minute
//	<prefix>{o:<org>}:M:<yyyymm>         the org's month (UTC)
//
// So all counting of such an org lands on one Cluster shard, and a key whose plan
// gains or loses an org budget starts its minute afresh once (it changes counter).
// The month counter lives until a day after its month ends.
//
// With WithPipelining, the requests of one org in a round, of any of its keys, share
// one script call; the rounds are the pipeline's (see WithPipelining) but separate
// from Allow's, so that a count of Allow never waits for or pays for these.
//
// With WithMonthSeed, a count that finds the month's counter missing counts nothing,
// seeds the month and counts again: three round trips, with the seed's, once a month
// or after Redis lost its data.
func (l *Redis) AllowBudgets(ctx context.Context, b Budgets) (BudgetsResult, error) {
	if err := b.check(); err != nil {
		return BudgetsResult{}, err
	}
	if !b.orgWide() {
		r, err := l.Allow(ctx, b.Key, b.KeyLimit)
		if err != nil {
			return BudgetsResult{}, err
		}
		return keyOnly(r), nil
	}
	by := gather.Deadline(ctx, l.opts.timeout)
	if err := l.clock.sync(ctx, by, l.rdb); err != nil {
		return BudgetsResult{}, fmt.Errorf("counting in redis: reading its clock: %w", err)
	}
	t := l.opts.now()
	w, reset, ttl := windowOf(t)
	m := monthOf(t)
	c := budgetCount{
		keyLimit: b.KeyLimit, orgLimit: b.OrgLimit, monthLimit: b.MonthLimit,
		minuteTTL: ttl, monthTTL: m.ttlMs, seed: firstSeed(l.seeds),
		redisDeadline: l.clock.deadline(by),
	}
	c.keyCounter, c.orgCounter, c.monthCounter = l.budgetKeys(b, w, m.name)
	var call *seedCall // the seed call c.seed came from
	for range seedAttempts {
		sent := time.Now()
		counts, err := l.countBudgets(ctx, by, c)
		if errors.Is(err, errMonthMissing) {
			if call, err = l.seeds.seed(ctx, by, sent, b.Org, m.start); err != nil {
				return BudgetsResult{}, fmt.Errorf("counting in redis: seeding the month of org %s: %w", b.Org, err)
			}
			c.seed = call.used
			continue
		}
		if err != nil {
			return BudgetsResult{}, fmt.Errorf("counting in redis: %w", err)
		}
		if call != nil {
			l.seeds.applied(call)
		}
		return budgetsResult(b, counts, reset, m), nil
	}
	return BudgetsResult{}, fmt.Errorf("counting in redis: %w", errMonthMissing)
}

// countBudgets runs c, through the pipeline if there is one, until deadline (zero:
// none).
func (l *Redis) countBudgets(ctx context.Context, deadline time.Time, c budgetCount) (budgetCounts, error) {
	if l.budgets != nil {
		reply, err := l.budgets.rounds.DoBy(ctx, deadline, c)
		if err == nil {
			err = reply.err
		}
		return reply.counts, err
	}
	ctx, cancel := bounded(ctx, deadline)
	defer cancel()
	round := []budgetCount{c}
	members := []int{0}
	keys, args := budgetCall(round, members)
	v, err := budgetScript.Run(ctx, l.rdb, keys, args...).Int64Slice()
	var replies [1]budgetReply
	readBudgets(members, v, err, replies[:], &l.clock)
	return replies[0].counts, replies[0].err
}

// budgetKeys returns the Redis keys of b's counters in minute window w and month
// yyyymm (see AllowBudgets), as substrings of one string: one allocation. key is
// empty when b has no key budget.
func (l *Redis) budgetKeys(b Budgets, w int64, yyyymm int) (key, org, month string) {
	n := 3*(len(l.opts.prefix)+len(b.Org)+8) + len(b.Key) + 3*20
	buf := make([]byte, 0, n)
	tag := func() {
		buf = append(buf, l.opts.prefix...)
		buf = append(buf, "{o:"...)
		buf = append(buf, b.Org...)
		buf = append(buf, '}')
	}
	tag()
	buf = append(buf, ":o:"...)
	buf = strconv.AppendInt(buf, w, 10)
	orgEnd := len(buf)
	tag()
	buf = append(buf, ":M:"...)
	buf = strconv.AppendInt(buf, int64(yyyymm), 10)
	monthEnd := len(buf)
	if b.KeyLimit > 0 {
		tag()
		buf = append(buf, ":k:"...)
		buf = append(buf, b.Key...)
		buf = append(buf, ':')
		buf = strconv.AppendInt(buf, w, 10)
	}
	s := string(buf)
	return s[monthEnd:], s[:orgEnd], s[orgEnd:monthEnd]
}

// budgetCount is one AllowBudgets call's count, in a round or alone.
type budgetCount struct {
	keyCounter   string // "" without a key budget
	orgCounter   string
	monthCounter string
	keyLimit     int
	orgLimit     int
	monthLimit   int64
	minuteTTL    int64 // milliseconds
	monthTTL     int64 // milliseconds
	seed         int64 // what a missing month starts from; -1: count nothing (see budgetScript)

	redisDeadline int64 // the caller's deadline on Redis's clock; 0 for none
}

// budgetReply is the script's answer to one count.
type budgetReply struct {
	counts budgetCounts
	err    error
}

// budgetPipeline gathers the counts of concurrent AllowBudgets calls into one Redis
// pipeline, as pipeline does Allow's, with one script call per org and month.
type budgetPipeline struct {
	rdb     pipeliner
	timeout time.Duration
	clock   *redisClock
	rounds  *gather.Gatherer[budgetCount, budgetReply]

	calls atomic.Uint64 // script calls sent, for tests through export_test.go
}

func newBudgetPipeline(rdb pipeliner, timeout, linger time.Duration, clock *redisClock) *budgetPipeline {
	p := &budgetPipeline{rdb: rdb, timeout: timeout, clock: clock}
	p.rounds = gather.New(p.send, gather.Options{Lanes: 1, MaxWait: max(timeout/10, time.Millisecond), Inline: true, Linger: linger})
	return p
}

// send is the budget pipeline's gather.Flush: one script call per org and month in the
// round, its members in the order they joined, sent as pipeline.send sends Allow's
// (one pipeline, NOSCRIPT calls again as EVAL, the round bounded by its callers' latest
// deadline).
func (p *budgetPipeline) send(ctx context.Context, deadline time.Time, round []budgetCount) ([]budgetReply, error) {
	if deadline.IsZero() {
		deadline = time.Now().Add(p.timeout)
	}
	ctx, cancel := bounded(ctx, deadline)
	defer cancel()
	replies := make([]budgetReply, len(round))
	calls := byOrg(round)
	keys := make([][]string, len(calls))
	args := make([][]any, len(calls))
	todo := make([]int, len(calls))
	for c := range calls {
		keys[c], args[c] = budgetCall(round, calls[c])
		todo[c] = c
	}
	for attempt := 0; attempt < 2 && len(todo) > 0; attempt++ {
		var pipe redis.Pipeliner
		var run redis.Scripter = p.rdb
		if len(todo) > 1 {
			pipe = p.rdb.Pipeline()
			run = pipe
		}
		cmds := make([]*redis.Cmd, len(todo))
		for j, c := range todo {
			if attempt == 0 {
				cmds[j] = budgetScript.EvalSha(ctx, run, keys[c], args[c]...)
			} else {
				cmds[j] = budgetScript.Eval(ctx, run, keys[c], args[c]...)
			}
		}
		p.calls.Add(uint64(len(todo)))
		if pipe != nil {
			pipe.Exec(ctx) // errors are read per command below
		}
		var again []int
		for j, c := range todo {
			v, err := cmds[j].Int64Slice()
			if err != nil && attempt == 0 && redis.HasErrorPrefix(err, "NOSCRIPT") {
				again = append(again, c)
				continue
			}
			readBudgets(calls[c], v, err, replies, p.clock)
		}
		todo = again
	}
	return replies, nil
}

// byOrg groups the indices of round by org counter and month counter, each group and
// the groups in the order of arrival: the members of one script call.
func byOrg(round []budgetCount) [][]int {
	if len(round) == 1 {
		return [][]int{{0}}
	}
	type call struct{ org, month string }
	var calls [][]int
	index := make(map[call]int)
	for i := range round {
		k := call{round[i].orgCounter, round[i].monthCounter}
		c, ok := index[k]
		if !ok {
			c = len(calls)
			index[k] = c
			calls = append(calls, nil)
		}
		calls[c] = append(calls[c], i)
	}
	return calls
}

// budgetCall returns the KEYS and ARGV of the script call counting members, indices of
// round sharing one org counter and month counter (see budgetScript).
func budgetCall(round []budgetCount, members []int) ([]string, []any) {
	first := &round[members[0]]
	keys := make([]string, 2, 3)
	keys[0], keys[1] = first.orgCounter, first.monthCounter
	args := make([]any, 3, 3+5*len(members))
	var minuteTTL, monthTTL, seed int64 = 0, 0, -1
	var index map[string]int // key counter to its index in keys, once there are many
	for _, i := range members {
		c := &round[i]
		k := 0 // no key budget
		if c.keyCounter != "" {
			k = keyIndex(&keys, &index, c.keyCounter)
		}
		// Any member's TTLs will do; the longest are safest. One seeded member
		// seeds them all: they count the same month.
		minuteTTL, monthTTL, seed = max(minuteTTL, c.minuteTTL), max(monthTTL, c.monthTTL), max(seed, c.seed)
		args = append(args, k, c.keyLimit, c.orgLimit, c.monthLimit, c.redisDeadline)
	}
	args[0], args[1], args[2] = minuteTTL, monthTTL, seed
	return keys, args
}

// keyIndex returns the index in KEYS (from 1, as Lua counts) of counter, adding it to
// *keys if it is new; *index maps counters to it once *keys is long.
func keyIndex(keys *[]string, index *map[string]int, counter string) int {
	if *index != nil {
		if k, ok := (*index)[counter]; ok {
			return k
		}
	} else {
		for j, have := range (*keys)[2:] {
			if have == counter {
				return j + 3
			}
		}
	}
	*keys = append(*keys, counter)
	k := len(*keys)
	if *index != nil {
		(*index)[counter] = k
	} else if k > 10 {
		*index = make(map[string]int, 2*k)
		for j, have := range (*keys)[2:] {
			(*index)[have] = j + 3
		}
	}
	return k
}

// readBudgets hands the members of one script call (indices of a round, in the order
// of its ARGV) their replies from the script's answer v or its error.
func readBudgets(members []int, v []int64, err error, replies []budgetReply, clock *redisClock) {
	if err == nil && len(v) >= 2 {
		clock.observe(v[1])
	}
	switch {
	case err != nil:
	case len(v) == 2 && v[0] == -2:
		err = errMonthMissing
	case len(v) != 2+4*len(members) || v[0] != 0:
		err = fmt.Errorf("unexpected reply %v for %d counts", v, len(members))
	}
	if err != nil {
		for _, i := range members {
			replies[i].err = err
		}
		return
	}
	for j, i := range members {
		s := v[2+4*j : 2+4*j+4]
		if s[0] < 0 {
			replies[i].err = ErrLate
			continue
		}
		replies[i].counts = budgetCounts{stage: s[0], key: s[1], org: s[2], month: s[3]}
	}
}
