package httpapi_test

import (
	"context"
	"testing"
	"time"

	"github.com/keygate/keygate/internal/testkit/testenv"
	"github.com/keygate/keygate/upstream/internal/upstreamtest"
)

func TestRunPurgePurgesOnScheduleUntilStopped(t *testing.T) {
	e := upstreamtest.NewEnv(t)
	email, _ := e.User()
	userID := upstreamtest.Scalar[string](e, `SELECT id::text FROM users WHERE email = $1`, email)
	e.Exec(`INSERT INTO sessions (token_hash, user_id, expires_at) VALUES (sha256('expired'), $1, now() - interval '1 second')`, userID)

	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		e.Server.RunPurge(ctx, 20*time.Millisecond)
	}()
	testenv.Eventually(t, 20*time.Second, "the expired session purged", func() bool {
		return upstreamtest.Scalar[int](e, `SELECT count(*) FROM sessions`) == 0
	})
	// The purge logs after its last DELETE, so the line may follow the empty table.
	testenv.Eventually(t, 20*time.Second, "a purge logged", func() bool {
		return e.Logs.FilterMessage("purged").Len() >= 1
	})
	cancel()
	select {
	case <-stopped:
	case <-time.After(20 * time.Second):
		t.Fatal("RunPurge did not return after its context ended")
	}
}
