package keystore

import (
	"context"
	"maps"
	"net/netip"
	"slices"
)

// BatchStats counts a Batcher's work since it was made. Tests check with it that
// batching happens.
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

// LookupAnySQL is the lookup as one `= ANY($1)` statement. The store sends it only for
// large batches. Benchmarks compare it with the store's statements.
var LookupAnySQL = lookupAnySQL

// Lookup runs s's lookup of ids (distinct key ids) presenting the digests sums, and
// returns the ids of the live keys it found, sorted.
func (s *Store) Lookup(ctx context.Context, ids []string, sums [][]byte) ([]string, error) {
	return s.LookupFrom(ctx, ids, sums, make([]netip.Addr, len(ids)))
}

// LookupFrom is Lookup of one batch whose requests came from addrs, by index.
func (s *Store) LookupFrom(ctx context.Context, ids []string, sums [][]byte, addrs []netip.Addr) ([]string, error) {
	probes := make([]probe, len(ids))
	for i := range ids {
		probes[i] = probe{id: ids[i], sum: [32]byte(sums[i]), addr: addrs[i].Unmap()}
	}
	rows, _, err := s.lookup(ctx, lookupOf(probes))
	return slices.Sorted(maps.Keys(rows)), err
}

// FenceReadings is the number of readings of the primary's position r has sent, its
// probes' included.
func (r *Reader) FenceReadings() uint64 { return r.fence.readings.Load() }

// StandbyQueries is the number of batch queries r's standbys have been sent.
func (r *Reader) StandbyQueries() (n uint64) {
	for _, s := range r.standbys {
		n += s.batcher.queries.Load()
	}
	return n
}

// LookupStatement returns the statement and arguments of the lookup of one batch of
// ids (distinct key ids) presenting the digests sums, as the store sends it.
func LookupStatement(ids []string, sums [][]byte) (string, []any) {
	probes := make([]probe, len(ids))
	for i := range ids {
		probes[i] = probe{id: ids[i], sum: [32]byte(sums[i])}
	}
	l := lookupOf(probes)
	return l.sql, l.args
}

// DeniedStatements are the second look's statements, of one key and of many.
var DeniedStatements = [2]string{deniedOneSQL, deniedAnySQL}
