package capacity

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/keygate/keygate/internal/testkit/testenv"
	"github.com/keygate/keygate/schema/schematest"
)

// TestLookupsThroughAStandby: with a standby, the workers' lookups go through a
// keystore.Reader, and each level measures the standby's CPU beside the primary's.
func TestLookupsThroughAStandby(t *testing.T) {
	ctx := context.Background()
	db := schematest.NewDatabase(t)
	if _, err := Seed(ctx, db, 200, 5); err != nil {
		t.Fatal(err)
	}
	standby, err := url.Parse(testenv.GetenvOrSkip(t, "DATABASE_STANDBY_FAST_URL"))
	if err != nil {
		t.Fatal(err)
	}
	primary, err := url.Parse(db)
	if err != nil {
		t.Fatal(err)
	}
	standby.Path = primary.Path
	l := Lookups{DatabaseURL: db, Keys: 200, Lanes: 1, Timeout: 5 * time.Second, StandbyURL: standby.String()}
	levels, err := l.Run(ctx, testRunner(t, 2), []int{4})
	if err != nil {
		t.Fatal(err)
	}
	for _, lv := range levels {
		if lv.Ops == 0 || lv.Errors+lv.Rejected != 0 || len(lv.Servers) != 2 || lv.Servers[1] == 0 {
			t.Errorf("W=%d: %+v", lv.Waiters, lv)
		}
	}
}
