package upstream

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"
)

// Error codes of the upstream. Every error a handler can answer with carries one of
// these; writeError maps them to the statuses and bodies of CONTRACT §6, and the CLI
// maps them to its exit codes.
const (
	// EINVALID is a request (or command line) with a bad value. HTTP: 400
	// {"error":"invalid_request","message":Message}, where Message names the field.
	EINVALID = "invalid"
	// EUNAUTHORIZED is a request without valid credentials. HTTP: 401
	// {"error":Message}, Message being "unauthenticated", "api key unauthenticated"
	// or "invalid credentials" depending on the route.
	EUNAUTHORIZED = "unauthorized"
	// EFORBIDDEN is an authenticated caller whose role lacks the permission. HTTP: 403
	// {"error":"forbidden"}.
	EFORBIDDEN = "forbidden"
	// EQUOTA is a plan quota that a write would exceed; Detail is the metric. HTTP: 402
	// {"error":"quota_exceeded","metric":Detail,"upgrade":true}.
	EQUOTA = "quota_exceeded"
	// EFEATUREGATED is a feature the organisation's plan lacks; Detail is the feature.
	// HTTP: 403 {"error":"feature_gated","feature":Detail,"upgrade":true}.
	EFEATUREGATED = "feature_gated"
	// ENOTFOUND is a resource the caller cannot see. HTTP: 404 {"error":Message}.
	ENOTFOUND = "not_found"
	// ECONFLICT is a write that clashes with existing data (a duplicate email in the
	// CLI, the roll of a revoked or expired key). HTTP: 409
	// {"error":"conflict","message":Message}.
	ECONFLICT = "conflict"
	// EMETHOD is a known route called with a method it does not serve. HTTP: 405
	// {"error":"method not allowed"}.
	EMETHOD = "method_not_allowed"
	// ERATELIMITED is a login refused before the password is checked, because of the
	// recent failures from the client's address (throttlestore.go). HTTP: 429
	// {"error":"rate_limited","retryAfter":RetryAfter} with a Retry-After header.
	ERATELIMITED = "rate_limited"
	// ETOOLARGE is a request body over maxBodyBytes. HTTP: 413
	// {"error":"request_too_large"}.
	ETOOLARGE = "request_too_large"
	// EUNAVAILABLE is a database that cannot be reached, is shutting down or does not
	// answer within the database timeout, or a password-hashing queue that is full:
	// worth a retry later. HTTP: 503 {"error":"service_unavailable"}; a database
	// failure's cause is logged.
	EUNAVAILABLE = "unavailable"
	// EINTERNAL is anything else: a broken database, a bug. HTTP: 500
	// {"error":"internal"}; the cause is logged, never sent.
	EINTERNAL = "internal"
)

// Error is the upstream's one error type: a code, a message meant for the caller, and
// for quota and feature errors the name of the metric or feature.
type Error struct {
	// Code is one of the E* constants.
	Code string
	// Message is safe to show to the caller: it never carries internal details.
	Message string
	// Detail is the metric of an EQUOTA error or the feature of an EFEATUREGATED one.
	Detail string
	// RetryAfter is the whole number of seconds an ERATELIMITED caller must wait.
	RetryAfter int
}

// Error implements the error interface.
func (e *Error) Error() string {
	if e.Detail != "" {
		return fmt.Sprintf("upstream error: code=%s message=%s detail=%s", e.Code, e.Message, e.Detail)
	}
	return fmt.Sprintf("upstream error: code=%s message=%s", e.Code, e.Message)
}

// Errorf returns an *Error with the given code and a formatted message.
func Errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// ErrorCode returns the code of the first *Error in err's chain, EUNAVAILABLE for a
// database that cannot be reached, EINTERNAL for any other non-nil error, and "" for nil.
func ErrorCode(err error) string {
	var e *Error
	switch {
	case err == nil:
		return ""
	case errors.As(err, &e):
		return e.Code
	case dbUnavailable(err):
		return EUNAVAILABLE
	}
	return EINTERNAL
}

// dbUnavailable reports whether err says that PostgreSQL could not be reached or
// went away, rather than that a statement failed.
func dbUnavailable(err error) bool {
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &connectErr), pgconn.Timeout(err), errors.As(err, &netErr),
		errors.Is(err, io.ErrUnexpectedEOF):
		return true
	case errors.As(err, &pgErr):
		// Class 08 is connection exceptions; 57P01..57P03 are a server shutting down or
		// starting; 53300 is too many connections.
		return strings.HasPrefix(pgErr.Code, "08") || pgErr.Code == "57P01" || pgErr.Code == "57P02" ||
			pgErr.Code == "57P03" || pgErr.Code == "53300"
	}
	return false
}

// invalid returns the EINVALID error for field, whose message is "<field>: <what>".
func invalid(field, format string, args ...any) *Error {
	return &Error{Code: EINVALID, Message: field + ": " + fmt.Sprintf(format, args...)}
}

// rateLimited returns the 429 of a throttled login that may be retried after d,
// rounded up to a whole second.
func rateLimited(d time.Duration) *Error {
	secs := int((d + time.Second - 1) / time.Second)
	return &Error{Code: ERATELIMITED, Message: "rate limited", RetryAfter: max(secs, 1)}
}

// quotaExceeded returns the 402 of a plan quota.
func quotaExceeded(metric string) *Error {
	return &Error{Code: EQUOTA, Message: "quota exceeded", Detail: metric}
}

// featureGated returns the 403 of a feature the plan lacks.
func featureGated(feature string) *Error {
	return &Error{Code: EFEATUREGATED, Message: "feature gated", Detail: feature}
}

// The errors the routes answer with, so that every door says exactly the same words.
var (
	errUnauthenticated   = &Error{Code: EUNAUTHORIZED, Message: "unauthenticated"}
	errKeyUnauth         = &Error{Code: EUNAUTHORIZED, Message: "api key unauthenticated"}
	errBadCredentials    = &Error{Code: EUNAUTHORIZED, Message: "invalid credentials"}
	errForbidden         = &Error{Code: EFORBIDDEN, Message: "forbidden"}
	errNotFound          = &Error{Code: ENOTFOUND, Message: "not found"}
	errMonitorNotFound   = &Error{Code: ENOTFOUND, Message: "monitor not found"}
	errMethodNotAllowed  = &Error{Code: EMETHOD, Message: "method not allowed"}
	errRequestTooLarge   = &Error{Code: ETOOLARGE, Message: "request_too_large"}
	errAPIFeatureGated   = featureGated("api")
	errMonitorQuota      = quotaExceeded("monitors")
	errMinIntervalQuota  = quotaExceeded("min_interval_seconds")
	errInternalForClient = &Error{Code: EINTERNAL, Message: "internal"}
	errUnavailable       = &Error{Code: EUNAVAILABLE, Message: "service unavailable"}
	errHashQueueFull     = &Error{Code: EUNAVAILABLE, Message: "password hashing queue full"}
)

// errorResponse is how one code answers over HTTP: a status and the body built from
// the *Error.
type errorResponse struct {
	status int
	body   func(e *Error) errorBody
}

// fixedBody is the body {"error":text}, whatever the *Error says.
func fixedBody(text string) func(*Error) errorBody {
	return func(*Error) errorBody { return errorBody{Error: text} }
}

// messageBody is the body {"error":Message}, for the codes whose routes choose the words.
func messageBody(e *Error) errorBody { return errorBody{Error: e.Message} }

// errorResponses is the one table from an error's code to its HTTP status and body
// (CONTRACT §6); the comments of the codes above say the same.
var errorResponses = map[string]errorResponse{
	EINVALID: {http.StatusBadRequest, func(e *Error) errorBody {
		return errorBody{Error: "invalid_request", Message: e.Message}
	}},
	EUNAUTHORIZED: {http.StatusUnauthorized, messageBody},
	EQUOTA: {http.StatusPaymentRequired, func(e *Error) errorBody {
		return errorBody{Error: "quota_exceeded", Metric: e.Detail, Upgrade: true}
	}},
	EFORBIDDEN: {http.StatusForbidden, fixedBody("forbidden")},
	EFEATUREGATED: {http.StatusForbidden, func(e *Error) errorBody {
		return errorBody{Error: "feature_gated", Feature: e.Detail, Upgrade: true}
	}},
	ENOTFOUND: {http.StatusNotFound, messageBody},
	EMETHOD:   {http.StatusMethodNotAllowed, fixedBody("method not allowed")},
	ECONFLICT: {http.StatusConflict, func(e *Error) errorBody {
		return errorBody{Error: "conflict", Message: e.Message}
	}},
	ETOOLARGE: {http.StatusRequestEntityTooLarge, fixedBody("request_too_large")},
	ERATELIMITED: {http.StatusTooManyRequests, func(e *Error) errorBody {
		return errorBody{Error: "rate_limited", RetryAfter: e.RetryAfter}
	}},
	EUNAVAILABLE: {http.StatusServiceUnavailable, fixedBody("service_unavailable")},
	EINTERNAL:    {http.StatusInternalServerError, fixedBody("internal")},
}

// errorBody is every error body's shape; the optional fields appear only for the codes
// that carry them.
type errorBody struct {
	Error   string `json:"error"`
	Message string `json:"message,omitempty"`
	Metric  string `json:"metric,omitempty"`
	Feature string `json:"feature,omitempty"`
	Upgrade bool   `json:"upgrade,omitempty"`
	// RetryAfter keeps the contract's camelCase (CONTRACT §11).
	RetryAfter int `json:"retryAfter,omitempty"`
}

// writeError answers r with the status and JSON body of err's code (errorResponses).
// A plan gate's refusal is counted, a throttled login gets Retry-After.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	e := s.callerError(r, err)
	resp := errorResponses[e.Code]
	switch e.Code {
	case EQUOTA, EFEATUREGATED:
		s.metrics.gateRejected(e.Detail)
	case ERATELIMITED:
		w.Header().Set("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	writeJSON(w, resp.status, resp.body(e))
}

// callerError returns the *Error to answer err with. A database that cannot be reached
// is logged with its cause and answered with errUnavailable; anything without a code of
// errorResponses is logged with its cause and answered with errInternalForClient, so
// that no internal detail reaches the caller.
func (s *Server) callerError(r *http.Request, err error) *Error {
	code := ErrorCode(err)
	var e *Error
	_, known := errorResponses[code]
	switch {
	case code == EUNAVAILABLE && errors.As(err, &e):
		// An overload this package detected itself (a full hashing queue): the request
		// log shows the 503; an error line per refused request would flood the log.
		return e
	case code == EUNAVAILABLE:
		s.logger.Error("database unavailable",
			zap.String("method", r.Method),
			zap.String("path", r.URL.Path),
			zap.Error(err))
		return errUnavailable
	case !errors.As(err, &e) || code == EINTERNAL || !known:
		s.logger.Error("internal error",
			zap.String("method", r.Method),
			zap.String("path", r.URL.Path),
			zap.Error(err))
		return errInternalForClient
	}
	return e
}
