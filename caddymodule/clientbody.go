package caddymodule

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"syscall"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/dustin/go-humanize"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

func init() {
	caddy.RegisterModule(ClientBody{})
	httpcaddyfile.RegisterHandlerDirective("keygate_body", parseClientBody)
	httpcaddyfile.RegisterDirectiveOrder("keygate_body", httpcaddyfile.Before, "reverse_proxy")
}

// ClientBody is the keygate_body handler (http.handlers.keygate_body): a request body
// the client breaks, on a route without v1_gateway, is the client's failure. Caddy's
// reverse proxy answers a body it cannot read (malformed chunking) as an upstream
// failure, an empty 502, and may do so after the upstream committed the request.
// Before it, ClientBody reads the body whole, and answers a failure as v1_gateway
// does: 400 {"error":"bad_request"}, and 413 {"error":"request_too_large"} for a body
// over max_size, logged at info level as the client's doing. A client that hangs up
// mid-upload gets 499, logged at debug level. The request goes on only with its body
// whole. Caddyfile.example puts it before the dashboard's reverse_proxy
// (docs/security.md, The gateway's edge).
type ClientBody struct {
	// MaxSize is the largest request body, in bytes, passed on. A larger one answers
	// 413 request_too_large: at once when Content-Length says so, and when a chunked
	// body crosses it. The Caddyfile takes sizes such as 1MiB.
	// Default: 1MiB (the upstream's own limit)
	MaxSize int64 `json:"max_size,omitempty"`

	logger *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (ClientBody) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.keygate_body",
		New: func() caddy.Module { return new(ClientBody) },
	}
}

// Provision applies the default.
func (c *ClientBody) Provision(ctx caddy.Context) error {
	c.logger = ctx.Logger()
	if c.MaxSize == 0 {
		c.MaxSize = defaultMaxRequestBody
	}
	return nil
}

// Validate checks max_size.
func (c *ClientBody) Validate() error {
	if c.MaxSize < 0 {
		return fmt.Errorf("max_size %d: must be positive", c.MaxSize)
	}
	return nil
}

// ServeHTTP reads the request's body whole, within MaxSize, and hands the request
// on, or answers the body's failure.
func (c *ClientBody) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if r.ContentLength > c.MaxSize {
		writeJSON(w, http.StatusRequestEntityTooLarge, bodyRequestTooLarge)
		return nil
	}
	if err := readBody(w, r, c.MaxSize); err != nil {
		status := bodyFailed(c.logger, w, r, err)
		writeJSON(w, status, statusBody(status))
		return nil
	}
	return next.ServeHTTP(w, r)
}

// bodyFailure returns the status that answers a request body the client broke, and
// the level its log line takes. A body that is not valid HTTP (malformed chunking) is
// 400, one over a limit 413, both logged at info. A hang-up mid-upload is 499, which
// nobody reads, logged at debug.
func bodyFailure(err error) (int, zapcore.Level) {
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return http.StatusRequestEntityTooLarge, zapcore.InfoLevel
	case errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET):
		return statusClientClosed, zapcore.DebugLevel
	}
	return http.StatusBadRequest, zapcore.InfoLevel
}

// parseClientBody sets up keygate_body from Caddyfile tokens. Syntax:
//
//	keygate_body [<matcher>] [<max_size>]
func parseClientBody(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	c := new(ClientBody)
	err := c.UnmarshalCaddyfile(h.Dispenser)
	return c, err
}

// UnmarshalCaddyfile reads keygate_body's one optional argument, max_size.
func (c *ClientBody) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume directive name
	if d.NextArg() {
		n, err := humanize.ParseBytes(d.Val())
		if err != nil || n == 0 || n > math.MaxInt64 {
			return d.Errf("max_size must be a positive size such as 1MiB, not %q", d.Val())
		}
		c.MaxSize = int64(n)
	}
	if d.NextArg() {
		return d.ArgErr()
	}
	if d.NextBlock(0) {
		return d.Err("keygate_body takes no block")
	}
	return nil
}

// Interface guards
var (
	_ caddy.Module                = (*ClientBody)(nil)
	_ caddy.Provisioner           = (*ClientBody)(nil)
	_ caddy.Validator             = (*ClientBody)(nil)
	_ caddyhttp.MiddlewareHandler = (*ClientBody)(nil)
	_ caddyfile.Unmarshaler       = (*ClientBody)(nil)
)
