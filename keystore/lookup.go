package keystore

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Running one lookup's query, on the primary or on a standby, and reading its rows.

// lookup runs l, once more if the first attempt fails (see retryable). It returns the
// live keys it found, by key id: those whose digest it presented. On a standby's
// Store it also returns the position the standby had replayed before the lookup's
// snapshot was taken (replayedBefore); on the primary's, 0.
func (s *Store) lookup(ctx context.Context, l lookup) (map[string]row, LSN, error) {
	out, replayed, err := s.lookupOnce(ctx, l)
	if retryable(ctx, err) {
		out, replayed, err = s.lookupOnce(ctx, l)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("looking up keys: %w", err)
	}
	return out, replayed, nil
}

func (s *Store) lookupOnce(ctx context.Context, l lookup) (map[string]row, LSN, error) {
	if s.standby {
		return s.lookupReplayed(ctx, l)
	}
	rows, err := s.pool.Query(ctx, l.sql, l.args...)
	if err != nil {
		return nil, 0, err
	}
	out, err := scanLookup(rows, l.ids)
	return out, 0, err
}

// scanLookup reads the rows of a lookup of ids key ids.
func scanLookup(rows pgx.Rows, ids int) (map[string]row, error) {
	out := make(map[string]row, ids)
	// d holds every column of a row: one allocation for all of them, where separate
	// variables, each escaping through the scan's arguments, would be one each.
	var d struct {
		id, org, role   string
		hash            []byte
		limit, orgLimit int
		windows         [NumWindows]int
		quota           int64
		cidrs           []netip.Prefix
		scopes          pgtype.Text
	}
	_, err := pgx.ForEachRow(rows, []any{&d.id, &d.org, &d.role, &d.hash, &d.limit,
		&d.windows[PerSecond], &d.windows[PerHour], &d.windows[PerDay], &d.orgLimit, &d.quota, &d.cidrs, &d.scopes}, func() error {
		out[d.id] = row{orgID: d.org, role: Role(d.role), hash: d.hash, rateLimit: d.limit, windows: d.windows, orgRateLimit: d.orgLimit,
			monthlyQuota: d.quota, cidrs: d.cidrs, scopes: splitScopes(d.scopes)}
		d.cidrs = nil // the next row's scan makes its own
		return nil
	})
	return out, err
}

// splitScopes returns the scopes of a lookup's row, which sends them separated by
// spaces, and nil for NULL: a key without scopes. Scanning the list as text rather than
// as an array spares every lookup the planning of an array scan, a few allocations, and
// costs a key without scopes nothing. A scope never holds a space (ValidScopeName).
func splitScopes(t pgtype.Text) []string {
	if !t.Valid {
		return nil
	}
	return strings.Fields(t.String)
}

// row is what a lookup finds of a live key.
type row struct {
	orgID        string
	role         Role
	hash         []byte
	rateLimit    int
	windows      [NumWindows]int
	orgRateLimit int
	monthlyQuota int64
	cidrs        []netip.Prefix
	scopes       []string
}

// retryable reports whether a failed lookup should be tried once more. The lookup is a
// read, so trying again is always safe. A connection that died under its query (a
// restart, a failover) fails it; the next is another, and the pool hands out none its
// server has closed (pgfailover.Follow). A lookup whose context has ended, or a
// standby found promoted, is not tried again.
func retryable(ctx context.Context, err error) bool {
	return err != nil && ctx.Err() == nil && !errors.Is(err, errNotStandby)
}

// replayedSQL reads how far a standby has replayed, in bytes. On a server that is not
// a standby it is NULL.
const replayedSQL = `SELECT (pg_last_wal_replay_lsn() - '0/0')::int8`

// errNotStandby is a server of database_read_urls that is not in recovery: a primary,
// or a standby promoted since. Its position cannot be compared with the primary's,
// and it may have lost commits of the primary it replaced, so it answers no lookup.
var errNotStandby = errors.New("not a standby: pg_last_wal_replay_lsn() is NULL")

// replayedLSN reads how far the standby of pool has replayed. A server that is not a
// standby is errNotStandby.
func replayedLSN(ctx context.Context, pool *pgxpool.Pool) (LSN, error) {
	var replayed *int64
	if err := pool.QueryRow(ctx, replayedSQL).Scan(&replayed); err != nil {
		return 0, err
	}
	if replayed == nil {
		return 0, errNotStandby
	}
	return LSN(*replayed), nil
}

// lookupReplayed is lookupOnce on a standby. It sends the read of the replayed
// position and the lookup in one pipeline, the read first. So the lookup's snapshot
// is taken after that position was replayed and reflects every commit up to it.
func (s *Store) lookupReplayed(ctx context.Context, l lookup) (map[string]row, LSN, error) {
	b := &pgx.Batch{}
	b.Queue(replayedSQL)
	b.Queue(l.sql, l.args...)
	res := s.pool.SendBatch(ctx, b)
	defer res.Close()
	var replayed *int64
	if err := res.QueryRow().Scan(&replayed); err != nil {
		return nil, 0, err
	}
	rows, err := res.Query()
	if err != nil {
		return nil, 0, err
	}
	out, err := scanLookup(rows, l.ids)
	if err != nil {
		return nil, 0, err
	}
	if replayed == nil {
		return nil, 0, errNotStandby
	}
	return out, LSN(*replayed), res.Close()
}
