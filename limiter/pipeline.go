package limiter

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// pipeliner is what a client needs for WithPipelining: *redis.Client, *redis.Ring,
// *redis.ClusterClient and redis.UniversalClient all have it.
type pipeliner interface {
	redis.Scripter
	Pipeline() redis.Pipeliner
}

// pipeline gathers the counts of concurrent Allow calls into one Redis pipeline, sent
// as soon as the previous one has returned (no timer), so that under load Redis reads
// and answers many counts per round trip.
type pipeline struct {
	rdb     pipeliner
	timeout time.Duration

	mu      sync.Mutex
	pending *round // the round taking new counts; guarded by mu
	busy    bool   // a round is in flight; guarded by mu
}

// round is one pipeline's worth of counts.
type round struct {
	keys    []string
	expires []int64
	counts  []int64
	errs    []error
	done    chan struct{} // closed when counts and errs are set
}

// count adds one INCR of counterKey to the next round and waits for its answer.
func (p *pipeline) count(ctx context.Context, counterKey string, expireAt int64) (int64, error) {
	p.mu.Lock()
	r := p.pending
	if r == nil {
		r = &round{done: make(chan struct{})}
		p.pending = r
	}
	i := len(r.keys)
	r.keys = append(r.keys, counterKey)
	r.expires = append(r.expires, expireAt)
	if !p.busy {
		p.busy = true
		p.pending = nil
		p.mu.Unlock()
		go p.run(r)
	} else {
		p.mu.Unlock()
	}

	select {
	case <-r.done:
		return r.counts[i], r.errs[i]
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// run sends r, then whatever round gathered meanwhile, until none is waiting.
func (p *pipeline) run(r *round) {
	for r != nil {
		p.send(r)
		close(r.done)

		p.mu.Lock()
		r = p.pending
		p.pending = nil
		if r == nil {
			p.busy = false
		}
		p.mu.Unlock()
	}
}

// send runs r's counts as EVALSHA in one pipeline; counts refused with NOSCRIPT (after
// a SCRIPT FLUSH or a failover) did not run, and go again as EVAL.
func (p *pipeline) send(r *round) {
	ctx, cancel := context.WithTimeout(context.Background(), p.timeout)
	defer cancel()
	n := len(r.keys)
	r.counts, r.errs = make([]int64, n), make([]error, n)

	todo := make([]int, n)
	for i := range todo {
		todo[i] = i
	}
	for attempt := 0; attempt < 2 && len(todo) > 0; attempt++ {
		pipe := p.rdb.Pipeline()
		cmds := make([]*redis.Cmd, len(todo))
		for j, i := range todo {
			keys, exp := r.keys[i:i+1], r.expires[i]
			if attempt == 0 {
				cmds[j] = incrScript.EvalSha(ctx, pipe, keys, exp)
			} else {
				cmds[j] = incrScript.Eval(ctx, pipe, keys, exp)
			}
		}
		pipe.Exec(ctx) // errors are read per command below
		var again []int
		for j, i := range todo {
			n, err := cmds[j].Int64()
			if err != nil && attempt == 0 && redis.HasErrorPrefix(err, "NOSCRIPT") {
				again = append(again, i)
				continue
			}
			if err != nil {
				err = fmt.Errorf("counting in redis: %w", err)
			}
			r.counts[i], r.errs[i] = n, err
		}
		todo = again
	}
}
