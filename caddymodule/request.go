package caddymodule

import (
	"net/http"
	"slices"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/keygate/keygate/gatewayauth"
	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/limiter"
)

// This file holds step 7 of ServeHTTP, the request sent upstream. The client's
// credentials go out, the key's identity goes in, and the upstream is asked for a
// body the filter can read. response.go holds what comes back.

// proxy is step 7. The request goes on with its header rewritten for the upstream.
// Its response comes back through a proxyWriter (response.go). The usage record
// counts it as units, its route's cost.
func (h *Handler) proxy(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, key keystore.Key, count limiter.Result, units int) error {
	if err := h.rewriteHeader(r.Header, key); err != nil {
		// Ed25519 signing does not fail with a valid key. Should it, the request
		// does not go on unsigned.
		h.logger.Error("signing the identity assertion", zap.Error(err))
		const status = http.StatusInternalServerError
		h.countUsage(&key, keystore.OutcomeProxied, status, units)
		writeJSON(w, status, statusBody(status))
		return nil
	}
	if !h.limitBody(w, r, &key, count, units) {
		return nil
	}
	pw := newProxyWriter(w, r, count, h.fields, h.floodLog)
	pw.refusedLog = h.refusedLog
	defer pw.release()
	defer h.countProxied(&key, pw, units) // once answered, however: the status the client got
	if err := next.ServeHTTP(pw, r); err != nil {
		return pw.nextFailed(err)
	}
	if err := pw.finish(); err != nil {
		// The status and part of the body are out. All that is left is to cut the
		// response short, so that the client sees it is incomplete.
		if c := h.floodLog.Check(zapcore.ErrorLevel, "aborting a response the JSON filter could not complete"); c != nil {
			c.Write(zap.String("key_id", key.ID), zap.String("path", keystore.Redact(r.URL.Path)), zap.Error(err))
		}
		panic(http.ErrAbortHandler)
	}
	return nil
}

// rewriteHeader makes hdr, the client's request header, the upstream's. It removes
// the client's credentials and every X-Gateway-* field the client sent. It sets the
// key's identity: X-Gateway-Org-Id, -Key-Id, -Key-Role, a scoped key's
// X-Gateway-Key-Scopes (space-separated), and X-Gateway-Secret or X-Gateway-Identity
// or both. Its only error is a failure to sign the identity.
func (h *Handler) rewriteHeader(hdr http.Header, key keystore.Key) error {
	for name := range hdr {
		if len(name) >= len("X-Gateway-") && asciiEqualFold(name[:len("X-Gateway-")], "x-gateway-") {
			delete(hdr, name)
		}
	}
	delete(hdr, "Authorization")
	delete(hdr, "Cookie")
	if _, ok := hdr["Connection"]; ok {
		keepOwnFields(hdr)
	}
	// The upstream answers uncompressed, so that its JSON can be filtered as it
	// streams. The header says identity: without one, Go's transport would ask for
	// gzip itself. The upstream answers whole, since a byte range of a JSON document
	// cannot be filtered.
	//
	// The seven values share one backing array, each slice capped at its value (see
	// writeJSON).
	v := []string{"identity", key.OrgID, key.ID, string(key.Role), h.secret, "", ""}
	hdr["Accept-Encoding"] = v[0:1:1]
	delete(hdr, "Range")
	delete(hdr, "If-Range")
	hdr["X-Gateway-Org-Id"] = v[1:2:2]
	hdr["X-Gateway-Key-Id"] = v[2:3:3]
	hdr["X-Gateway-Key-Role"] = v[3:4:4]
	if h.secret != "" {
		hdr["X-Gateway-Secret"] = v[4:5:5]
	}
	if key.Scopes != nil {
		v[6] = strings.Join(key.Scopes, " ")
		hdr["X-Gateway-Key-Scopes"] = v[6:7:7]
	}
	if h.signer != nil {
		assertion, err := h.signer.Assertion(key.ID, key.OrgID, string(key.Role), key.Scopes...)
		if err != nil {
			return err
		}
		v[5] = assertion
		hdr[gatewayauth.Header] = v[5:6:6]
	}
	return nil
}

// keepOwnFields removes from the client's Connection header the names of the fields
// the module sets on a proxied request (X-Gateway-*, Accept-Encoding). The reverse
// proxy deletes every field Connection names, as a proxy must (RFC 9110, section
// 7.6.1). It does so after the module has set them. So a client could otherwise
// strip the gateway's identity, or have the upstream compress what the filter must
// read. The client's other names stay, and still remove the fields they name.
func keepOwnFields(hdr http.Header) {
	vals := hdr["Connection"]
	if !slices.ContainsFunc(vals, namesOwnField) {
		return
	}
	var kept []string
	for _, v := range vals {
		for name := range strings.SplitSeq(v, ",") {
			if name = strings.TrimSpace(name); name != "" && !namesOwnField(name) {
				kept = append(kept, name)
			}
		}
	}
	if len(kept) == 0 {
		delete(hdr, "Connection")
		return
	}
	hdr["Connection"] = []string{strings.Join(kept, ", ")}
}

// namesOwnField reports whether a Connection value names a field the module sets,
// in any case, among other names or alone.
func namesOwnField(v string) bool {
	for name := range strings.SplitSeq(v, ",") {
		name = strings.TrimSpace(name)
		if asciiEqualFold(name, "accept-encoding") ||
			len(name) >= len("x-gateway-") && asciiEqualFold(name[:len("x-gateway-")], "x-gateway-") {
			return true
		}
	}
	return false
}

// setIdentityPlaceholders makes the key's identity available to the rest of the
// config, and to Caddy's access log (user_id). It never sets the key itself.
func setIdentityPlaceholders(r *http.Request, key keystore.Key) {
	repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if !ok {
		return
	}
	repl.Set("http.auth.user.id", key.ID)
	repl.Set("http.auth.user.org_id", key.OrgID)
	repl.Set("http.auth.user.role", string(key.Role))
}
