package caddymodule

import (
	"compress/gzip"
	"compress/zlib"
	"errors"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/keygate/keygate/fieldstrip"
	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/limiter"
)

// This file holds the response of step 7: the proxyWriter, its hand-off to the JSON
// filter, its one error writer and its one list of headers to drop. request.go holds
// the request.

// writerMode is what a proxyWriter does with the body. It is decided when the
// response header is written.
type writerMode uint8

const (
	modeUndecided   writerMode = iota
	modePassthrough            // copied unchanged: not JSON, or no body
	modeFilter                 // JSON: through the filter
	modeDecode                 // compressed JSON: decoded, then through the filter
	modeDiscard                // replaced by a body of the module's: the upstream's is dropped
)

// proxyWriter is the ResponseWriter the next handler, the reverse proxy, writes to
// in step 7. When the response header is written, it:
//
//   - sets the request's RateLimit fields, replacing any the upstream sent;
//   - makes an ETag weak, since the body may be rewritten;
//   - for any body a status may have: removes Content-Length and Accept-Ranges,
//     decodes gzip or deflate, and streams the body through the JSON filter
//     (package fieldstrip). It filters a body labelled JSON, and sniffs any other.
//     Any other Content-Encoding is answered 502, rather than let unfiltered fields
//     through;
//   - replaces the body of an error (status >= 400) that is not JSON by
//     {"error":"<status text>"}, so that every /v1 error is JSON.
//
// Anything else passes through unchanged, streamed: Flush and ReadFrom work. An
// upstream that fails before answering gets the same JSON error (nextFailed). The
// request's body has arrived whole before the request goes on (limitBody): the
// upstream's answer is never replaced by the client's failure.
type proxyWriter struct {
	*caddyhttp.ResponseWriterWrapper
	wrapper caddyhttp.ResponseWriterWrapper // what ResponseWriterWrapper points to: one allocation for both
	r       *http.Request
	count   limiter.Result     // the request's count, for the RateLimit fields
	fields  *fieldstrip.Fields // strip_fields
	log     *zap.Logger        // the handler's rate-limited logger
	// refusedLog logs an upstream's 401: the upstream refused the credentials of a
	// request the gateway authenticated (upstreamRefusedLog).
	refusedLog *zap.Logger

	mode   writerMode
	status int
	filter *fieldstrip.Filter
	// In modeDecode, the handler writes the compressed body to pipe. A goroutine
	// decodes it into filter, and sends its outcome on done.
	pipe *io.PipeWriter
	done chan error
}

func newProxyWriter(w http.ResponseWriter, r *http.Request, count limiter.Result, fields *fieldstrip.Fields, log *zap.Logger) *proxyWriter {
	pw := &proxyWriter{
		wrapper: caddyhttp.ResponseWriterWrapper{ResponseWriter: w},
		r:       r,
		count:   count,
		fields:  fields,
		log:     log,
	}
	pw.ResponseWriterWrapper = &pw.wrapper
	return pw
}

// WriteHeader decides what to do with the body; see proxyWriter.
func (pw *proxyWriter) WriteHeader(status int) {
	if pw.mode != modeUndecided {
		return
	}
	if status >= 100 && status <= 199 && status != http.StatusSwitchingProtocols {
		pw.ResponseWriter.WriteHeader(status) // informational: not the response yet
		return
	}
	pw.status = status
	if status == http.StatusUnauthorized && pw.refusedLog != nil {
		pw.refusedLog.Error("the upstream refused the credentials of a request the gateway authenticated (401); "+
			"check identity_key and identity_audience against its JWKS and audience, or gateway_secret against its secret",
			zap.String("path", keystore.Redact(pw.r.URL.Path)))
	}
	hdr := pw.Header()
	setRateLimit(hdr, pw.count)
	weakenETag(hdr)

	// Any Content-Type value saying JSON makes the body JSON. Every other body is
	// sniffed, whatever its label: text/plain, application/octet-stream, none.
	isJSON := false
	for _, ct := range hdr.Values("Content-Type") {
		isJSON = isJSON || fieldstrip.IsJSONType(ct)
	}
	switch {
	case status >= 400 && !isJSON:
		pw.writeError(status)
		return
	case status == http.StatusSwitchingProtocols:
		pw.passthrough(status)
		return
	case pw.r.Method == http.MethodHead || !bodyAllowedForStatus(status):
		if isJSON {
			hdr.Del("Content-Length") // the length of the unfiltered body
		}
		pw.passthrough(status)
		return
	}

	// A JSON body, or a body that may be JSON, is filtered. Its length changes, so
	// it goes out chunked.
	hdr.Del("Content-Length")
	hdr.Del("Accept-Ranges")
	encoding := strings.ToLower(strings.TrimSpace(hdr.Get("Content-Encoding")))
	switch encoding {
	case "", "identity":
		hdr.Del("Content-Encoding")
		pw.filter = fieldstrip.NewFilter(pw.ResponseWriter, pw.fields, !isJSON)
		pw.mode = modeFilter
		pw.ResponseWriter.WriteHeader(status)
	case "gzip", "x-gzip", "deflate":
		hdr.Del("Content-Encoding")
		pw.filter = fieldstrip.NewFilter(pw.ResponseWriter, pw.fields, !isJSON)
		pw.mode = modeDecode
		pw.ResponseWriter.WriteHeader(status)
		pw.startDecoder(encoding)
	default:
		// br, zstd, a list of codings: not decoded here, and never passed on
		// unfiltered.
		if c := pw.log.Check(zapcore.ErrorLevel, "upstream sent JSON in an unsupported content encoding; answering 502"); c != nil {
			c.Write(zap.String("content_encoding", keystore.Redact(encoding)), zap.String("path", keystore.Redact(pw.r.URL.Path)))
		}
		pw.writeError(http.StatusBadGateway)
	}
}

func (pw *proxyWriter) passthrough(status int) {
	pw.mode = modePassthrough
	pw.ResponseWriter.WriteHeader(status)
}

// upstreamRefusedLog returns the logger of an upstream's 401, with the credentials
// the gateway sends it. It writes at most one line a minute. A wrong
// identity_audience, key or secret fails every request alike, and the client sees
// only the 401.
func (h *Handler) upstreamRefusedLog() *zap.Logger {
	var fields []zap.Field
	if h.signer != nil {
		fields = append(fields, zap.String("identity_kid", h.signer.KeyID()), zap.String("identity_audience", h.IdentityAudience))
	}
	if h.secret != "" {
		fields = append(fields, zap.Bool("gateway_secret", true))
	}
	return h.logger.With(fields...).WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return zapcore.NewSamplerWithOptions(c, time.Minute, 1, 0)
	}))
}

// upstreamBodyHeaders are the upstream's header fields that describe its body. A
// body of the module's in its place drops them.
var upstreamBodyHeaders = []string{"Content-Encoding", "Content-Range", "Accept-Ranges", "Etag", "Last-Modified", "Content-Disposition"}

// writeError answers status with the module's JSON body for it (statusBody), with
// the request's RateLimit fields. The upstream's body, if any, is discarded.
func (pw *proxyWriter) writeError(status int) {
	pw.mode, pw.status = modeDiscard, status
	hdr := pw.Header()
	setRateLimit(hdr, pw.count)
	for _, name := range upstreamBodyHeaders {
		delete(hdr, name)
	}
	writeJSON(pw.ResponseWriter, status, statusBody(status))
}

// nextFailed turns an error returned by the next handler, a dead or slow upstream,
// into the module's JSON answer. Once something has been written, a response is
// under way, and the error goes back to Caddy.
func (pw *proxyWriter) nextFailed(err error) error {
	if pw.mode != modeUndecided {
		return err
	}
	// The reverse proxy's errors carry their status: 502 for an upstream it cannot
	// reach, 504 for one that timed out. Any other error is the server's own.
	status := http.StatusInternalServerError
	if he, ok := errors.AsType[caddyhttp.HandlerError](err); ok && he.StatusCode != 0 {
		status = he.StatusCode
	}
	lvl := zapcore.ErrorLevel
	if status == statusClientClosed {
		lvl = zapcore.DebugLevel // the client went away
	}
	if c := pw.log.Check(lvl, "upstream failed; answering with a JSON error"); c != nil {
		c.Write(zap.Int("status", status), zap.String("path", keystore.Redact(pw.r.URL.Path)), zap.Error(err))
	}
	pw.writeError(status)
	return nil
}

// statusClientClosed is Caddy's status for a client that went away. The reverse
// proxy answers it when its round trip ends in context.Canceled.
const statusClientClosed = 499

func (pw *proxyWriter) Write(p []byte) (int, error) {
	if pw.mode == modeUndecided {
		pw.WriteHeader(http.StatusOK)
	}
	switch pw.mode {
	case modeFilter:
		return pw.filter.Write(p)
	case modeDecode:
		return pw.pipe.Write(p)
	case modeDiscard:
		return len(p), nil
	}
	return pw.ResponseWriter.Write(p)
}

// ReadFrom keeps io.Copy from going around Write to the underlying writer.
func (pw *proxyWriter) ReadFrom(r io.Reader) (int64, error) {
	if pw.mode == modeUndecided {
		pw.WriteHeader(http.StatusOK)
	}
	if pw.mode == modePassthrough {
		return pw.ResponseWriterWrapper.ReadFrom(r)
	}
	return io.Copy(writerOnly{pw}, r)
}

// writerOnly hides ReadFrom from io.Copy.
type writerOnly struct{ io.Writer }

// FlushError flushes what the filter has written. In modeDecode the decoding
// goroutine owns the underlying writer, so flushing is left to the end.
func (pw *proxyWriter) FlushError() error {
	if pw.mode == modeUndecided {
		pw.WriteHeader(http.StatusOK)
	}
	if pw.mode == modeDecode || pw.mode == modeDiscard {
		return nil
	}
	//nolint:bodyclose
	return http.NewResponseController(pw.ResponseWriter).Flush()
}

// Flush implements http.Flusher for callers that do not use http.ResponseController.
func (pw *proxyWriter) Flush() { _ = pw.FlushError() }

// startDecoder starts the goroutine decoding a compressed body into the filter.
func (pw *proxyWriter) startDecoder(encoding string) {
	pr, pwr := io.Pipe()
	pw.pipe, pw.done = pwr, make(chan error, 1)
	go func() {
		var zr io.ReadCloser
		var err error
		if encoding == "deflate" {
			zr, err = zlib.NewReader(pr) // HTTP's "deflate" is the zlib format
		} else {
			zr, err = gzip.NewReader(pr)
		}
		if err == nil {
			_, err = io.Copy(pw.filter, zr)
			if err == nil {
				err = pw.filter.Close()
			}
			zr.Close()
		}
		// Unblock the writer. With the error when decoding failed, so that the proxy
		// stops copying; with io.EOF-like closing otherwise.
		pr.CloseWithError(errors.Join(err, errDecodingDone))
		pw.done <- err
	}()
}

var errDecodingDone = errors.New("response body fully decoded")

// finish completes the body after the next handler returned without error. The
// filter checks that the JSON ended where JSON may end. An error means the client
// got a truncated body, and the caller must abort the response.
func (pw *proxyWriter) finish() error {
	switch pw.mode {
	case modeFilter:
		return pw.filter.Close()
	case modeDecode:
		pw.pipe.Close()
		err := <-pw.done
		pw.pipe, pw.done = nil, nil
		return err
	case modeUndecided:
		// Nothing written: the server answers 200 with the header as it is. It must
		// carry the request's RateLimit fields.
		setRateLimit(pw.Header(), pw.count)
	}
	return nil
}

// release frees the filter. It stops the decoding goroutine, should the next
// handler have panicked: the reverse proxy aborts a response that way. It must run,
// deferred, after finish or instead of it.
func (pw *proxyWriter) release() {
	if pw.done != nil {
		pw.pipe.CloseWithError(errAborted)
		<-pw.done
		pw.pipe, pw.done = nil, nil
	}
	if pw.filter != nil {
		pw.filter.Release()
		pw.filter = nil
	}
}

var errAborted = errors.New("response aborted")

// weakenETag makes a strong ETag weak. The body may be filtered, so it is no longer
// byte-identical to the upstream's. It is still equivalent for a given upstream
// body, and If-None-Match, which compares weakly, keeps working.
func weakenETag(hdr http.Header) {
	vals := hdr["Etag"]
	if len(vals) != 1 || strings.HasPrefix(vals[0], "W/") {
		return
	}
	hdr["Etag"] = []string{"W/" + vals[0]}
}

// bodyAllowedForStatus reports whether a response with the given status may include
// a body (RFC 9110, section 6.4.1).
func bodyAllowedForStatus(status int) bool {
	switch {
	case status >= 100 && status <= 199:
		return false
	case status == http.StatusNoContent, status == http.StatusNotModified:
		return false
	}
	return true
}

// Interface guards
var (
	_ http.ResponseWriter = (*proxyWriter)(nil)
	_ http.Flusher        = (*proxyWriter)(nil)
	_ io.ReaderFrom       = (*proxyWriter)(nil)
)
