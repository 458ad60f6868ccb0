package limiter

import (
	"context"
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

// pipeline gathers the counts of concurrent Allow calls into one Redis pipeline, so
// that under load Redis reads and answers many counts per round trip.
//
// A round is sent at once on the one lane if it is free, or when the lane's round
// returns, or at the latest maxWait after its first count joined, on its own (no timer
// runs while Redis is quick). So a caller waits for a slow round in flight at most
// maxWait before its own round goes out, never for the whole of the other round: its
// own timeout is for its own answer. Each count carries its caller's deadline, which the script checks. (The
// gathering is internal/gather's; the pipeline adds the script.)
type pipeline struct {
	rdb     pipeliner
	timeout time.Duration
	clock   *redisClock
	rounds  *gather.Gatherer[pipelinedCount, countReply]
}

// pipelinedCount is one Allow call's count in a round.
type pipelinedCount struct {
	counterKey     string
	ttl            int64 // milliseconds
	redisDeadline  int64 // the caller's deadline on Redis's clock, for the script; 0 for none
	callerDeadline int64 // the caller's deadline on our clock in Unix nanoseconds; 0 for none
}

// countReply is the script's answer to one count.
type countReply struct {
	count int64
	err   error
}

func newPipeline(rdb pipeliner, timeout time.Duration, clock *redisClock) *pipeline {
	p := &pipeline{rdb: rdb, timeout: timeout, clock: clock}
	p.rounds = gather.New(p.send, gather.Options{Lanes: 1, MaxWait: max(timeout/10, time.Millisecond)})
	return p
}

// count adds one count of counterKey to the next round and waits for its answer.
func (p *pipeline) count(ctx context.Context, counterKey string, ttl, deadline int64) (int64, error) {
	c := pipelinedCount{counterKey: counterKey, ttl: ttl, redisDeadline: deadline}
	if d, ok := ctx.Deadline(); ok {
		c.callerDeadline = d.UnixNano()
	}
	reply, err := p.rounds.Do(ctx, c)
	if err != nil {
		return 0, err
	}
	return reply.count, reply.err
}

// send is the pipeline's gather.Flush: it runs a round's counts as EVALSHA in one
// pipeline; counts refused with NOSCRIPT (after a SCRIPT FLUSH or a failover) did not
// run, and go again as EVAL.
//
// The round runs until the last of its callers gives up (or for timeout if one has no
// deadline): a round serves many callers, so no one caller's context may cut it short.
func (p *pipeline) send(round []pipelinedCount) ([]countReply, error) {
	ctx, cancel := context.WithDeadline(context.Background(), p.roundDeadline(round))
	defer cancel()
	replies := make([]countReply, len(round))
	counterKeys := make([]string, len(round)) // each count's KEYS is one of these, sliced
	todo := make([]int, len(round))
	for i := range round {
		counterKeys[i], todo[i] = round[i].counterKey, i
	}
	for attempt := 0; attempt < 2 && len(todo) > 0; attempt++ {
		pipe := p.rdb.Pipeline()
		cmds := make([]*redis.Cmd, len(todo))
		for j, i := range todo {
			c, keys := &round[i], counterKeys[i:i+1]
			if attempt == 0 {
				cmds[j] = incrScript.EvalSha(ctx, pipe, keys, c.ttl, c.redisDeadline)
			} else {
				cmds[j] = incrScript.Eval(ctx, pipe, keys, c.ttl, c.redisDeadline)
			}
		}
		pipe.Exec(ctx) // errors are read per command below
		var again []int
		for j, i := range todo {
			v, err := cmds[j].Int64Slice()
			if err != nil && attempt == 0 && redis.HasErrorPrefix(err, "NOSCRIPT") {
				again = append(again, i)
				continue
			}
			var n int64
			if err == nil {
				n, err = p.clock.reply(v)
			}
			replies[i] = countReply{count: n, err: err}
		}
		todo = again
	}
	return replies, nil
}

// roundDeadline is the latest deadline of round's callers, or timeout from now if one
// of them has none.
func (p *pipeline) roundDeadline(round []pipelinedCount) time.Time {
	var latest int64
	for _, c := range round {
		if c.callerDeadline == 0 {
			return time.Now().Add(p.timeout)
		}
		latest = max(latest, c.callerDeadline)
	}
	return time.Unix(0, latest)
}
