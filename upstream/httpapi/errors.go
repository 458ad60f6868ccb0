package httpapi

import (
	"errors"
	"net/http"
	"strconv"

	"go.uber.org/zap"

	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/upstream/apperr"
)

// errorResponse is how one code answers over HTTP: a status, and a body built from
// the *apperr.Error.
type errorResponse struct {
	status int
	body   func(e *apperr.Error) errorBody
}

// fixedBody is the body {"error":text}, whatever the *apperr.Error says.
func fixedBody(text string) func(*apperr.Error) errorBody {
	return func(*apperr.Error) errorBody { return errorBody{Error: text} }
}

// messageBody is the body {"error":Message}. Its route chooses the words.
func messageBody(e *apperr.Error) errorBody { return errorBody{Error: e.Message} }

// errorResponses is the one table from an error's code to its HTTP status and body.
// The comments of the codes in package apperr say the same. The OpenAPI documents
// (docs/openapi.md) list every body.
var errorResponses = map[string]errorResponse{
	apperr.EINVALID: {http.StatusBadRequest, func(e *apperr.Error) errorBody {
		return errorBody{Error: "invalid_request", Message: e.Message}
	}},
	apperr.EUNAUTHORIZED: {http.StatusUnauthorized, messageBody},
	apperr.EQUOTA: {http.StatusPaymentRequired, func(e *apperr.Error) errorBody {
		return errorBody{Error: "quota_exceeded", Metric: e.Detail, Upgrade: true}
	}},
	apperr.EFORBIDDEN: {http.StatusForbidden, fixedBody("forbidden")},
	apperr.EFEATUREGATED: {http.StatusForbidden, func(e *apperr.Error) errorBody {
		return errorBody{Error: "feature_gated", Feature: e.Detail, Upgrade: true}
	}},
	apperr.ENOTFOUND: {http.StatusNotFound, messageBody},
	apperr.EMETHOD:   {http.StatusMethodNotAllowed, fixedBody("method not allowed")},
	apperr.ECONFLICT: {http.StatusConflict, func(e *apperr.Error) errorBody {
		return errorBody{Error: "conflict", Message: e.Message}
	}},
	apperr.ETOOLARGE: {http.StatusRequestEntityTooLarge, fixedBody("request_too_large")},
	apperr.ERATELIMITED: {http.StatusTooManyRequests, func(e *apperr.Error) errorBody {
		return errorBody{Error: "rate_limited", RetryAfter: e.RetryAfter}
	}},
	apperr.EUNAVAILABLE: {http.StatusServiceUnavailable, fixedBody("service_unavailable")},
	apperr.EINTERNAL:    {http.StatusInternalServerError, fixedBody("internal")},
}

// errorBody is every error body's shape. The optional members appear only for the
// codes that carry them.
type errorBody struct {
	Error   string `json:"error"`
	Message string `json:"message,omitempty"`
	Metric  string `json:"metric,omitempty"`
	Feature string `json:"feature,omitempty"`
	Upgrade bool   `json:"upgrade,omitempty"`
	// RetryAfter is camelCase, as in the gateway's own 429 (README.md).
	RetryAfter int `json:"retryAfter,omitempty"`
}

// writeError answers r with the status and JSON body of err's code (errorResponses).
// It counts a plan gate's refusal. A rate-limited request gets Retry-After.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	e := s.callerError(r, err)
	resp := errorResponses[e.Code]
	switch e.Code {
	case apperr.EQUOTA, apperr.EFEATUREGATED:
		s.metrics.gateRejected(e.Detail)
	case apperr.ERATELIMITED:
		w.Header().Set("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	writeJSON(w, resp.status, resp.body(e))
}

// callerError returns the *apperr.Error to answer err with. No internal detail reaches
// the caller. A database that cannot be reached is apperr.ErrUnavailable. Anything
// without a code of errorResponses is apperr.ErrInternalForClient. Both are logged with
// their cause.
func (s *Server) callerError(r *http.Request, err error) *apperr.Error {
	code := apperr.Code(err)
	var e *apperr.Error
	_, known := errorResponses[code]
	switch {
	case code == apperr.EUNAVAILABLE && errors.As(err, &e):
		// An overload this package detected itself, such as a full hashing queue. The
		// request log shows the 503. An error line per refusal would flood the log.
		return e
	case code == apperr.EUNAVAILABLE:
		s.logger.Error("database unavailable",
			zap.String("method", keystore.Redact(r.Method)),
			zap.String("path", keystore.Redact(r.URL.Path)),
			zap.Error(err))
		return apperr.ErrUnavailable
	case !errors.As(err, &e) || code == apperr.EINTERNAL || !known:
		s.logger.Error("internal error",
			zap.String("method", keystore.Redact(r.Method)),
			zap.String("path", keystore.Redact(r.URL.Path)),
			zap.Error(err))
		return apperr.ErrInternalForClient
	}
	return e
}
