// Package jwks is the Caddy module v1_gateway_jwks: it publishes the public halves of
// v1_gateway's identity keys as a JSON Web Key Set, for the upstreams that verify its
// signed identity. Package caddymodule imports it, so a Caddy built with caddymodule
// has it.
package jwks

import (
	"fmt"
	"net/http"
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/keygate/keygate/caddymodule/placement"
	"github.com/keygate/keygate/gatewayauth"
)

func init() {
	caddy.RegisterModule(JWKS{})
	httpcaddyfile.RegisterDirective("v1_gateway_jwks", parseJWKSCaddyfile)
	httpcaddyfile.RegisterDirectiveOrder("v1_gateway_jwks", httpcaddyfile.Before, "respond")
}

// JWKS is the module v1_gateway_jwks. It answers every request with the JSON Web
// Key Set (RFC 7517) of the public halves of the gateway's identity keys. Upstreams
// verify X-Gateway-Identity with it (package gatewayauth). During a rotation it
// lists the old key beside the new one, until the old one's assertions have expired:
// a minute after it stopped signing. It never holds a private part.
//
//	handle /.well-known/jwks.json {
//		v1_gateway_jwks /etc/keygate/identity-new.pem /etc/keygate/identity-old.pem
//	}
type JWKS struct {
	// Files are PEM files of Ed25519 keys, private (PKCS#8) or public (PKIX). The
	// public half of each is published. Placeholders are replaced at load. Required.
	Files []string `json:"files,omitempty"`

	body []byte
}

// CaddyModule returns the Caddy module information.
func (JWKS) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.v1_gateway_jwks",
		New: func() caddy.Module { return new(JWKS) },
	}
}

// Provision reads the keys once; a reload reads them again. It warns when the
// handler is under no path matcher.
func (j *JWKS) Provision(ctx caddy.Context) error {
	if len(j.Files) == 0 {
		return fmt.Errorf("v1_gateway_jwks: at least one key file is required")
	}
	placement.WarnUnmatched(ctx, "v1_gateway_jwks", "handle /.well-known/jwks.json { … }")
	repl := caddy.NewReplacer()
	files := make([]string, len(j.Files))
	for i, f := range j.Files {
		files[i] = repl.ReplaceKnown(f, "")
	}
	body, err := gatewayauth.JWKS(files...)
	if err != nil {
		return fmt.Errorf("v1_gateway_jwks: %v", err)
	}
	j.body = body
	return nil
}

// ServeHTTP answers with the key set. Verifiers use it for its max-age, and fetch it
// again at once for an unknown kid.
func (j *JWKS) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	hdr := w.Header()
	hdr.Set("Content-Type", "application/jwk-set+json")
	hdr.Set("Content-Length", strconv.Itoa(len(j.body)))
	hdr.Set("Cache-Control", "public, max-age=300")
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		w.Write(j.body)
	}
	return nil
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens. Syntax:
//
//	v1_gateway_jwks <pem file>...
//
// It takes no matcher, so that an absolute path (/etc/keygate/identity.pem) is read
// as a file rather than as a path matcher. Place it in a handle or route block.
func (j *JWKS) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume directive name
	j.Files = d.RemainingArgs()
	if len(j.Files) == 0 {
		return d.ArgErr()
	}
	if d.NextBlock(0) {
		return d.Err("v1_gateway_jwks takes no block")
	}
	return nil
}

func parseJWKSCaddyfile(h httpcaddyfile.Helper) ([]httpcaddyfile.ConfigValue, error) {
	j := new(JWKS)
	if err := j.UnmarshalCaddyfile(h.Dispenser); err != nil {
		return nil, err
	}
	return h.NewRoute(nil, j), nil
}

// Interface guards
var (
	_ caddy.Provisioner           = (*JWKS)(nil)
	_ caddyhttp.MiddlewareHandler = (*JWKS)(nil)
	_ caddyfile.Unmarshaler       = (*JWKS)(nil)
)
