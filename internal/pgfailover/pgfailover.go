// Package pgfailover keeps a pgxpool on a PostgreSQL that fails over: a primary that
// dies and a standby promoted in its place, reached through one URL of several hosts
// with target_session_attrs (docs/operations.md, Failover). It knows nothing of
// keys or of Caddy; the gateway and the upstream both tune their pools with it.
//
// pgx already follows the promotion: a new connection tries the URL's hosts in
// turn and keeps the first whose session has the attributes asked for. What it
// does not do is give up the connections the dead primary left in the pool. Each
// would fail its next query, one request at a time, long after the new primary
// answers. Follow has the pool check a connection's socket each time it hands it
// out, and throw away one whose server has gone.
package pgfailover

import (
	"context"
	"crypto/tls"
	"net"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Follow tunes cfg so that the pool never hands out a connection whose server has
// closed it: after a crash, a failover, a restart or an administrator's
// pg_terminate_backend. The check (Gone) is one system call on the connection's
// socket and no round trip, so it runs on every acquire. A server that vanished
// without closing its end (a host cut off the network) is not seen this way; the
// query's own timeout finds it. A PrepareConn already in cfg still runs, after the
// check.
func Follow(cfg *pgxpool.Config) {
	next := cfg.PrepareConn
	cfg.PrepareConn = func(ctx context.Context, c *pgx.Conn) (bool, error) {
		if gone(ctx, c) {
			return false, nil // the pool destroys it and hands out another
		}
		if next != nil {
			return next(ctx, c)
		}
		return true, nil
	}
}

// gone reports whether c's server has gone. A connection with bytes waiting is
// asked a ping: an idle connection receives nothing unless its server is about to
// close it (a notice, then the end of the stream, as PostgreSQL sends when it
// shuts down at once), and the ping reads whatever came.
func gone(ctx context.Context, c *pgx.Conn) bool {
	switch peek(socketOf(c.PgConn().Conn())) {
	case peekClosed:
		return true
	case peekData:
		return c.Ping(ctx) != nil
	}
	return false
}

// socketOf returns the connection under TLS, whose socket holds the bytes.
func socketOf(conn net.Conn) net.Conn {
	if t, ok := conn.(*tls.Conn); ok {
		return t.NetConn()
	}
	return conn
}

// peekResult is what a look at a socket found.
type peekResult uint8

const (
	peekIdle   peekResult = iota // nothing waiting, or no way to tell
	peekData                     // bytes waiting
	peekClosed                   // the end of the stream or an error
)
