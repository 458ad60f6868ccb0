package keystore

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keygate/keygate/internal/gather"
)

// Reader verifies keys like a Batcher, but has hot standbys answer the lookups, with
// the primary's answer when none can. A lookup a standby answers reflects every
// commit completed on the primary before the lookup began, whatever the standby's
// lag. So a key revoked before a request arrives is refused on that request, as on
// the primary.
//
// The Fence gives each lookup a target: the primary's insert position, read after
// the lookup began. The reading goes out with the lookup's batch, so the two round
// trips overlap, and it serves the whole batch. Each standby's batch query reads, in
// the same round trip and before its lookup, how far the standby has replayed. A
// lookup is answered by a standby only if that is at least its target. On a primary
// that writes all the time, a fresh target is nearly always a little past what any
// standby has replayed: its WAL has yet to be written, sent and applied. So a lookup
// behind its target waits for the first standby in to replay it, and is asked there
// again. It waits at most MaxLag, and only within half the Timeout; then the primary
// answers. While lookups wait, each standby in is asked its replay position every
// catchUpPoll, one query for all of them.
//
// Each standby has its own pool, Batcher and health. A standby is left out while its
// lookups have failed standbyFailures times in a row, or while it has not replayed a
// reading of the primary taken within MaxLag. A server out of recovery, a standby
// promoted in a failover, fails every lookup and probe: it is left out until it is a
// standby again. Its probe, on its own goroutine, brings it back when it answers and
// has caught up, on the primary's timeline of the moment. With no standby in, the
// primary answers every lookup.
type Reader struct {
	primary  *Batcher
	fence    *Fence
	standbys []*standby
	timeout  time.Duration
	maxLag   time.Duration
	probe    time.Duration // how often each standby's health is read
	opts     ReaderOptions

	next atomic.Uint32 // spreads the lookups over the standbys in turn
	stop chan struct{}

	waiting  atomic.Int32    // lookups waiting for a standby to replay their target
	progress sync.Mutex      // guards advanced, closed and every standby's polling
	advanced chan struct{}   // closed, and replaced, when a standby's replay advances
	closed   bool            // Close has begun: no poll starts
	probes   context.Context // the probes' queries; cancelled by Close
	cancel   context.CancelFunc
	wg       sync.WaitGroup
}

// ReaderOptions tunes a Reader. The zero value is usable.
type ReaderOptions struct {
	// Batcher tunes each standby's Batcher. Its Timeout is also the Fence's and the
	// lookup's (BatcherOptions.Timeout). Default: the zero BatcherOptions.
	Batcher BatcherOptions
	// MaxLag leaves out a standby that has not replayed a reading of the primary's
	// position taken within MaxLag. Default: 1s.
	MaxLag time.Duration
	// ProbeTimeout bounds a standby's health probe, connection setup included. It is
	// a budget of its own: no request waits on a probe. Default: twice the Timeout.
	ProbeTimeout time.Duration
	// OnLookup, if set, is called once a lookup is answered, with the context the
	// lookup was made under and whether a standby answered it. It must be fast.
	// Default: none.
	OnLookup func(ctx context.Context, standby bool)
	// OnFenceWait, if set, is called with each lookup's wait for its reading of the
	// primary's position once its standby answered. It must be fast. Default: none.
	OnFenceWait func(time.Duration)
	// OnReplayWait, if set, is called with the wait of each lookup that waited for a
	// standby to replay its reading, whether one did or the primary answered. It must
	// be fast. Default: none.
	OnReplayWait func(time.Duration)
	// OnStandby, if set, is called when standby i (in the order given to NewReader)
	// joins (in) or leaves the lookups, for logs. Default: none.
	OnStandby func(i int, in bool)
}

// standbyFailures is how many lookups in a row may fail on a standby before it is
// left out until its probe answers.
const standbyFailures = 3

// standby is one hot standby of a Reader.
type standby struct {
	pool     *pgxpool.Pool
	batcher  *Batcher
	failures atomic.Int32  // lookups that failed in a row
	covered  atomic.Int64  // unix nanoseconds: when the latest reading it has replayed was sent
	replayed atomic.Uint64 // the furthest position it is known to have replayed
	in       atomic.Bool   // last reported to OnStandby
	polling  bool          // its catch-up poll runs; guarded by Reader.progress
	promoted bool          // its last probe found it out of recovery; only its probe uses it
}

// catchUpPoll is how often each standby in is asked its replay position while
// lookups wait for it. It adds at most that to their wait, and costs each standby
// one small query per poll, whatever the number of lookups waiting.
const catchUpPoll = 2 * time.Millisecond

// NewReader returns a Reader with the lookups of primary, the Batcher of primaryPool,
// and a standby over each pool of standbys. Keys have primary's format. Close stops
// the standbys' probes.
func NewReader(primary *Batcher, primaryPool *pgxpool.Pool, standbys []*pgxpool.Pool, opts ReaderOptions) *Reader {
	if opts.Batcher.Timeout <= 0 {
		opts.Batcher.Timeout = 5 * time.Second
	}
	if opts.MaxLag <= 0 {
		opts.MaxLag = time.Second
	}
	if opts.ProbeTimeout <= 0 {
		opts.ProbeTimeout = 2 * opts.Batcher.Timeout
	}
	r := &Reader{
		primary: primary,
		fence:   newFence(primaryPool, opts.Batcher.Timeout),
		timeout: opts.Batcher.Timeout,
		maxLag:  opts.MaxLag,
		// A standby that keeps up is read four times within MaxLag, so a reading it
		// replayed is never older than MaxLag while it keeps up.
		probe:    min(max(opts.MaxLag/4, 10*time.Millisecond), 250*time.Millisecond),
		opts:     opts,
		stop:     make(chan struct{}),
		advanced: make(chan struct{}),
	}
	r.probes, r.cancel = context.WithCancel(context.Background())
	for _, pool := range standbys {
		store := &Store{pool: pool, format: primary.store.format, standby: true}
		s := &standby{pool: pool, batcher: NewBatcher(store, opts.Batcher)}
		s.failures.Store(standbyFailures) // out until its first probe
		r.standbys = append(r.standbys, s)
	}
	for i := range r.standbys {
		r.wg.Add(1)
		go r.watch(i)
	}
	return r
}

// Close stops the standbys' probes, cutting short a probe in flight, so that a hung
// standby does not hold a config reload up. It closes no pool.
func (r *Reader) Close() {
	r.progress.Lock()
	r.closed = true
	r.progress.Unlock()
	close(r.stop)
	r.cancel()
	r.wg.Wait()
}

// Verify is Store.Verify through the Reader; see Store.Verify for its outcomes.
func (r *Reader) Verify(ctx context.Context, presented string) (Key, bool, error) {
	keyID, secret, ok := r.primary.store.format.Parse(presented)
	if !ok {
		return Key{}, false, nil
	}
	return r.VerifyParsed(ctx, keyID, secret, netip.Addr{})
}

// VerifyParsed is Verify for a key that Format.Parse has already split, asked from
// from; see Store.VerifyParsed. Its error is the primary's: a standby that fails hands the
// lookup on. A lookup's time on the standbys, its tries and its wait for their
// replay together, is at most half the Timeout, so a standby down, hung or behind
// costs a request at most that before the primary answers.
func (r *Reader) VerifyParsed(ctx context.Context, keyID, secret string, from netip.Addr) (Key, bool, error) {
	s := r.pick(time.Now(), nil)
	if s == nil {
		return r.fromPrimary(ctx, keyID, secret, from)
	}
	rd := r.fence.hold() // the first reading sent after the request arrived
	arrived := time.Now()
	fenceBy := gather.Deadline(ctx, r.timeout)
	by := gather.Deadline(ctx, r.timeout/2)
	catchUp := by
	if t := arrived.Add(r.maxLag); t.Before(catchUp) {
		catchUp = t
	}
	var (
		fenced bool
		target LSN
		sent   time.Time
	)
	// A standby's replay can go back when it restarts, so its tries are counted too.
	for failures, tries := 0, 0; s != nil && failures < 2 && tries < 4 && time.Now().Before(by); tries++ {
		k, ok, replayed, err := s.batcher.verifyBy(ctx, by, keyID, secret, from, rd)
		if err != nil {
			if ctx.Err() != nil {
				return Key{}, false, fmt.Errorf("looking up key: %w", ctx.Err())
			}
			failures++
			s.failed(r, time.Now())
			s = r.pick(time.Now(), s)
			continue
		}
		if s.failures.Load() != 0 {
			s.failures.Store(0) // only then: every core's lookups share the word
		}
		r.advance(s, replayed)
		if !fenced {
			// The reading went out with the batch, and is often in already.
			waited := time.Now()
			target, sent, err = rd.await(ctx, fenceBy)
			if r.opts.OnFenceWait != nil {
				r.opts.OnFenceWait(time.Since(waited))
			}
			if err != nil {
				return Key{}, false, fmt.Errorf("fencing the key lookup: %w", err)
			}
			fenced = true
		}
		if replayed >= target {
			s.caughtUp(sent)
			if r.opts.OnLookup != nil {
				r.opts.OnLookup(ctx, true)
			}
			return k, ok, nil
		}
		s = r.awaitReplay(ctx, target, catchUp)
	}
	return r.fromPrimary(ctx, keyID, secret, from)
}

// awaitReplay returns the first standby in that has replayed target, or nil once ctx
// ends, deadline passes or no standby is in. The standbys' catch-up polls run while it
// waits.
func (r *Reader) awaitReplay(ctx context.Context, target LSN, deadline time.Time) *standby {
	r.waiting.Add(1)
	defer r.waiting.Add(-1)
	if r.opts.OnReplayWait != nil {
		began := time.Now()
		defer func() { r.opts.OnReplayWait(time.Since(began)) }()
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	for {
		// The channel is taken before the positions are read: a standby that
		// advances after the reads closes it.
		r.progress.Lock()
		advanced := r.advanced
		now := time.Now()
		var found *standby
		in := false
		for _, s := range r.standbys {
			if r.closed || !s.usable(now, r.maxLag) {
				continue
			}
			in = true
			if found == nil && LSN(s.replayed.Load()) >= target {
				found = s
			}
			if !s.polling {
				s.polling = true
				r.wg.Add(1)
				go r.poll(s)
			}
		}
		r.progress.Unlock()
		if found != nil || !in {
			return found
		}
		select {
		case <-advanced:
		case <-t.C:
			return nil
		case <-ctx.Done():
			return nil
		case <-r.stop:
			return nil
		}
	}
}

// poll asks s its replay position every catchUpPoll while lookups wait for a standby
// to replay their target, and until Close. Each query is bounded by half the Timeout,
// as a lookup's time on the standbys is. A query that fails ends the poll: s's
// lookups and probe count its failures.
func (r *Reader) poll(s *standby) {
	defer r.wg.Done()
	t := time.NewTicker(catchUpPoll)
	defer t.Stop()
	for {
		ctx, cancel := context.WithTimeout(r.probes, r.timeout/2)
		replayed, err := replayedLSN(ctx, s.pool)
		cancel()
		if err == nil {
			r.advance(s, replayed)
		}
		r.progress.Lock()
		if err != nil || r.waiting.Load() == 0 {
			s.polling = false
			r.progress.Unlock()
			return
		}
		r.progress.Unlock()
		select {
		case <-r.stop:
			r.progress.Lock()
			s.polling = false
			r.progress.Unlock()
			return
		case <-t.C:
		}
	}
}

// advance records that s has replayed up to replayed, and wakes the lookups waiting
// for a standby's replay if that is further than before.
func (r *Reader) advance(s *standby, replayed LSN) {
	for {
		old := s.replayed.Load()
		if uint64(replayed) <= old {
			return
		}
		if s.replayed.CompareAndSwap(old, uint64(replayed)) {
			break
		}
	}
	if r.waiting.Load() == 0 {
		return // no one to wake: the lookups' common case takes no lock
	}
	r.progress.Lock()
	close(r.advanced)
	r.advanced = make(chan struct{})
	r.progress.Unlock()
}

// fromPrimary looks the key up on the primary.
func (r *Reader) fromPrimary(ctx context.Context, keyID, secret string, from netip.Addr) (Key, bool, error) {
	k, ok, err := r.primary.VerifyParsed(ctx, keyID, secret, from)
	if err == nil && r.opts.OnLookup != nil {
		r.opts.OnLookup(ctx, false)
	}
	return k, ok, err
}

// pick returns the next standby in turn that is in at now, other than not, or nil.
func (r *Reader) pick(now time.Time, not *standby) *standby {
	n := uint32(len(r.standbys))
	if n == 0 {
		return nil
	}
	first := r.next.Add(1)
	for i := range n {
		s := r.standbys[(first+i)%n]
		if s != not && s.usable(now, r.maxLag) {
			return s
		}
	}
	return nil
}

// usable reports whether s takes lookups at now.
func (s *standby) usable(now time.Time, maxLag time.Duration) bool {
	return s.failures.Load() < standbyFailures && now.UnixNano()-s.covered.Load() <= int64(maxLag)
}

// failed counts a failed lookup of s.
func (s *standby) failed(r *Reader, now time.Time) {
	if s.failures.Add(1) >= standbyFailures {
		r.report(s, now)
	}
}

// watch probes standby i until Close, at once and then every r.probe.
func (r *Reader) watch(i int) {
	defer r.wg.Done()
	s := r.standbys[i]
	t := time.NewTicker(r.probe)
	defer t.Stop()
	var readings []fenceReading
	for {
		readings = r.probeOnce(s, readings)
		r.report(s, time.Now())
		select {
		case <-r.stop:
			return
		case <-t.C:
		}
	}
}

// fenceReading is a reading of the primary's position that a probe took: its target,
// and when it was sent.
type fenceReading struct {
	target LSN
	sent   time.Time
}

// probeOnce reads how far s has replayed, after taking a reading of the primary. A
// standby that answers takes lookups again (its failures are cleared). It is caught
// up as of when the latest reading it has replayed was sent: that reading, or one of
// the earlier ones, which the probe keeps while they are within MaxLag. On a primary
// that writes all the time a standby seldom has replayed a reading taken just before,
// yet one that keeps up has replayed the probe's previous one. While the primary does
// not answer, the standby is judged against the readings kept. It returns the readings
// to keep.
func (r *Reader) probeOnce(s *standby, readings []fenceReading) []fenceReading {
	ctx, cancel := context.WithTimeout(r.probes, r.opts.ProbeTimeout)
	defer cancel()
	target, sent, err := r.fence.wait(ctx, time.Time{})
	if err == nil {
		readings = append(readings, fenceReading{target, sent})
	}
	for len(readings) > 0 && time.Since(readings[0].sent) > r.maxLag {
		readings = readings[1:]
	}
	replayed, err := replayedLSN(ctx, s.pool)
	if errors.Is(err, errNotStandby) && !s.promoted {
		// Its connections stay open through a promotion. Closed, they open again
		// on a host of the URL that target_session_attrs accepts, if it names one.
		s.pool.Reset()
	}
	s.promoted = errors.Is(err, errNotStandby)
	if err != nil {
		s.failures.Store(standbyFailures)
		return readings
	}
	s.failures.Store(0)
	r.advance(s, replayed)
	for i := len(readings) - 1; i >= 0; i-- {
		if replayed >= readings[i].target {
			s.caughtUp(readings[i].sent)
			return readings[i+1:]
		}
	}
	return readings
}

// caughtUp records that s has replayed a reading sent at sent.
func (s *standby) caughtUp(sent time.Time) {
	if t := sent.UnixNano(); t > s.covered.Load() {
		s.covered.Store(t)
	}
}

// report tells OnStandby when s has joined or left the lookups.
func (r *Reader) report(s *standby, now time.Time) {
	in := s.usable(now, r.maxLag)
	if s.in.Swap(in) != in && r.opts.OnStandby != nil {
		for i, t := range r.standbys {
			if t == s {
				r.opts.OnStandby(i, in)
			}
		}
	}
}
