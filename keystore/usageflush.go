package keystore

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/keygate/keygate/internal/pgfailover"
)

// Usage's flushes: how the counts Record makes reach usage_minutes, each request
// once.

// usageFlushSQL adds counts, and their units beyond one a request (extra), to
// usage_minutes, unless a flush of the same id ($1) was written before. The rows come sorted as the primary key (usageBatch), so that
// processes writing at once, and the roll-up, lock rows in one order.
const usageFlushSQL = `WITH flush AS (
	INSERT INTO usage_flushes (id) VALUES ($1) ON CONFLICT DO NOTHING RETURNING id)
INSERT INTO usage_minutes AS m (org_id, key_id, start, outcome, status, count, extra)
SELECT * FROM unnest($2::uuid[], $3::text[], $4::timestamptz[], $5::text[], $6::smallint[], $7::bigint[], $8::bigint[])
WHERE EXISTS (SELECT FROM flush)
ON CONFLICT (org_id, start, key_id, outcome, status) DO UPDATE
SET count = m.count + EXCLUDED.count, extra = m.extra + EXCLUDED.extra`

// usageBatch is the rows of one flush, as the columns of usageFlushSQL, with the
// flush's id.
type usageBatch struct {
	id       string
	orgs     []string
	keys     []string
	starts   []time.Time
	outcomes []string
	statuses []int16
	counts   []int64
	extras   []int64
}

// newUsageBatch returns the rows of m as a batch with a new id, sorted as
// usage_minutes' primary key, (org_id, start, key_id, outcome, status), with text
// compared byte by byte (COLLATE "C"). A lower-case UUID's text sorts as the uuid.
func newUsageBatch(m map[usageKey]*usageCount) *usageBatch {
	type row struct {
		k usageKey
		c *usageCount
	}
	rows := make([]row, 0, len(m))
	for k, c := range m {
		rows = append(rows, row{k, c})
	}
	slices.SortFunc(rows, func(a, b row) int {
		return cmp.Or(
			strings.Compare(a.c.orgID, b.c.orgID),
			cmp.Compare(a.k.minute, b.k.minute),
			strings.Compare(a.k.keyID, b.k.keyID),
			strings.Compare(a.k.outcome.String(), b.k.outcome.String()),
			cmp.Compare(a.k.status, b.k.status),
		)
	})
	n := len(rows)
	b := &usageBatch{
		id:   newFlushID(),
		orgs: make([]string, n), keys: make([]string, n), starts: make([]time.Time, n),
		outcomes: make([]string, n), statuses: make([]int16, n), counts: make([]int64, n),
		extras: make([]int64, n),
	}
	for i, r := range rows {
		b.orgs[i], b.keys[i], b.starts[i] = r.c.orgID, r.k.keyID, time.Unix(r.k.minute, 0).UTC()
		b.outcomes[i], b.statuses[i], b.counts[i] = r.k.outcome.String(), r.k.status, r.c.count
		b.extras[i] = r.c.extra
	}
	return b
}

// newFlushID returns a random UUID (version 4).
func newFlushID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// write sends b.
func (u *Usage) write(ctx context.Context, b *usageBatch) error {
	_, err := pgfailover.Exec(ctx, u.pool, pgfailover.Local, usageFlushSQL, b.id, b.orgs, b.keys, b.starts, b.outcomes, b.statuses, b.counts, b.extras)
	if err != nil {
		return fmt.Errorf("writing usage: %w", err)
	}
	return nil
}

// notWritten reports whether err, a failed write, surely wrote nothing: PostgreSQL
// refused the statement, or it was never sent. A write cut short by a timeout or a
// lost connection may have been made, or may still be made by a statement that runs
// on without its client.
func notWritten(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) || pgconn.SafeToRetry(err)
}

// Flush writes the counts held, and forgets them. First it sends again, each with its
// own id, the batches of earlier flushes that may or may not have been written: those
// that were are skipped by PostgreSQL, so no request counts twice. Then it writes the
// counts made since the last flush with one INSERT. A write that surely failed
// (notWritten) counts its rows again for the next flush; one that may have been made
// keeps its batch for the next flush to send again. The first failure ends the flush.
// Flushes take turns: a Flush waits for the one in progress, or for ctx.
func (u *Usage) Flush(ctx context.Context) error {
	if err := u.takeTurn(ctx); err != nil {
		return fmt.Errorf("writing usage: %w", err)
	}
	defer func() { <-u.flushing }()
	rows := 0
	err := u.resend(ctx, &rows)
	if err == nil {
		err = u.writePending(ctx, &rows)
	}
	if rows > 0 && u.opts.OnFlush != nil {
		u.opts.OnFlush(rows, err)
	}
	return err
}

// resend sends the batches that may or may not have been written, oldest first, until
// one fails. It adds the rows it sent to *rows. It must be called with the flush token.
func (u *Usage) resend(ctx context.Context, rows *int) error {
	for len(u.unsure) > 0 {
		b := u.unsure[0]
		*rows += len(b.orgs)
		if err := u.write(ctx, b); err != nil {
			return err
		}
		u.mu.Lock()
		u.unsure = u.unsure[1:]
		u.unsureRows -= len(b.orgs)
		u.mu.Unlock()
	}
	return nil
}

// writePending writes the counts made since the last flush, adding their rows to
// *rows. It must be called with the flush token.
func (u *Usage) writePending(ctx context.Context, rows *int) error {
	u.mu.Lock()
	if len(u.pending) == 0 {
		u.mu.Unlock()
		return nil
	}
	taken := u.pending
	u.pending, u.spare, u.inflight = u.spare, nil, taken
	u.mu.Unlock()

	b := newUsageBatch(taken)
	*rows += len(b.orgs)
	err := u.write(ctx, b)

	u.mu.Lock()
	switch {
	case err == nil:
	case notWritten(err):
		u.requeue(taken)
	default:
		u.unsure = append(u.unsure, b)
		u.unsureRows += len(b.orgs)
	}
	u.inflight, u.spare = nil, taken
	clear(taken)
	u.mu.Unlock()
	return err
}

// takeTurn waits for the flush in progress, if any, and takes the token. It fails
// only when ctx ends while it waits: a free token is taken even under a context that
// has ended. The caller gives the token back with <-u.flushing.
func (u *Usage) takeTurn(ctx context.Context) error {
	select {
	case u.flushing <- struct{}{}:
		return nil
	default:
	}
	select {
	case u.flushing <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// requeue counts the rows of a write that surely failed again, into the row of the
// same key if one was counted since, else into a row of their own. There is room for
// them: while they were in flight they counted against MaxPending (held). It must be
// called with mu held.
func (u *Usage) requeue(taken map[usageKey]*usageCount) {
	for k, c := range taken {
		if p, ok := u.pending[k]; ok {
			p.count += c.count
			p.extra += c.extra
			continue
		}
		u.pending[k] = c
	}
}

// held returns the rows u holds against MaxPending: those counted since the last
// flush, those of the flush in progress and those of the batches to send again. It
// must be called with mu held.
func (u *Usage) held() int { return len(u.pending) + len(u.inflight) + u.unsureRows }
