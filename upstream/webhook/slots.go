package webhook

import (
	"context"
	"sync"
	"time"
)

// Slots runs the jobs of an outbox on at most Size goroutines. It claims jobs as
// slots free up, never waiting for a batch to end: a slow job holds its own slot and
// no other. The webhook dispatcher runs on one; any sender of an outbox in
// PostgreSQL can, with a Claim that leases what it returns.
type Slots[T any] struct {
	// Size is the most jobs in flight.
	Size int
	// Poll is how long Run waits, when Claim found nothing to do, before it asks
	// again. A slot that frees asks at once.
	Poll time.Duration
	// Claim returns at most n jobs due now, which no other claimer gets until they
	// are done or their lease ends. Its error is Failed's, and Run waits for Poll.
	Claim func(ctx context.Context, n int) ([]T, error)
	// Send does a job. It must return soon after ctx ends.
	Send func(ctx context.Context, job T)
	// Failed is told Claim's errors, but not those of ctx ending. May be nil.
	Failed func(error)
}

// Run claims and sends until ctx ends, then waits for the jobs in flight.
func (s *Slots[T]) Run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	freed := make(chan struct{}, s.Size)
	t := time.NewTicker(s.Poll)
	defer t.Stop()
	busy := 0
	for ctx.Err() == nil {
		if free := s.Size - busy; free > 0 {
			jobs, err := s.Claim(ctx, free)
			if err != nil && ctx.Err() == nil && s.Failed != nil {
				s.Failed(err)
			}
			for _, job := range jobs {
				busy++
				wg.Go(func() {
					defer func() { freed <- struct{}{} }()
					s.Send(ctx, job)
				})
			}
		}
		select {
		case <-ctx.Done():
		case <-freed:
			busy--
		case <-t.C:
		}
	}
}
