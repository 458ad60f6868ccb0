package keystore_test

import (
	"context"
	"testing"

	"github.com/keygate/keygate/internal/benchcpu"
	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/schema/schematest"
)

// BenchmarkBatcherVerify verifies keys from 1, 4 and 32 goroutines at once through a
// Batcher over the real PostgreSQL; allocs/op is what one verification costs, batching
// included, cpu-µs/op this process's CPU per verification and pg-µs/op PostgreSQL's
// (benchcpu: run on a stack of its own, -benchtime 3s or more).
func BenchmarkBatcherVerify(b *testing.B) {
	pool, _ := schematest.NewPool(b)
	s := keystore.New(pool, mustFormat(b, "mon"))
	var org string
	if err := pool.QueryRow(context.Background(),
		`INSERT INTO orgs (name, plan) VALUES ('acme', 'pro') RETURNING id::text`).Scan(&org); err != nil {
		b.Fatal(err)
	}
	var keys []string
	for range 16 {
		_, full, err := s.Create(context.Background(), keystore.NewKey{OrgID: org, Name: "k", Role: keystore.RoleViewer})
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
}
