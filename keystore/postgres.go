package keystore

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"math/bits"
	"net/netip"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keygate/keygate/internal/pgfailover"
)

// Store is the PostgreSQL-backed key store. It is safe for concurrent use.
type Store struct {
	pool   *pgxpool.Pool
	format Format
	// standby marks a Store over a hot standby: its lookups also read how far the
	// standby has replayed (standby.go).
	standby bool
}

// New returns a Store over pool for keys of the given format. The pool's default
// query mode caches prepared statements per connection. So Verify costs one round trip
// once a connection has seen its statement.
func New(pool *pgxpool.Pool, format Format) *Store {
	return &Store{pool: pool, format: format}
}

// lookupSelect finds the live keys with their budgets, allowed networks and scopes.
// The key's limit in each window is the smaller of its own and its plan's; a plan
// without API access keeps 0 whatever the key says, and a window the plan does not
// limit keeps the key's own or -1, none. A key without networks sends NULL rather than
// an empty array, which costs a batch's decoding more than the rest of its row. The
// scopes come as one text, NULL for none (splitScopes). lookupOf completes its
// condition on the key id, then lookupDigest its condition on the digest and address. The
// database's clock decides revocation and expiry, on this very request.
//
// It reads only indexes: api_keys_lookup_idx, whose key ids it asks for in their
// order (COLLATE "C"), and orgs_plan_idx hold every column it reads of api_keys and
// orgs (schema/migrations/013_key_lookup.sql). A column added here goes in its index
// too, or every lookup reads the table's row again (TestLookupReadsOnlyIndexes).
const lookupSelect = `SELECT k.key_id, k.org_id::text, k.role, k.secret_hash,
CASE WHEN k.rate_limit IS NULL OR p.api_rate_limit = 0 THEN p.api_rate_limit
	WHEN p.api_rate_limit < 0 THEN k.rate_limit
	ELSE least(k.rate_limit, p.api_rate_limit) END,
CASE WHEN p.api_rate_limit_per_second < 0 THEN coalesce(k.rate_limit_per_second, -1)
	ELSE least(k.rate_limit_per_second, p.api_rate_limit_per_second) END,
CASE WHEN p.api_rate_limit_per_hour < 0 THEN coalesce(k.rate_limit_per_hour, -1)
	ELSE least(k.rate_limit_per_hour, p.api_rate_limit_per_hour) END,
CASE WHEN p.api_rate_limit_per_day < 0 THEN coalesce(k.rate_limit_per_day, -1)
	ELSE least(k.rate_limit_per_day, p.api_rate_limit_per_day) END,
p.org_rate_limit, p.api_requests_per_month,
CASE WHEN cardinality(k.allowed_cidrs) > 0 THEN k.allowed_cidrs END,
array_to_string(k.scopes, ' ')
FROM api_keys k
JOIN orgs o ON o.id = k.org_id
JOIN plans p ON p.name = o.plan
WHERE k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > now()) AND k.key_id COLLATE "C" `

// lookupDigest is the condition on the presented digests and client addresses of a
// lookup statement whose ids take params parameters. They come after the ids: one
// bytea and one inet (one), or two arrays of the same length, the digests and the
// addresses of the batch's requests, in pairs (any). The stored digest must be one of
// them. A key with allowed networks must also hold the address paired with its digest,
// or be paired with NULL, which skips the address check (Store.VerifyParsed).
//
// So a live key id with a wrong secret, or a key used from outside its networks, costs
// the database what a revoked or expired one does: a row found and filtered out.
// Otherwise the organisation and plan would be joined and a row sent back, which
// paired requests could tell apart from an unknown id (docs/security.md). The database
// compares SHA-256 digests, which say nothing of a secret. check compares again, in
// constant time. A key without networks costs the address check one cardinality.
//
// It is a CASE so that PostgreSQL leaves it out of its estimate of the keys the id
// condition finds. As a plain condition it takes it for a rare one. On small tables it
// would then put api_keys first in the join, scanning the organisations and plans once
// per key found rather than once.
func lookupDigest(params int, one bool) string {
	sum, addr := "$"+strconv.Itoa(params+1), "$"+strconv.Itoa(params+2)
	if one {
		return " AND CASE WHEN k.secret_hash = " + sum + " AND (cardinality(k.allowed_cidrs) = 0 OR " +
			addr + "::inet <<= ANY(k.allowed_cidrs) OR " + addr + "::inet IS NULL) THEN true END"
	}
	return " AND CASE WHEN k.secret_hash = ANY(" + sum + "::bytea[]) AND (cardinality(k.allowed_cidrs) = 0 OR EXISTS (" +
		"SELECT FROM unnest(" + sum + "::bytea[], " + addr + "::inet[]) p(sum, addr) WHERE p.sum = k.secret_hash" +
		" AND (p.addr IS NULL OR p.addr <<= ANY(k.allowed_cidrs)))) THEN true END"
}

// The lookup's statements, one per shape of batch. PostgreSQL keeps a generic plan,
// planned once per connection, only for a statement whose generic plan it estimates
// no dearer than its custom ones. It does for `= $1` and `IN ($1, …, $n)`, where it
// knows how many ids come. It does not for `= ANY($1)` once api_keys has more than a
// few pages of analysed rows. It then plans the three-table join anew on every
// execution (docs/performance.md). So:
//
//   - a batch of one id and one digest is `= $1`;
//   - a batch of up to maxInListIDs ids is an IN list of the next power of two of
//     parameters, at least two, the last id repeated. That makes a handful of statements per
//     connection, and a repeated id matches once;
//   - only a larger batch is `= ANY($1)`. Its many ids share its planning.
var (
	lookupOneSQL = lookupSelect + "= $1" + lookupDigest(1, true)
	lookupAnySQL = lookupSelect + "= ANY($1)" + lookupDigest(1, false)
	lookupInSQL  = func() (sqls [maxInListLog + 1]string) {
		for i := 1; i < len(sqls); i++ {
			params := make([]string, 1<<i)
			for j := range params {
				params[j] = "$" + strconv.Itoa(j+1)
			}
			sqls[i] = lookupSelect + "IN (" + strings.Join(params, ", ") + ")" + lookupDigest(1<<i, false)
		}
		return sqls
	}()
)

// maxInListIDs is the largest batch looked up with an IN list.
const (
	maxInListLog = 6
	maxInListIDs = 1 << maxInListLog
)

// probe is a presented key: its id, the digest of its secret, and the client address
// it came from, never IPv4-mapped. The zero address skips the key's networks.
type probe struct {
	id      string
	sum     [32]byte
	addr    netip.Addr
	reading *reading // on a standby, the Fence's reading the request holds; sent with its batch
}

// lookup is a lookup statement with its arguments, and how many distinct key ids it
// looks up.
type lookup struct {
	sql  string
	args []any
	ids  int
}

// lookupOf returns the lookup of the key ids of probes, with their digests and
// addresses. probes must not be empty.
func lookupOf(probes []probe) lookup {
	if len(probes) == 1 {
		return lookup{lookupOneSQL, []any{probes[0].id, probes[0].sum[:], probes[0].addr}, 1}
	}
	ids, sums, addrs := split(probes)
	n := len(ids)
	switch {
	case n == 1 && len(sums) == 1:
		return lookup{lookupOneSQL, []any{ids[0], sums[0], addrs[0]}, 1}
	case n <= maxInListIDs:
		i := max(bits.Len(uint(n-1)), 1) // 2^i is the smallest power of two >= n, and >= 2
		args := make([]any, 1<<i+2)
		for j := range 1 << i {
			args[j] = ids[min(j, n-1)]
		}
		args[1<<i], args[1<<i+1] = sums, addrs
		return lookup{lookupInSQL[i], args, n}
	default:
		return lookup{lookupAnySQL, []any{ids, sums, addrs}, n}
	}
}

// split returns the distinct key ids of probes, and their distinct pairs of digest
// and address as two slices of one length, each in order of first appearance.
// Requests of one key from one address share all three. So a batch of them is a
// lookup of one id, one digest and one address. A key asked from two addresses keeps
// both: each pair is checked against the key's networks.
func split(probes []probe) (ids []string, sums [][]byte, addrs []netip.Addr) {
	ids = make([]string, len(probes))
	for i := range probes {
		ids[i] = probes[i].id
	}
	ids = distinct(ids)
	sums = make([][]byte, 0, len(probes))
	addrs = make([]netip.Addr, 0, len(probes))
	if len(probes) <= 32 {
	next:
		for i := range probes {
			for j, kept := range sums {
				if string(kept) == string(probes[i].sum[:]) && addrs[j] == probes[i].addr {
					continue next
				}
			}
			sums = append(sums, probes[i].sum[:])
			addrs = append(addrs, probes[i].addr)
		}
		return ids, sums, addrs
	}
	type pair struct {
		sum  [32]byte
		addr netip.Addr
	}
	seen := make(map[pair]struct{}, len(probes))
	for i := range probes {
		p := pair{probes[i].sum, probes[i].addr}
		if _, dup := seen[p]; !dup {
			seen[p] = struct{}{}
			sums = append(sums, probes[i].sum[:])
			addrs = append(addrs, probes[i].addr)
		}
	}
	return ids, sums, addrs
}

// PrepareLookups prepares every lookup statement on conn in one batch. pgx pipelines
// the preparations of a batch's new statements. So no lookup on conn pays a round trip
// to prepare its statement. Call it from pgxpool's AfterConnect, on the connection's
// own budget rather than a request's. It does nothing in the exec modes that prepare
// nothing: exec and simple_protocol, used through PgBouncer in transaction pooling
// (see the exec mode of the database URL).
func PrepareLookups(ctx context.Context, conn *pgx.Conn) error {
	switch conn.Config().DefaultQueryExecMode {
	case pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe:
	default:
		return nil
	}
	b := &pgx.Batch{}
	// Batches of 1, 2, 4, … maxInListIDs ids, and one larger: one of each statement.
	for n := 1; n <= 2*maxInListIDs; n *= 2 {
		probes := make([]probe, min(n, maxInListIDs+1))
		for i := range probes {
			probes[i] = probe{id: strconv.Itoa(i), sum: dummyHash} // no key id is this short
		}
		l := lookupOf(probes)
		b.Queue(l.sql, l.args...)
	}
	// A standby's batches read its replay position first (Store.lookupReplayed). On
	// the primary it is NULL, and preparing it costs nothing more.
	b.Queue(replayedSQL)
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("preparing the key lookups: %w", err)
	}
	return nil
}

// dummyHash is compared against when no live key has the presented key id. So an
// unknown key costs the same hashing and comparison as a known one.
var dummyHash = sha256.Sum256([]byte("keygate: no such key"))

// Verify checks a presented full key with one PostgreSQL round trip. It returns
// ok == false with a nil error for a malformed, unknown, revoked or expired key, or a
// wrong secret. It returns a non-nil error only when the database could not answer.
// It does not check the key's allowed networks: the caller does, with Key.AllowsAddr.
func (s *Store) Verify(ctx context.Context, presented string) (Key, bool, error) {
	keyID, secret, ok := s.format.Parse(presented)
	if !ok {
		return Key{}, false, nil
	}
	return s.VerifyParsed(ctx, keyID, secret, netip.Addr{})
}

// VerifyParsed is Verify for a key that Format.Parse has already split into its key id
// and secret, asked from the client address from. A caller that parsed the key does
// not parse it again. A key with allowed networks none of which holds from is refused
// as a dead key is, inside the lookup (docs/security.md, Timing). The zero from skips
// that check, as Verify does. An IPv4-mapped from counts as its IPv4 address.
func (s *Store) VerifyParsed(ctx context.Context, keyID, secret string, from netip.Addr) (Key, bool, error) {
	sum := HashSecret(secret)
	rows, _, err := s.lookup(ctx, lookupOf([]probe{{id: keyID, sum: sum, addr: from.Unmap()}}))
	if err != nil {
		return Key{}, false, err
	}
	r, found := rows[keyID]
	k, ok := check(keyID, sum, r, found)
	return k, ok, nil
}

// check compares a presented secret's digest with what the lookup found, in constant
// time. It compares against dummyHash when the lookup found no live key.
func check(keyID string, sum [32]byte, r row, found bool) (Key, bool) {
	stored := r.hash
	if !found {
		stored = dummyHash[:]
	}
	if subtle.ConstantTimeCompare(sum[:], stored) != 1 || !found {
		return Key{}, false
	}
	return Key{ID: keyID, OrgID: r.orgID, Role: r.role, RateLimit: r.rateLimit, Windows: r.windows,
		OrgRateLimit: r.orgRateLimit, MonthlyQuota: r.monthlyQuota, AllowedCIDRs: r.cidrs, Scopes: r.scopes}, true
}

// Create makes a new key and returns its record and the full key, which is never
// readable again. A key with a creator (NewKey.CreatedBy) is audited as key.created,
// in the same transaction. Settings that break their rules are a *SettingError. The
// rate limit is checked against the organisation's plan, and the scopes against the
// vocabulary, within the transaction.
func (s *Store) Create(ctx context.Context, nk NewKey) (Record, string, error) {
	if !nk.Role.Valid() {
		return Record{}, "", fmt.Errorf("invalid role %q", nk.Role)
	}
	var err error
	if nk.Scopes, err = ParseScopes(nk.Scopes); err != nil {
		return Record{}, "", err
	}
	tx, err := pgfailover.Begin(ctx, s.pool, pgfailover.Local)
	if err != nil {
		return Record{}, "", fmt.Errorf("beginning transaction: %w", err)
	}
	defer tx.Rollback(ctx)
	if err := checkNewSettings(ctx, tx, nk.OrgID, nk.RateLimit, nk.WindowLimits, nk.AllowedCIDRs); err != nil {
		return Record{}, "", err
	}
	if nk.Scopes, err = resolveScopes(ctx, tx, nk.Scopes); err != nil {
		return Record{}, "", err
	}
	r, full, err := s.insertKey(ctx, tx, nk)
	if err != nil {
		return Record{}, "", err
	}
	if nk.CreatedBy != "" {
		if err := audit(ctx, tx, Event{OrgID: nk.OrgID, Action: ActionCreated, KeyID: r.ID, Actor: nk.CreatedBy}); err != nil {
			return Record{}, "", err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return Record{}, "", fmt.Errorf("committing key: %w", err)
	}
	return r, full, nil
}

// insertKey draws a new key and inserts it in tx. A key id collision is astronomically
// unlikely (22 base62 characters). It is no reason to fail: draw again.
func (s *Store) insertKey(ctx context.Context, tx pgx.Tx, nk NewKey) (Record, string, error) {
	var createdBy *string
	if nk.CreatedBy != "" {
		createdBy = &nk.CreatedBy
	}
	for attempt := 0; attempt < 4; attempt++ {
		full, keyID, secret, err := s.format.Generate()
		if err != nil {
			return Record{}, "", err
		}
		sum := HashSecret(secret)
		r := Record{ID: keyID, OrgID: nk.OrgID, Name: nk.Name, Role: nk.Role}
		w := &r.WindowLimits
		err = tx.QueryRow(ctx, `INSERT INTO api_keys (key_id, org_id, name, role, secret_hash, created_by, expires_at, rate_limit, allowed_cidrs, scopes,
	rate_limit_per_second, rate_limit_per_hour, rate_limit_per_day)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
ON CONFLICT (key_id) DO NOTHING
RETURNING created_at, expires_at, rate_limit, allowed_cidrs, scopes, rate_limit_per_second, rate_limit_per_hour, rate_limit_per_day`,
			keyID, nk.OrgID, nk.Name, string(nk.Role), sum[:], createdBy, nk.ExpiresAt, nk.RateLimit, nonNil(nk.AllowedCIDRs), nk.Scopes,
			nk.WindowLimits[PerSecond], nk.WindowLimits[PerHour], nk.WindowLimits[PerDay]).
			Scan(&r.CreatedAt, &r.ExpiresAt, &r.RateLimit, &r.AllowedCIDRs, &r.Scopes, &w[PerSecond], &w[PerHour], &w[PerDay])
		if errors.Is(err, pgx.ErrNoRows) {
			continue
		}
		if err != nil {
			return Record{}, "", fmt.Errorf("inserting key: %w", err)
		}
		return r, full, nil
	}
	return Record{}, "", errors.New("inserting key: key id collisions on every attempt")
}

// List returns every key of an organisation, revoked and expired ones included,
// oldest first.
func (s *Store) List(ctx context.Context, orgID string) ([]Record, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+recordColumns+`
FROM api_keys WHERE org_id = $1 ORDER BY created_at, key_id`, orgID)
	if err != nil {
		return nil, fmt.Errorf("listing keys: %w", err)
	}
	recs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Record, error) { return scanRecord(row) })
	if err != nil {
		return nil, fmt.Errorf("listing keys: %w", err)
	}
	return recs, nil
}

// recordColumns are the columns of api_keys that make a Record, in scanRecord's order.
// A key's last use is the later of api_key_last_used's, which LastUsed writes, and
// api_keys.last_used_at, which gateways of the release before it wrote.
const recordColumns = `key_id, org_id::text, name, role, created_at, expires_at, revoked_at,
greatest(last_used_at, (SELECT u.last_used_at FROM api_key_last_used u WHERE u.key_id = api_keys.key_id)),
rate_limit, allowed_cidrs, scopes, rate_limit_per_second, rate_limit_per_hour, rate_limit_per_day`

// scanRecord scans a row of recordColumns.
func scanRecord(row pgx.Row) (Record, error) {
	var r Record
	var role string
	err := row.Scan(&r.ID, &r.OrgID, &r.Name, &role, &r.CreatedAt, &r.ExpiresAt, &r.RevokedAt, &r.LastUsedAt,
		&r.RateLimit, &r.AllowedCIDRs, &r.Scopes, &r.WindowLimits[PerSecond], &r.WindowLimits[PerHour], &r.WindowLimits[PerDay])
	r.Role = Role(role)
	return r, err
}

// Revoke revokes the key keyID of organisation orgID from now on. In the same
// statement, it audits it as key.revoked by actor. Revoking a revoked key succeeds,
// keeps its first revocation time and audits nothing. found is false when the
// organisation has no key keyID. The revocation commits Synced: acknowledged, it
// survives a failover to a synchronous standby.
func (s *Store) Revoke(ctx context.Context, orgID, keyID, actor string) (found bool, err error) {
	if !ValidKeyID(keyID) {
		return false, nil
	}
	// The UPDATE waits for a concurrent revocation of the same key, then finds it
	// revoked. So exactly one of them is audited.
	var revoked int
	err = pgfailover.QueryRow(ctx, s.pool, pgfailover.Synced, `WITH r AS (
	UPDATE api_keys SET revoked_at = now()
	WHERE org_id = $1 AND key_id = $2 AND revoked_at IS NULL
	RETURNING org_id, key_id
), a AS (
	INSERT INTO audit_events (org_id, action, key_id, actor)
	SELECT org_id, $3, key_id, $4 FROM r
)
SELECT count(*) FROM r`, orgID, keyID, ActionRevoked, actor).Scan(&revoked)
	if err != nil {
		return false, fmt.Errorf("revoking key: %w", err)
	}
	if revoked == 1 {
		return true, nil
	}
	err = s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM api_keys WHERE org_id = $1 AND key_id = $2)`,
		orgID, keyID).Scan(&found)
	if err != nil {
		return false, fmt.Errorf("revoking key: %w", err)
	}
	return found, nil
}
