package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/keygate/keygate/upstream/internal/upstreamtest"
)

func TestPurgeDeletesExpiredSessionsAndOldLoginAttempts(t *testing.T) {
	clock := upstreamtest.NewClock()
	e := upstreamtest.NewEnv(t)
	email, _ := e.User()
	userID := upstreamtest.Scalar[string](e, `SELECT id::text FROM users WHERE email = $1`, email)
	e.Exec(`INSERT INTO sessions (token_hash, user_id, expires_at) VALUES
		(sha256('expired'), $1, now() - interval '1 second'),
		(sha256('live'), $1, now() + interval '1 hour')`, userID)
	e.Exec(`INSERT INTO login_attempts (client, email_hash, at) VALUES
		('203.0.113.1', sha256('a'), $1), ('203.0.113.1', sha256('b'), $2)`,
		clock.Now().Add(-61*time.Second), clock.Now().Add(-59*time.Second))

	sessions, attempts, err := e.Store.PurgeExpired(context.Background(), clock.Now(), time.Minute)
	if err != nil || sessions != 1 || attempts != 1 {
		t.Fatalf("PurgeExpired = %d sessions, %d attempts, %v; want 1, 1, nil", sessions, attempts, err)
	}
	if n := upstreamtest.Scalar[int](e, `SELECT count(*) FROM sessions WHERE token_hash = sha256('live')`); n != 1 {
		t.Errorf("the live session was purged")
	}
	if n := upstreamtest.Scalar[int](e, `SELECT count(*) FROM login_attempts WHERE email_hash = sha256('b')`); n != 1 {
		t.Errorf("the attempt still in the window was purged")
	}
}
