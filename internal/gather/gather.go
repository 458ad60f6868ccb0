// Package gather batches the calls of concurrent callers: each batch is sent as one
// round trip. keystore.Batcher looks keys up with one query a batch. The limiter's
// pipeline counts with one Redis pipeline a batch. The caller's Flush sends a batch.
// This package only decides which calls go in which batch, and when it goes.
//
// # Freshness
//
// A call only joins a batch not yet sent. So its answer comes from a round trip that
// started after the call did. keystore relies on it: a key revoked before a request
// starts is refused on that request. Sharing the round trip in flight,
// singleflight-style, would break it: a call could get the answer of a round trip
// older than itself.
//
// # Sending
//
// A batch goes out as soon as a lane is free. No timer runs while the backend keeps
// up, so a lone call waits for nothing. With Options.Lanes, several batches may be in
// flight at once. A batch that has waited MaxWait for a lane goes out on a goroutine of
// its own. So a slow round trip in flight costs the next batch at most MaxWait.
//
// "As soon as a lane is free" is after one runtime.Gosched. The goroutine that is to
// send the batch calls it first: the call that finds the lane free, or the lane's
// worker. The goroutines ready to run then run, and those about to call Do join the
// batch. They are the callers one round trip answered at once, or one netpoll woke,
// and the callers just answered, coming back in a closed loop. Without the Gosched the
// first of them goes alone, and the others wait for its round trip
// (docs/performance.md). With nothing else ready to run, Gosched returns at once.
//
// A lane's batches run on a worker goroutine (see dispatch). With Options.Inline, a
// call still alone in its batch after the Gosched runs it on its own goroutine. That
// saves a goroutine hand-off, the cost that matters under light traffic.
//
// With Options.Linger, a batch may wait for more calls while a lane is free. linger.go
// holds that policy.
//
// # Deadlines
//
// A call waits until its deadline (DoBy), or its context's (Do), and no longer. Its
// batch goes on for the others. Flush gets the latest deadline of the batch's calls
// (deadline.go).
//
// A batch has no size cap: it holds at most one call per concurrent caller.
package gather

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"time"
)

// Flush sends one batch of requests as one round trip. It returns one response per
// request, in order, or an error that answers every request of the batch. Errors of
// single requests belong in Resp.
//
// A batch serves many callers, so Flush runs under none of their contexts: ctx is
// context.Background() and inline is false. Flush bounds its own round trip by
// deadline: the latest deadline of the batch's calls, past which none of them waits.
// It is zero if one of them has none. With Options.Inline, a batch of one may run on
// its caller's goroutine instead. inline is then true, and ctx is the caller's.
// deadline is still the call's, which ctx may not carry.
//
// Flush runs once per batch, on a goroutine of the Gatherer, possibly for several
// batches at once (Options.Lanes). It must neither keep reqs nor return it as the
// responses: its array serves a later batch.
type Flush[Req, Resp any] func(ctx context.Context, deadline time.Time, inline bool, reqs []Req) ([]Resp, error)

// Options tunes a Gatherer.
type Options struct {
	// Lanes is the number of batches that may be in flight at once. Batches sent
	// after MaxWait do not count. Default: 1
	Lanes int
	// MaxWait is how long a batch waits for a free lane. It then goes out on a
	// goroutine of its own. It should be positive. Default: 0 (at once)
	MaxWait time.Duration
	// Inline runs a batch of one on its caller's goroutine, under the caller's
	// context (see Flush). Do then returns when Flush does, not when ctx ends. Set
	// it only if Flush returns by the deadline it gets. Default: false
	Inline bool
	// Linger is how long a batch may wait for more calls after its first, while
	// calls come fast (see lingerPolicy). It adds up to Linger to a call's wait.
	// Default: 0 (never wait)
	Linger time.Duration
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
	opened  *batch[Req, Resp] // a batch opened that no call joined, for the next open; guarded by mu
	linger  lingerPolicy      // guarded by mu

	work chan *batch[Req, Resp] // hands a batch to an idle worker (see dispatch)
	idle time.Duration          // workerIdle; tests set another through export_test.go
}

// batch is one round trip's worth of calls.
type batch[Req, Resp any] struct {
	reqs    []Req
	by      time.Time     // the latest deadline of its calls with one
	unbound bool          // one of its calls has no deadline
	timer   *time.Timer   // runs fire: after MaxWait with no lane free, or when due if lingering
	opening bool          // its first caller holds a lane for it, and calls Gosched before sending it (see open)
	linger  lingering     // written under mu while pending
	done    chan struct{} // closed when resps and err are set

	resps []Resp
	err   error
}

// New returns a Gatherer sending its batches through flush.
func New[Req, Resp any](flush Flush[Req, Resp], opts Options) *Gatherer[Req, Resp] {
	return &Gatherer[Req, Resp]{
		flush: flush, maxWait: opts.MaxWait, inline: opts.Inline, free: max(opts.Lanes, 1),
		linger: newLingerPolicy(opts.Linger), work: make(chan *batch[Req, Resp]), idle: workerIdle,
	}
}

// Do is DoBy with ctx's deadline, if it has one.
func (g *Gatherer[Req, Resp]) Do(ctx context.Context, req Req) (Resp, error) {
	deadline, _ := ctx.Deadline()
	return g.DoBy(ctx, deadline, req)
}

// DoBy adds req to the batch not yet sent and waits for its answer: its response, or
// the error of its whole batch. If ctx ends first, DoBy returns ctx.Err() at once. At
// deadline (zero: none) it returns context.DeadlineExceeded. The batch still runs for
// its other callers. A call that runs its batch of one inline returns what Flush does,
// when Flush does.
//
// A deadline costs a pooled timer while the call waits. A context of its own
// (context.WithTimeout) would cost four allocations, a timer and a registration with
// ctx. So a caller that bounds each call by a timeout passes it here (see Deadline),
// not in ctx.
func (g *Gatherer[Req, Resp]) DoBy(ctx context.Context, deadline time.Time, req Req) (Resp, error) {
	g.mu.Lock()
	now, fast := g.linger.arrive()
	linger := fast && g.pending == nil && g.linger.pays()
	if !linger && g.free > 0 && g.pending == nil {
		return g.open(ctx, deadline, req)
	}
	b, i := g.join(req, deadline, now, linger)
	return g.wait(ctx, deadline, b, i)
}

// open starts a batch with req on a free lane, which it takes. It sends the batch after
// a runtime.Gosched, so that the callers ready to run join it (see the package doc). A
// batch still of one runs inline (Options.Inline), a larger one on a worker. open must
// be called with mu held, and unlocks it.
func (g *Gatherer[Req, Resp]) open(ctx context.Context, deadline time.Time, req Req) (Resp, error) {
	g.free--
	b := g.opened
	if b == nil {
		b = &batch[Req, Resp]{done: make(chan struct{})}
	}
	g.opened = nil
	b.reqs, g.spare = append(g.spare, req), nil
	b.by, b.unbound = time.Time{}, false
	b.bound(deadline)
	b.opening = true
	g.pending = b
	g.mu.Unlock()

	runtime.Gosched()

	g.mu.Lock()
	b.opening = false
	g.take(b) // nothing else takes an opening batch
	if len(b.reqs) == 1 && g.inline {
		// No one joined, so no one else knows b: keep it for the next open.
		reqs := b.reqs
		b.reqs = nil
		g.opened = b
		g.mu.Unlock()
		return g.alone(ctx, deadline, reqs)
	}
	g.mu.Unlock()
	g.dispatch(b)
	return g.wait(ctx, deadline, b, 0)
}

// alone runs reqs, one call's request, as a batch on the caller's goroutine. It runs
// under ctx and by deadline, on a lane the caller has taken. The lane then goes to the
// batch gathered meanwhile, if any, and reqs's array to a later batch.
func (g *Gatherer[Req, Resp]) alone(ctx context.Context, deadline time.Time, reqs []Req) (Resp, error) {
	defer g.handOn(reqs)
	var zero Resp
	resps, err := g.flush(ctx, deadline, true, reqs)
	if err == nil && len(resps) != 1 {
		err = fmt.Errorf("gather: flush answered %d responses for 1 request", len(resps))
	}
	if err != nil {
		return zero, err
	}
	return resps[0], nil
}

// handOn keeps the requests array of a batch sent inline for a later batch. It gives
// the lane to a worker for the batch gathered meanwhile, or frees it. The worker takes
// the batch when it runs, not now. So the callers that run before it still join,
// this one among them, on its way back with its answer.
func (g *Gatherer[Req, Resp]) handOn(reqs []Req) {
	clear(reqs)
	g.mu.Lock()
	g.keepSpare(reqs)
	kept := g.keepLane()
	g.mu.Unlock()
	if kept {
		g.dispatch(nil)
	}
}

// join adds req, arrived at now with deadline, to the pending batch. It starts one if
// there is none, lingering if linger. It sends the batch at once if a lane is free and
// the batch does not wait to linger. It returns the batch and req's index in it. join
// must be called with mu held, and unlocks it.
func (g *Gatherer[Req, Resp]) join(req Req, deadline, now time.Time, linger bool) (*batch[Req, Resp], int) {
	b := g.pending
	if b == nil {
		b = &batch[Req, Resp]{reqs: g.spare, done: make(chan struct{})}
		g.pending, g.spare = b, nil
		switch {
		case linger:
			g.linger.start(&b.linger, now)
			b.timer = time.AfterFunc(g.linger.due(&b.linger).Sub(now), func() { g.fire(b) })
		case g.free == 0:
			b.timer = time.AfterFunc(g.maxWait, func() { g.fire(b) })
		}
	}
	if b.linger.on {
		b.linger.latest = now
	}
	i := len(b.reqs)
	b.reqs = append(b.reqs, req)
	b.bound(deadline)
	if g.free == 0 || b.opening || b.linger.on && !g.linger.full(&b.linger, len(b.reqs)) {
		g.mu.Unlock()
		return b, i
	}
	g.free--
	g.take(b)
	g.mu.Unlock()
	g.dispatch(b)
	return b, i
}

// take marks b as sent, and counts what it gathered into the linger policy. It must be
// called with mu held and b == g.pending.
func (g *Gatherer[Req, Resp]) take(b *batch[Req, Resp]) {
	g.pending = nil
	if b.timer != nil {
		b.timer.Stop()
	}
	g.linger.sent(&b.linger, len(b.reqs))
}

// ready tells whether b may take a lane now: it is neither opening nor waiting to
// linger. It must be called with mu held.
func (g *Gatherer[Req, Resp]) ready(b *batch[Req, Resp]) bool {
	return !b.opening && !g.linger.waits(&b.linger, len(b.reqs))
}

// dispatch runs b on a lane (see run) on a worker goroutine; a nil b is the batch
// pending when the worker runs. The worker is an idle one if there is one, else a new
// one. A worker waits workerIdle for another batch before it ends. So under load a
// batch does not run on a fresh goroutine, whose stack the client library grows anew
// (docs/performance.md).
func (g *Gatherer[Req, Resp]) dispatch(b *batch[Req, Resp]) {
	select {
	case g.work <- b:
	default:
		go g.worker(b)
	}
}

// workerIdle is how long a worker goroutine waits for another batch before it ends.
const workerIdle = time.Second

func (g *Gatherer[Req, Resp]) worker(b *batch[Req, Resp]) {
	idle := time.NewTimer(g.idle)
	defer idle.Stop()
	for {
		g.run(b)
		idle.Reset(g.idle)
		select {
		case b = <-g.work:
		case <-idle.C:
			return
		}
	}
}

// run sends b on a lane; a nil b is the batch pending. After each round trip and a
// Gosched (see the package doc), it sends the batch gathered meanwhile. It frees the
// lane when none has.
func (g *Gatherer[Req, Resp]) run(b *batch[Req, Resp]) {
	if b == nil {
		b = g.next()
	}
	for b != nil {
		g.send(b)
		runtime.Gosched()
		b = g.next()
	}
}

// next takes the pending batch for a lane that has come free, or frees the lane (see
// keepLane).
func (g *Gatherer[Req, Resp]) next() *batch[Req, Resp] {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.keepLane() {
		return nil
	}
	b := g.pending
	g.take(b)
	return b
}

// keepLane tells whether a lane that has come free has a batch to take, and frees it
// if not. A lingering batch not yet due leaves the lane free: it goes when its timer
// says. keepLane must be called with mu held.
func (g *Gatherer[Req, Resp]) keepLane() bool {
	if b := g.pending; b != nil && g.ready(b) {
		return true
	}
	g.free++
	return false
}

// fire runs on b's timer. A batch that waited MaxWait for a lane is sent on the timer's
// goroutine. It takes no lane, and nothing is sent after it there. A lingering batch
// not yet due waits on. One due takes a free lane. With none free, it waits for one as
// any batch does, at most MaxWait more.
func (g *Gatherer[Req, Resp]) fire(b *batch[Req, Resp]) {
	g.mu.Lock()
	if g.pending != b {
		g.mu.Unlock()
		return
	}
	if b.linger.on {
		now := g.linger.now()
		if due := g.linger.due(&b.linger); now.Before(due) && !g.linger.full(&b.linger, len(b.reqs)) {
			b.timer.Reset(due.Sub(now))
			g.mu.Unlock()
			return
		}
		if g.free == 0 {
			b.linger.on = false
			b.timer.Reset(g.maxWait)
			g.mu.Unlock()
			return
		}
		g.free--
		g.take(b)
		g.mu.Unlock()
		g.dispatch(b)
		return
	}
	g.take(b)
	g.mu.Unlock()
	g.send(b)
}

// send flushes b and hands the answers to its callers. It keeps b's requests array for
// a later batch: callers only read their response. A batch that lingered stops being
// the one out full (lingerPolicy.fullOut) before its callers wake. So none of them,
// calling again, counts as a call from elsewhere. The others wake first.
func (g *Gatherer[Req, Resp]) send(b *batch[Req, Resp]) {
	reqs := b.reqs
	resps, err := g.flush(context.Background(), b.deadline(), false, reqs)
	if err == nil && len(resps) != len(reqs) {
		err = fmt.Errorf("gather: flush answered %d responses for %d requests", len(resps), len(reqs))
	}
	b.reqs, b.resps, b.err = nil, resps, err
	lingered := b.linger.lingered() // set before b was sent, and not since
	if !lingered {
		close(b.done)
	}

	clear(reqs) // let go of what the requests point to
	g.mu.Lock()
	g.keepSpare(reqs)
	g.linger.answered(&b.linger)
	g.mu.Unlock()
	if lingered {
		close(b.done)
	}
}

// keepSpare keeps reqs, a batch's requests array, for a later batch, unless the one
// kept is larger. It must be called with mu held.
func (g *Gatherer[Req, Resp]) keepSpare(reqs []Req) {
	if cap(reqs) > cap(g.spare) {
		g.spare = reqs[:0]
	}
}
