package limiter

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

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
// With WithMonthSeed, a count that finds the month's counter missing counts nothing;
// the month is seeded (see WithMonthSeed) and the count made again with the seed:
// two round trips and a seed call, once a month per org, or after Redis lost its
// data.
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
				return BudgetsResult{}, fmt.Errorf("counting in redis: seeding the month of org %s: %w: %w", b.Org, ErrMonthSeed, err)
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
	calls := budgetCalls(round)
	if len(calls) != 1 {
		return budgetCounts{}, fmt.Errorf("limiter: %d script calls for one count", len(calls))
	}
	v, err := budgetScript.Run(ctx, l.rdb, calls[0].keys, calls[0].args...).Int64Slice()
	var replies [1]budgetReply
	readBudgets(round, &calls[0], v, err, replies[:], &l.clock)
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
// round (see budgetCalls), sent as pipeline.send sends Allow's (sendCalls, the round
// bounded by its callers' latest deadline).
func (p *budgetPipeline) send(ctx context.Context, deadline time.Time, _ bool, round []budgetCount) ([]budgetReply, error) {
	if deadline.IsZero() {
		deadline = time.Now().Add(p.timeout)
	}
	ctx, cancel := bounded(ctx, deadline)
	defer cancel()
	replies := make([]budgetReply, len(round))
	calls := budgetCalls(round)
	sent := sendCalls(ctx, p.rdb, budgetScript, len(calls), func(c int) ([]string, []any) {
		return calls[c].keys, calls[c].args
	}, func(c int, v []int64, err error) {
		readBudgets(round, &calls[c], v, err, replies, p.clock)
	})
	p.calls.Add(uint64(sent))
	return replies, nil
}

// budgetCall is one call of budgetScript: its KEYS and ARGV, its members (indices of a
// round, in the order of ARGV), and for each member the index in KEYS of its key's
// counter, from 1 as Lua counts (0: no key budget).
type budgetCall struct {
	keys    []string
	args    []any
	members []int
	keyOf   []int
}

// budgetCalls splits round into script calls: one per org counter, month counter and
// org limits (an org's plan changed mid-round goes as two), the groups and their
// members in the order of arrival. A call holds each key counter once, with its limit:
// a count of a key counter already in its call with another limit (the key's limit
// changed mid-round) goes in a call of its own.
func budgetCalls(round []budgetCount) []budgetCall {
	var groups [][]int
	if len(round) == 1 {
		groups = oneCount
	} else {
		type group struct {
			org, month string
			orgLimit   int
			monthLimit int64
		}
		index := make(map[group]int)
		for i := range round {
			c := &round[i]
			k := group{c.orgCounter, c.monthCounter, c.orgLimit, c.monthLimit}
			g, ok := index[k]
			if !ok {
				g = len(groups)
				index[k] = g
				groups = append(groups, nil)
			}
			groups[g] = append(groups[g], i)
		}
	}
	calls := make([]budgetCall, 0, len(groups))
	for _, members := range groups {
		for len(members) > 0 {
			var call budgetCall
			members = call.fill(round, members)
			calls = append(calls, call)
		}
	}
	return calls
}

// oneCount is the groups of a round of one count; read only.
var oneCount = [][]int{{0}}

// fill makes call count the members of round it can (see budgetCalls) and returns
// the others.
func (call *budgetCall) fill(round []budgetCount, members []int) (others []int) {
	first := &round[members[0]]
	call.keys = append(make([]string, 0, 3), first.orgCounter, first.monthCounter)
	var limits []int         // of keys[2:]
	var index map[string]int // key counter to its index in keys, once there are many
	minuteTTL, monthTTL, seed := int64(0), int64(0), int64(-1)
	call.members = members // until one goes to others
	call.keyOf = make([]int, 0, len(members))
	for j, i := range members {
		c := &round[i]
		k := 0 // no key budget
		if c.keyCounter != "" {
			k = lookup(call.keys, index, c.keyCounter)
			switch {
			case k == 0:
				call.keys = append(call.keys, c.keyCounter)
				limits = append(limits, c.keyLimit)
				k = len(call.keys)
				if index != nil {
					index[c.keyCounter] = k
				} else if k > 10 {
					index = make(map[string]int, 2*len(members))
					for x, have := range call.keys[2:] {
						index[have] = x + 3
					}
				}
			case limits[k-3] != c.keyLimit:
				if others == nil {
					call.members = append(make([]int, 0, len(members)), members[:j]...)
				}
				others = append(others, i)
				continue
			}
		}
		// Any member's TTLs will do; the longest are safest. One seeded member seeds
		// them all: they count the same month.
		minuteTTL, monthTTL, seed = max(minuteTTL, c.minuteTTL), max(monthTTL, c.monthTTL), max(seed, c.seed)
		if others != nil {
			call.members = append(call.members, i)
		}
		call.keyOf = append(call.keyOf, k)
	}
	call.args = make([]any, 0, 5+len(limits)+2*len(call.members))
	call.args = append(call.args, minuteTTL, monthTTL, seed, first.orgLimit, first.monthLimit)
	for _, limit := range limits {
		call.args = append(call.args, limit)
	}
	for j, i := range call.members {
		call.args = append(call.args, call.keyOf[j], round[i].redisDeadline)
	}
	return others
}

// lookup returns the index in keys (from 1) of counter among the key counters,
// keys[2:], through index if it is not nil; 0 if it is not there.
func lookup(keys []string, index map[string]int, counter string) int {
	if index != nil {
		return index[counter]
	}
	for j, have := range keys[2:] {
		if have == counter {
			return j + 3
		}
	}
	return 0
}

// readBudgets hands the members of one script call their replies, from the script's
// answer v or its error: the counts as they stood before the call, from which stages
// numbers each member in order, as the script did; ErrLate to those the script did
// not count, as it decided (see late).
func readBudgets(round []budgetCount, call *budgetCall, v []int64, err error, replies []budgetReply, clock *redisClock) {
	if err == nil && len(v) >= 2 {
		clock.observe(v[1])
	}
	switch {
	case err != nil:
	case len(v) == 2 && v[0] == -2:
		err = errMonthMissing
	case len(v) != 2+len(call.keys) || v[0] != 0:
		err = fmt.Errorf("unexpected reply %v for %d counts", v, len(call.members))
	}
	if err != nil {
		for _, i := range call.members {
			replies[i].err = err
		}
		return
	}
	now, org, month, keys := v[1], v[2], v[3], v[4:] // keys: of call.keys[2:], advanced below
	var none int64
	for j, i := range call.members {
		c := &round[i]
		if late(c.redisDeadline, now) {
			replies[i].err = ErrLate
			continue
		}
		key := &none
		if k := call.keyOf[j]; k > 0 {
			key = &keys[k-3]
		}
		replies[i].counts = stages(key, &org, &month, c.keyLimit, c.orgLimit, c.monthLimit)
	}
}
