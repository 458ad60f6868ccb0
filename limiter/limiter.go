// Package limiter counts the requests of API keys against their budgets, in fixed
// windows aligned to UTC (a second, a minute, an hour, a day) and in UTC calendar
// months. The window of a span of d seconds holding instant t is floor(unix(t) / d).
//
// A request counts against up to three budgets, in order (see Budgets): its key's
// windows (its minute, and a second, an hour and a day where it has them), its
// organisation's minute, its organisation's month. A key whose plan has no
// organisation budget counts against its key's windows alone: the one-stage case of
// the same count. Windows count every request that reaches them, allowed or not; in a
// window, the requests numbered limit+1 and later are refused.
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

// ErrBadLimit is returned by Allow for Budgets with no budget at all. "No API
// access" and "unlimited" are the caller's decisions, not counts.
var ErrBadLimit = errors.New("limiter: limit must be positive")

// Span is the length of a window: a second, a minute, an hour or a day. Each window is
// aligned to UTC: the day's start at midnight UTC.
type Span uint8

// The spans, in the order a key's windows are listed: its minute first.
const (
	Minute Span = iota
	Second
	Hour
	Day
	spans // how many
)

// spanSeconds are the spans' lengths, in seconds.
var spanSeconds = [spans]int64{Minute: 60, Second: 1, Hour: 3600, Day: 86400}

// spanNames are the spans' names.
var spanNames = [spans]string{Minute: "minute", Second: "second", Hour: "hour", Day: "day"}

// Seconds returns the length of s in seconds.
func (s Span) Seconds() int { return int(spanSeconds[s]) }

// String returns "second", "minute", "hour" or "day".
func (s Span) String() string { return spanNames[s] }

// Window is the state of one window after a count.
type Window struct {
	// Allowed reports whether the request passed the window's budget. A key's windows
	// are one budget: each of them refuses a request that one of them refuses.
	Allowed bool
	// Limit is the limit the request was counted against; 0 when the budget does
	// not apply.
	Limit int
	// Remaining is how many more units the window allows; never negative.
	Remaining int
	// ResetAfter is the whole number of seconds left in the window, rounded up, at
	// least 1. It is the Retry-After of a request the window refused.
	ResetAfter int
}

// Limiter is what both backends do.
type Limiter interface {
	// Allow counts one request against b's budgets in order, stopping at the first
	// that refuses it: the key's windows count it, the request passing only if it fits
	// in every one of them; then, if they allowed it, the org's minute window counts
	// it; then, if that allowed it, the org's month lets it through and counts it, or
	// refuses it uncounted when it does not fit. Windows count every request that
	// reaches them, refused or not, except where a refused request would spend units
	// the window still has (see Budgets.Cost); a month counts only what passed every
	// budget. An error means nothing was
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

// windowOf returns the index of the window of span s holding t, and the whole seconds
// left in it, rounded up, at least 1. It also returns how long the window's counters
// must live from t, in milliseconds: the rest of the window and one window more. So a
// gateway whose clock runs a little behind still finds the count.
func windowOf(t time.Time, s Span) (index int64, resetAfter int, ttlMs int64) {
	ms := t.UnixMilli()
	windowMs := spanSeconds[s] * 1000
	index = floorDiv(ms, windowMs)
	leftMs := (index+1)*windowMs - ms // 1..windowMs
	resetAfter = int((leftMs + 999) / 1000)
	return index, max(resetAfter, 1), leftMs + windowMs
}

// clock is the windows of every span holding one instant (see windowOf), by span.
type clock struct {
	index  [spans]int64
	resets [spans]int
	ttlMs  [spans]int64
}

func clockAt(t time.Time) clock {
	var c clock
	for s := range spans {
		c.index[s], c.resets[s], c.ttlMs[s] = windowOf(t, s)
	}
	return c
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// window builds the Window of the count'th request of a window.
func window(count int64, limit, resetAfter int) Window {
	return Window{
		Allowed:    count <= int64(limit),
		Limit:      limit,
		Remaining:  int(max(int64(limit)-count, 0)),
		ResetAfter: resetAfter,
	}
}
