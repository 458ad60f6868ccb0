package gather

import "time"

// This file holds the linger policy (Options.Linger): which batches wait for more
// calls with a lane free, and when they go out. gather.go holds the lanes that send
// them.

// Tuning of the linger policy; see lingerPolicy.
const (
	lingerCalls = 4  // calls one Linger must bring, at the recent rate, for a batch to linger
	minYield    = 3  // calls a lingering batch must gather on average for the next to linger
	yieldRetry  = 64 // while they do not, one batch in yieldRetry lingers all the same
	probeEvery  = 16 // one lingering batch in probeEvery is a probe
)

// lingerPolicy decides whether a new batch lingers and when a lingering batch goes
// out. Its fields are guarded by the Gatherer's mu. Its methods must be called with
// mu held.
//
// Without Linger, a batch goes out the moment a lane is free. On a busy machine with
// quick round trips, a batch then holds only the calls that came during one round
// trip. Each call pays a good share of a round trip.
//
// With Linger, a batch started while calls come fast lingers, as with Kafka's
// linger.ms. Calls come fast while the gap is at most Linger/4. The gap is the moving
// average of the time between calls. A lingering batch goes out at the first of:
//
//   - a pause: no call for twice the gap, and for at least Linger/8;
//   - Linger after its first call;
//   - being full (see below).
//
// Under a closed loop of clients, the pause comes when every client is waiting. The
// batch then holds them all. When calls slow down, batches go out at once again.
//
// A fast rate is not enough. A few clients in a closed loop send fast, yet nobody is
// left to send while a batch waits. So the policy keeps the yield: the moving average
// of the calls per lingering batch. While the yield is under minYield, batches go out
// at once. One in yieldRetry lingers all the same, to find out whether lingering pays
// again.
//
// Nor does a batch wait for calls that cannot come. The peak is the most calls that
// lingering batches gathered of late. A batch holding the peak is full: it goes out
// without waiting for the pause. So a closed loop of a few clients sends its batch as
// soon as the last client joins. The peak follows a larger batch at once. It grows by
// one when a call comes while a full batch is out: none of that batch's callers sent
// it, so there were more to wait for.
//
// A probe is a lingering batch that is never full: it waits for the pause. It finds
// out what the peak is now, and the peak falls to it, by a quarter at most. Probes
// are the first lingering batch, every probeEvery-th, and those started while the
// yield is low.
//
// A lingering batch adds up to Linger to a call's wait. It still takes only calls
// that arrive before it is sent, so freshness holds (see the package doc).
type lingerPolicy struct {
	linger   time.Duration    // Options.Linger; 0: no batch lingers
	now      func() time.Time // time.Now; tests set another through export_test.go
	last     time.Time        // when the latest call arrived
	gap      time.Duration    // moving average of the time between calls
	yield    int              // moving average of the calls per lingering batch, in eighths
	retry    int              // batches to start before one lingers again, while yield is low
	peak     int              // the most calls lingering batches gathered of late; 0: none yet
	unprobed int              // lingering batches started since the latest probe
	fullOut  *lingering       // the latest lingering batch that went out full, until answered
}

// lingering is what a batch knows of its lingering.
type lingering struct {
	on     bool      // waits for more calls even with a lane free, until full or due
	probe  bool      // never full: waits for the pause whatever it holds
	first  time.Time // when its first call joined; zero if it never lingered
	latest time.Time // when its latest call joined
}

// lingered tells whether the batch was started lingering. It stays true once a
// lingering batch gives up waiting for a lane (see fire).
func (l *lingering) lingered() bool { return !l.first.IsZero() }

func newLingerPolicy(linger time.Duration) lingerPolicy {
	return lingerPolicy{linger: linger, now: time.Now, gap: maxGap(linger), yield: 8 * minYield}
}

// maxGap is the longest time between two calls that the gap counts. An idle spell
// weighs no more than this. So a burst after it is seen within a few dozen calls.
func maxGap(linger time.Duration) time.Duration { return 8 * linger }

// arrive counts a call's arrival into the gap. It returns the time, and whether calls
// come fast enough for a batch started now to linger.
func (p *lingerPolicy) arrive() (now time.Time, fast bool) {
	if p.linger <= 0 {
		return now, false
	}
	now = p.now()
	d := min(now.Sub(p.last), maxGap(p.linger))
	p.last = now
	p.gap += (d - p.gap) / 8
	return now, p.gap*lingerCalls <= p.linger
}

// pays tells whether a batch about to start while calls come fast should linger. It
// must be called once per batch started.
func (p *lingerPolicy) pays() bool {
	if p.yield >= 8*minYield || p.retry == 0 {
		return true
	}
	p.retry--
	return false
}

// start makes l, a batch starting with a call arrived at now, linger.
func (p *lingerPolicy) start(l *lingering, now time.Time) {
	l.on, l.first, l.latest = true, now, now
	l.probe = p.peak == 0 || p.yield < 8*minYield || p.unprobed >= probeEvery-1
	if p.fullOut != nil { // this call is none of its callers: there were more
		p.peak, p.fullOut = p.peak+1, nil
	}
}

// due is when l is to go out if not full: Linger after its first call, or after a
// pause since its latest, whichever is sooner.
func (p *lingerPolicy) due(l *lingering) time.Time {
	return minTime(l.first.Add(p.linger), l.latest.Add(p.pause()))
}

// pause is how long calls must pause for a lingering batch to go out: twice the gap,
// and at least Linger/8.
func (p *lingerPolicy) pause() time.Duration {
	return max(2*p.gap, p.linger/8)
}

// full tells whether l, holding n calls, holds the peak. A probe is never full.
func (p *lingerPolicy) full(l *lingering, n int) bool {
	return !l.probe && n >= p.peak
}

// waits tells whether l, holding n calls, still waits for more with a lane free: it
// lingers, is not full and is not due.
func (p *lingerPolicy) waits(l *lingering, n int) bool {
	return l.on && !p.full(l, n) && p.now().Before(p.due(l))
}

// sent counts what l gathered, n calls, into the yield and the peak, as its batch is
// sent. It does nothing for a batch that never lingered.
func (p *lingerPolicy) sent(l *lingering, n int) {
	if !l.lingered() {
		return
	}
	p.yield += (8*n - p.yield) / 4
	if p.yield < 8*minYield {
		p.retry = yieldRetry
	}
	if l.probe {
		p.peak, p.unprobed = max(n, p.peak-p.peak/4), 0
		return
	}
	if p.full(l, n) && p.now().Before(p.due(l)) { // it goes for being full, not for a pause
		p.fullOut = l
	}
	p.peak, p.unprobed = max(n, p.peak), p.unprobed+1
}

// answered forgets l as the batch out full, once its callers have their answers.
func (p *lingerPolicy) answered(l *lingering) {
	if p.fullOut == l {
		p.fullOut = nil
	}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
