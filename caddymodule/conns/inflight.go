package conns

import (
	"sync"
	"sync/atomic"
)

// Inflight counts the requests a handler is answering, so that the connections they
// use outlive the handler's config. On a reload Caddy cleans the old config up as
// soon as its server stops taking requests, while the server still answers those it
// has begun. They must not find its pools, Redis client or usage record closed: the
// last of them gives them back (Close). A nil Inflight (a handler never provisioned)
// holds nothing back.
type Inflight struct {
	n      atomic.Int64
	closed atomic.Bool
	once   sync.Once
	then   func(later bool) // set before closed
}

// Enter counts a request in. It must be followed by exactly one Leave.
func (f *Inflight) Enter() {
	if f != nil {
		f.n.Add(1)
	}
}

// Leave counts a request out. The last to leave a closed Inflight runs its Close's
// function, on a goroutine of its own: it may write to PostgreSQL, and the request
// has its answer to finish.
func (f *Inflight) Leave() {
	if f != nil && f.n.Add(-1) == 0 && f.closed.Load() {
		go f.once.Do(func() { f.then(true) })
	}
}

// Close runs then once no request is in: at once, with later false, or after the
// last request leaves, with later true.
func (f *Inflight) Close(then func(later bool)) {
	if f == nil {
		then(false)
		return
	}
	f.then = then
	f.closed.Store(true)
	if f.n.Load() == 0 {
		f.once.Do(func() { then(false) })
	}
}
