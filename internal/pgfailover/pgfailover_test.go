package pgfailover

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keygate/keygate/internal/testkit/testenv"
)

// TestAPoolHandsOutNoConnectionItsServerClosed: every connection of a pool ended by
// the server (pg_terminate_backend, as a restart or a failover ends them), then as
// many queries in a row as the pool held connections. With Follow each finds a live
// connection; without it, the dead ones fail their queries.
func TestAPoolHandsOutNoConnectionItsServerClosed(t *testing.T) {
	url := testenv.Getenv(t, "DATABASE_URL")
	for _, tc := range []struct {
		name     string
		follow   bool
		failures bool
	}{
		{"with Follow", true, false},
		{"without Follow", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const n = 4
			app := fmt.Sprintf("pgfailover-test-%d", time.Now().UnixNano())
			cfg, err := pgxpool.ParseConfig(url)
			if err != nil {
				t.Fatal(err)
			}
			cfg.ConnConfig.RuntimeParams["application_name"] = app
			cfg.MinConns, cfg.MaxConns = n, n
			cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false } // as the gateway's
			if tc.follow {
				Follow(cfg)
			}
			pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			sockets := holdAll(t, pool, n)

			admin, err := pgx.Connect(context.Background(), url)
			if err != nil {
				t.Fatal(err)
			}
			defer admin.Close(context.Background())
			if _, err := admin.Exec(context.Background(),
				`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, app); err != nil {
				t.Fatal(err)
			}
			// A backend leaves pg_stat_activity before its process closes its socket.
			testenv.Eventually(t, 30*time.Second, "the server's end of every connection closed", func() bool {
				for _, c := range sockets {
					if peek(c) == peekIdle {
						return false
					}
				}
				return true
			})

			failed := 0
			for range n {
				var one int
				if err := pool.QueryRow(context.Background(), `SELECT 1`).Scan(&one); err != nil {
					failed++
					t.Logf("query: %v", err)
				}
			}
			if (failed > 0) != tc.failures {
				t.Errorf("%d of %d queries failed after the server closed the pool's connections; want failures: %v", failed, n, tc.failures)
			}
		})
	}
}

// holdAll opens n connections of pool at once, gives them back idle, and returns
// their sockets.
func holdAll(t *testing.T, pool *pgxpool.Pool, n int) []net.Conn {
	t.Helper()
	conns := make([]*pgxpool.Conn, n)
	sockets := make([]net.Conn, n)
	for i := range conns {
		c, err := pool.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		conns[i], sockets[i] = c, socketOf(c.Conn().PgConn().Conn())
	}
	for _, c := range conns {
		c.Release()
	}
	return sockets
}

// TestPeekTellsIdleFromWaitingFromClosed: a loopback connection, idle, then with a
// byte from its peer, then closed by its peer. Peeking reads nothing: the byte is
// still there to read.
func TestPeekTellsIdleFromWaitingFromClosed(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			accepted <- c
		}
		close(accepted)
	}()
	client, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server := <-accepted
	if server == nil {
		t.Fatal("accept failed")
	}
	if got := peek(client); got != peekIdle {
		t.Errorf("idle: peek %d, want %d (idle)", got, peekIdle)
	}
	// pgconn may leave a goroutine blocked in Read on an idle connection (its
	// background reader, after a slow write): peeking beside it must not wait for it.
	read := make(chan byte)
	go func() {
		var b [1]byte
		client.Read(b[:])
		read <- b[0]
	}()
	testenv.Eventually(t, 10*time.Second, "the Read blocked", func() bool {
		return testenv.Goroutines("TestPeekTellsIdleFromWaitingFromClosed.func", "waitRead") > 0
	})
	peeked := make(chan peekResult)
	go func() { peeked <- peek(client) }()
	select {
	case got := <-peeked:
		if got != peekIdle {
			t.Errorf("idle, beside a blocked Read: peek %d, want %d (idle)", got, peekIdle)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("peek waited for a Read blocked on the connection")
	}
	if _, err := server.Write([]byte("R")); err != nil {
		t.Fatal(err)
	}
	if b := <-read; b != 'R' {
		t.Fatalf("the blocked Read got %q, want R", b)
	}
	if _, err := server.Write([]byte("N")); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the byte seen waiting", func() bool { return peek(client) == peekData })
	server.Close()
	var b [1]byte
	if _, err := client.Read(b[:]); err != nil || b[0] != 'N' {
		t.Fatalf("reading the byte after peeking: %q, %v", b[:], err)
	}
	testenv.Eventually(t, 10*time.Second, "the end seen", func() bool { return peek(client) == peekClosed })
}

// BenchmarkPeek is what Follow adds to each acquire of a live connection: one peek
// at an idle loopback socket.
func BenchmarkPeek(b *testing.B) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	go func() {
		if c, err := l.Accept(); err == nil {
			defer c.Close()
			c.Read(make([]byte, 1)) // until the client closes
		}
	}()
	client, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer client.Close()
	for b.Loop() {
		if peek(client) != peekIdle {
			b.Fatal("not idle")
		}
	}
}
