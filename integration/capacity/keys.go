package capacity

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keygate/keygate/schema"
)

// KeyPrefix is the key prefix of the keys Seed makes.
const KeyPrefix = "mon"

// KeyID returns the key id of key i of Seed: "capacity" and i in 14 digits, 22
// characters like a generated key id.
func KeyID(i int) string {
	s := strconv.Itoa(i)
	return "capacity" + "00000000000000"[len(s):] + s
}

// OrgID returns the id of organisation n of Seed (orgIDSQL); Seed's key i belongs to
// organisation i mod its orgs.
func OrgID(n int) string {
	s := strconv.Itoa(n)
	return "cafe0000-0000-4000-8000-" + "000000000000"[len(s):] + s
}

// Secret returns the secret of key i of Seed: the unpadded base64url of
// SHA-256("capacity-<i>"), 43 characters. It is a legacy secret, without a checksum,
// so that SQL can make it (seedKeysSQL); keystore.Format accepts legacy secrets unless
// told to reject them, and verifies them with the same query.
func Secret(i int) string {
	sum := sha256.Sum256([]byte("capacity-" + strconv.Itoa(i)))
	return base64.RawURLEncoding.EncodeToString(sum[:])
}

// FullKey returns key i of Seed as a client presents it.
func FullKey(i int) string {
	return KeyPrefix + "_live_" + KeyID(i) + "." + Secret(i)
}

// seedOrgsSQL makes organisations 0 … $1-1 on the migrations' "pro" plan, each with
// an id made of its number (orgIDSQL), so that seedKeysSQL needs no join.
const seedOrgsSQL = `INSERT INTO orgs (id, name, plan)
SELECT ` + orgIDSQL + `, 'capacity ' || n, 'pro' FROM generate_series(0, $1 - 1) AS n`

// orgIDSQL is the id of organisation n of seedOrgsSQL.
const orgIDSQL = `('cafe0000-0000-4000-8000-' || lpad(n::text, 12, '0'))::uuid`

// seedKeysSQL makes keys 0 … $1-1 (KeyID, Secret), spread over the $2 capacity
// organisations in turn. Its secret expression is Secret's: base64 with '+/' as '-_'
// and without its '=' (32 bytes make 44 characters, one of them padding).
const seedKeysSQL = `INSERT INTO api_keys (key_id, org_id, name, role, secret_hash)
SELECT 'capacity' || lpad(i::text, 14, '0'),
	` + orgIDSQL + `,
	'capacity',
	'Viewer',
	sha256(convert_to(rtrim(translate(encode(sha256(convert_to('capacity-' || i, 'UTF8')), 'base64'), '+/', '-_'), '='), 'UTF8'))
FROM generate_series(0, $1 - 1) AS i, LATERAL (SELECT i % $2 AS n) AS o`

// Seeded describes the database Seed left.
type Seeded struct {
	Keys, Orgs int
	// Took is how long Seed took; zero when the keys were there already.
	Took time.Duration
	// TableBytes and IndexBytes are api_keys's heap and its key_id index, and
	// LookupIndexBytes the lookup's index (0 in a schema without it); SharedBuffers
	// is PostgreSQL's setting, to compare them with.
	TableBytes, IndexBytes, LookupIndexBytes int64
	SharedBuffers                            string
	// AllVisible is the share of api_keys's pages marked all-visible, whose rows an
	// index-only scan need not read.
	AllVisible float64
}

// Seed makes sure the database of databaseURL exists, is migrated and holds exactly
// keys keys of Seed's (KeyID, Secret) over orgs organisations, then vacuums and
// analyses it as autovacuum would have, so that no autovacuum runs during a
// measurement. It creates the database through the server's "postgres" database
// when it is missing, and leaves a database that already holds the keys as it is.
func Seed(ctx context.Context, databaseURL string, keys, orgs int) (Seeded, error) {
	start := time.Now()
	if err := createDatabase(ctx, databaseURL); err != nil {
		return Seeded{}, err
	}
	if err := schema.Migrate(ctx, databaseURL); err != nil {
		return Seeded{}, err
	}
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		return Seeded{}, fmt.Errorf("connecting to postgres: %w", err)
	}
	defer conn.Close(ctx)
	// Vacuum marks a page all-visible, which the lookup's index-only scans need, only
	// once the commits of its rows are flushed to the WAL. A server with
	// synchronous_commit off (scripts/stack.sh's) flushes them later: the seeding
	// connection's commits wait for the flush.
	if _, err := conn.Exec(ctx, `SET synchronous_commit = on`); err != nil {
		return Seeded{}, fmt.Errorf("seeding: %w", err)
	}
	var haveKeys, haveOrgs int
	err = conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM api_keys WHERE key_id LIKE 'capacity%'),
	(SELECT count(*) FROM orgs WHERE name LIKE 'capacity %')`).Scan(&haveKeys, &haveOrgs)
	if err != nil {
		return Seeded{}, fmt.Errorf("counting the keys: %w", err)
	}
	s := Seeded{Keys: keys, Orgs: orgs}
	if haveKeys != keys || haveOrgs != orgs {
		if err := insertKeys(ctx, conn, keys, orgs); err != nil {
			return Seeded{}, err
		}
		s.Took = time.Since(start)
	}
	err = conn.QueryRow(ctx, `SELECT pg_relation_size('api_keys'), pg_relation_size('api_keys_pkey'),
	coalesce(pg_relation_size(to_regclass('api_keys_lookup_idx')), 0), current_setting('shared_buffers'),
	(SELECT relallvisible::float8 / greatest(relpages, 1) FROM pg_class WHERE oid = 'api_keys'::regclass)`).
		Scan(&s.TableBytes, &s.IndexBytes, &s.LookupIndexBytes, &s.SharedBuffers, &s.AllVisible)
	if err != nil {
		return Seeded{}, fmt.Errorf("reading the table's size: %w", err)
	}
	return s, nil
}

// insertKeys replaces every capacity key and organisation by keys new keys over orgs
// new organisations, in one transaction, then vacuums and analyses (and, as a
// superuser, checkpoints).
func insertKeys(ctx context.Context, conn *pgx.Conn, keys, orgs int) error {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("seeding: %w", err)
	}
	defer tx.Rollback(ctx)
	// A superuser (as on scripts/stack.sh's servers) skips the foreign keys' checks,
	// a quarter of the time: the keys' organisations are made right before them.
	var super bool
	if err := tx.QueryRow(ctx, `SELECT rolsuper FROM pg_roles WHERE rolname = current_user`).Scan(&super); err != nil {
		return fmt.Errorf("seeding: %w", err)
	}
	skipChecks := `SELECT 1`
	if super {
		skipChecks = `SET LOCAL session_replication_role = replica`
	}
	for _, step := range []struct {
		sql  string
		args []any
	}{
		{`DELETE FROM orgs WHERE name LIKE 'capacity %'`, nil}, // their keys go with them
		{seedOrgsSQL, []any{orgs}},
		{skipChecks, nil},
		{seedKeysSQL, []any{keys, orgs}},
	} {
		if _, err := tx.Exec(ctx, step.sql, step.args...); err != nil {
			return fmt.Errorf("seeding: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("seeding: %w", err)
	}
	after := []string{`VACUUM ANALYZE api_keys, orgs, plans`}
	if super {
		after = append(after, `CHECKPOINT`) // the insert's dirty pages written now, not during a measurement
	}
	for _, sql := range after {
		if _, err := conn.Exec(ctx, sql); err != nil {
			return fmt.Errorf("seeding: %s: %w", sql, err)
		}
	}
	return nil
}

// createDatabase creates the database of databaseURL, through the same server's
// "postgres" database, unless it exists.
func createDatabase(ctx context.Context, databaseURL string) error {
	cfg, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		return fmt.Errorf("parsing the database URL: %w", err)
	}
	name := cfg.Database
	cfg.Database = "postgres"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("connecting to postgres: %w", err)
	}
	defer conn.Close(ctx)
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil {
		return fmt.Errorf("looking for database %s: %w", name, err)
	}
	if exists {
		return nil
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return fmt.Errorf("creating database %s: %w", name, err)
	}
	return nil
}
