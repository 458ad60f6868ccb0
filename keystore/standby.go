package keystore

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
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
// the lookup began. Each standby's batch query reads, in the same round trip and
// before its lookup, how far the standby has replayed. A lookup is answered by a
// standby only if that is at least its target. A standby behind it is asked again
// once, another one if there is one. Then the primary answers.
//
// Each standby has its own pool, Batcher and health. A standby is left out while its
// lookups have failed standbyFailures times in a row, or while it has not replayed a
// reading of the primary taken within MaxLag. Its probe, on its own goroutine, brings
// it back when it answers and has caught up. With no standby in, the primary answers
// every lookup.
type Reader struct {
	primary  *Batcher
	fence    *Fence
	standbys []*standby
	timeout  time.Duration
	maxLag   time.Duration
	probe    time.Duration // how often each standby's health is read
	opts     ReaderOptions

	next   atomic.Uint32 // spreads the lookups over the standbys in turn
	stop   chan struct{}
	probes context.Context // the probes' queries; cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
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
	// OnLookup, if set, is called once a lookup is answered, with whether a standby
	// answered it. It must be fast. Default: none.
	OnLookup func(standby bool)
	// OnFenceWait, if set, is called with each lookup's wait for its reading of the
	// primary's position. It must be fast. Default: none.
	OnFenceWait func(time.Duration)
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
	failures atomic.Int32 // lookups that failed in a row
	covered  atomic.Int64 // unix nanoseconds: when the latest reading it has replayed was sent
	in       atomic.Bool  // last reported to OnStandby
}

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
		probe: min(max(opts.MaxLag/4, 10*time.Millisecond), 250*time.Millisecond),
		opts:  opts,
		stop:  make(chan struct{}),
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
	return r.VerifyParsed(ctx, keyID, secret)
}

// VerifyParsed is Verify for a key that Format.Parse has already split; see
// Store.VerifyParsed. Its error is the primary's: a standby that fails hands the
// lookup on. A standby's tries together wait at most half the Timeout, so a standby
// down or hung costs a request at most that before the primary answers.
func (r *Reader) VerifyParsed(ctx context.Context, keyID, secret string) (Key, bool, error) {
	arrived := time.Now()
	s := r.pick(arrived, nil)
	if s == nil {
		return r.fromPrimary(ctx, keyID, secret)
	}
	target, sent, err := r.fence.wait(ctx, gather.Deadline(ctx, r.timeout))
	if r.opts.OnFenceWait != nil {
		r.opts.OnFenceWait(time.Since(arrived))
	}
	if err != nil {
		return Key{}, false, fmt.Errorf("fencing the key lookup: %w", err)
	}
	by := gather.Deadline(ctx, r.timeout/2)
	for try := 0; try < 2 && s != nil; try++ {
		k, ok, replayed, err := s.batcher.verifyBy(ctx, by, keyID, secret)
		if err != nil {
			if ctx.Err() != nil {
				return Key{}, false, fmt.Errorf("looking up key: %w", ctx.Err())
			}
			s.failed(r, time.Now())
			s = r.pick(time.Now(), s)
			continue
		}
		if s.failures.Load() != 0 {
			s.failures.Store(0) // only then: every core's lookups share the word
		}
		if replayed >= target {
			s.caughtUp(sent)
			if r.opts.OnLookup != nil {
				r.opts.OnLookup(true)
			}
			return k, ok, nil
		}
		// Behind: another standby if one is in, else this one once more.
		if other := r.pick(time.Now(), s); other != nil {
			s = other
		}
	}
	return r.fromPrimary(ctx, keyID, secret)
}

// fromPrimary looks the key up on the primary.
func (r *Reader) fromPrimary(ctx context.Context, keyID, secret string) (Key, bool, error) {
	k, ok, err := r.primary.VerifyParsed(ctx, keyID, secret)
	if err == nil && r.opts.OnLookup != nil {
		r.opts.OnLookup(false)
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
	for {
		r.probeOnce(s)
		r.report(s, time.Now())
		select {
		case <-r.stop:
			return
		case <-t.C:
		}
	}
}

// probeOnce reads how far s has replayed, against a reading of the primary taken
// now. A standby that answers takes lookups again (its failures are cleared). One
// that has replayed the reading is caught up as of when it was sent. A primary that
// does not answer says nothing about the standby.
func (r *Reader) probeOnce(s *standby) {
	ctx, cancel := context.WithTimeout(r.probes, r.opts.ProbeTimeout)
	defer cancel()
	target, sent, err := r.fence.wait(ctx, time.Time{})
	if err != nil {
		return
	}
	replayed, err := replayedLSN(ctx, s.pool)
	if err != nil {
		s.failures.Store(standbyFailures)
		return
	}
	s.failures.Store(0)
	if replayed >= target {
		s.caughtUp(sent)
	}
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

// replayedSQL reads how far a standby has replayed, in bytes. On a server that is not
// a standby it is NULL.
const replayedSQL = `SELECT (pg_last_wal_replay_lsn() - '0/0')::int8`

// replayedLSN reads how far the standby of pool has replayed. A server that is not a
// standby is an error: its position cannot be compared with the primary's.
func replayedLSN(ctx context.Context, pool *pgxpool.Pool) (LSN, error) {
	var replayed *int64
	if err := pool.QueryRow(ctx, replayedSQL).Scan(&replayed); err != nil {
		return 0, err
	}
	if replayed == nil {
		return 0, fmt.Errorf("not a standby: pg_last_wal_replay_lsn() is NULL")
	}
	return LSN(*replayed), nil
}

// lookupReplayed is lookupOnce on a standby. It sends the read of the replayed
// position and the lookup in one pipeline, the read first. So the lookup's snapshot
// is taken after that position was replayed and reflects every commit up to it.
func (s *Store) lookupReplayed(ctx context.Context, l lookup) (map[string]row, LSN, error) {
	b := &pgx.Batch{}
	b.Queue(replayedSQL)
	b.Queue(l.sql, l.args...)
	res := s.pool.SendBatch(ctx, b)
	defer res.Close()
	var replayed *int64
	if err := res.QueryRow().Scan(&replayed); err != nil {
		return nil, 0, err
	}
	rows, err := res.Query()
	if err != nil {
		return nil, 0, err
	}
	out, err := scanLookup(rows, l.ids)
	if err != nil {
		return nil, 0, err
	}
	if replayed == nil {
		return out, 0, nil // not a standby: never past a target, so never used
	}
	return out, LSN(*replayed), res.Close()
}
