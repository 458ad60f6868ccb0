package httpapi

import (
	"context"
	"testing"
	"time"
)

func TestPurgeDeletesExpiredSessionsAndOldLoginAttempts(t *testing.T) {
	clock := newFakeClock()
	e := newTestEnv(t, func(c *Config) {
		c.LoginThrottle = LoginThrottle{Window: time.Minute}
		c.Now = clock.Now
	})
	email, _ := e.user()
	userID := scalar[string](e, `SELECT id::text FROM users WHERE email = $1`, email)
	e.exec(`INSERT INTO sessions (token_hash, user_id, expires_at) VALUES
		(sha256('expired'), $1, now() - interval '1 second'),
		(sha256('live'), $1, now() + interval '1 hour')`, userID)
	e.exec(`INSERT INTO login_attempts (client, email_hash, at) VALUES
		('203.0.113.1', sha256('a'), $1), ('203.0.113.1', sha256('b'), $2)`,
		clock.Now().Add(-61*time.Second), clock.Now().Add(-59*time.Second))

	sessions, attempts, err := e.srv.purgeExpired(context.Background(), clock.Now())
	if err != nil || sessions != 1 || attempts != 1 {
		t.Fatalf("purgeExpired = %d sessions, %d attempts, %v; want 1, 1, nil", sessions, attempts, err)
	}
	if n := scalar[int](e, `SELECT count(*) FROM sessions WHERE token_hash = sha256('live')`); n != 1 {
		t.Errorf("the live session was purged")
	}
	if n := scalar[int](e, `SELECT count(*) FROM login_attempts WHERE email_hash = sha256('b')`); n != 1 {
		t.Errorf("the attempt still in the window was purged")
	}
}

func TestRunPurgePurgesOnScheduleUntilStopped(t *testing.T) {
	e := newTestEnv(t)
	email, _ := e.user()
	userID := scalar[string](e, `SELECT id::text FROM users WHERE email = $1`, email)
	e.exec(`INSERT INTO sessions (token_hash, user_id, expires_at) VALUES (sha256('expired'), $1, now() - interval '1 second')`, userID)

	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		e.srv.RunPurge(ctx, 20*time.Millisecond)
	}()
	deadline := time.Now().Add(20 * time.Second)
	for scalar[int](e, `SELECT count(*) FROM sessions`) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the expired session was not purged within 20s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The purge logs after its last DELETE, so the line may follow the empty table.
	for e.logs.FilterMessage("purged").Len() < 1 {
		if time.Now().After(deadline) {
			t.Fatal("no purge logged within 20s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	select {
	case <-stopped:
	case <-time.After(20 * time.Second):
		t.Fatal("RunPurge did not return after its context ended")
	}
}
