package limiter

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/keygate/keygate/internal/gather"
)

// pipeliner is what a client needs for WithPipelining: *redis.Client, *redis.Ring,
// *redis.ClusterClient and redis.UniversalClient all have it.
type pipeliner interface {
	redis.Scripter
	Pipeline() redis.Pipeliner
}

// pipeline gathers the counts of concurrent Allow calls into one Redis pipeline, a
// round. Under load, Redis then reads and answers many counts per round trip. The
// gathering is internal/gather's, and so is its freshness (see its package doc). The
// pipeline adds the script: one call per counter's hash slot in the round, or, on one
// Redis server, one call for all the keys without org budgets (see scriptCalls).
//
// A round goes out at once if the one lane is free, or when the lane's round returns.
// At the latest, it goes out on its own maxWait after its first count joined. No timer
// runs while Redis is quick. So a caller waits for a slow round in flight at most
// maxWait, never for the whole of it: its timeout is for its own answer. Each count
// carries its caller's deadline, which the script checks.
type pipeline struct {
	rdb     pipeliner
	oneNode bool // rdb is one server (or a Sentinel's primary): no hash slots to keep apart
	timeout time.Duration
	clock   *redisClock
	rounds  *gather.Gatherer[count, reply]

	calls atomic.Uint64 // script calls sent, for tests through export_test.go
}

// count is one Allow call's count, in a round or alone.
type count struct {
	// key is the key's id, "" without a window of the key's; keyCounters are its
	// window counters, by span ("" where it has none of that span).
	key          string
	keyCounters  [spans]string
	orgCounter   string // "" without an org budget
	monthCounter string // "" without an org budget
	limits       limits
	cost         int64        // units, at least 1
	ttlMs        [spans]int64 // how long a new counter of each span must live
	monthTTL     int64        // milliseconds
	seed         int64        // what a missing month starts from; -1: count nothing (see countScript)

	redisDeadline int64 // the caller's deadline on Redis's clock; 0 for none
}

// reply is the script's answer to one count.
type reply struct {
	counts stageCounts
	err    error
}

func newPipeline(rdb pipeliner, timeout, linger time.Duration, clock *redisClock) *pipeline {
	_, oneNode := rdb.(*redis.Client) // a Cluster's or a Ring's keys live on several
	p := &pipeline{rdb: rdb, oneNode: oneNode, timeout: timeout, clock: clock}
	p.rounds = gather.New(p.send, gather.Options{Lanes: 1, MaxWait: max(timeout/10, time.Millisecond), Inline: true, Linger: linger})
	return p
}

// send is the pipeline's gather.Flush. It runs a round's counts as script calls in one
// pipeline (see scriptCalls and sendCalls).
//
// A round serves many callers, so no one caller's context may cut it short. It runs
// until deadline, when the last of its callers gives up, or for timeout if one has
// none. A count alone in its round runs inline (gather.Options.Inline): on its
// caller's goroutine, under its caller's context. go-redis ends a command at its
// context's deadline. So the caller still gets its answer by then. Both ways run alike
// here, so send ignores the inline flag.
func (p *pipeline) send(ctx context.Context, deadline time.Time, _ bool, round []count) ([]reply, error) {
	if deadline.IsZero() {
		deadline = time.Now().Add(p.timeout)
	}
	ctx, cancel := bounded(ctx, deadline)
	defer cancel()
	replies := make([]reply, len(round))
	calls := scriptCalls(round, p.oneNode)
	sent := sendCalls(ctx, p.rdb, countScript, len(calls), func(c int) ([]string, []any) {
		return calls[c].keys, calls[c].args
	}, func(c int, v []int64, err error) {
		readReplies(round, &calls[c], v, err, replies, p.clock)
	})
	p.calls.Add(uint64(sent))
	return replies, nil
}

// sendCalls sends n calls of script in one pipeline, or as a plain command if n is 1:
// a pipeline of one costs allocations and bookkeeping for nothing. call(c) gives call
// c's KEYS and ARGV; read(c, …) gets its answer, once. Calls refused with NOSCRIPT,
// after a SCRIPT FLUSH or a failover, did not run: they go once more, as EVAL. It
// returns how many calls it sent, those sent twice counted twice. ctx bounds it all.
func sendCalls(ctx context.Context, rdb pipeliner, script *redis.Script, n int,
	call func(c int) (keys []string, args []any), read func(c int, v []int64, err error)) (sent int) {
	todo := make([]int, n)
	for c := range todo {
		todo[c] = c
	}
	for attempt := 0; attempt < 2 && len(todo) > 0; attempt++ {
		var pipe redis.Pipeliner
		var run redis.Scripter = rdb
		if len(todo) > 1 {
			pipe = rdb.Pipeline()
			run = pipe
		}
		cmds := make([]*redis.Cmd, len(todo))
		for j, c := range todo {
			keys, args := call(c)
			if attempt == 0 {
				cmds[j] = script.EvalSha(ctx, run, keys, args...)
			} else {
				cmds[j] = script.Eval(ctx, run, keys, args...)
			}
		}
		sent += len(todo)
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
			read(c, v, err)
		}
		todo = again
	}
	return sent
}

// scriptCall is one call of countScript: its KEYS and ARGV, its members (indices of a
// round, in the order of ARGV), for each member the index of its key among the call's,
// from 1 as Lua counts (0: no key budget), for each of the call's keys the member that
// brought it (whose counters and limits are the key's in the call), and how many key
// counters KEYS starts with.
type scriptCall struct {
	keys     []string
	args     []any
	members  []int
	keyOf    []int
	keyFirst []int
	nKeys    int
}

// scriptCalls splits round into script calls, one per hash slot: the counts of a key
// without org budgets by its counters, the others by org counter, month counter and
// org limits (an org's plan changed mid-round goes as two), the groups and their
// members in the order of arrival. On oneNode, a Redis without hash slots, the counts
// of every key without org budgets go in one group: a round of many keys costs Redis
// one call rather than one per key. A call holds each key once, with its limits and
// counters: a count of a key already in its call with other limits or counters (the
// key's limits changed mid-round, or a second ended) goes in a call of its own, so
// that no counter is in a call twice.
func scriptCalls(round []count, oneNode bool) []scriptCall {
	var groups [][]int
	if len(round) == 1 {
		groups = oneCount
	} else {
		type group struct {
			slot, month string // the org's counters; a key's own counters and "" without
			orgLimit    int
			monthLimit  int64
		}
		index := make(map[group]int)
		for i := range round {
			c := &round[i]
			k := group{c.orgCounter, c.monthCounter, c.limits.org, c.limits.month}
			if c.orgCounter == "" && !oneNode {
				k.slot = c.key
			}
			g, ok := index[k]
			if !ok {
				g = len(groups)
				index[k] = g
				groups = append(groups, nil)
			}
			groups[g] = append(groups[g], i)
		}
	}
	calls := make([]scriptCall, 0, len(groups))
	for _, members := range groups {
		for len(members) > 0 {
			var call scriptCall
			members = call.fill(round, members)
			calls = append(calls, call)
		}
	}
	return calls
}

// oneCount is the groups of a round of one count; read only.
var oneCount = [][]int{{0}}

// fill makes call count the members of round it can (see scriptCalls) and returns
// the others.
func (call *scriptCall) fill(round []count, members []int) (others []int) {
	first := &round[members[0]]
	call.keys = make([]string, 0, 3)
	var index map[string]int // key to its index among the call's keys, once there are many
	var ttlMs [spans]int64   // the longest of each span's; any member's will do
	monthTTL, seed := int64(0), int64(-1)
	call.members = members // until one goes to others
	call.keyOf = make([]int, 0, len(members))
	for j, i := range members {
		c := &round[i]
		k := 0 // no key budget
		if c.key != "" {
			k = call.lookup(round, index, c.key)
			switch {
			case k == 0:
				call.keyFirst = append(call.keyFirst, i)
				k = len(call.keyFirst)
				for _, counter := range c.keyCounters {
					if counter != "" {
						call.keys = append(call.keys, counter)
					}
				}
				if index != nil {
					index[c.key] = k
				} else if k > 10 {
					index = make(map[string]int, 2*len(members))
					for x, have := range call.keyFirst {
						index[round[have].key] = x + 1
					}
				}
			case round[call.keyFirst[k-1]].limits.key != c.limits.key || round[call.keyFirst[k-1]].keyCounters != c.keyCounters:
				if others == nil {
					call.members = append(make([]int, 0, len(members)), members[:j]...)
				}
				others = append(others, i)
				continue
			}
		}
		// The longest TTLs are safest. One seeded member seeds them all: they count
		// the same month.
		for s := range ttlMs {
			ttlMs[s] = max(ttlMs[s], c.ttlMs[s])
		}
		monthTTL, seed = max(monthTTL, c.monthTTL), max(seed, c.seed)
		if others != nil {
			call.members = append(call.members, i)
		}
		call.keyOf = append(call.keyOf, k)
	}
	call.nKeys = len(call.keys)
	if first.orgCounter != "" {
		call.keys = append(call.keys, first.orgCounter, first.monthCounter)
	}
	call.args = make([]any, 0, 9+2*len(call.keyFirst)+3*len(call.members))
	call.args = append(call.args, ttlMs[Minute], monthTTL, seed, first.limits.org, first.limits.month,
		ttlMs[Second], ttlMs[Hour], ttlMs[Day], len(call.keyFirst))
	for _, i := range call.keyFirst {
		c := &round[i]
		call.args = append(call.args, c.spanBits())
		for s, counter := range c.keyCounters {
			if counter != "" {
				call.args = append(call.args, c.limits.key[s])
			}
		}
	}
	for j, i := range call.members {
		call.args = append(call.args, call.keyOf[j], round[i].redisDeadline, round[i].cost)
	}
	return others
}

// spanBits returns the spans of c's key counters, as countScript's ARGV gives them: a
// sum of 1 (minute), 2 (second), 4 (hour) and 8 (day).
func (c *count) spanBits() uint8 {
	var bits uint8
	for s, counter := range c.keyCounters {
		if counter != "" {
			bits |= 1 << s
		}
	}
	return bits
}

// lookup returns the index among call's keys (from 1) of key, through index if it is
// not nil; 0 if it is not there.
func (call *scriptCall) lookup(round []count, index map[string]int, key string) int {
	if index != nil {
		return index[key]
	}
	for j, have := range call.keyFirst {
		if round[have].key == key {
			return j + 1
		}
	}
	return 0
}

// readReplies hands the members of one script call their replies, from the script's
// answer v or its error: the counts as they stood before the call, from which stages
// numbers each member in order, as the script did; ErrLate to those the script did
// not count, as it decided (see late).
func readReplies(round []count, call *scriptCall, v []int64, err error, replies []reply, clock *redisClock) {
	if err == nil && len(v) >= 2 {
		clock.observe(v[1])
	}
	switch {
	case err != nil:
	case len(v) == 2 && v[0] == -2:
		err = errMonthMissing
	case len(v) != 4+call.nKeys || v[0] != 0:
		err = fmt.Errorf("unexpected reply %v for %d counts", v, len(call.members))
	}
	if err != nil {
		for _, i := range call.members {
			replies[i].err = err
		}
		return
	}
	now, org, month := v[1], v[2], v[3]
	// The counts of each of the call's keys, by span, advanced below: on the stack for
	// the few keys of most calls.
	var few [8][spans]int64
	keys := few[:0]
	if len(call.keyFirst) > len(few) {
		keys = make([][spans]int64, 0, len(call.keyFirst))
	}
	keys = keys[:len(call.keyFirst)]
	at := 4
	for k, i := range call.keyFirst {
		for s, counter := range round[i].keyCounters {
			if counter != "" {
				keys[k][s] = v[at]
				at++
			}
		}
	}
	var none [spans]int64
	for j, i := range call.members {
		c := &round[i]
		if late(c.redisDeadline, now) {
			replies[i].err = ErrLate
			continue
		}
		key := &none
		if k := call.keyOf[j]; k > 0 {
			key = &keys[k-1]
		}
		replies[i].counts = stages(key, &org, &month, &c.limits, c.cost)
	}
}

// bounded returns ctx ending by deadline (zero: none), and its cancel. It returns ctx
// itself if ctx ends by then anyway, so no context is made for nothing. A round sent
// inline runs under its caller's context, whose deadline may be the round's.
func bounded(ctx context.Context, deadline time.Time) (context.Context, context.CancelFunc) {
	if d, ok := ctx.Deadline(); deadline.IsZero() || ok && !d.After(deadline) {
		return ctx, func() {}
	}
	return context.WithDeadline(ctx, deadline)
}
