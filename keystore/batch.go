package keystore

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Batcher verifies keys like Store.Verify, but gathers the lookups of concurrent
// requests into one query (WHERE key_id = ANY($1)), so that under load PostgreSQL
// answers one statement for many requests.
//
// Freshness is kept: a request only ever joins a batch that has not been sent yet, and a
// batch is sent as soon as a lane is free (no timer). So every answer comes from a query
// that started after the request arrived, and a key revoked before a request starts is
// refused on that request. (A singleflight-style cache of the query in progress would
// break this: it can hand a request the result of a query that began before it.)
//
// With one lane, one batch is in flight at a time; more lanes keep several in flight,
// each still only taking requests that arrived before it was sent. A batch that has
// waited a tenth of Timeout for a lane goes out on a lane of its own: a slow query in
// flight never costs the requests of the next batch more than that on top of their
// own query, so a PostgreSQL answering within the timeout does not turn them into 503s.
type Batcher struct {
	store   *Store
	timeout time.Duration
	onBatch func(size int) // BatcherOptions.OnBatch; may be nil
	maxWait time.Duration  // how long a batch waits for a lane; see Batcher

	queries, lookups atomic.Uint64

	mu      sync.Mutex
	pending *batch // the batch taking new requests; guarded by mu
	free    int    // lanes not running a query; guarded by mu
}

// batch is one query's worth of lookups.
type batch struct {
	ids   []string // distinct key ids, in arrival order
	seen  map[string]struct{}
	timer *time.Timer   // sends the batch on a lane of its own after maxWait
	done  chan struct{} // closed when rows and err are set

	rows map[string]row
	err  error
}

// BatcherOptions tunes a Batcher. The zero value is usable.
type BatcherOptions struct {
	// Lanes is the number of batch queries that may be in flight at once. Default: 1.
	Lanes int
	// Timeout bounds each batch query, which serves many requests and so does not run
	// under any one request's context. Default: 5s.
	Timeout time.Duration
	// OnBatch, if set, is called with the number of distinct key ids of every batch
	// query as it is sent, for metrics. It runs on the batch's goroutine and must be
	// fast. Default: none.
	OnBatch func(size int)
}

// NewBatcher returns a Batcher looking keys up in s.
func NewBatcher(s *Store, opts BatcherOptions) *Batcher {
	if opts.Lanes <= 0 {
		opts.Lanes = 1
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 5 * time.Second
	}
	return &Batcher{store: s, timeout: opts.Timeout, maxWait: opts.Timeout / 10, free: opts.Lanes, onBatch: opts.OnBatch}
}

// Verify is Store.Verify through a batch; see Store.Verify for its outcomes. If ctx ends
// before the batch answers, Verify returns ctx's error (a "broken", not a "rejected").
func (b *Batcher) Verify(ctx context.Context, presented string) (Key, bool, error) {
	keyID, secret, ok := b.store.format.Parse(presented)
	if !ok {
		return Key{}, false, nil
	}
	return b.VerifyParsed(ctx, keyID, secret)
}

// VerifyParsed is Verify for a key that Format.Parse has already split; see
// Store.VerifyParsed.
func (b *Batcher) VerifyParsed(ctx context.Context, keyID, secret string) (Key, bool, error) {
	sum := HashSecret(secret)
	bt := b.join(keyID)
	select {
	case <-bt.done:
	case <-ctx.Done():
		return Key{}, false, fmt.Errorf("looking up key: %w", ctx.Err())
	}
	if bt.err != nil {
		return Key{}, false, bt.err
	}
	r, found := bt.rows[keyID]
	k, ok := check(keyID, sum, r, found)
	return k, ok, nil
}

// join adds keyID to the batch not yet sent, starting one if there is none, and sends it
// at once if a lane is free. A batch holds at most one id per concurrent request, so it
// needs no size cap.
func (b *Batcher) join(keyID string) *batch {
	b.mu.Lock()
	bt := b.pending
	if bt == nil {
		bt = &batch{seen: make(map[string]struct{}), done: make(chan struct{})}
		b.pending = bt
		if b.free == 0 {
			bt.timer = time.AfterFunc(b.maxWait, func() { b.overflow(bt) })
		}
	}
	if _, dup := bt.seen[keyID]; !dup {
		bt.seen[keyID] = struct{}{}
		bt.ids = append(bt.ids, keyID)
	}
	if b.free > 0 {
		b.free--
		b.take(bt)
		b.mu.Unlock()
		go b.run(bt)
		return bt
	}
	b.mu.Unlock()
	return bt
}

// take marks bt as sent. It must be called with mu held and bt == b.pending.
func (b *Batcher) take(bt *batch) {
	b.pending = nil
	if bt.timer != nil {
		bt.timer.Stop()
	}
}

// run sends bt, then keeps its lane busy with whatever batch gathered meanwhile.
func (b *Batcher) run(bt *batch) {
	for bt != nil {
		bt.rows, bt.err = b.query(bt.ids)
		close(bt.done)

		b.mu.Lock()
		bt = b.pending
		if bt != nil {
			b.take(bt)
		} else {
			b.free++
		}
		b.mu.Unlock()
	}
}

// overflow sends bt on a lane of its own once it has waited maxWait for one, if it has
// not gone yet.
func (b *Batcher) overflow(bt *batch) {
	b.mu.Lock()
	if b.pending != bt {
		b.mu.Unlock()
		return
	}
	b.take(bt)
	b.mu.Unlock()
	bt.rows, bt.err = b.query(bt.ids)
	close(bt.done)
}

// BatchStats counts a Batcher's work since it was made.
type BatchStats struct {
	// Queries is the number of batch queries sent.
	Queries uint64
	// Lookups is the number of key ids they looked up, counting each id once a batch.
	Lookups uint64
}

// Stats returns what b has done so far.
func (b *Batcher) Stats() BatchStats {
	return BatchStats{Queries: b.queries.Load(), Lookups: b.lookups.Load()}
}

func (b *Batcher) query(ids []string) (map[string]row, error) {
	b.queries.Add(1)
	b.lookups.Add(uint64(len(ids)))
	if b.onBatch != nil {
		b.onBatch(len(ids))
	}
	ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
	defer cancel()
	return b.store.lookup(ctx, ids)
}
