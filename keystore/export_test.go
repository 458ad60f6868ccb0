package keystore

// BatchStats counts a Batcher's work since it was made; for the tests' checks that
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
