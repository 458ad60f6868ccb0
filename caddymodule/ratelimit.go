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

// rateCount is a request's count, as the RateLimit fields of its answer show it. The
// zero value is a request not counted: an unlimited key, or a count Redis could not
// make under limiter_failure open.
type rateCount struct {
	limiter.Result
	counted bool
}

// rateLimit is step 4. It counts a request of key, unless the key is unlimited. When
// Redis cannot count, h.failMode decides. rateLimit answers the request itself when
// the key is over its limit (429), or when limiter_failure closed refuses it (503).
// answered then tells ServeHTTP to stop. Otherwise the count goes on to the answer.
func (h *Handler) rateLimit(w http.ResponseWriter, r *http.Request, key *keystore.Key) (count rateCount, answered bool) {
	if key.RateLimit <= 0 {
		return rateCount{}, false // unlimited: not counted
	}
	rl, err := h.counts.allow(r.Context(), key.ID, key.RateLimit)
	if err != nil {
		h.limiterFailed(key, err)
		switch h.failMode {
		case failOpen:
			return rateCount{}, false
		case failClosed:
			h.record(r, outcomeLimiterUnavailable, key)
			writeJSON(w, http.StatusServiceUnavailable, bodyServiceUnavailable)
			return rateCount{}, true
		case failLocal:
			// Local.Allow fails only for a limit below 1, which does not get here.
			rl, _ = h.fallback.Allow(r.Context(), key.ID, key.RateLimit)
		}
	}
	count = rateCount{rl, true}
	if !rl.Allowed {
		if c := h.logger.Check(zapcore.DebugLevel, "rate limit exceeded"); c != nil {
			c.Write(zap.String("key_id", key.ID), zap.Int("limit", rl.Limit))
		}
		h.record(r, outcomeRateLimited, key)
		writeRateLimited(w, count)
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

// writeRateLimited writes the 429 of a key over its limit. Retry-After and the body's
// retryAfter both carry the seconds left in the window.
func writeRateLimited(w http.ResponseWriter, count rateCount) {
	var buf [64]byte
	b := append(buf[:0], `{"error":"rate_limited","retryAfter":`...)
	b = strconv.AppendInt(b, int64(count.ResetAfter), 10)
	b = append(b, '}')
	hdr := w.Header()
	setRateLimit(hdr, count)
	hdr["Retry-After"] = []string{strconv.Itoa(count.ResetAfter)}
	writeJSON(w, http.StatusTooManyRequests, b)
}

// setRateLimit makes hdr carry the request's count and no other. A counted request
// gets RateLimit-Policy and RateLimit (draft-ietf-httpapi-ratelimit-headers-11). A
// request not counted gets neither. The fields are set, not added, so an upstream's
// own are replaced: only the gateway counts.
func setRateLimit(hdr http.Header, count rateCount) {
	if !count.counted {
		delete(hdr, "Ratelimit")
		delete(hdr, "Ratelimit-Policy")
		return
	}
	// Both values are built in one buffer and become one string. Their slices share
	// one backing array, each capped at its value (see writeJSON).
	var buf [96]byte
	b := append(buf[:0], `"default";q=`...)
	b = strconv.AppendInt(b, int64(count.Limit), 10)
	b = append(b, ";w=60"...)
	split := len(b)
	b = append(b, `"default";r=`...)
	b = strconv.AppendInt(b, int64(max(count.Remaining, 0)), 10)
	b = append(b, ";t="...)
	b = strconv.AppendInt(b, int64(count.ResetAfter), 10)
	both := string(b)
	v := []string{both[:split], both[split:]}
	hdr["Ratelimit-Policy"], hdr["Ratelimit"] = v[0:1:1], v[1:2:2]
}
