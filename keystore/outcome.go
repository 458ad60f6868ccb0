package keystore

import "net/http"

// Outcome is what the gateway decided for a request. Its name is the label of the
// keygate_requests_total metric, the "outcome" field of the access log and the
// outcome column of the usage record (docs/operations.md, docs/usage.md). The
// outcomes table below is the one list of them: a new outcome is a constant and a
// row there.
type Outcome uint8

// The outcomes, in the order of the outcomes table.
const (
	OutcomeUnauthenticated    Outcome = iota // no, a malformed, an unknown or a wrong key
	OutcomeFeatureGated                      // the plan has no API access
	OutcomeRateLimited                       // over the key's or the organisation's minute
	OutcomeForbidden                         // the key's role (a Viewer key writing) or its scopes
	OutcomeMe                                // GET /v1/me, answered by the gateway
	OutcomeProxied                           // handed to the upstream, whatever it answered
	OutcomeLookupUnavailable                 // PostgreSQL did not answer in time
	OutcomeLimiterUnavailable                // Redis did not count, limiter_failure closed
	OutcomeQuotaExceeded                     // the organisation's month is spent
	OutcomeIPDenied                          // a key used from outside its allowed networks
	OutcomeInvalidPath                       // a path a service could route otherwise than the gateway decided
	NumOutcomes                              // the number of outcomes, not an outcome
)

// outcomes holds each outcome's name and the status the gateway answers it with. A
// status of 0 is not fixed: a proxied request takes the status its client got. An
// outcome with keyKnown is decided once the key is known, so the usage record counts
// it; the others have no key to count against. An outcome with inMonth counts
// against a monthly quota: the request passed every budget.
var outcomes = [NumOutcomes]struct {
	name     string
	status   int
	keyKnown bool
	inMonth  bool
}{
	OutcomeUnauthenticated:    {"unauthenticated", http.StatusUnauthorized, false, false},
	OutcomeFeatureGated:       {"feature_gated", http.StatusForbidden, true, false},
	OutcomeRateLimited:        {"rate_limited", http.StatusTooManyRequests, true, false},
	OutcomeForbidden:          {"forbidden", http.StatusForbidden, true, true},
	OutcomeMe:                 {"me", http.StatusOK, true, true},
	OutcomeProxied:            {"proxied", 0, true, true},
	OutcomeLookupUnavailable:  {"lookup_unavailable", http.StatusServiceUnavailable, false, false},
	OutcomeLimiterUnavailable: {"limiter_unavailable", http.StatusServiceUnavailable, true, false},
	OutcomeQuotaExceeded:      {"quota_exceeded", http.StatusPaymentRequired, true, false},
	OutcomeIPDenied:           {"ip_denied", http.StatusUnauthorized, true, false},
	OutcomeInvalidPath:        {"invalid_path", http.StatusBadRequest, false, false},
}

// String returns o's name, or "" for a value that is no outcome.
func (o Outcome) String() string {
	if o >= NumOutcomes {
		return ""
	}
	return outcomes[o].name
}

// Status returns the status the gateway answers o with, or 0 where it is not fixed
// (OutcomeProxied) or o is no outcome.
func (o Outcome) Status() int {
	if o >= NumOutcomes {
		return 0
	}
	return outcomes[o].status
}

// Recorded reports whether the usage record counts o: whether o is decided once the
// request's key is known.
func (o Outcome) Recorded() bool {
	return o < NumOutcomes && outcomes[o].keyKnown
}
