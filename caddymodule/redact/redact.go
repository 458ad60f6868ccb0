// Package redact is the Caddy log filter keygate_redact: it keeps API keys' secrets
// and the gateway's credentials out of Caddy's logs. Package caddymodule imports it,
// so a Caddy built with caddymodule has it.
package redact

import (
	"net/http"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/logging"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/keygate/keygate/gatewayauth"
	"github.com/keygate/keygate/keystore"
)

func init() {
	caddy.RegisterModule(RedactFilter{})
}

// RedactFilter is the log field filter keygate_redact
// (caddy.logging.encoders.filter.keygate_redact). On a string field (request>uri,
// request>host, request>method), it replaces the secret of every API key by REDACTED,
// percent-encoded or not (keystore.Redact). On a header object (request>headers,
// resp_headers), it does the same in the name and the values of every header,
// whatever its name: Api-Key, X-Auth-Token, Referer and so on. It redacts every value
// of a header whose values hold a key only together: a key split over two values. It
// replaces X-Gateway-Secret and X-Gateway-Identity, an upstream's credential for a
// minute, which the reverse proxy logs among the headers it sent upstream. Caddy's
// own redaction of Authorization, Cookie and Set-Cookie still applies.
//
// Caddy's filter encoder names fields exactly (request>headers>Api-Key). It has no
// wildcard for "every header", so this filter takes the whole object.
//
//	log {
//		format filter {
//			fields {
//				request>uri keygate_redact
//				request>host keygate_redact
//				request>method keygate_redact
//				request>headers keygate_redact
//			}
//		}
//	}
type RedactFilter struct{}

// CaddyModule returns the Caddy module information.
func (RedactFilter) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "caddy.logging.encoders.filter.keygate_redact",
		New: func() caddy.Module { return new(RedactFilter) },
	}
}

// UnmarshalCaddyfile sets up the filter from Caddyfile tokens; it takes no options.
func (RedactFilter) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume filter name
	if d.NextArg() {
		return d.ArgErr()
	}
	return nil
}

// Filter redacts the field; see RedactFilter.
func (RedactFilter) Filter(in zapcore.Field) zapcore.Field {
	switch v := in.Interface.(type) {
	case caddyhttp.LoggableHTTPHeader:
		return zap.Object(in.Key, redactHeader(v))
	case caddyhttp.LoggableStringArray:
		out := make(caddyhttp.LoggableStringArray, len(v))
		for i, s := range v {
			out[i] = keystore.Redact(s)
		}
		in.Interface = out
		return in
	}
	if in.Type == zapcore.StringType {
		in.String = keystore.Redact(in.String)
	}
	return in
}

func redactHeader(h caddyhttp.LoggableHTTPHeader) caddyhttp.LoggableHTTPHeader {
	out := caddyhttp.LoggableHTTPHeader{Header: make(http.Header, len(h.Header)), ShouldLogCredentials: h.ShouldLogCredentials}
	for name, values := range h.Header {
		if strings.EqualFold(name, "X-Gateway-Secret") || strings.EqualFold(name, gatewayauth.Header) {
			out.Header[name] = []string{"REDACTED"}
			continue
		}
		// A key sent as a header's name is logged as the name, canonicalized (in
		// lower case but for its first letter).
		name = keystore.Redact(name)
		out.Header[name] = append(out.Header[name], redactValues(values)...)
	}
	return out
}

// redactValues redacts each of a header's values. It redacts every one of them when
// only their concatenation holds a key, as they come or with a dot between them. A
// key split over two values of one header is a key in the log all the same.
func redactValues(values []string) []string {
	out := make([]string, len(values))
	for i, v := range values {
		out[i] = keystore.Redact(v)
	}
	if len(out) < 2 {
		return out
	}
	for _, sep := range []string{"", "."} {
		if joined := strings.Join(out, sep); keystore.Redact(joined) != joined {
			for i := range out {
				out[i] = "REDACTED"
			}
			break
		}
	}
	return out
}

// Interface guards
var (
	_ logging.LogFieldFilter = (*RedactFilter)(nil)
	_ caddyfile.Unmarshaler  = (*RedactFilter)(nil)
)
