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
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The outcomes of the usage record: the gateway's decisions for a request whose key it
// identified, named as in the keygate_requests_total metric (docs/operations.md).
const (
	OutcomeMe                 = "me"
	OutcomeProxied            = "proxied"
	OutcomeRateLimited        = "rate_limited"
	OutcomeQuotaExceeded      = "quota_exceeded"
	OutcomeForbidden          = "forbidden"
	OutcomeFeatureGated       = "feature_gated"
	OutcomeLimiterUnavailable = "limiter_unavailable"
	OutcomeIPDenied           = "ip_denied"
)

// usageOutcomes are the outcomes Record accepts, by their index in a usageKey.
var usageOutcomes = [...]string{
	OutcomeMe, OutcomeProxied, OutcomeRateLimited, OutcomeQuotaExceeded,
	OutcomeForbidden, OutcomeFeatureGated, OutcomeLimiterUnavailable, OutcomeIPDenied,
}

// outcomeIndex returns the index of outcome in usageOutcomes.
func outcomeIndex(outcome string) (uint8, bool) {
	for i, o := range usageOutcomes {
		if o == outcome {
			return uint8(i), true
		}
	}
	return 0, false
}

// monthOutcomes are the outcomes a monthly quota counts: the requests that passed
// every budget. An SQL array literal.
const monthOutcomes = `'{me,proxied,forbidden}'`

// countsInMonth reports whether a row of outcome counts in MonthUsed.
func countsInMonth(outcome string) bool {
	switch outcome {
	case OutcomeMe, OutcomeProxied, OutcomeForbidden:
		return true
	}
	return false
}

// Defaults of UsageOptions.
const (
	DefaultUsageInterval   = 10 * time.Second
	DefaultUsageMaxPending = 100_000
	maxUsageTimeout        = 10 * time.Second
)

// UsageOptions tune a Usage. The zero value takes every default.
type UsageOptions struct {
	// Interval is the time between two flushes, and so the most a process that dies
	// without warning loses. Default: DefaultUsageInterval (10s)
	Interval time.Duration
	// Timeout bounds one flush. Default: Interval, at most 10s
	Timeout time.Duration
	// MaxPending caps the rows held in memory, a row being a key, a minute, an outcome
	// and a status, and the rows of failed flushes counting. The counts of further
	// rows are dropped. Default: DefaultUsageMaxPending
	MaxPending int
	// OnFlush, if set, is called after every flush that had rows to write, with their
	// number and the flush's error. It runs on the flushing goroutine.
	OnFlush func(rows int, err error)
	// OnDrop, if set, is called for each request Record drops, because MaxPending rows
	// are already held or the request cannot be written, with the number of requests
	// (1). It runs on Record's caller: it must be quick.
	OnDrop func(requests int)
}

// usageKey is a row of the record as Record counts it: the key, the UTC minute (Unix
// seconds), the outcome (an index in usageOutcomes) and the status. The key's org is
// beside, in usageCount: a key belongs to one org.
type usageKey struct {
	keyID   string
	minute  int64
	outcome uint8
	status  int16
}

// usageCount is a row's org and its count of requests not yet written.
type usageCount struct {
	orgID string
	count int64
}

// Usage counts the requests of each key in memory, per UTC minute, outcome and status,
// and adds the counts to usage_minutes in batches, off the request path (the usage
// record of docs/operations.md). Record only counts; Run flushes every Interval with
// one INSERT, whose rows add up with those of other processes. A flush that fails keeps
// its rows for the next one, within MaxPending rows; beyond, their counts are dropped
// and reported through OnDrop. A write that may or may not have been made is sent
// again under its own id, which PostgreSQL skips if it was: no request counts twice.
// What was counted since the last flush is lost if the process dies; Run flushes once
// more when it is stopped.
//
// A nil *Usage records nothing. A Usage is safe for concurrent use.
type Usage struct {
	pool *pgxpool.Pool
	opts UsageOptions

	// flushing holds one token: whoever holds it is writing, or reading the record
	// with no flush in flight (MonthUsed). A channel so that a wait can end with its
	// context.
	flushing chan struct{}

	mu       sync.Mutex
	pending  map[usageKey]*usageCount // counted since the last flush took them
	inflight map[usageKey]*usageCount // taken by the flush in progress, or nil
	spare    map[usageKey]*usageCount // empty; the next pending, so its room is reused
	// unsure are the batches whose write may or may not have been made, oldest first,
	// and unsureRows their rows. Only the holder of the flush token changes them.
	unsure     []*usageBatch
	unsureRows int
}

// NewUsage returns a Usage writing through pool. Start it with Run.
func NewUsage(pool *pgxpool.Pool, opts UsageOptions) *Usage {
	if opts.Interval <= 0 {
		opts.Interval = DefaultUsageInterval
	}
	if opts.Timeout <= 0 {
		opts.Timeout = min(opts.Interval, maxUsageTimeout)
	}
	if opts.MaxPending <= 0 {
		opts.MaxPending = DefaultUsageMaxPending
	}
	return &Usage{
		pool:     pool,
		opts:     opts,
		flushing: make(chan struct{}, 1),
		pending:  make(map[usageKey]*usageCount),
		spare:    make(map[usageKey]*usageCount),
	}
}

// Record counts one request of the key keyID of the org orgID, made at at, decided
// with outcome (one of the Outcome constants) and answered with status. It never waits
// on the database: it takes a mutex held for one map update, and allocates only for
// the first request of a row between two flushes.
//
// A request that cannot be written is dropped and reported through OnDrop, so that it
// never fails the flush of the others: an unknown outcome, a status outside 100..599,
// an org id that is not a UUID or a key id that is not one.
func (u *Usage) Record(orgID, keyID string, at time.Time, outcome string, status int) {
	if u == nil {
		return
	}
	o, ok := outcomeIndex(outcome)
	if !ok || status < 100 || status > 599 {
		u.drop(1)
		return
	}
	k := usageKey{keyID: keyID, minute: unixMinute(at), outcome: o, status: int16(status)}
	u.mu.Lock()
	if c, ok := u.pending[k]; ok {
		c.count++
		u.mu.Unlock()
		return
	}
	if u.held() >= u.opts.MaxPending || !ValidKeyID(keyID) || !validUUID(orgID) {
		u.mu.Unlock()
		u.drop(1)
		return
	}
	// The ids may share the memory of a request: keep copies of their own. The org id
	// in lower case sorts as PostgreSQL sorts the uuid (newUsageBatch).
	k.keyID = strings.Clone(keyID)
	u.pending[k] = &usageCount{orgID: strings.Clone(strings.ToLower(orgID)), count: 1}
	u.mu.Unlock()
}

// drop reports requests dropped.
func (u *Usage) drop(requests int) {
	if requests > 0 && u.opts.OnDrop != nil {
		u.opts.OnDrop(requests)
	}
}

// unixMinute returns the start of the UTC minute of t, in Unix seconds.
func unixMinute(t time.Time) int64 {
	s := t.Unix()
	return s - (s%60+60)%60
}

// validUUID reports whether s is a UUID in its 36-character text form.
func validUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case i == 8 || i == 13 || i == 18 || i == 23:
			if c != '-' {
				return false
			}
		case !isDigit(c) && !('a' <= c && c <= 'f') && !('A' <= c && c <= 'F'):
			return false
		}
	}
	return true
}

// Run flushes every Interval until ctx ends, then flushes once more and returns. Each
// flush, the last one included, runs to its end or its Timeout, whatever becomes of
// ctx, so that a stop never cuts the last writes short.
func (u *Usage) Run(ctx context.Context) {
	tick := time.NewTicker(u.opts.Interval)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			u.flushWithTimeout(ctx)
		case <-ctx.Done():
			u.flushWithTimeout(ctx)
			return
		}
	}
}

func (u *Usage) flushWithTimeout(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), u.opts.Timeout)
	defer cancel()
	_ = u.Flush(ctx) // reported through OnFlush
}

// usageFlushSQL adds counts to usage_minutes, unless a flush of the same id ($1) was
// written before. The rows come sorted as the primary key (usageBatch), so that
// processes writing at once, and the roll-up, lock rows in one order.
const usageFlushSQL = `WITH flush AS (
	INSERT INTO usage_flushes (id) VALUES ($1) ON CONFLICT DO NOTHING RETURNING id)
INSERT INTO usage_minutes AS m (org_id, key_id, start, outcome, status, count)
SELECT * FROM unnest($2::uuid[], $3::text[], $4::timestamptz[], $5::text[], $6::smallint[], $7::bigint[])
WHERE EXISTS (SELECT FROM flush)
ON CONFLICT (org_id, start, key_id, outcome, status) DO UPDATE SET count = m.count + EXCLUDED.count`

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
			strings.Compare(usageOutcomes[a.k.outcome], usageOutcomes[b.k.outcome]),
			cmp.Compare(a.k.status, b.k.status),
		)
	})
	n := len(rows)
	b := &usageBatch{
		id:   newFlushID(),
		orgs: make([]string, n), keys: make([]string, n), starts: make([]time.Time, n),
		outcomes: make([]string, n), statuses: make([]int16, n), counts: make([]int64, n),
	}
	for i, r := range rows {
		b.orgs[i], b.keys[i], b.starts[i] = r.c.orgID, r.k.keyID, time.Unix(r.k.minute, 0).UTC()
		b.outcomes[i], b.statuses[i], b.counts[i] = usageOutcomes[r.k.outcome], r.k.status, r.c.count
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
	_, err := u.pool.Exec(ctx, usageFlushSQL, b.id, b.orgs, b.keys, b.starts, b.outcomes, b.statuses, b.counts)
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
			continue
		}
		u.pending[k] = c
	}
}

// held returns the rows u holds against MaxPending: those counted since the last
// flush, those of the flush in progress and those of the batches to send again. It
// must be called with mu held.
func (u *Usage) held() int { return len(u.pending) + len(u.inflight) + u.unsureRows }

// Pending returns the requests of the org orgID in the UTC month of month that u has
// counted and not written yet, in the outcomes MonthUsed counts. A flush in progress,
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
			if c.orgID == orgID && k.minute >= lo && k.minute < hi && countsInMonth(usageOutcomes[k.outcome]) {
				n += c.count
			}
		}
	}
	for _, b := range u.unsure {
		for i, org := range b.orgs {
			if org == orgID && !b.starts[i].Before(from) && b.starts[i].Before(to) && countsInMonth(b.outcomes[i]) {
				n += b.counts[i]
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

// MonthUsed returns the requests of the org orgID in the UTC month of month that the
// usage record holds, in the outcomes a monthly quota counts (me, proxied and
// forbidden: the requests that passed every budget). It reads usage_days and the part
// of usage_minutes not yet rolled up into it, in one statement, so that a roll-up in
// progress neither hides nor doubles a request.
func (s *Store) MonthUsed(ctx context.Context, orgID string, month time.Time) (int64, error) {
	return monthUsed(ctx, s.pool, orgID, month)
}

// monthUsedSQL sums the month's days and the minutes not rolled up yet.
const monthUsedSQL = `SELECT (
	(SELECT coalesce(sum(count), 0) FROM usage_days
	 WHERE org_id = $1 AND start >= $2 AND start < $3 AND outcome = ANY(` + monthOutcomes + `::text[]))
	+ (SELECT coalesce(sum(count - rolled), 0) FROM usage_minutes
	 WHERE org_id = $1 AND start >= $2 AND start < $3 AND count > rolled AND outcome = ANY(` + monthOutcomes + `::text[]))
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
