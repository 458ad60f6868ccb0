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
// minute, and its organisation's minute and month where its plan has them. A key of a
// plan without organisation budgets counts on its own minute alone, on the counter it
// always had.
func budgetsOf(key *keystore.Key, cost int) limiter.Budgets {
	return limiter.Budgets{Key: key.ID, KeyLimit: key.RateLimit, Org: key.OrgID,
		OrgLimit: key.OrgRateLimit, MonthLimit: key.MonthlyQuota, Cost: cost}
}

// counted reports whether b has any budget: an unlimited key of a plan without
// organisation budgets is not counted.
func counted(b limiter.Budgets) bool {
	return b.KeyLimit > 0 || b.OrgLimit > 0 || b.MonthLimit > 0
}

// rateLimit is step 4. It counts a request of key against its budgets, cost units at
// each, in the order README.md gives: the key's minute, the organisation's minute, its
// month. The
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
			h.record(r, outcomeLimiterUnavailable, key)
			writeJSON(w, http.StatusServiceUnavailable, bodyServiceUnavailable)
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
		h.record(r, outcomeRateLimited, key)
		writeRateLimited(w, count)
		return count, true
	case limiter.StageMonth:
		h.record(r, outcomeQuotaExceeded, key)
		setRateLimit(w.Header(), count)
		writeJSON(w, http.StatusPaymentRequired, bodyQuotaExceeded)
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

// writeRateLimited writes the 429 of a request over a minute budget. Retry-After and
// the body's retryAfter both carry the seconds left in the refusing window, and the
// body's budget names that window's budget: "key" or "org".
func writeRateLimited(w http.ResponseWriter, count limiter.Result) {
	retryAfter := count.RetryAfter()
	var buf [80]byte
	b := append(buf[:0], `{"error":"rate_limited","retryAfter":`...)
	b = strconv.AppendInt(b, int64(retryAfter), 10)
	b = append(b, `,"budget":"`...)
	b = append(b, count.RefusedAt.String()...)
	b = append(b, `"}`...)
	hdr := w.Header()
	setRateLimit(hdr, count)
	hdr["Retry-After"] = []string{strconv.Itoa(retryAfter)}
	writeJSON(w, http.StatusTooManyRequests, b)
}

// setRateLimit makes hdr carry the request's count and no other. A counted request
// gets RateLimit-Policy and RateLimit (draft-ietf-httpapi-ratelimit-headers-11), with
// one item per minute budget that counted it: "default", the key's, then "org", the
// organisation's. A request not counted gets neither. The fields are set, not added,
// so an upstream's own are replaced: only the gateway counts.
func setRateLimit(hdr http.Header, count limiter.Result) {
	keyCounted := count.Key.Limit > 0
	if !keyCounted && count.Org.Limit == 0 {
		delete(hdr, "Ratelimit")
		delete(hdr, "Ratelimit-Policy")
		return
	}
	// Both values are built in one buffer and become one string. Their slices share
	// one backing array, each capped at its value (see writeJSON).
	var buf [192]byte
	b := buf[:0]
	if keyCounted {
		b = appendPolicy(b, "default", count.Key.Limit)
	}
	if count.Org.Limit > 0 {
		if keyCounted {
			b = append(b, ", "...)
		}
		b = appendPolicy(b, "org", count.Org.Limit)
	}
	split := len(b)
	if keyCounted {
		b = appendState(b, "default", count.Key)
	}
	if count.Org.Limit > 0 {
		if keyCounted {
			b = append(b, ", "...)
		}
		b = appendState(b, "org", count.Org)
	}
	both := string(b)
	v := []string{both[:split], both[split:]}
	hdr["Ratelimit-Policy"], hdr["Ratelimit"] = v[0:1:1], v[1:2:2]
}

// appendPolicy appends the RateLimit-Policy item of a one-minute budget of limit.
func appendPolicy(b []byte, name string, limit int) []byte {
	b = append(b, '"')
	b = append(b, name...)
	b = append(b, `";q=`...)
	b = strconv.AppendInt(b, int64(limit), 10)
	return append(b, ";w=60"...)
}

// appendState appends the RateLimit item of a budget's window: what it has left, and
// the seconds until it ends.
func appendState(b []byte, name string, rl limiter.Minute) []byte {
	b = append(b, '"')
	b = append(b, name...)
	b = append(b, `";r=`...)
	b = strconv.AppendInt(b, int64(max(rl.Remaining, 0)), 10)
	b = append(b, ";t="...)
	return strconv.AppendInt(b, int64(rl.ResetAfter), 10)
}
