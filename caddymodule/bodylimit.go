package caddymodule

import (
	"io"
	"net/http"
	"strings"

	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/limiter"
)

// defaultMaxRequestBody is max_request_body's default: the upstream's own limit.
const defaultMaxRequestBody = 1 << 20

// limitBody holds a proxied request's body to max_request_body. A Content-Length
// over it is answered 413 request_too_large here, before anything goes upstream, with
// Connection: close (refuseBody), and limitBody reports false. Any other body is read through a limit. A chunked body
// that crosses it fails the reverse proxy's read at the first byte too many. The
// proxyWriter then answers the same 413 as the client's failure (clientFailed). So
// the upstream never gets more than the limit, and never answers or hangs up first:
// without the limit, its own 413 raced the rest of the upload, and a reset
// connection was a 502.
func (h *Handler) limitBody(w http.ResponseWriter, r *http.Request, key *keystore.Key, count limiter.Result, units int) bool {
	if r.ContentLength > h.MaxRequestBody {
		h.countUsage(key, keystore.OutcomeProxied, http.StatusRequestEntityTooLarge, units)
		setRateLimit(w.Header(), count)
		refuseBody(w)
		writeJSON(w, http.StatusRequestEntityTooLarge, bodyRequestTooLarge)
		return false
	}
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = http.MaxBytesReader(innermostWriter(w), r.Body, h.MaxRequestBody)
	}
	return true
}

// refuseBody tells net/http's server that the request's body is over its limit
// before any of it is read, with http.MaxBytesReader's own signal, as a chunked body
// crossing it does. The server then answers with Connection: close and closes the
// connection gracefully after the answer, instead of reading the body first: a
// client that waits to send it (Expect: 100-continue, or none) would otherwise get
// the 413 only at read_body's timeout.
func refuseBody(w http.ResponseWriter) {
	var one [1]byte
	_, _ = http.MaxBytesReader(innermostWriter(w), io.NopCloser(strings.NewReader(".")), 0).Read(one[:])
}

// innermostWriter unwraps w to the writer of net/http's server. http.MaxBytesReader
// tells that one, and no wrapper, that the limit was hit. The server then closes
// the connection after the answer, gracefully, rather than read the rest of the
// body as the next request. Caddy's access log puts a reader of its own in place of
// the request's body, which hides a body closed early from the server.
func innermostWriter(w http.ResponseWriter) http.ResponseWriter {
	for {
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return w
		}
		w = u.Unwrap()
	}
}
