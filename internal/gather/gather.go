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
// Ready callers: "as soon as a lane is free" is after one runtime.Gosched of the
// goroutine that is to send the batch: the call that finds the lane free, or the worker
// whose round just returned (or that an inline call handed its lane on to, which takes
// the batch only when it runs). The goroutines ready to run then run first, and those
// of them about to call Do join the batch: the callers one round trip answered at once
// (a key lookup's, on their way to the count) or one netpoll woke, and the callers just
// answered, on their way back in a closed loop. Without the Gosched the first of them
// goes alone and the others wait for its round trip (docs/performance.md: measured).
// With nothing else ready to run, Gosched returns at once.
//
// Lanes: with one lane one batch is in flight at a time, with more several, each still
// taking only calls that arrived before it was sent. A batch that has waited MaxWait for
// a lane is sent on a goroutine of its own, so that a slow round trip in flight never
// costs the calls of the next batch more than MaxWait on top of their own round trip.
// A lane's batches run on a worker goroutine that waits a second for the next batch
// before it ends, rather than each on a new goroutine (see dispatch).
//
// Inline (Options.Inline): a call that finds a lane free, and is still alone in its
// batch after the Gosched, may run it on its own goroutine under its own context rather
// than hand it to a goroutine of the Gatherer and wait to be woken: one goroutine
// hand-off less, the cost that matters when traffic is light and batches are of one.
//
// Linger (Options.Linger): by default a batch goes out the moment a lane is free (after
// the Gosched above), so on a busy machine whose round trips are quick batches hold the
// few calls that arrived during one, and every call pays a good share of a round trip.
// With Linger, a batch started while calls come fast (the moving average of the time
// between calls, the gap, at most Linger/4) lingers, as with Kafka's linger.ms: even
// with a lane free it goes out only once calls pause (no call for twice the gap, and
// for at least Linger/8) or once Linger has passed since its first call, whichever
// comes first. Under a closed loop of clients
// (each sends its next request when it has its answer) the pause comes when every
// client is waiting, so the batch takes them all. When calls slow down, batches go out
// at once again. And a rate is not enough: a few clients in a closed loop can send fast
// and yet have nobody left to send while a batch waits. So the Gatherer keeps a moving
// average of the calls its lingering batches gathered; while it is under three, batches
// go out at once, and after every 64 of them one lingers, to find out whether lingering
// pays again. Nor does a lingering batch wait for calls that cannot come: the Gatherer
// keeps the most calls its lingering batches gathered of late (the peak), and a batch
// holding that many goes out without waiting for the pause. Under a closed loop of a
// few clients, the batch that holds them all goes as soon as the last has joined, not
// a pause later. The peak follows a larger batch at once, and grows by one when a call
// comes while a batch that went out full is still out (none of its callers could:
// there were more to wait for); it falls, by a quarter at most, at a probe, a lingering
// batch that waits for the pause whatever it holds: the first, the one that finds out
// whether lingering pays again, and every 16th.
// A lingering batch still takes only calls that arrive before it is sent, so the
// freshness above holds; a call may wait up to Linger longer.
//
// Deadlines: a call waits until its deadline (DoBy), or its context's (Do), and no
// longer; its batch goes on for the others, and Flush gets the latest deadline of the
// batch's calls, past which none of them waits for it.
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

// Flush sends one batch of requests as one round trip and returns one response per
// request, in order, or an error that is the answer of every request of the batch.
// Errors of single requests belong in Resp. A batch serves many callers, so Flush
// runs under no caller's context (ctx is context.Background()) and bounds its own
// round trip: deadline is the latest of its callers' deadlines (see DoBy), past which
// none of them waits for it, or zero if one of them has none. It runs on a goroutine
// of the Gatherer, once per batch, possibly for several batches at once (see
// Options.Lanes); with Options.Inline, a batch of one may instead run on its caller's
// goroutine, and ctx is then that caller's (deadline still the call's, which ctx may
// not carry). Flush must neither keep reqs nor return it as the responses: its array
// serves a later batch.
type Flush[Req, Resp any] func(ctx context.Context, deadline time.Time, reqs []Req) ([]Resp, error)

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
	// set it only if Flush returns by the deadline it is given. Default: false
	Inline bool
	// Linger is how long a batch may wait for more calls after its first, while calls
	// come at least four a Linger; it goes out sooner when they pause (see the package
	// documentation). It adds up to Linger to a call's wait. Default: 0 (never wait)
	Linger time.Duration
}

// lingerCalls is how many calls one Linger must bring, at the recent rate, for a batch
// to linger; a lingering batch must gather minYield calls on average for the next to
// linger, and while they do not, one batch in yieldRetry lingers all the same.
const (
	lingerCalls = 4
	minYield    = 3
	yieldRetry  = 64
	probeEvery  = 16 // a lingering batch in probeEvery waits for the pause whatever it holds
)

// Gatherer runs calls in batches through its Flush. It is safe for concurrent use.
type Gatherer[Req, Resp any] struct {
	flush   Flush[Req, Resp]
	maxWait time.Duration
	inline  bool
	linger  time.Duration
	now     func() time.Time // time.Now; tests set another through export_test.go

	mu       sync.Mutex
	pending  *batch[Req, Resp] // the batch taking new calls; guarded by mu
	free     int               // lanes not running a batch; guarded by mu
	spare    []Req             // the requests array of a batch sent, for the next one; guarded by mu
	opened   *batch[Req, Resp] // a batch opened that no call joined, for the next open; guarded by mu
	last     time.Time         // when the latest call arrived, with Linger; guarded by mu
	gap      time.Duration     // moving average of the time between calls, with Linger; guarded by mu
	yield    int               // moving average of the calls per lingering batch, in eighths; guarded by mu
	retry    int               // batches to start before one lingers again, while yield is low; guarded by mu
	peak     int               // the most calls lingering batches gathered of late (0: none yet); guarded by mu
	unprobed int               // lingering batches started since the latest probe; guarded by mu
	fullOut  *batch[Req, Resp] // the latest lingering batch that went out full, until answered; guarded by mu

	work chan *batch[Req, Resp] // hands a batch to an idle worker (see dispatch)
	idle time.Duration          // workerIdle; tests set another through export_test.go
}

// batch is one round trip's worth of calls.
type batch[Req, Resp any] struct {
	reqs    []Req
	by      time.Time     // the latest deadline of its calls with one
	unbound bool          // one of its calls has no deadline
	timer   *time.Timer   // runs fire: after maxWait if no lane was free, or when a lingering batch is due
	linger  bool          // waits for more calls even with a lane free, until due or full
	probe   bool          // lingering, and not full before it is due, whatever it holds (see full)
	opening bool          // its first caller, holding a lane for it, calls Gosched before sending it (see open)
	first   time.Time     // when the first call joined, if lingering
	latest  time.Time     // when the latest call joined, if lingering
	done    chan struct{} // closed when resps and err are set

	resps []Resp
	err   error
}

// New returns a Gatherer sending its batches through flush.
func New[Req, Resp any](flush Flush[Req, Resp], opts Options) *Gatherer[Req, Resp] {
	return &Gatherer[Req, Resp]{
		flush: flush, maxWait: opts.MaxWait, inline: opts.Inline, free: max(opts.Lanes, 1),
		linger: opts.Linger, now: time.Now, gap: maxGap(opts.Linger), yield: 8 * minYield,
		work: make(chan *batch[Req, Resp]), idle: workerIdle,
	}
}

// maxGap is the longest time between two calls that the moving average counts: an idle
// spell weighs no more than this, so that a burst after it is seen to be one within a
// few dozen calls.
func maxGap(linger time.Duration) time.Duration { return 8 * linger }

// Do is DoBy with ctx's deadline, if it has one.
func (g *Gatherer[Req, Resp]) Do(ctx context.Context, req Req) (Resp, error) {
	deadline, _ := ctx.Deadline()
	return g.DoBy(ctx, deadline, req)
}

// DoBy adds req to the batch not yet sent and waits for its answer: its response, or
// the error of its whole batch. If ctx ends first, DoBy returns ctx.Err() at once, and
// at deadline (zero: none) context.DeadlineExceeded; the batch still runs for its
// other callers. (With Options.Inline, a call that runs its batch of one itself
// returns what Flush does, when Flush does.)
//
// A deadline costs a pooled timer while the call waits, where a context of its own
// (context.WithTimeout) would cost four allocations, a timer and a registration with
// ctx: a caller that bounds each call by a timeout of its own passes it here (see
// Deadline) rather than in ctx.
func (g *Gatherer[Req, Resp]) DoBy(ctx context.Context, deadline time.Time, req Req) (Resp, error) {
	g.mu.Lock()
	now, fast := g.arrive()
	linger := fast && g.pending == nil && g.pays()
	if !linger && g.free > 0 && g.pending == nil {
		return g.open(ctx, deadline, req)
	}
	b, i := g.join(req, deadline, now, linger)
	return g.wait(ctx, deadline, b, i)
}

// Deadline is the sooner of ctx's deadline and timeout from now (timeout 0: none), or
// zero if there is neither: the deadline of a call that its caller bounds by timeout.
func Deadline(ctx context.Context, timeout time.Duration) time.Time {
	d, ok := ctx.Deadline()
	if timeout > 0 {
		if t := time.Now().Add(timeout); !ok || t.Before(d) {
			return t
		}
	}
	return d
}

// wait waits for the answer of call i of batch b, sent or to be sent by others, until
// ctx ends or deadline (zero: none) passes.
func (g *Gatherer[Req, Resp]) wait(ctx context.Context, deadline time.Time, b *batch[Req, Resp], i int) (Resp, error) {
	var zero Resp
	var expired <-chan time.Time
	if !deadline.IsZero() {
		t := timers.Get().(*time.Timer)
		t.Reset(time.Until(deadline))
		defer putTimer(t)
		expired = t.C
	}
	select {
	case <-b.done:
	case <-ctx.Done():
		return zero, ctx.Err()
	case <-expired:
		return zero, context.DeadlineExceeded
	}
	if b.err != nil {
		return zero, b.err
	}
	return b.resps[i], nil
}

// timers are the stopped timers of wait.
var timers = sync.Pool{New: func() any {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}}

// putTimer stops t and gives it back to timers, with nothing stale in t.C for its next
// user. (Since Go 1.23 Stop sees to that; the drain is for a main module built with
// asynctimerchan=1.)
func putTimer(t *time.Timer) {
	if !t.Stop() {
		select {
		case <-t.C:
		default:
		}
	}
	timers.Put(t)
}

// bound counts a call's deadline (zero: none) into b's, the latest of its calls'. It
// must be called with mu held.
func (b *batch[Req, Resp]) bound(deadline time.Time) {
	if deadline.IsZero() {
		b.unbound = true
	} else if deadline.After(b.by) {
		b.by = deadline
	}
}

// deadline is what Flush gets for b: the latest deadline of its calls, or zero if one
// has none.
func (b *batch[Req, Resp]) deadline() time.Time {
	if b.unbound {
		return time.Time{}
	}
	return b.by
}

// arrive counts a call's arrival into the moving average of the time between calls and
// returns the time and whether calls come fast enough for a batch started now to
// linger. It must be called with mu held.
func (g *Gatherer[Req, Resp]) arrive() (now time.Time, fast bool) {
	if g.linger <= 0 {
		return now, false
	}
	now = g.now()
	d := min(now.Sub(g.last), maxGap(g.linger))
	g.last = now
	g.gap += (d - g.gap) / 8
	return now, g.gap*lingerCalls <= g.linger
}

// pays tells whether a batch about to start while calls come fast should linger: while
// lingering batches gather minYield calls on average, or, while they do not, once
// yieldRetry batches have gone at once since the last that lingered. It must be called
// with mu held, once per batch started.
func (g *Gatherer[Req, Resp]) pays() bool {
	if g.yield >= 8*minYield || g.retry == 0 {
		return true
	}
	g.retry--
	return false
}

// due is when lingering batch b is to go out: Linger after its first call, or once
// calls have paused for twice the gap (at least Linger/8) after its latest, whichever
// is sooner. It must be called with mu held.
func (g *Gatherer[Req, Resp]) due(b *batch[Req, Resp]) time.Time {
	return minTime(b.first.Add(g.linger), b.latest.Add(g.pause()))
}

// pause is how long calls must pause for a lingering batch to go out: twice the gap,
// and at least Linger/8. It must be called with mu held.
func (g *Gatherer[Req, Resp]) pause() time.Duration {
	return max(2*g.gap, g.linger/8)
}

// full tells whether lingering batch b holds as many calls as lingering batches
// gathered of late, the peak, so that it goes out without waiting for the pause: no
// more calls are likely to come. A probe is never full: it finds out what the peak is
// now. It must be called with mu held.
func (g *Gatherer[Req, Resp]) full(b *batch[Req, Resp]) bool {
	return !b.probe && len(b.reqs) >= g.peak
}

// ready tells whether b may take a lane now: it is not lingering, or is full or due. It
// must be called with mu held.
func (g *Gatherer[Req, Resp]) ready(b *batch[Req, Resp]) bool {
	return !b.opening && (!b.linger || g.full(b) || !g.now().Before(g.due(b)))
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// open starts a batch with req on a free lane, which it takes, and sends it once the
// goroutines that are ready to run have run (runtime.Gosched): those of them about to
// call Do join it rather than wait for it to return. They are the callers that a round
// trip just answered all at once (the lookup batch before the count, a netpoll of many
// requests): without the Gosched the first of them would go alone and the others a
// round trip later, two rounds where one does. With nothing else ready to run
// Gosched returns at once, so a lone call still waits for nothing. A batch still of one
// runs inline (Options.Inline); a larger one on a worker. It must be called with mu
// held, and unlocks it.
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

// alone runs reqs, a call's request alone, as a batch on the caller's goroutine, under
// ctx and by deadline, on a lane the caller has taken. The lane then goes to whatever
// batch gathered meanwhile, and reqs's array to a later batch.
func (g *Gatherer[Req, Resp]) alone(ctx context.Context, deadline time.Time, reqs []Req) (Resp, error) {
	defer g.handOn(reqs)
	var zero Resp
	resps, err := g.flush(ctx, deadline, reqs)
	if err == nil && len(resps) != 1 {
		err = fmt.Errorf("gather: flush answered %d responses for 1 request", len(resps))
	}
	if err != nil {
		return zero, err
	}
	return resps[0], nil
}

// handOn keeps the requests array of a batch sent inline for a later batch, and gives
// its lane to a worker for the batch that gathered meanwhile, if any, or frees it. The
// worker takes the batch when it runs, not now, so that the callers that run before it
// (this one goes on with its request) still join.
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

// join adds req, arrived at now with deadline, to the pending batch, starting one if
// there is none (lingering if linger), sends the batch at once if a lane is free and
// it is not lingering, and returns the batch and req's index in it. It must be called
// with mu held, and unlocks it.
func (g *Gatherer[Req, Resp]) join(req Req, deadline, now time.Time, linger bool) (*batch[Req, Resp], int) {
	b := g.pending
	if b == nil {
		b = &batch[Req, Resp]{reqs: g.spare, done: make(chan struct{})}
		g.pending, g.spare = b, nil
		switch {
		case linger:
			b.linger, b.first, b.latest = true, now, now
			b.probe = g.peak == 0 || g.yield < 8*minYield || g.unprobed >= probeEvery-1
			if g.fullOut != nil { // this call is none of its callers: there were more
				g.peak, g.fullOut = g.peak+1, nil
			}
			b.timer = time.AfterFunc(g.due(b).Sub(now), func() { g.fire(b) })
		case g.free == 0:
			b.timer = time.AfterFunc(g.maxWait, func() { g.fire(b) })
		}
	}
	if b.linger {
		b.latest = now
	}
	i := len(b.reqs)
	b.reqs = append(b.reqs, req)
	b.bound(deadline)
	if g.free == 0 || b.opening || b.linger && !g.full(b) {
		g.mu.Unlock()
		return b, i
	}
	g.free--
	g.take(b)
	g.mu.Unlock()
	g.dispatch(b)
	return b, i
}

// take marks b as sent, and counts the calls of a batch that lingered into the yield
// and the peak. It must be called with mu held and b == g.pending.
func (g *Gatherer[Req, Resp]) take(b *batch[Req, Resp]) {
	g.pending = nil
	if b.timer != nil {
		b.timer.Stop()
	}
	if b.first.IsZero() {
		return
	}
	// It lingered: count what that gathered.
	n := len(b.reqs)
	g.yield += (8*n - g.yield) / 4
	if g.yield < 8*minYield {
		g.retry = yieldRetry
	}
	if b.probe {
		g.peak, g.unprobed = max(n, g.peak-g.peak/4), 0
		return
	}
	if g.full(b) && g.now().Before(g.due(b)) { // it goes for being full, not for a pause
		g.fullOut = b
	}
	g.peak, g.unprobed = max(n, g.peak), g.unprobed+1
}

// dispatch runs b (nil: the batch pending when it starts) on a lane (see run) on a
// worker goroutine: one left idle by an earlier batch if there is one, else a new one.
// A worker waits workerIdle for another batch before it ends, so that under load
// batches are not each run on a fresh goroutine whose stack the round trip's client
// library grows anew, copy by copy (docs/performance.md: measured).
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

// run sends b (if nil, the batch pending) on a lane, then, after a Gosched (see the
// package documentation), keeps the lane busy with whatever batch gathered meanwhile,
// and frees it when none has.
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
// if not: there is none pending, or only a lingering batch not due, which goes when its
// timer says. It must be called with mu held.
func (g *Gatherer[Req, Resp]) keepLane() bool {
	if b := g.pending; b != nil && g.ready(b) {
		return true
	}
	g.free++
	return false
}

// fire runs on b's timer. A batch that waited maxWait for a lane is sent on the timer's
// goroutine, taking no lane and sending nothing after it. A lingering batch not yet due
// waits on; one due takes a free lane, or, with none free, waits for one as any batch
// does, at most maxWait more.
func (g *Gatherer[Req, Resp]) fire(b *batch[Req, Resp]) {
	g.mu.Lock()
	if g.pending != b {
		g.mu.Unlock()
		return
	}
	if b.linger {
		now := g.now()
		if due := g.due(b); now.Before(due) && !g.full(b) {
			b.timer.Reset(due.Sub(now))
			g.mu.Unlock()
			return
		}
		if g.free == 0 {
			b.linger = false
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

// send flushes b, hands the answers to its callers and keeps b's requests array for a
// later batch: callers only read their response. A batch that lingered is no longer
// out (fullOut) before its callers are woken, so that none of them, calling again,
// counts as a call from elsewhere; the others wake first.
func (g *Gatherer[Req, Resp]) send(b *batch[Req, Resp]) {
	reqs := b.reqs
	resps, err := g.flush(context.Background(), b.deadline(), reqs)
	if err == nil && len(resps) != len(reqs) {
		err = fmt.Errorf("gather: flush answered %d responses for %d requests", len(resps), len(reqs))
	}
	b.reqs, b.resps, b.err = nil, resps, err
	lingered := !b.first.IsZero() // set before b was sent, and not since
	if !lingered {
		close(b.done)
	}

	clear(reqs) // let go of what the requests point to
	g.mu.Lock()
	g.keepSpare(reqs)
	if g.fullOut == b {
		g.fullOut = nil
	}
	g.mu.Unlock()
	if lingered {
		close(b.done)
	}
}

// keepSpare keeps reqs, a batch's requests array, cleared, for a later batch, unless
// the one kept is larger. It must be called with mu held.
func (g *Gatherer[Req, Resp]) keepSpare(reqs []Req) {
	if cap(reqs) > cap(g.spare) {
		g.spare = reqs[:0]
	}
}
