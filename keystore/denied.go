package keystore

import (
	"context"
	"crypto/subtle"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keygate/keygate/internal/gather"
)

// Denials tells, after a lookup from an address refused a key, whether the key was
// refused for that address: a live key with that secret and allowed networks. The
// lookup filters such a key out inside PostgreSQL, as it does a dead one, so that the
// two refusals take the same time (docs/security.md, Timing). Whoever answered the
// refusal asks Denials afterwards, to record it against the key.
//
// Its cost is bounded, since every unknown key that passed Format.Parse asks it too.
// One batch is in flight at a time, carrying every refused key that asked meanwhile,
// each distinct key id and digest once. A batch that waited Timeout for its turn goes
// out on its own. Its statement reads api_keys alone, joins nothing, and sends back
// only the keys it finds.
type Denials struct {
	store   *Store
	timeout time.Duration
	looks   *gather.Gatherer[probe, map[string]denied] // a refused key in, its batch's restricted live keys out
}

// denied is what Denials finds of a live key with allowed networks.
type denied struct {
	orgID string
	hash  []byte
}

// NewDenials returns a Denials looking keys up in s, each look bounded by timeout.
func NewDenials(s *Store, timeout time.Duration) *Denials {
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	d := &Denials{store: s, timeout: timeout}
	d.looks = gather.New(d.query, gather.Options{Lanes: 1, MaxWait: timeout})
	return d
}

// Denied reports whether keyID with secret is a live key with allowed networks. Its
// Key then holds the key's ID and OrgID only. Called after a lookup from an address
// refused the key, ok means the address was the reason. A key whose networks
// changed in between may be misreported: the answer was a 401 either way. Denied
// returns an error when the database could not answer in time.
func (d *Denials) Denied(ctx context.Context, keyID, secret string) (Key, bool, error) {
	sum := HashSecret(secret)
	found, err := d.looks.DoBy(ctx, gather.Deadline(ctx, d.timeout), probe{id: keyID, sum: sum})
	if err != nil {
		return Key{}, false, fmt.Errorf("looking up a refused key: %w", err)
	}
	k, ok := found[keyID]
	if !ok || subtle.ConstantTimeCompare(sum[:], k.hash) != 1 {
		return Key{}, false, nil
	}
	return Key{ID: keyID, OrgID: k.orgID}, true, nil
}

// deniedSelect finds the live keys with allowed networks among a batch's refused keys.
// Its conditions on the key id and the digest complete it.
const deniedSelect = `SELECT k.key_id, k.org_id::text, k.secret_hash FROM api_keys k
WHERE cardinality(k.allowed_cidrs) > 0 AND k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > now())`

// Like the lookup, it reads api_keys_lookup_idx alone (lookupSelect).
var (
	deniedOneSQL = deniedSelect + ` AND k.key_id COLLATE "C" = $1 AND k.secret_hash = $2`
	deniedAnySQL = deniedSelect + ` AND k.key_id COLLATE "C" = ANY($1) AND k.secret_hash = ANY($2)`
)

// query is the Denials' gather.Flush: one statement for the batch's distinct key ids
// and digests. Every request of the batch gets the keys it found, by key id. It runs
// by the latest deadline of the batch's requests, under none of their contexts.
func (d *Denials) query(_ context.Context, deadline time.Time, _ bool, probes []probe) ([]map[string]denied, error) {
	ids, sums, _ := split(probes)
	sql, args := deniedAnySQL, []any{ids, sums}
	if len(ids) == 1 && len(sums) == 1 {
		sql, args = deniedOneSQL, []any{ids[0], sums[0]}
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	rows, err := d.store.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	found := make(map[string]denied)
	var id string
	var k denied
	_, err = pgx.ForEachRow(rows, []any{&id, &k.orgID, &k.hash}, func() error {
		found[id] = k
		k.hash = nil // the next row's scan makes its own
		return nil
	})
	if err != nil {
		return nil, err
	}
	out := make([]map[string]denied, len(probes))
	for i := range out {
		out[i] = found
	}
	return out, nil
}
