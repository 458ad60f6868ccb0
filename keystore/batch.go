package keystore

import (
	"context"
	"fmt"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/keygate/keygate/internal/gather"
)

// Batcher verifies keys like Store.Verify, but gathers the lookups of concurrent
// requests into one query. Under load, PostgreSQL then answers one statement for many
// requests (lookupOf chooses it by the batch's size). The gathering is
// internal/gather's; a Batcher adds the query.
//
// Every answer comes from a query that started after the request did. So a key revoked
// before a request starts is refused on that request. Freshness, in the package doc of
// internal/gather, tells why batching keeps this.
//
// With one lane, one batch is in flight at a time. More lanes keep several in flight.
// A batch that has waited a tenth of Timeout for a lane goes out on its own. So a slow
// query in flight costs the next batch at most that, on top of its own query. A
// PostgreSQL answering within the timeout does not turn the next batch into 503s. A
// request alone in its batch runs its query itself, on its own goroutine (see query).
type Batcher struct {
	store   *Store
	timeout time.Duration
	onBatch func(size int)                 // BatcherOptions.OnBatch; may be nil
	batches *gather.Gatherer[probe, found] // a presented key in, its batch's live keys out

	queries, lookups atomic.Uint64 // for tests, through export_test.go
}

// BatcherOptions tunes a Batcher. The zero value is usable.
type BatcherOptions struct {
	// Lanes is the number of batch queries that may be in flight at once. Default: 1.
	Lanes int
	// Timeout bounds each lookup. A request waits at most Timeout for its answer, less
	// if its context's deadline is sooner. A batch query serves many requests, so it
	// runs under none of their contexts. It runs until the last of its requests gives
	// up. Default: 5s.
	Timeout time.Duration
	// Linger lets a batch query started while lookups come fast wait up to Linger for
	// more (gather.Options.Linger in internal/gather). Default: 0 (never wait).
	Linger time.Duration
	// OnBatch, if set, is called with the number of distinct key ids of every batch
	// query as it is sent, for metrics. It runs on the batch's goroutine, so it must
	// be fast. Default: none.
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
// before the batch answers, Verify returns ctx's error: a "broken", not a "rejected".
func (b *Batcher) Verify(ctx context.Context, presented string) (Key, bool, error) {
	keyID, secret, ok := b.store.format.Parse(presented)
	if !ok {
		return Key{}, false, nil
	}
	return b.VerifyParsed(ctx, keyID, secret, netip.Addr{})
}

// VerifyParsed is Verify for a key that Format.Parse has already split, asked from
// from; see Store.VerifyParsed.
func (b *Batcher) VerifyParsed(ctx context.Context, keyID, secret string, from netip.Addr) (Key, bool, error) {
	// The deadline goes to the Gatherer, not into a context of its own: see
	// gather.DoBy.
	k, ok, _, err := b.verifyBy(ctx, gather.Deadline(ctx, b.timeout), keyID, secret, from, nil)
	return k, ok, err
}

// verifyBy is VerifyParsed by deadline, with the Fence's reading rd sent as its batch
// is (nil: none). It also returns the position a standby's batch had replayed before
// its lookup (Store.lookup); 0 on the primary.
func (b *Batcher) verifyBy(ctx context.Context, deadline time.Time, keyID, secret string, from netip.Addr, rd *reading) (Key, bool, LSN, error) {
	sum := HashSecret(secret)
	f, err := b.batches.DoBy(ctx, deadline, probe{keyID, sum, from.Unmap(), rd})
	if err != nil && (err == ctx.Err() || err == context.DeadlineExceeded) {
		return Key{}, false, 0, fmt.Errorf("looking up key: %w", err)
	}
	if err != nil {
		return Key{}, false, 0, err // the batch's, already saying what failed
	}
	r, live := f.rows[keyID]
	k, ok := check(keyID, sum, r, live)
	return k, ok, f.replayed, nil
}

// found is what a batch's lookup found: the live keys by key id, and on a standby
// the position it had replayed before the lookup.
type found struct {
	rows     map[string]row
	replayed LSN
}

// query is the Batcher's gather.Flush: one lookup of the batch's distinct key ids and
// their digests.
// Every request of the batch gets the live keys it found, by key id. The lookup runs
// by the latest deadline of the batch's requests. Each has one: VerifyParsed bounds
// them by Timeout.
//
// A lookup alone in its batch runs inline, on its request's goroutine. It must end by
// the request's deadline, which pgx's cancelling does not promise (see RequestLookup).
// So it runs under a context with that deadline and RequestLookup's mark. It does not
// take the request's cancellation: a client that goes away does not cut a lookup of a
// few hundred microseconds short.
func (b *Batcher) query(_ context.Context, deadline time.Time, inline bool, probes []probe) ([]found, error) {
	var sent *reading
	for _, p := range probes {
		if p.reading != nil && p.reading != sent {
			sent = p.reading
			sent.send()
		}
	}
	l := lookupOf(probes)
	b.queries.Add(1)
	b.lookups.Add(uint64(l.ids))
	if b.onBatch != nil {
		b.onBatch(l.ids)
	}
	ctx := context.Background()
	if inline {
		ctx = context.WithValue(ctx, requestLookupKey{}, true)
	}
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	rows, replayed, err := b.store.lookup(ctx, l)
	if err != nil {
		return nil, err
	}
	out := make([]found, len(probes))
	for i := range out {
		out[i] = found{rows, replayed}
	}
	return out, nil
}

// requestLookupKey marks the context of a lookup run inline; see RequestLookup.
type requestLookupKey struct{}

// RequestLookup reports whether ctx is that of a lookup a Batcher runs on its
// request's own goroutine. Such a lookup must end at ctx's deadline: the request
// answers when it does. A pgx connection's context watcher
// (pgconn.Config.BuildContextWatcherHandler) should then give the connection up at
// once, as pgx does by default. A pool may prefer, for other queries, to ask
// PostgreSQL to cancel the query and wait for it; caddymodule's does. The lookups of
// batches, which no request waits on directly, are not marked.
func RequestLookup(ctx context.Context) bool {
	marked, _ := ctx.Value(requestLookupKey{}).(bool)
	return marked
}

// distinct returns ids without repeats, in order of first appearance. A batch of one
// id, the common case under light traffic, costs no allocation. A small batch is
// checked by scanning what it has kept. A map only pays off beyond that.
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
