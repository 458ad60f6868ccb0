// Package pgfailover keeps keygate's data through a PostgreSQL failover: a primary
// that dies and a standby promoted in its place, reached through one URL of several
// hosts with target_session_attrs (docs/operations.md, Failover). It knows nothing of
// keys or of Caddy; the gateway and the upstream both use it, for two things.
//
// Their pools follow the promotion. pgx already opens new connections on the host
// that takes writes. What it does not do is give up the connections the dead primary
// left in the pool: each would fail its next query, one request at a time, long
// after the new primary answers. Follow has the pool check a connection's socket as
// it hands it out, and throw away one whose server has gone.
//
// Their writes say how they commit (Commit): those that take access away wait for a
// synchronous standby, so that a failover cannot undo them once acknowledged; the
// others never wait on one.
package pgfailover

import (
	"context"
	"crypto/tls"
	"net"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Follow tunes cfg so that the pool never hands out a connection whose server has
// closed it: after a crash, a failover, a restart or an administrator's
// pg_terminate_backend. The check (gone) is one system call on the connection's
// socket and no round trip. It skips a connection given back less than peekAfter
// ago, as on a busy pool: its server answered it a moment before, and a server that
// died since cannot have been replaced yet. A server that vanished without closing
// its end (a host cut off the network) is not seen this way; the query's own timeout
// finds it. It must be called after cfg's ShouldPing is set: it keeps it, or
// pgxpool's default (a ping after a second idle), for the connections it finds live.
func Follow(cfg *pgxpool.Config) {
	next := cfg.ShouldPing
	if next == nil {
		next = func(_ context.Context, p pgxpool.ShouldPingParams) bool { return p.IdleDuration > time.Second }
	}
	cfg.ShouldPing = func(ctx context.Context, p pgxpool.ShouldPingParams) bool {
		// A ping of a connection its server closed fails: the pool destroys it and
		// hands out another.
		return (p.IdleDuration >= peekAfter && gone(p.Conn)) || next(ctx, p)
	}
}

// peekAfter is how long a connection must have been idle for Follow to look at it.
const peekAfter = time.Millisecond

// gone reports whether c's server has gone, or may have: the end of its stream is
// waiting on its socket, or bytes are. An idle connection receives nothing unless its
// server is about to close it (a notice, then the end of the stream, as PostgreSQL
// sends when it shuts down at once); the ping that follows reads whatever came.
func gone(c *pgx.Conn) bool {
	return peek(socketOf(c.PgConn().Conn())) != peekIdle
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
