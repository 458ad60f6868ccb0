package httpapi

import (
	"context"
	"time"

	"go.uber.org/zap"
)

// DefaultPurgeInterval is how often serve purges expired sessions and old login
// attempts, unless --purge-interval says otherwise.
const DefaultPurgeInterval = 10 * time.Minute

// RunPurge deletes expired sessions and login attempts older than the throttle's window.
// It runs every interval until ctx ends. A failed purge is logged and tried again at
// the next tick. Instances purging at once only find less to delete.
func (s *Server) RunPurge(ctx context.Context, interval time.Duration) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		sessions, attempts, err := s.store.PurgeExpired(ctx, s.now(), s.throttle.Window)
		switch {
		case err != nil && ctx.Err() == nil:
			s.logger.Warn("purge failed", zap.Error(err))
		case sessions > 0 || attempts > 0:
			s.logger.Info("purged", zap.Int64("sessions", sessions), zap.Int64("login_attempts", attempts))
		}
	}
}
