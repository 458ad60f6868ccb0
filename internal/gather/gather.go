// Package gather gathers the calls of concurrent callers into batches, each sent as one
// round trip: keystore.Batcher looks keys up with one query per batch, and limiter's
// pipeline counts with one Redis pipeline per batch. What is sent, and how, is the
// caller's Flush; this package only decides who goes in which batch and when it goes.
//
// Freshness: a call only ever joins a batch that has not been sent yet, and a batch is
// sent as soon as a lane is free (no timer while the backend keeps up). So every answer
// comes from a round trip that started after the call did, and a lone call waits for
// nothing. (A singleflight-style share of the round trip in progress would break this:
// it can hand a call the answer of a round trip that began before it.)
//
// Lanes: with one lane one batch is in flight at a time, with more several, each still
// taking only calls that arrived before it was sent. A batch that has waited MaxWait for
// a lane is sent on a goroutine of its own, so that a slow round trip in flight never
// costs the calls of the next batch more than MaxWait on top of their own round trip.
//
// Inline (Options.Inline): a call that finds a lane free is alone in its batch, and may
// run it on its own goroutine under its own context rather than hand it to a goroutine
// of the Gatherer and wait to be woken: one goroutine hand-off less, the cost that
// matters when traffic is light and batches are of one.
//
// A batch has no size cap: it holds at most one call per concurrent caller.
package gather

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Flush sends one batch of requests as one round trip and returns one response per
// request, in order, or an error that is the answer of every request of the batch.
// Errors of single requests belong in Resp. A batch serves many callers, so Flush
// runs under no caller's context (ctx is context.Background()) and bounds its own
// round trip. It runs on a goroutine of the Gatherer, once per batch, possibly for
// several batches at once (see Options.Lanes); with Options.Inline, a batch of one
// may instead run on its caller's goroutine, and ctx is then that caller's. Flush
// must neither keep reqs nor return it as the responses: its array serves a later
// batch.
type Flush[Req, Resp any] func(ctx context.Context, reqs []Req) ([]Resp, error)

// Options tunes a Gatherer.
type Options struct {
	// Lanes is the number of batches that may be in flight at once, not counting those
	// sent after MaxWait. Default: 1
	Lanes int
	// MaxWait is how long a batch waits for a free lane before it is sent on a
	// goroutine of its own; it should be positive. Default: 0 (at once)
	MaxWait time.Duration
	// Inline runs a call that finds a lane free (it is then alone in its batch) on the
	// caller's goroutine, Flush getting the caller's context, instead of on a
	// goroutine of the Gatherer. Do then returns when Flush does, not when ctx ends:
	// set it only if Flush returns by ctx's deadline. Default: false
	Inline bool
}

// Gatherer runs calls in batches through its Flush. It is safe for concurrent use.
type Gatherer[Req, Resp any] struct {
	flush   Flush[Req, Resp]
	maxWait time.Duration
	inline  bool

	mu      sync.Mutex
	pending *batch[Req, Resp] // the batch taking new calls; guarded by mu
	free    int               // lanes not running a batch; guarded by mu
	spare   []Req             // the requests array of a batch sent, for the next one; guarded by mu
}

// batch is one round trip's worth of calls.
type batch[Req, Resp any] struct {
	reqs  []Req
	timer *time.Timer   // sends the batch on a goroutine of its own after maxWait; nil if sent at once
	done  chan struct{} // closed when resps and err are set

	resps []Resp
	err   error
}

// New returns a Gatherer sending its batches through flush.
func New[Req, Resp any](flush Flush[Req, Resp], opts Options) *Gatherer[Req, Resp] {
	return &Gatherer[Req, Resp]{flush: flush, maxWait: opts.MaxWait, inline: opts.Inline, free: max(opts.Lanes, 1)}
}

// Do adds req to the batch not yet sent and waits for its answer: its response, or the
// error of its whole batch. If ctx ends first, Do returns ctx.Err() at once; the batch
// still runs for its other callers. (With Options.Inline, a call that runs its batch
// of one itself returns what Flush does, when Flush does.)
func (g *Gatherer[Req, Resp]) Do(ctx context.Context, req Req) (Resp, error) {
	if g.inline {
		if resp, err, ran := g.alone(ctx, req); ran {
			return resp, err
		}
	}
	b, i := g.join(req)
	var zero Resp
	select {
	case <-b.done:
	case <-ctx.Done():
		return zero, ctx.Err()
	}
	if b.err != nil {
		return zero, b.err
	}
	return b.resps[i], nil
}

// alone runs req as a batch of its own on the caller's goroutine, under ctx, if a lane
// is free (and so no batch is pending: one is sent as soon as a lane is); ran is false
// if none is. The lane then goes to whatever batch gathered meanwhile.
func (g *Gatherer[Req, Resp]) alone(ctx context.Context, req Req) (resp Resp, err error, ran bool) {
	g.mu.Lock()
	if g.free == 0 {
		g.mu.Unlock()
		return resp, nil, false
	}
	g.free--
	g.mu.Unlock()
	defer g.handOn()
	resps, err := g.flush(ctx, []Req{req})
	if err == nil && len(resps) != 1 {
		err = fmt.Errorf("gather: flush answered %d responses for 1 request", len(resps))
	}
	if err != nil {
		return resp, err, true
	}
	return resps[0], nil, true
}

// handOn gives the lane of a batch sent inline to the batch that gathered meanwhile,
// if any, or frees it.
func (g *Gatherer[Req, Resp]) handOn() {
	g.mu.Lock()
	b := g.pending
	if b == nil {
		g.free++
		g.mu.Unlock()
		return
	}
	g.take(b)
	g.mu.Unlock()
	go g.run(b)
}

// join adds req to the pending batch, starting one if there is none, sends the batch at
// once if a lane is free, and returns the batch and req's index in it.
func (g *Gatherer[Req, Resp]) join(req Req) (*batch[Req, Resp], int) {
	g.mu.Lock()
	b := g.pending
	if b == nil {
		b = &batch[Req, Resp]{reqs: g.spare, done: make(chan struct{})}
		g.pending, g.spare = b, nil
		if g.free == 0 {
			b.timer = time.AfterFunc(g.maxWait, func() { g.overflow(b) })
		}
	}
	i := len(b.reqs)
	b.reqs = append(b.reqs, req)
	if g.free == 0 {
		g.mu.Unlock()
		return b, i
	}
	g.free--
	g.take(b)
	g.mu.Unlock()
	go g.run(b)
	return b, i
}

// take marks b as sent. It must be called with mu held and b == g.pending.
func (g *Gatherer[Req, Resp]) take(b *batch[Req, Resp]) {
	g.pending = nil
	if b.timer != nil {
		b.timer.Stop()
	}
}

// run sends b on a lane, then keeps the lane busy with whatever batch gathered
// meanwhile, and frees it when none has.
func (g *Gatherer[Req, Resp]) run(b *batch[Req, Resp]) {
	for b != nil {
		g.send(b)
		g.mu.Lock()
		b = g.pending
		if b != nil {
			g.take(b)
		} else {
			g.free++
		}
		g.mu.Unlock()
	}
}

// overflow sends b on the timer's goroutine once it has waited maxWait for a lane, if
// it has not gone yet. It takes no lane and sends nothing after b.
func (g *Gatherer[Req, Resp]) overflow(b *batch[Req, Resp]) {
	g.mu.Lock()
	if g.pending != b {
		g.mu.Unlock()
		return
	}
	g.take(b)
	g.mu.Unlock()
	g.send(b)
}

// send flushes b, hands the answers to its callers and keeps b's requests array for a
// later batch: callers only read their response.
func (g *Gatherer[Req, Resp]) send(b *batch[Req, Resp]) {
	reqs := b.reqs
	resps, err := g.flush(context.Background(), reqs)
	if err == nil && len(resps) != len(reqs) {
		err = fmt.Errorf("gather: flush answered %d responses for %d requests", len(resps), len(reqs))
	}
	b.reqs, b.resps, b.err = nil, resps, err
	close(b.done)

	clear(reqs) // let go of what the requests point to
	g.mu.Lock()
	if cap(reqs) > cap(g.spare) {
		g.spare = reqs[:0]
	}
	g.mu.Unlock()
}
