// Package schematest gives tests a fresh, migrated PostgreSQL database of their own on
// the server named by DATABASE_URL (started by scripts/stack.sh under `make test`).
package schematest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keygate/keygate/internal/testkit/latencyproxy"
	"github.com/keygate/keygate/internal/testkit/testenv"
	"github.com/keygate/keygate/schema"
)

// URL returns DATABASE_URL, failing the test when it is not set: these tests need a
// real PostgreSQL and are run through `make test`, which starts one.
func URL(t testing.TB) string {
	t.Helper()
	return testenv.Getenv(t, "DATABASE_URL")
}

// NewDatabase creates an empty database with a random name, applies the migrations to
// it, and drops it when the test ends. It returns the new database's URL.
func NewDatabase(t testing.TB) string {
	t.Helper()
	base := URL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	name := "test_" + hex.EncodeToString(b[:])
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatalf("connecting to postgres: %v", err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("creating database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, base)
		if err != nil {
			t.Logf("connecting to postgres to drop %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Logf("dropping %s: %v", name, err)
		}
	})

	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("parsing DATABASE_URL: %v", err)
	}
	u.Path = "/" + name
	if err := schema.Migrate(ctx, u.String()); err != nil {
		t.Fatalf("migrating %s: %v", name, err)
	}
	return u.String()
}

// NewPool returns a pool on a fresh database (see NewDatabase), closed when the test ends.
func NewPool(t testing.TB) (*pgxpool.Pool, string) {
	t.Helper()
	u := NewDatabase(t)
	pool, err := pgxpool.New(context.Background(), u)
	if err != nil {
		t.Fatalf("opening pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool, u
}

// UnreachablePool returns a pool pointed at a loopback port nobody listens on, closed
// when the test ends: every query fails to connect, as against a PostgreSQL that is down.
func UnreachablePool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig("postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	return OpenPool(t, cfg)
}

// OpenPool returns a pool made from cfg, closed when the test ends, for a test that
// tunes the pool as the program under test tunes its own.
func OpenPool(t testing.TB, cfg *pgxpool.Config) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("opening pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Proxied points cfg at a latencyproxy in front of the server cfg names, for a test
// that makes that server slow or hung without touching it, and returns the proxy,
// closed when the test ends.
func Proxied(t testing.TB, cfg *pgxpool.Config) *latencyproxy.Proxy {
	t.Helper()
	p, err := latencyproxy.Start(net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	if err != nil {
		t.Fatalf("starting a latency proxy: %v", err)
	}
	t.Cleanup(p.Close)
	host, port, _ := net.SplitHostPort(p.Addr())
	n, _ := strconv.Atoi(port)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(n)
	return p
}
