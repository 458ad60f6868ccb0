// Package capacity is for benchmarks only: it measures how much CPU PostgreSQL and
// Redis spend per key lookup and per count when gateway processes drive them, for
// `make bench`'s capacity sections (scripts/bench/capacity.sh) and the model in
// docs/scaling.md.
//
// A measurement runs a Runner's worker processes, each one gateway process's worth
// of clients: a keystore.Batcher on a pool of its own for lookups (Lookups), a
// limiter.Redis with pipelining on a client of its own for counts (Counts). Each
// worker runs W goroutines in a closed loop, so a Batcher's batches and a pipeline's
// rounds grow with W as a gateway's do with its load. Over a window of each level the
// Runner reads the servers' CPU time (internal/testkit/benchcpu) and the workers report their
// operations, round trips, CPU time and latencies; the report divides the one by the
// other. CPU per operation carries to bigger machines and holds on a busy one,
// operations per second do neither.
//
// Seed fills api_keys quickly, in SQL, with keys whose secrets the workers can
// compute (FullKey); LastUsedWrites measures the last_used_at writes.
package capacity
