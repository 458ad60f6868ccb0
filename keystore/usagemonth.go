package keystore

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// The month's units of an organisation's requests, for a monthly quota, which counts
// each request at its route's cost as every budget does: what the usage record holds
// (Store.MonthUsed) and what a Usage holds and has not written (Pending).

// monthOutcomes are the outcomes a monthly quota counts (inMonth in the outcomes
// table): the requests that passed every budget. An SQL array literal.
var monthOutcomes = func() string {
	var names []string
	for _, o := range outcomes {
		if o.inMonth {
			names = append(names, o.name)
		}
	}
	return "'{" + strings.Join(names, ",") + "}'"
}()

// countsInMonth reports whether a row of the outcome named name counts in MonthUsed.
func countsInMonth(name string) bool {
	for _, o := range outcomes {
		if o.name == name {
			return o.inMonth
		}
	}
	return false
}

// Pending returns the units of the requests of the org orgID in the UTC month of month
// that u has counted and not written yet, in the outcomes MonthUsed counts. A flush in progress,
// and a batch that may or may not have been written, count as not written. It walks
// every row u holds with Record's lock held: it is for a rare read, such as a
// quota's re-seed.
func (u *Usage) Pending(orgID string, month time.Time) int64 {
	if u == nil {
		return 0
	}
	from, to := monthBounds(month)
	lo, hi := from.Unix(), to.Unix()
	orgID = strings.ToLower(orgID)
	u.mu.Lock()
	defer u.mu.Unlock()
	var n int64
	for _, m := range []map[usageKey]*usageCount{u.pending, u.inflight} {
		for k, c := range m {
			if c.orgID == orgID && k.minute >= lo && k.minute < hi && countsInMonth(k.outcome.String()) {
				n += c.count + c.extra
			}
		}
	}
	for _, b := range u.unsure {
		for i, org := range b.orgs {
			if org == orgID && !b.starts[i].Before(from) && b.starts[i].Before(to) && countsInMonth(b.outcomes[i]) {
				n += b.counts[i] + b.extras[i]
			}
		}
	}
	return n
}

// MonthUsed returns what the record holds of the org orgID in the UTC month of month
// (Store.MonthUsed), plus what u has counted and not written yet (Pending). It waits
// for a flush in progress, so that a request is counted neither twice nor never by
// this process. What other processes hold in memory is not in it.
func (u *Usage) MonthUsed(ctx context.Context, orgID string, month time.Time) (int64, error) {
	if err := u.takeTurn(ctx); err != nil {
		return 0, fmt.Errorf("reading usage: %w", err)
	}
	defer func() { <-u.flushing }()
	n, err := monthUsed(ctx, u.pool, orgID, month)
	if err != nil {
		return 0, err
	}
	return n + u.Pending(orgID, month), nil
}

// MonthUsed returns the units of the requests of the org orgID in the UTC month of
// month that the usage record holds (count + extra), in the outcomes a monthly quota
// counts (me, proxied and forbidden: the requests that passed every budget). It reads usage_days and the part
// of usage_minutes not yet rolled up into it, in one statement, so that a roll-up in
// progress neither hides nor doubles a request.
func (s *Store) MonthUsed(ctx context.Context, orgID string, month time.Time) (int64, error) {
	return monthUsed(ctx, s.pool, orgID, month)
}

// monthUsedSQL sums the units of the month's days and of the minutes not rolled up
// yet.
var monthUsedSQL = `SELECT (
	(SELECT coalesce(sum(count + extra), 0) FROM usage_days
	 WHERE org_id = $1 AND start >= $2 AND start < $3 AND outcome = ANY(` + monthOutcomes + `::text[]))
	+ (SELECT coalesce(sum(count - rolled + extra - extra_rolled), 0) FROM usage_minutes
	 WHERE org_id = $1 AND start >= $2 AND start < $3 AND (count > rolled OR extra > extra_rolled)
	 AND outcome = ANY(` + monthOutcomes + `::text[]))
)::bigint`

func monthUsed(ctx context.Context, pool *pgxpool.Pool, orgID string, month time.Time) (int64, error) {
	if !validUUID(orgID) {
		return 0, nil // no org has that id; the cast would fail the statement
	}
	from, to := monthBounds(month)
	var n int64
	if err := pool.QueryRow(ctx, monthUsedSQL, orgID, from, to).Scan(&n); err != nil {
		return 0, fmt.Errorf("reading usage: %w", err)
	}
	return n, nil
}

// monthBounds returns the start of t's UTC month and of the next.
func monthBounds(t time.Time) (from, to time.Time) {
	t = t.UTC()
	from = time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
	return from, from.AddDate(0, 1, 0)
}
