package caddymodule

import (
	"bytes"
	"io"
	"net/http"
	"strings"

	"go.uber.org/zap"

	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/limiter"
)

// defaultMaxRequestBody is max_request_body's default: the upstream's own limit.
const defaultMaxRequestBody = 1 << 20

// limitBody reads a proxied request's body whole (readBody) before anything goes
// upstream. A body over max_request_body answers 413 request_too_large: at once when
// its Content-Length says so, closing the connection (refuseBody), else at the first
// byte too many. A body the client
// breaks answers as bodyFailure says. Then limitBody reports false, and the upstream
// has seen nothing of the request: it never commits a change whose answer the
// gateway would have to replace by an error (docs/security.md, The gateway's edge).
func (h *Handler) limitBody(w http.ResponseWriter, r *http.Request, key *keystore.Key, count limiter.Result, units int) bool {
	status := http.StatusRequestEntityTooLarge
	if r.ContentLength <= h.MaxRequestBody {
		err := readBody(w, r, h.MaxRequestBody)
		if err == nil {
			return true
		}
		status = bodyFailed(h.floodLog, w, r, err)
	} else {
		refuseBody(w)
	}
	h.countUsage(key, keystore.OutcomeProxied, status, units)
	setRateLimit(w.Header(), count)
	writeJSON(w, status, statusBody(status))
	return false
}

// readBody reads r's body, up to limit bytes, and puts it back in full, with its
// length, so that the request goes on only once its body has arrived whole. A body
// over limit is a *http.MaxBytesError; any other error is the client's reading's.
//
// A request that declares an empty body (no Transfer-Encoding and a length of 0:
// every GET and HEAD a client sends without one) is not read: net/http and HTTP/2
// have already made its body empty, and reading through Caddy's wrappers would set a
// read deadline on the connection for nothing, a cost every such request paid.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) error {
	if r.Body == nil || r.Body == http.NoBody {
		return nil
	}
	if r.ContentLength == 0 && len(r.TransferEncoding) == 0 {
		// Its own return, before the buffer below: that buffer escapes to the heap, an
		// allocation every GET would otherwise pay.
		r.Body = http.NoBody
		r.Header.Del("Expect")
		return nil
	}
	var buf bytes.Buffer
	if r.ContentLength > 0 {
		buf.Grow(int(r.ContentLength))
	}
	_, err := buf.ReadFrom(http.MaxBytesReader(innermostWriter(w), r.Body, limit))
	if err != nil {
		return err
	}
	r.Body, r.ContentLength, r.TransferEncoding = http.NoBody, 0, nil
	if buf.Len() > 0 {
		r.Body, r.ContentLength = io.NopCloser(&buf), int64(buf.Len())
	}
	// The client has been told to continue (net/http did, at the first read); the
	// upstream gets the body at once.
	r.Header.Del("Expect")
	return nil
}

// bodyFailed logs to log a body the client broke, as the client's doing, and returns
// the status that answers it (bodyFailure). It marks the connection to be closed:
// what is left of the body must never be read as another request.
func bodyFailed(log *zap.Logger, w http.ResponseWriter, r *http.Request, err error) int {
	status, lvl := bodyFailure(err)
	if c := log.Check(lvl, "the client's request body could not be read; answering with a JSON error"); c != nil {
		c.Write(zap.Int("status", status), zap.String("path", keystore.Redact(r.URL.Path)), zap.Error(err))
	}
	w.Header().Set("Connection", "close")
	return status
}

// refuseBody tells net/http's server that the request's body is over its limit
// before any of it is read, with http.MaxBytesReader's own signal, as a body crossing
// it on the way does. The server then answers with Connection: close and closes the
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
