package caddymodule

import (
	"net/http"
	"slices"
	"strconv"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/limiter"
)

// This file holds step 4 of ServeHTTP, the rate limit: the count, the
// limiter_failure policy, the 429, and the RateLimit header fields of every answer
// after it.

// limiterFailure is the limiter_failure policy: what a request of a rate-limited key
// gets while Redis cannot count it.
type limiterFailure uint8

const (
	failOpen   limiterFailure = iota // through, without RateLimit fields
	failClosed                       // 503 service_unavailable
	failLocal                        // counted in this instance, against the same limit
)

// limiterFailures are the values of limiter_failure, by mode.
var limiterFailures = [...]string{failOpen: "open", failClosed: "closed", failLocal: "local"}

func (m limiterFailure) String() string { return limiterFailures[m] }

// parseLimiterFailure returns the mode a value of limiter_failure names. ok is false
// for any other value.
func parseLimiterFailure(v string) (m limiterFailure, ok bool) {
	i := slices.Index(limiterFailures[:], v)
	return limiterFailure(max(i, 0)), i >= 0
}

// budgetsOf returns the budgets a request of key and cost counts against: its own
// windows (its minute, and a second, an hour and a day where it has them), and its
// organisation's minute and month where its plan has them. A key of a plan without
// organisation budgets counts on its own windows alone, its minute on the counter it
// always had.
func budgetsOf(key *keystore.Key, cost int) limiter.Budgets {
	return limiter.Budgets{Key: key.ID, KeyLimit: key.RateLimit, KeyPerSecond: key.Windows[keystore.PerSecond],
		KeyPerHour: key.Windows[keystore.PerHour], KeyPerDay: key.Windows[keystore.PerDay], Org: key.OrgID,
		OrgLimit: key.OrgRateLimit, MonthLimit: key.MonthlyQuota, Cost: cost}
}

// counted reports whether b has any budget: an unlimited key without windows, of a
// plan without organisation budgets, is not counted.
func counted(b limiter.Budgets) bool {
	return b.KeyLimit > 0 || b.KeyPerSecond > 0 || b.KeyPerHour > 0 || b.KeyPerDay > 0 || b.OrgLimit > 0 || b.MonthLimit > 0
}

// rateLimit is step 4. It counts a request of key against its budgets, cost units at
// each, in the order README.md gives: the key's windows, the organisation's minute,
// its month. The
// count is what the RateLimit fields of the answer show; its zero value is a request
// not counted (an unlimited key without organisation budgets, or a count Redis could
// not make under limiter_failure open). When Redis cannot count, h.failMode decides.
// rateLimit answers the request itself when a budget refuses it (429 or 402), or when
// limiter_failure closed refuses it (503). answered then tells ServeHTTP to stop.
// Otherwise the count goes on to the answer.
func (h *Handler) rateLimit(w http.ResponseWriter, r *http.Request, key *keystore.Key, cost int) (count limiter.Result, answered bool) {
	b := budgetsOf(key, cost)
	if !counted(b) {
		return limiter.Result{}, false
	}
	count, err := h.counts.allow(r.Context(), b)
	if err != nil {
		h.limiterFailed(key, err)
		switch h.failMode {
		case failOpen:
			return limiter.Result{}, false
		case failClosed:
			h.answerUnits(w, r, keystore.OutcomeLimiterUnavailable, key, cost, bodyServiceUnavailable)
			return limiter.Result{}, true
		case failLocal:
			// The in-process limiter fails only when the month's seed cannot be read:
			// the request then goes through uncounted, as under limiter_failure open.
			count, err = h.fallback.Allow(r.Context(), b)
			if err != nil {
				return limiter.Result{}, false
			}
		}
	}
	switch count.RefusedAt {
	case limiter.StageKey, limiter.StageOrg:
		if c := h.logger.Check(zapcore.DebugLevel, "rate limit exceeded"); c != nil {
			c.Write(zap.String("key_id", key.ID), zap.String("budget", count.RefusedAt.String()))
		}
		var buf [128]byte
		h.answerUnits(w, r, keystore.OutcomeRateLimited, key, cost, rateLimited(w.Header(), &count, cost, buf[:0]))
		return count, true
	case limiter.StageMonth:
		setRateLimit(w.Header(), count)
		h.answerUnits(w, r, keystore.OutcomeQuotaExceeded, key, cost, quotaExceededBody(count.Month))
		return count, true
	}
	return count, false
}

// limiterFailureLogs are the messages of limiterFailed, by mode.
var limiterFailureLogs = [...]string{
	failOpen:   "rate limiter failed; letting the request through (limiter_failure open)",
	failClosed: "rate limiter failed; answering 503 (limiter_failure closed)",
	failLocal:  "rate limiter failed; counting in this instance (limiter_failure local)",
}

// limiterFailed logs a count that Redis could not make, at most once a second.
func (h *Handler) limiterFailed(key *keystore.Key, err error) {
	if c := h.floodLog.Check(zapcore.WarnLevel, limiterFailureLogs[h.failMode]); c != nil {
		c.Write(zap.String("key_id", key.ID), zap.Error(err))
	}
}

// rateLimited sets the header fields of the 429 of a request of cost over a window's
// budget, in hdr, and returns its body, appended to b. The body names the refusing
// window's budget ("key" or "org") and span ("second", "minute", "hour" or "day"),
// and the cost when it is above 1. Retry-After and the body's retryAfter both carry
// the seconds left in the refusing window, unless the cost is above its whole limit:
// then no wait helps, and the body says so with the limit and "fits":false instead.
func rateLimited(hdr http.Header, count *limiter.Result, cost int, b []byte) []byte {
	retryAfter := count.RetryAfter()
	b = append(b, `{"error":"rate_limited",`...)
	if !count.NeverFits {
		b = append(b, `"retryAfter":`...)
		b = strconv.AppendInt(b, int64(retryAfter), 10)
		b = append(b, ',')
	}
	b = append(b, `"budget":"`...)
	b = append(b, count.RefusedAt.String()...)
	b = append(b, `","window":"`...)
	b = append(b, count.RefusedIn.String()...)
	b = append(b, '"')
	if cost > 1 {
		b = append(b, `,"cost":`...)
		b = strconv.AppendInt(b, int64(cost), 10)
	}
	if count.NeverFits {
		b = append(b, `,"limit":`...)
		b = strconv.AppendInt(b, int64(count.Refusing().Limit), 10)
		b = append(b, `,"fits":false`...)
	}
	b = append(b, '}')
	setRateLimit(hdr, *count)
	if !count.NeverFits {
		hdr["Retry-After"] = []string{strconv.Itoa(retryAfter)}
	}
	return b
}

// setRateLimit makes hdr carry the request's count and no other. A counted request
// gets RateLimit-Policy and RateLimit (draft-ietf-httpapi-ratelimit-headers-11), with
// one item per window that counted it: the key's minute as "default", then its
// "second", "hour" and "day", then "org", the organisation's minute. A request not
// counted gets neither. The fields are set, not added, so an upstream's own are
// replaced: only the gateway counts.
func setRateLimit(hdr http.Header, count limiter.Result) {
	// Both values are built in one buffer and become one string. Their slices share
	// one backing array, each capped at its value (see writeJSON).
	var buf [384]byte
	b := appendItems(buf[:0], &count, true)
	if len(b) == 0 {
		delete(hdr, "Ratelimit")
		delete(hdr, "Ratelimit-Policy")
		return
	}
	split := len(b)
	b = appendItems(b, &count, false)
	both := string(b)
	v := []string{both[:split], both[split:]}
	hdr["Ratelimit-Policy"], hdr["Ratelimit"] = v[0:1:1], v[1:2:2]
}

// appendItems appends the items of each window of count that applies, in the order
// setRateLimit lists them, separated by commas: RateLimit-Policy's (policy) or
// RateLimit's.
func appendItems(b []byte, count *limiter.Result, policy bool) []byte {
	start := len(b)
	for s := limiter.Minute; s <= limiter.Day; s++ {
		if w := count.KeyWindow(s); w.Limit > 0 {
			name := s.String()
			if s == limiter.Minute {
				name = "default" // the key's minute, under the name it has always had
			}
			b = appendItem(b, start, name, w, s.Seconds(), policy)
		}
	}
	if count.Org.Limit > 0 {
		b = appendItem(b, start, "org", count.Org, limiter.Minute.Seconds(), policy)
	}
	return b
}

// appendItem appends the item of a window of so many seconds, after a comma if b
// holds an item after start: its limit and length (policy), or what it has left and
// the seconds until it ends.
func appendItem(b []byte, start int, name string, w limiter.Window, seconds int, policy bool) []byte {
	if len(b) > start {
		b = append(b, ", "...)
	}
	b = append(b, '"')
	b = append(b, name...)
	if policy {
		b = append(b, `";q=`...)
		b = strconv.AppendInt(b, int64(w.Limit), 10)
		b = append(b, ";w="...)
		return strconv.AppendInt(b, int64(seconds), 10)
	}
	b = append(b, `";r=`...)
	b = strconv.AppendInt(b, int64(max(w.Remaining, 0)), 10)
	b = append(b, ";t="...)
	return strconv.AppendInt(b, int64(w.ResetAfter), 10)
}
