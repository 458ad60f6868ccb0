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
// pipeline adds the script.
//
// A round goes out at once if the one lane is free, or when the lane's round returns.
// At the latest, it goes out on its own maxWait after its first count joined. No timer
// runs while Redis is quick. So a caller waits for a slow round in flight at most
// maxWait, never for the whole of it: its timeout is for its own answer. Each count
// carries its caller's deadline, which the script checks.
type pipeline struct {
	rdb     pipeliner
	timeout time.Duration
	clock   *redisClock
	rounds  *gather.Gatherer[pipelinedCount, countReply]

	calls atomic.Uint64 // script calls sent, for tests through export_test.go
}

// pipelinedCount is one Allow call's count in a round.
type pipelinedCount struct {
	counterKey    string
	ttl           int64 // milliseconds
	redisDeadline int64 // the caller's deadline on Redis's clock, for the script; 0 for none
}

// countReply is the script's answer to one count.
type countReply struct {
	count int64
	err   error
}

func newPipeline(rdb pipeliner, timeout, linger time.Duration, clock *redisClock) *pipeline {
	p := &pipeline{rdb: rdb, timeout: timeout, clock: clock}
	p.rounds = gather.New(p.send, gather.Options{Lanes: 1, MaxWait: max(timeout/10, time.Millisecond), Inline: true, Linger: linger})
	return p
}

// count adds one count of counterKey to the next round and waits for its answer. It
// stops when ctx ends or deadline (zero: none) passes. redisDeadline is deadline on
// Redis's clock.
func (p *pipeline) count(ctx context.Context, deadline time.Time, counterKey string, ttl, redisDeadline int64) (int64, error) {
	c := pipelinedCount{counterKey: counterKey, ttl: ttl, redisDeadline: redisDeadline}
	reply, err := p.rounds.DoBy(ctx, deadline, c)
	if err != nil {
		return 0, err
	}
	return reply.count, reply.err
}

// send is the pipeline's gather.Flush. It runs a round's counts as EVALSHA in one
// pipeline, one script call per counter. The counts of one counter share a call, which
// adds them all at once. They take the numbers it made in the order they joined (see
// incrScript). Each call still touches one key, as Cluster wants. Calls refused with
// NOSCRIPT, after a SCRIPT FLUSH or a failover, did not run: they go again as EVAL.
//
// A round serves many callers, so no one caller's context may cut it short. It runs
// until deadline, when the last of its callers gives up, or for timeout if one has
// none. A count alone in its round runs inline (gather.Options.Inline): on its
// caller's goroutine, under its caller's context. go-redis ends a command at its
// context's deadline. So the caller still gets its answer by then. Both ways run alike
// here, so send ignores the inline flag.
func (p *pipeline) send(ctx context.Context, deadline time.Time, _ bool, round []pipelinedCount) ([]countReply, error) {
	if deadline.IsZero() {
		deadline = time.Now().Add(p.timeout)
	}
	ctx, cancel := bounded(ctx, deadline)
	defer cancel()
	replies := make([]countReply, len(round))
	calls := byCounter(round)
	keys := make([]string, len(calls)) // each call's KEYS is one of these, sliced
	for c := range calls {
		keys[c] = round[calls[c][0]].counterKey
	}
	sent := sendCalls(ctx, p.rdb, incrScript, len(calls), func(c int) ([]string, []any) {
		var ttl int64 // any member's will do; the longest is safest
		args := make([]any, 1, 1+len(calls[c]))
		for _, i := range calls[c] {
			ttl = max(ttl, round[i].ttl)
			args = append(args, round[i].redisDeadline)
		}
		args[0] = ttl
		return keys[c : c+1], args
	}, func(c int, v []int64, err error) {
		p.number(round, calls[c], v, err, replies)
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

// number hands the counts of one script call their replies. members are their
// indices in round, in the order of the call's ARGV. On the script's error, every
// count gets it. Those it did not count get ErrLate. The others get the numbers
// count-n+1 … count, in order.
func (p *pipeline) number(round []pipelinedCount, members []int, v []int64, err error, replies []countReply) {
	if err == nil && len(v) != 2 {
		err = fmt.Errorf("unexpected reply %v", v)
	}
	if err != nil {
		for _, i := range members {
			replies[i].err = err
		}
		return
	}
	count, now := v[0], v[1]
	p.clock.observe(now)
	var live int64
	for _, i := range members {
		if !late(round[i].redisDeadline, now) {
			live++
		}
	}
	if count < 0 && live == 0 || count >= live && live > 0 {
		next := count - live + 1
		for _, i := range members {
			if late(round[i].redisDeadline, now) {
				replies[i].err = ErrLate
			} else {
				replies[i].count = next
				next++
			}
		}
		return
	}
	err = fmt.Errorf("unexpected reply %v for %d counts", v, live)
	for _, i := range members {
		replies[i].err = err
	}
}

// byCounter groups the indices of round by counter key. The groups, and the indices in
// each, keep the order of arrival. A round of one count, the common case under light
// traffic, costs one small allocation.
func byCounter(round []pipelinedCount) [][]int {
	if len(round) == 1 {
		return [][]int{{0}}
	}
	var calls [][]int
	var index map[string]int // counter key to its group, once there are many groups
	for i := range round {
		k, c := round[i].counterKey, -1
		if index != nil {
			if g, ok := index[k]; ok {
				c = g
			}
		} else {
			for g := range calls {
				if round[calls[g][0]].counterKey == k {
					c = g
					break
				}
			}
		}
		if c < 0 {
			c = len(calls)
			calls = append(calls, nil)
			if index != nil {
				index[k] = c
			} else if len(calls) > 8 {
				index = make(map[string]int, len(round))
				for g := range calls[:c] {
					index[round[calls[g][0]].counterKey] = g
				}
				index[k] = c
			}
		}
		calls[c] = append(calls[c], i)
	}
	return calls
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
