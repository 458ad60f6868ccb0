package keystore_test

import (
	"context"
	"testing"

	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/schema/schematest"
)

// TestTheUsageRecordHoldsExactlyTheOutcomesDecidedWithAKey holds the outcomes table
// against the schema: usage_minutes accepts the name of every outcome Record counts,
// and refuses the others.
func TestTheUsageRecordHoldsExactlyTheOutcomesDecidedWithAKey(t *testing.T) {
	pool, _ := schematest.NewPool(t)
	seen := map[string]bool{}
	for o := range keystore.NumOutcomes {
		name := o.String()
		if name == "" || seen[name] {
			t.Fatalf("outcome %d has the name %q, empty or taken", o, name)
		}
		seen[name] = true
		_, err := pool.Exec(context.Background(), `INSERT INTO usage_minutes (org_id, key_id, start, outcome, status, count)
			VALUES ($1, $2, $3, $4, 200, 1)`, orgA, keyA, t0, name)
		if (err == nil) != o.Recorded() {
			t.Errorf("%s: recorded %v, but the schema's insert gave %v", name, o.Recorded(), err)
		}
	}
	if got := keystore.NumOutcomes.String(); got != "" {
		t.Errorf("NumOutcomes.String() = %q, want none", got)
	}
}

func TestOutcomeStatuses(t *testing.T) {
	for _, tc := range []struct {
		o      keystore.Outcome
		status int
	}{
		{keystore.OutcomeUnauthenticated, 401},
		{keystore.OutcomeFeatureGated, 403},
		{keystore.OutcomeRateLimited, 429},
		{keystore.OutcomeForbidden, 403},
		{keystore.OutcomeMe, 200},
		{keystore.OutcomeProxied, 0},
		{keystore.OutcomeLookupUnavailable, 503},
		{keystore.OutcomeLimiterUnavailable, 503},
		{keystore.OutcomeQuotaExceeded, 402},
		{keystore.OutcomeIPDenied, 401},
		{keystore.NumOutcomes, 0},
	} {
		if got := tc.o.Status(); got != tc.status {
			t.Errorf("%s: status %d, want %d", tc.o, got, tc.status)
		}
	}
}
