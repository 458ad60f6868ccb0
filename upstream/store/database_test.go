package store

import (
	"testing"
	"time"
)

func TestPoolConfigBoundsWaitsAndSizesThePool(t *testing.T) {
	for _, tc := range []struct {
		url      string
		maxConns int32
		want     int32
		wantMin  int32
	}{
		{"postgres://u@127.0.0.1/db", 0, DefaultMaxConns, defaultMinConns},
		{"postgres://u@127.0.0.1/db?pool_max_conns=3", 0, 3, 3},
		{"postgres://u@127.0.0.1/db?pool_max_conns=3", 2, 2, 2},
		{"postgres://u@127.0.0.1/db?pool_min_conns=1", 0, DefaultMaxConns, 1},
	} {
		cfg, err := PoolConfig(tc.url, tc.maxConns, 3*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.MaxConns != tc.want || cfg.MinConns != tc.wantMin {
			t.Errorf("%s with maxConns %d: MaxConns = %d, MinConns = %d, want %d and %d",
				tc.url, tc.maxConns, cfg.MaxConns, cfg.MinConns, tc.want, tc.wantMin)
		}
		if _, ok := cfg.ConnConfig.Tracer.(timeoutTracer); !ok || cfg.ConnConfig.ConnectTimeout != 3*time.Second {
			t.Errorf("%s: tracer %T, connect timeout %v; want the timeout tracer and 3s", tc.url, cfg.ConnConfig.Tracer, cfg.ConnConfig.ConnectTimeout)
		}
	}
}
