// Package apperr is the upstream's one error type. Its code says what went wrong, in
// the caller's terms. Its message is safe to show them. The store returns these
// errors. The HTTP API maps their codes to statuses and bodies. The command line maps
// them to exit codes. So the three layers share one vocabulary.
package apperr

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Error codes of the upstream. Every error a handler can answer with carries one. Each
// code's comment gives its HTTP status and body, as the OpenAPI documents do.
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
	// ECONFLICT is a write that clashes with existing data. Examples are a duplicate
	// email in the CLI, and the roll of a revoked or expired key. HTTP: 409
	// {"error":"conflict","message":Message}.
	ECONFLICT = "conflict"
	// EMETHOD is a known route called with a method it does not serve. HTTP: 405
	// {"error":"method not allowed"}.
	EMETHOD = "method_not_allowed"
	// ERATELIMITED is a request refused for how often it came: a login, for the
	// recent failures from the client's address (the store's login throttle; the
	// password is not checked), or a webhook's test event past its limit. HTTP: 429
	// {"error":"rate_limited","retryAfter":RetryAfter} with a Retry-After header.
	ERATELIMITED = "rate_limited"
	// ETOOLARGE is a request body over the HTTP API's limit. HTTP: 413
	// {"error":"request_too_large"}.
	ETOOLARGE = "request_too_large"
	// EUNAVAILABLE is a database that cannot be reached, is shutting down, or does not
	// answer within the database timeout. A full password-hashing queue is one too. A
	// retry later may succeed. HTTP: 503 {"error":"service_unavailable"}. A database
	// failure's cause is logged.
	EUNAVAILABLE = "unavailable"
	// EINTERNAL is anything else: a broken database, a bug. HTTP: 500
	// {"error":"internal"}. The cause is logged, never sent.
	EINTERNAL = "internal"
)

// Error is the upstream's one error type. It has a code and a message meant for the
// caller. A quota or feature error also names its metric or feature.
type Error struct {
	// Code is one of the E* constants.
	Code string
	// Message is safe to show to the caller. It never carries internal details.
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

// Code returns the code of the first *Error in err's chain. A database that cannot be
// reached is EUNAVAILABLE. Any other non-nil error is EINTERNAL, and nil is "".
func Code(err error) string {
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

// dbUnavailable reports whether err says that PostgreSQL could not be reached or went
// away. A statement that failed is not that.
func dbUnavailable(err error) bool {
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &connectErr), pgconn.Timeout(err), errors.As(err, &netErr),
		errors.Is(err, io.ErrUnexpectedEOF):
		return true
	case errors.As(err, &pgErr):
		// Class 08 is connection exceptions. 57P01 to 57P03 are a server shutting down
		// or starting. 53300 is too many connections.
		return strings.HasPrefix(pgErr.Code, "08") || pgErr.Code == "57P01" || pgErr.Code == "57P02" ||
			pgErr.Code == "57P03" || pgErr.Code == "53300"
	}
	return false
}

// Invalid returns the EINVALID error for field, whose message is "<field>: <what>".
func Invalid(field, format string, args ...any) *Error {
	return &Error{Code: EINVALID, Message: field + ": " + fmt.Sprintf(format, args...)}
}

// RateLimited returns the 429 of a throttled login that may be retried after d. d is
// rounded up to a whole second.
func RateLimited(d time.Duration) *Error {
	secs := int((d + time.Second - 1) / time.Second)
	return &Error{Code: ERATELIMITED, Message: "rate limited", RetryAfter: max(secs, 1)}
}

// QuotaExceeded returns the 402 of a plan quota.
func QuotaExceeded(metric string) *Error {
	return &Error{Code: EQUOTA, Message: "quota exceeded", Detail: metric}
}

// FeatureGated returns the 403 of a feature the plan lacks.
func FeatureGated(feature string) *Error {
	return &Error{Code: EFEATUREGATED, Message: "feature gated", Detail: feature}
}

// The errors the routes answer with, in one list. So every door says exactly the same
// words.
var (
	ErrUnauthenticated   = &Error{Code: EUNAUTHORIZED, Message: "unauthenticated"}
	ErrKeyUnauth         = &Error{Code: EUNAUTHORIZED, Message: "api key unauthenticated"}
	ErrBadCredentials    = &Error{Code: EUNAUTHORIZED, Message: "invalid credentials"}
	ErrForbidden         = &Error{Code: EFORBIDDEN, Message: "forbidden"}
	ErrNotFound          = &Error{Code: ENOTFOUND, Message: "not found"}
	ErrMonitorNotFound   = &Error{Code: ENOTFOUND, Message: "monitor not found"}
	ErrMethodNotAllowed  = &Error{Code: EMETHOD, Message: "method not allowed"}
	ErrRequestTooLarge   = &Error{Code: ETOOLARGE, Message: "request_too_large"}
	ErrAPIFeatureGated   = FeatureGated("api")
	ErrMonitorQuota      = QuotaExceeded("monitors")
	ErrMinIntervalQuota  = QuotaExceeded("min_interval_seconds")
	ErrInternalForClient = &Error{Code: EINTERNAL, Message: "internal"}
	ErrUnavailable       = &Error{Code: EUNAVAILABLE, Message: "service unavailable"}
	ErrHashQueueFull     = &Error{Code: EUNAVAILABLE, Message: "password hashing queue full"}
)
