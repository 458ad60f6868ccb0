package keystore

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/keygate/keygate/internal/gather"
)

// Batcher verifies keys like Store.Verify, but gathers the lookups of concurrent
// requests into one query (the statement lookupOf chooses for the batch's
// size), so that under load PostgreSQL answers one statement for many requests.
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
// A request that finds a lane free, and is still alone once the requests ready to run
// have had their turn (gather's Gosched), is a batch of its own, and runs its query
// itself, on its own goroutine (see query). (The gathering is internal/gather's; a Batcher
// adds the query.)
type Batcher struct {
	store   *Store
	timeout time.Duration
	onBatch func(size int)                          // BatcherOptions.OnBatch; may be nil
	batches *gather.Gatherer[probe, map[string]row] // a presented key in, its batch's live keys out

	queries, lookups atomic.Uint64 // for tests, through export_test.go
}

// BatcherOptions tunes a Batcher. The zero value is usable.
type BatcherOptions struct {
	// Lanes is the number of batch queries that may be in flight at once. Default: 1.
	Lanes int
	// Timeout bounds each lookup: a request waits at most Timeout for its answer (less
	// if its context's deadline is sooner), and a batch query, which serves many
	// requests and so runs under none of their contexts, runs until the last of its
	// requests gives up. Default: 5s.
	Timeout time.Duration
	// Linger lets a batch query started while lookups come fast wait up to Linger
	// for more (internal/gather, Options.Linger). Default: 0 (never wait).
	Linger time.Duration
	// OnBatch, if set, is called with the number of distinct key ids of every batch
	// query as it is sent, for metrics. It runs on the batch's goroutine and must be
	// fast. Default: none.
	OnBatch func(size int)
}

// NewBatcher returns a Batcher looking keys up in s.
func NewBatcher(s *Store, opts BatcherOptions) *Batcher {
	if opts.Timeout <= 0 {
		opts.Timeout = 5 * time.Second
	}
	b := &Batcher{store: s, timeout: opts.Timeout, onBatch: opts.OnBatch}
	b.batches = gather.New(b.query, gather.Options{Lanes: opts.Lanes, MaxWait: opts.Timeout / 10, Inline: true, Linger: opts.Linger})
	return b
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
	// The deadline goes to the Gatherer, not into a context of its own: it costs a
	// pooled timer there, and a context.WithTimeout four allocations (gather.DoBy).
	rows, err := b.batches.DoBy(ctx, gather.Deadline(ctx, b.timeout), probe{keyID, sum})
	if err != nil && (err == ctx.Err() || err == context.DeadlineExceeded) {
		return Key{}, false, fmt.Errorf("looking up key: %w", err)
	}
	if err != nil {
		return Key{}, false, err // the batch's, already saying what failed
	}
	r, found := rows[keyID]
	k, ok := check(keyID, sum, r, found)
	return k, ok, nil
}

// query is the Batcher's gather.Flush: one lookup of the batch's distinct key ids and
// its digests, by the latest deadline of its requests (each has one: VerifyParsed
// bounds them by Timeout). Every request of the batch gets the live keys it found,
// by key id.
//
// A lookup that finds a lane free runs inline, on its request's goroutine (ctx is then
// the request's, not context.Background()): one goroutine hand-off less. It must end
// by the request's deadline, which pgx's cancelling does not promise (see
// RequestLookup), so it runs under a context of its own with that deadline and
// RequestLookup's mark, and not the request's cancellation: a client that goes away
// does not cut a lookup of a few hundred microseconds short.
func (b *Batcher) query(ctx context.Context, deadline time.Time, probes []probe) ([]map[string]row, error) {
	l := lookupOf(probes)
	b.queries.Add(1)
	b.lookups.Add(uint64(l.ids))
	if b.onBatch != nil {
		b.onBatch(l.ids)
	}
	if ctx != context.Background() {
		ctx = context.WithValue(context.Background(), requestLookupKey{}, true)
	}
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	rows, err := b.store.lookup(ctx, l)
	if err != nil {
		return nil, err
	}
	out := make([]map[string]row, len(probes))
	for i := range out {
		out[i] = rows
	}
	return out, nil
}

// requestLookupKey marks the context of a lookup run inline; see RequestLookup.
type requestLookupKey struct{}

// RequestLookup reports whether ctx is that of a lookup a Batcher runs on its
// request's own goroutine, which must end at ctx's deadline: the request answers when
// it does. A pgx connection's context watcher (pgconn.Config.BuildContextWatcherHandler)
// should then give the connection up at once, as pgx does by default, rather than ask
// PostgreSQL to cancel the query and wait for it, which a pool may prefer for other
// queries (caddymodule's does). Lookups of batches, which no request waits on
// directly, are not marked.
func RequestLookup(ctx context.Context) bool {
	marked, _ := ctx.Value(requestLookupKey{}).(bool)
	return marked
}

// distinct returns ids without repeats, in order of first appearance. A batch of one
// id, the common case when traffic is light, costs no allocation; a small one is
// checked by scanning what it has kept, a map only pays off beyond that.
func distinct(ids []string) []string {
	if len(ids) == 1 {
		return ids
	}
	out := make([]string, 0, len(ids))
	if len(ids) <= 32 {
	next:
		for _, id := range ids {
			for _, kept := range out {
				if kept == id {
					continue next
				}
			}
			out = append(out, id)
		}
		return out
	}
	seen := make(map[string]struct{}, len(ids))
	for _, id := range ids {
		if _, dup := seen[id]; !dup {
			seen[id] = struct{}{}
			out = append(out, id)
		}
	}
	return out
}
