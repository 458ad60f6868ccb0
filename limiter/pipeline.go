package limiter

import (
	"context"
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

// pipeline gathers the counts of concurrent Allow calls into one Redis pipeline, so
// that under load Redis reads and answers many counts per round trip.
//
// A round is sent as soon as no round is in flight, or when one returns, or at the
// latest maxWait after its first count joined (no timer runs while Redis is quick).
// So a caller waits for a slow round in flight at most maxWait before its own round
// goes out, never for the whole of the other round: its own timeout is for its own
// answer. Each count carries its caller's deadline, which the script checks.
type pipeline struct {
	rdb     pipeliner
	timeout time.Duration
	maxWait time.Duration
	clock   *redisClock

	mu       sync.Mutex
	pending  *round // the round taking new counts; guarded by mu
	inFlight int    // rounds sent and not yet answered; guarded by mu
}

// round is one pipeline's worth of counts.
type round struct {
	keys      []string
	ttls      []int64
	deadlines []int64
	counts    []int64
	errs      []error
	latest    time.Time     // the latest deadline of its callers; zero if one has none
	timer     *time.Timer   // sends the round after maxWait; nil if sent at once
	done      chan struct{} // closed when counts and errs are set
}

func newPipeline(rdb pipeliner, timeout time.Duration, clock *redisClock) *pipeline {
	return &pipeline{rdb: rdb, timeout: timeout, maxWait: max(timeout/10, time.Millisecond), clock: clock}
}

// count adds one count of counterKey to the next round and waits for its answer.
func (p *pipeline) count(ctx context.Context, counterKey string, ttl, deadline int64) (int64, error) {
	p.mu.Lock()
	r := p.pending
	if r == nil {
		r = &round{done: make(chan struct{})}
		p.pending = r
		if p.inFlight > 0 {
			r.timer = time.AfterFunc(p.maxWait, func() { p.sendIfPending(r) })
		}
	}
	i := len(r.keys)
	r.keys = append(r.keys, counterKey)
	r.ttls = append(r.ttls, ttl)
	r.deadlines = append(r.deadlines, deadline)
	if d, ok := ctx.Deadline(); !ok || i > 0 && r.latest.IsZero() {
		r.latest = time.Time{}
	} else if i == 0 || d.After(r.latest) {
		r.latest = d
	}
	if p.inFlight == 0 {
		p.take(r)
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

// take marks r as sent. It must be called with mu held and r == p.pending.
func (p *pipeline) take(r *round) {
	p.pending = nil
	p.inFlight++
	if r.timer != nil {
		r.timer.Stop()
	}
}

// sendIfPending sends r when its maxWait has passed and it has not gone yet.
func (p *pipeline) sendIfPending(r *round) {
	p.mu.Lock()
	if p.pending != r {
		p.mu.Unlock()
		return
	}
	p.take(r)
	p.mu.Unlock()
	p.run(r)
}

// run sends r, then whatever round gathered meanwhile, until none is waiting.
func (p *pipeline) run(r *round) {
	for r != nil {
		p.send(r)
		close(r.done)

		p.mu.Lock()
		p.inFlight--
		r = p.pending
		if r != nil {
			p.take(r)
		}
		p.mu.Unlock()
	}
}

// send runs r's counts as EVALSHA in one pipeline; counts refused with NOSCRIPT (after
// a SCRIPT FLUSH or a failover) did not run, and go again as EVAL.
//
// The round runs until the last of its callers gives up (or for timeout if one has no
// deadline): a round serves many callers, so no one caller's context may cut it short.
func (p *pipeline) send(r *round) {
	deadline := r.latest
	if deadline.IsZero() {
		deadline = time.Now().Add(p.timeout)
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
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
			keys := r.keys[i : i+1]
			if attempt == 0 {
				cmds[j] = incrScript.EvalSha(ctx, pipe, keys, r.ttls[i], r.deadlines[i])
			} else {
				cmds[j] = incrScript.Eval(ctx, pipe, keys, r.ttls[i], r.deadlines[i])
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
			r.counts[i], r.errs[i] = n, err
		}
		todo = again
	}
}
