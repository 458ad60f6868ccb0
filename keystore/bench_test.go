package keystore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keygate/keygate/internal/testkit/benchcpu"
	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/keystore/keystoretest"
	"github.com/keygate/keygate/schema/schematest"
)

// BenchmarkBatcherVerify verifies keys from 1, 4 and 32 goroutines at once, through a
// Batcher over the real PostgreSQL, for keys without scopes and with two. allocs/op is
// what one verification costs, batching included. cpu-µs/op is this process's CPU per
// verification, and pg-µs/op is PostgreSQL's. Run it on a stack of its own, with
// -benchtime 3s or more (see internal/testkit/benchcpu).
func BenchmarkBatcherVerify(b *testing.B) {
	for _, kind := range []struct {
		name   string
		scopes []string
	}{{"unscoped", nil}, {"scoped", []string{"monitors:read", "monitors:write"}}} {
		b.Run(kind.name, func(b *testing.B) {
			s, pool, org := newStore(b, "pro")
			var keys []string
			for range 16 {
				_, full, err := s.Create(context.Background(), keystore.NewKey{OrgID: org, Name: "k", Role: keystore.RoleAdmin, Scopes: kind.scopes})
				if err != nil {
					b.Fatal(err)
				}
				keys = append(keys, full)
			}
			v := keystore.NewBatcher(s, keystore.BatcherOptions{})
			pg, err := benchcpu.Postgres(pool)
			if err != nil {
				b.Fatal(err)
			}
			benchcpu.Run(b, func(b *testing.B, i int) {
				if _, ok, err := v.Verify(context.Background(), keys[i%len(keys)]); !ok || err != nil {
					b.Errorf("Verify = %v, %v", ok, err)
				}
			}, benchcpu.Self(), pg)
		})
	}
}

// BenchmarkReaderVerify verifies one key from 1, 4 and 32 goroutines at once, on the
// primary through a Batcher, and through a Reader whose lookups the stack's fast
// standby answers (scripts/stack.sh up-standbys), each fenced on the primary.
// cpu-µs/op is this process's CPU per verification, pg-µs/op the primary's and
// standby-µs/op the standby's: what moving the lookups to a standby costs the gateway
// and saves the primary. Run it on a stack of its own, with -benchtime 3s or more.
func BenchmarkReaderVerify(b *testing.B) {
	s, pool, org := newStore(b, "pro")
	_, key, err := s.Create(context.Background(), keystore.NewKey{OrgID: org, Name: "k", Role: keystore.RoleAdmin})
	if err != nil {
		b.Fatal(err)
	}
	standby := standbyPool(b, pool, "DATABASE_STANDBY_FAST_URL") // replayed what the primary holds
	pg, err := benchcpu.Postgres(pool)
	if err != nil {
		b.Fatal(err)
	}
	sb, err := benchcpu.Postgres(standby)
	if err != nil {
		b.Fatal(err)
	}
	sb.Unit = "standby-µs/op"
	for _, via := range []string{"primary", "standby"} {
		b.Run(via, func(b *testing.B) {
			var v interface {
				Verify(context.Context, string) (keystore.Key, bool, error)
			}
			primary := keystore.NewBatcher(s, keystore.BatcherOptions{})
			v = primary
			if via == "standby" {
				r := keystore.NewReader(primary, pool, []*pgxpool.Pool{standby}, keystore.ReaderOptions{})
				defer r.Close()
				v = r
			}
			benchcpu.Run(b, func(b *testing.B, i int) {
				if _, ok, err := v.Verify(context.Background(), key); !ok || err != nil {
					b.Errorf("Verify = %v, %v", ok, err)
				}
			}, benchcpu.Self(), pg, sb)
		})
	}
}

// BenchmarkLookup reports the PostgreSQL CPU of one key lookup, for batches of 1 and 8
// distinct ids. pg-µs/op is the CPU of every process of the server over the run,
// divided by lookups. The api_keys table holds either a few keys, not yet analysed, as
// in a new deployment, or 5000 analysed ones, as in a running one.
//
// The same run measures two more, for comparison. "any" is the lookup as one
// `= ANY($1)` statement for every batch, which PostgreSQL plans anew on every
// execution once api_keys is analysed (see lookupStatement). "select1" is a round trip
// that does nothing, the floor of any lookup. The machine is noisy: compare ratios
// within one run. pg-µs/op counts in clock ticks of 10ms (internal/testkit/benchcpu), so run
// with -benchtime 3s or more.
func BenchmarkLookup(b *testing.B) {
	for _, table := range []struct {
		keys    int
		analyze bool
	}{{16, false}, {5000, true}} {
		pool, _ := schematest.NewPool(b)
		ids, sums := insertKeys(b, pool, table.keys, table.analyze)
		s := keystore.New(pool, keystoretest.Format(b, "mon"))
		pg, err := benchcpu.Postgres(pool)
		if err != nil {
			b.Fatal(err)
		}
		for _, n := range []int{1, 8} {
			batch, batchSums := ids[:n], sums[:n]
			shapes := []struct {
				name   string
				lookup func(context.Context) (int, error)
			}{
				{"store", func(ctx context.Context) (int, error) {
					found, err := s.Lookup(ctx, batch, batchSums)
					return len(found), err
				}},
				{"any", func(ctx context.Context) (int, error) {
					return countRows(ctx, pool, keystore.LookupAnySQL, batch, batchSums)
				}},
				{"select1", func(ctx context.Context) (int, error) {
					return countRows(ctx, pool, "SELECT 1 FROM generate_series(1, $1)", n)
				}},
			}
			for _, shape := range shapes {
				b.Run(fmt.Sprintf("keys=%d/ids=%d/%s", table.keys, n, shape.name), func(b *testing.B) {
					ctx := context.Background()
					lookup := func() {
						if found, err := shape.lookup(ctx); found != n || err != nil {
							b.Fatalf("lookup found %d of %d keys, %v", found, n, err)
						}
					}
					for range 20 { // past the custom plans PostgreSQL starts a statement with
						lookup()
					}
					before := serverCPU(b, pg)
					b.ResetTimer()
					for range b.N {
						lookup()
					}
					b.StopTimer()
					b.ReportMetric(float64((serverCPU(b, pg)-before).Nanoseconds())/1e3/float64(b.N), pg.Unit)
				})
			}
		}
	}
}

// insertKeys inserts n live keys of one organisation straight into api_keys. It
// returns their key ids and stored digests. With analyze, the table is vacuumed and
// analysed, as autovacuum would have done. So no autovacuum runs during the benchmark.
func insertKeys(b *testing.B, pool *pgxpool.Pool, n int, analyze bool) ([]string, [][]byte) {
	b.Helper()
	ctx := context.Background()
	var org string
	if err := pool.QueryRow(ctx, `INSERT INTO orgs (name, plan) VALUES ('acme', 'pro') RETURNING id::text`).Scan(&org); err != nil {
		b.Fatal(err)
	}
	rows, err := pool.Query(ctx, `INSERT INTO api_keys (key_id, org_id, name, role, secret_hash)
SELECT 'benchkey' || lpad(i::text, 14, '0'), $1, 'k', 'Viewer', sha256(i::text::bytea)
FROM generate_series(1, $2) AS i RETURNING key_id, secret_hash`, org, n)
	if err != nil {
		b.Fatal(err)
	}
	var (
		ids  []string
		sums [][]byte
		id   string
		sum  []byte
	)
	if _, err := pgx.ForEachRow(rows, []any{&id, &sum}, func() error {
		ids, sums = append(ids, id), append(sums, sum)
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	if analyze {
		if _, err := pool.Exec(ctx, `VACUUM ANALYZE api_keys, orgs, plans`); err != nil {
			b.Fatal(err)
		}
	}
	return ids, sums
}

// countRows runs sql with args and returns how many rows it answered.
func countRows(ctx context.Context, pool *pgxpool.Pool, sql string, args ...any) (int, error) {
	rows, _ := pool.Query(ctx, sql, args...)
	n := 0
	for rows.Next() {
		n++
	}
	return n, rows.Err()
}

// serverCPU reads a server's CPU so far through probe.
func serverCPU(b *testing.B, probe benchcpu.Probe) time.Duration {
	b.Helper()
	d, err := probe.Read()
	if err != nil {
		b.Fatal(err)
	}
	return d
}
