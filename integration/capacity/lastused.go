package capacity

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keygate/keygate/internal/testkit/benchcpu"
	"github.com/keygate/keygate/keystore"
)

// LastUsedWrites describes a measurement of the last_used_at writes: one
// keystore.LastUsed, as a gateway process has, records Sizes[i] distinct keys of Seed's
// among Keys and flushes them, again and again with other keys, until it has written
// at least PerSize keys of that size (and flushed twice).
type LastUsedWrites struct {
	DatabaseURL string
	Keys        int
	Sizes       []int
	PerSize     int
}

// Flushes is what the flushes of one size cost.
type Flushes struct {
	IDs, Flushes int
	// Wall and Postgres are the flushes' time and PostgreSQL's CPU time, in all.
	Wall, Postgres time.Duration
}

// Run measures every size of w in turn.
func (w LastUsedWrites) Run(ctx context.Context) ([]Flushes, error) {
	pool, err := pgxpool.New(ctx, w.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("connecting to postgres: %w", err)
	}
	defer pool.Close()
	pg, err := benchcpu.Postgres(pool)
	if err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0))
	order := rng.Perm(w.Keys)
	next := 0
	var out []Flushes
	for _, n := range w.Sizes {
		if n > w.Keys {
			return out, fmt.Errorf("%d keys to flush of %d", n, w.Keys)
		}
		f := Flushes{IDs: n}
		for f.Flushes < 2 || f.Flushes*n < w.PerSize {
			lu := keystore.NewLastUsed(pool, keystore.LastUsedOptions{MaxPending: n})
			for range n {
				if next == len(order) {
					next = 0
				}
				lu.Record(KeyID(order[next]))
				next++
			}
			before, err := pg.Read()
			if err != nil {
				return out, err
			}
			start := time.Now()
			if err := lu.Flush(ctx); err != nil {
				return out, err
			}
			f.Wall += time.Since(start)
			after, err := pg.Read()
			if err != nil {
				return out, err
			}
			f.Postgres += after - before
			f.Flushes++
		}
		out = append(out, f)
	}
	return out, nil
}
