// Package limiter counts the requests of API keys against their budgets, in fixed
// one-minute windows aligned to the UTC minute and in UTC calendar months. The window
// of instant t is floor(unix(t) / 60).
//
// A request counts against up to three budgets, in order (see Budgets): its key's
// minute, its organisation's minute, its organisation's month. A key whose plan has no
// organisation budget counts against its key's minute alone: the one-stage case of
// the same count. Minute windows count every request that reaches them, allowed or
// not; in a window, the requests numbered limit+1 and later are refused.
//
// Two backends share that behaviour. Redis counts in Redis, and every process using
// the same Redis shares each budget: several gateway instances have one budget, not
// several. Local counts in process memory, for a single instance. Both are safe for
// concurrent use, and both have one entry point, Allow.
//
// The package knows nothing of HTTP. Callers turn a Result into headers.
package limiter

import (
	"context"
	"errors"
	"time"
)

// Window is the length of a rate limit window.
const Window = time.Minute

// ErrBadLimit is returned by Allow for Budgets with no budget at all. "No API
// access" and "unlimited" are the caller's decisions, not counts.
var ErrBadLimit = errors.New("limiter: limit must be positive")

// Minute is the state of one minute window after a count.
type Minute struct {
	// Allowed reports whether the request is within the window's limit.
	Allowed bool
	// Limit is the limit the request was counted against; 0 when the budget does
	// not apply.
	Limit int
	// Remaining is how many more requests the window allows; never negative.
	Remaining int
	// ResetAfter is the whole number of seconds left in the window, rounded up, at
	// least 1. It is the Retry-After of a request the window refused.
	ResetAfter int
}

// Limiter is what both backends do.
type Limiter interface {
	// Allow counts one request against b's budgets in order, stopping at the first
	// that refuses it: the key's minute window counts it; then, if the key's allowed
	// it, the org's minute window counts it; then, if that allowed it, the org's month
	// lets it through and counts it, or refuses it uncounted once Used has reached
	// MonthLimit. Minute windows count every request that reaches them, refused or
	// not; a month counts only what passed every budget. An error means nothing was
	// counted: Redis is unreachable or slow, or the month's seed failed. The Result is
	// then meaningless, and the caller applies its failure policy.
	Allow(ctx context.Context, b Budgets) (Result, error)
}

var (
	_ Limiter = (*Redis)(nil)
	_ Limiter = (*Local)(nil)
)

// Option configures a backend.
type Option func(*options)

type options struct {
	now             func() time.Time
	prefix          string
	timeout         time.Duration // WithTimeout; 0: none
	pipelineTimeout time.Duration // 0: no pipelining
	linger          time.Duration // WithLinger; 0: none
	monthSeed       MonthSeed     // WithMonthSeed; nil: none
}

// WithClock makes the limiter read the time from now instead of time.Now. Tests of
// window edges use it.
func WithClock(now func() time.Time) Option {
	return func(o *options) { o.now = now }
}

// WithPrefix sets the prefix of the Redis keys holding counts. Default: "keygate:rl:".
func WithPrefix(prefix string) Option {
	return func(o *options) { o.prefix = prefix }
}

// WithTimeout bounds each Allow of a Redis limiter. Its deadline is its context's, or
// d after the call if that is sooner. A deadline set this way costs a pipelined count
// a pooled timer. A context.WithTimeout of the caller's would cost four allocations
// (gather.DoBy in internal/gather). Default: the context's deadline only.
func WithTimeout(d time.Duration) Option {
	return func(o *options) { o.timeout = d }
}

// WithPipelining makes a Redis limiter gather the counts of concurrent Allow calls into
// one pipeline, a round. A round goes out as soon as the previous one returns. If that
// takes longer, it goes out a tenth of timeout after its first count joined. So a slow
// round in flight costs a caller at most that, on top of its own round.
//
// A round serves many callers. So it runs until the latest of their deadlines, or for
// timeout if one has none. Each caller still stops waiting at its own deadline, or when
// its context ends. Its count carries its own deadline (see Redis).
//
// A count alone in its round runs on its caller's goroutine, under its caller's
// context. Give the client ContextTimeoutEnabled: such a round then ends at the
// caller's deadline, not at the client's ReadTimeout.
//
// Pipelining needs a client with a Pipeline method: Client, Ring, ClusterClient or
// UniversalClient. It is ignored otherwise, and by Local.
func WithPipelining(timeout time.Duration) Option {
	return func(o *options) { o.pipelineTimeout = timeout }
}

// WithLinger lets a pipeline round started while counts come fast wait up to d for
// more (gather.Options.Linger in internal/gather). Fewer, larger rounds cost Redis and
// the gateway less CPU per count, for up to d of latency. It applies only with
// WithPipelining.
func WithLinger(d time.Duration) Option {
	return func(o *options) { o.linger = d }
}

func buildOptions(opts []Option) options {
	o := options{now: time.Now, prefix: "keygate:rl:"}
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// windowOf returns the index of the window holding t, and the whole seconds left in
// it, rounded up, at least 1. It also returns how long the window's counters must live
// from t, in milliseconds: the rest of the window and one window more. So a gateway
// whose clock runs a little behind still finds the count.
func windowOf(t time.Time) (index int64, resetAfter int, ttlMs int64) {
	ms := t.UnixMilli()
	const windowMs = int64(Window / time.Millisecond)
	index = floorDiv(ms, windowMs)
	leftMs := (index+1)*windowMs - ms // 1..60000
	resetAfter = int((leftMs + 999) / 1000)
	return index, max(resetAfter, 1), leftMs + windowMs
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// minute builds the Minute of the count'th request of a window.
func minute(count int64, limit, resetAfter int) Minute {
	return Minute{
		Allowed:    count <= int64(limit),
		Limit:      limit,
		Remaining:  int(max(int64(limit)-count, 0)),
		ResetAfter: resetAfter,
	}
}
